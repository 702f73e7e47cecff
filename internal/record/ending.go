package record

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Ending is the record of how one frame ended, which every output reads — the span, the
// metrics, the log record, the Verdicts, automatic reconciliation —: what the frame was,
// how it ended and its reference, copied once from its evidence and its parts, so that no
// output reads the evidence itself. It is built on the stack, and no output keeps it.
type Ending struct {
	ID      outcome.OperationID
	Outcome outcome.Outcome
	Phase   outcome.Phase // the terminal phase
	Verdict classifier.Classification
	EndedIn outcome.Phase // the phase the frame was concluded from
	// Deliberate: rolled back on purpose with nothing gone wrong.
	Deliberate       bool
	CommittedLocally bool
	// FirstCause is the first failed query's error, cause the executor's, endErr the one
	// that concluded the frame.
	FirstCause, Cause, EndErr error
	Ref                       *outcome.ReconciliationRef
	NoRef                     string // why a frame with references on has none, when it is its own (reference.Frame.Missing)
	StartedAt, CommittingAt   time.Time
	ConcludedAt, At           time.Time // at: when the outputs got it (the executor's is later)
	// Span is the frame span's context, recorded whether the frame was; parentSpan the one
	// it was begun under; spanCtx carries the frame span, for exemplars.
	Span, ParentSpan trace.SpanContext
	Recorded         bool
	SpanCtx          context.Context
	Awaited          *Awaited // automatic reconciliation's answer, or nil
	// What the frame was: its depth, what BEGIN said, what Run set.
	Depth                              int
	Isolation, AccessMode, Propagation string
	AttemptNo                          int
	Implicit                           bool // an implicit transaction (evidence.Frame.Implicit)
}
