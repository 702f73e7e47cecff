package otelpgxtx

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/outcome"
)

// frame is one physical transaction as the instrumentation sees it: its evidence (the
// phases, what was observed, the verdict: package evidence), and one part for each
// consumer of what the evidence records — its span, what a Verdict is told, the
// executor's, its commit reference — so that a change to one concern reads one part. Its
// id, connection and parent are fixed at creation.
//
// Its life has two ends, kept apart because the executor runs post-commit work between
// them: the conclusion records the verdict and takes the frame off its connection (the
// evidence), and tells a Verdict; end hands the ending to the outputs — span, metrics, log
// record, reconciliation — once, at the conclusion unless the executor manages the frame.
//
// The owning connection's goroutine changes it; other goroutines only read its phase and
// end state (atomics) and add events to its span (which is safe for concurrent use),
// except that the close of its connection may conclude it on another goroutine, under the
// connection state's mutex (see closeWatch).
type frame struct {
	evidence.Frame
	frameSpan     // its span (phase_span.go) and the statements that are its events
	frameAnswer   // what a Verdict is told (verdict.go)
	frameExecutor // what Run sets (run.go, attempt.go)
	// commitRef is its commit reference (package reference).
	commitRef reference.Frame

	t         *core
	id        outcome.OperationID
	conn      *pgconn.PgConn
	parent    *frame // the suspended outer frame, or nil
	startedAt time.Time
	ended     atomic.Bool // the outputs have its ending (Tracer.end)
}

// Evidence returns f's evidence, for the connection's (evidence.Holder).
func (f *frame) Evidence() *evidence.Frame { return &f.Frame }

// frameExecutor is what Run sets on the frames of its attempts.
type frameExecutor struct {
	managed     bool // the executor ends the frame, after post-commit work
	propagation string
	attemptNo   int // the attempt of Run it is, from 1
}

// transition moves f to phase to and records its event.
func (f *frame) transition(to outcome.Phase) {
	if f.Move(to) {
		f.phaseEvent(to)
	}
}

// record records what the evidence decided of f: the events of the phases it moved to
// and, when it was concluded, its conclusion.
func (f *frame) record(r evidence.Result) {
	if r.Moved != 0 && f.recording {
		for p := outcome.PhaseNotStarted; p <= outcome.PhaseUnknown; p++ {
			if r.Moved.Has(p) {
				f.phaseEvent(p)
			}
		}
	}
	if r.Ended {
		f.concluded(r.UnsentEnded)
	}
}

// concluded is what follows f's conclusion: the suspended outer frame resumes, the
// Verdicts are told, and, unless the executor manages f, the outputs get its ending.
// unsent: it was a COMMIT that never left, whose call's Verdict is told too.
func (f *frame) concluded(unsent bool) {
	if f.parent != nil {
		f.parent.spanEvent(eventResumed, f.id)
	}
	if f.t.auto != nil && f.Outcome() == outcome.OutcomeIndeterminate {
		f.awaited = newAwaited() // before any Verdict is told, so that each is told this one
	}
	if f.asked != nil {
		e := f.ending(f.Outcome())
		f.asked.frameEnded(&e)
	}
	if !f.managed {
		f.t.end(f, f.Outcome(), nil)
	}
	if v := f.unsentAsked; unsent && v != nil && v != f.asked {
		e := f.ending(f.Outcome())
		v.frameEnded(&e)
	}
}

// chainCtx rebuilds the context f was begun in: the next frame of COMMIT AND CHAIN
// begins in it, under the same parent span and suspended frame.
func (f *frame) chainCtx() context.Context {
	ctx := trace.ContextWithSpanContext(context.Background(), f.parentSpan)
	if f.parent != nil {
		ctx = contextWithFrame(ctx, f.parent)
	}
	return ctx
}

// Frames travel in contexts as an immutable linked list: a context holds the innermost
// frame, which points to its suspended parent. No cleanup can resurrect a frame there:
// a concluded frame is skipped, never reused.
type frameKey struct{}

// contextWithFrame returns ctx with f as its innermost frame.
func contextWithFrame(ctx context.Context, f *frame) context.Context {
	return context.WithValue(ctx, frameKey{}, f)
}

// openFrameFromContext returns the innermost frame in ctx whose transaction is open.
func openFrameFromContext(ctx context.Context) *frame {
	f, _ := ctx.Value(frameKey{}).(*frame)
	for f != nil && !f.Open() {
		f = f.parent
	}
	return f
}

// ending returns f's record, ended with o.
func (f *frame) ending(o outcome.Outcome) ending {
	e := ending{id: f.id, outcome: o, phase: f.Phase(), verdict: f.Verdict(), endedIn: f.EndedIn(), deliberate: f.Deliberate(),
		committedLocally: f.CommittedLocally(), firstCause: f.FirstCause(), cause: f.Cause(), endErr: f.EndErr(), ref: f.commitRef.Ref(), noRef: f.commitRef.Missing(),
		startedAt: f.startedAt, committingAt: f.CommittingAt(), concludedAt: f.ConcludedAt(),
		span: f.span.SpanContext(), parentSpan: f.parentSpan, recorded: !f.unrecorded, spanCtx: f.spanCtx, awaited: f.awaited,
		depth: f.Depth(), isolation: f.Isolation(), accessMode: f.AccessMode(), propagation: f.propagation, attemptNo: f.attemptNo}
	e.at = e.concludedAt // the conclusion has just read the clock
	if f.managed {
		e.at = time.Now() // the executor ends the frame after its post-commit work
	}
	return e
}

// end hands f's ending, with outcome o, to every output, exactly once: the metrics, the
// log record of an indeterminate one, the span, and automatic reconciliation.
// postCommitErr is the follow-up failure of a committed_with_post_commit_failure frame.
func (t *core) end(f *frame, o outcome.Outcome, postCommitErr error) {
	if !f.ended.CompareAndSwap(false, true) {
		return
	}
	e := f.ending(o)
	t.metrics.record(&e)
	if o == outcome.OutcomeIndeterminate {
		t.logIndeterminate(&e)
	}
	f.frameSpan.end(&e, &t.cfg, postCommitErr)
	if o == outcome.OutcomeIndeterminate && t.auto != nil {
		// Handed over once the span has ended, so that a reconciliation never starts
		// before the frame it settles has ended.
		t.auto.enqueue(&e)
	}
}
