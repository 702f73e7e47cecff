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
	startedAt, committingAt   time.Time
	concludedAt, at           time.Time // at: when the outputs got it (the executor's is later)
	// span is the frame span's context, recorded whether the frame was; parentSpan the one
	// it was begun under; spanCtx carries the frame span, for exemplars.
	span, parentSpan trace.SpanContext
	recorded         bool
	spanCtx          context.Context
	awaited          *awaited // automatic reconciliation's answer, or nil
}

// ending returns f's record, ended with o.
func (f *frame) ending(o outcome.Outcome) ending {
	e := ending{id: f.id, outcome: o, phase: f.Phase(), verdict: f.Verdict(), endedIn: f.EndedIn(), deliberate: f.Deliberate(),
		committedLocally: f.CommittedLocally(), firstCause: f.FirstCause(), cause: f.Cause(), endErr: f.EndErr(), ref: f.commitRef.Ref(),
		startedAt: f.startedAt, committingAt: f.CommittingAt(), concludedAt: f.ConcludedAt(),
		span: f.span.SpanContext(), parentSpan: f.parentSpan, recorded: !f.unrecorded, spanCtx: f.spanCtx, awaited: f.awaited}
	e.at = e.concludedAt // the conclusion has just read the clock
	if f.managed {
		e.at = time.Now() // the executor ends the frame after its post-commit work
	}
	return e
}

// end hands f's ending, with outcome o, to every output, exactly once: the metrics, the
// log record of an indeterminate one, the span, and automatic reconciliation.
// postCommitErr is the follow-up failure of a committed_with_post_commit_failure frame.
func (t *Tracer) end(f *frame, o outcome.Outcome, postCommitErr error) {
	if !f.ended.CompareAndSwap(false, true) {
		return
	}
	e := f.ending(o)
	t.metrics.record(&e)
	if o == outcome.OutcomeIndeterminate {
		t.logIndeterminate(&e)
	}
	f.endSpan(&e, postCommitErr)
	if o == outcome.OutcomeIndeterminate && t.auto != nil {
		// Handed over once the span has ended, so that a reconciliation never starts
		// before the frame it settles has ended.
		t.auto.enqueue(&e)
	}
}
