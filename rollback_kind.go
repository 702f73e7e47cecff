package otelpgxtx

import (
	"github.com/txevidence/otelpgxtx/classifier"
)

// deliberateRollback reports whether f, rolled back, was ended on purpose with nothing
// gone wrong: the one rule behind its span status and its metric series.
func (f *frame) deliberateRollback() bool {
	return !f.hasErr && f.cause == nil && f.verdict.Reason() == classifier.ReasonRolledBack
}
