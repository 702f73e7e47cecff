package otelpgxtx

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// ending is the record of how one frame ended, which every output reads — the span, the
// metrics, the log record, the Verdicts, automatic reconciliation —: what the frame was,
// how it ended and its reference, copied once from its evidence and its parts, so that no
// output reads the evidence itself. It is built on the stack, and no output keeps it.
type ending struct {
	id      outcome.OperationID
	outcome outcome.Outcome
	phase   outcome.Phase // the terminal phase
	verdict classifier.Classification
	endedIn outcome.Phase // the phase the frame was concluded from
	// deliberate: rolled back on purpose with nothing gone wrong.
	deliberate       bool
	committedLocally bool
	// firstCause is the first failed query's error, cause the executor's, endErr the one
	// that concluded the frame.
	firstCause, cause, endErr error
	ref                       *outcome.ReconciliationRef
	noRef                     string // why a frame with references on has none, when it is its own (reference.Frame.Missing)
	startedAt, committingAt   time.Time
	concludedAt, at           time.Time // at: when the outputs got it (the executor's is later)
	// span is the frame span's context, recorded whether the frame was; parentSpan the one
	// it was begun under; spanCtx carries the frame span, for exemplars.
	span, parentSpan trace.SpanContext
	recorded         bool
	spanCtx          context.Context
	awaited          *awaited // automatic reconciliation's answer, or nil
	// What the frame was: its depth, what BEGIN said, what Run set.
	depth                              int
	isolation, accessMode, propagation string
	attemptNo                          int
	implicit                           bool // an implicit transaction (evidence.Frame.Implicit)
}
