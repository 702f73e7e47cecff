package otelpgxtx

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/txevidence/otelpgxtx/classifier"
)

// RollbackKey is tx.rollback: on a rolled_back frame span, and on the rolled_back series
// of [MetricTransactions], [MetricDuration] and [MetricCommitDuration], whether the
// application ended the transaction on purpose ([RollbackDeliberate]) or something failed
// ([RollbackFailure]). A deliberate Rollback() is how Go code usually ends a read-only
// transaction; an alert on rollbacks must not count it. Its two values are the only ones,
// so it adds one series to each metric.
const RollbackKey = attribute.Key("tx.rollback")

// The values of [RollbackKey].
const (
	// RollbackDeliberate: the application rolled back with nothing gone wrong — no
	// statement failed, [Run]'s function returned nil, no participant failed, and the
	// server answered the ROLLBACK. Its span status stays Unset.
	RollbackDeliberate = "deliberate"
	// RollbackFailure: a statement, the COMMIT or the connection failed, [Run]'s function
	// returned an error or panicked, or the transaction ended where no statement showed
	// it (error.type says which). Its span status is Error, unless the failure was an
	// expected one ([WithExpectedErrors]).
	RollbackFailure = "failure"
)

// deliberateRollback reports whether f, rolled back, was ended on purpose with nothing
// gone wrong: the one rule behind its span status and its metric series.
func (f *frame) deliberateRollback() bool {
	return !f.hasErr && f.cause == nil && f.verdict.Reason() == classifier.ReasonRolledBack
}
