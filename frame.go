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
// Both go through apply (apply.go).
//
// The owning connection's goroutine changes it; other goroutines only read its phase and
// end state (atomics) and add events to its span (which is safe for concurrent use),
// except that the close of its connection may conclude it on another goroutine, under the
// connection state's mutex (see closeWatch).
type frame struct {
	// ev is its evidence, which only the connection's evidence.Conn changes; everything
	// else reads it (its exported methods read), and the outputs read its ending record.
	ev            evidence.Frame
	frameSpan     // its span (phase_span.go) and the statements that are its events
	frameAnswer   // what a Verdict is told (verdict.go)
	frameExecutor // what Run sets (run.go, attempt.go)
	// commitRef is its commit reference (package reference).
	commitRef reference.Frame

	id        outcome.OperationID
	conn      *pgconn.PgConn
	parent    *frame // the suspended outer frame, or nil
	startedAt time.Time
	ended     atomic.Bool // the outputs have its ending (Tracer.end)
}

// Evidence returns f's evidence, for the connection's (evidence.Holder).
func (f *frame) Evidence() *evidence.Frame { return &f.ev }

// frameExecutor is what Run sets on the frames of its attempts.
type frameExecutor struct {
	managed     bool // the executor ends the frame, after post-commit work
	propagation string
	attemptNo   int // the attempt of Run it is, from 1
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
	for f != nil && !f.ev.Open() {
		f = f.parent
	}
	return f
}

// ending returns f's record, ended with o.
func (f *frame) ending(o outcome.Outcome) ending {
	ev := &f.ev
	e := ending{id: f.id, outcome: o, phase: ev.Phase(), verdict: ev.Verdict(), endedIn: ev.EndedIn(), deliberate: ev.Deliberate(),
		committedLocally: ev.CommittedLocally(), firstCause: ev.FirstCause(), cause: ev.Cause(), endErr: ev.EndErr(), ref: f.commitRef.Ref(), noRef: f.commitRef.Missing(),
		startedAt: f.startedAt, committingAt: ev.CommittingAt(), concludedAt: ev.ConcludedAt(),
		span: f.spanContext(), parentSpan: f.parentSpan, recorded: !f.unrecorded, spanCtx: f.spanCtx, awaited: f.awaited,
		depth: ev.Depth(), isolation: ev.Isolation(), accessMode: ev.AccessMode(), propagation: f.propagation, attemptNo: f.attemptNo,
		implicit: ev.Implicit()}
	e.at = e.concludedAt // the conclusion has just read the clock
	if f.managed {
		e.at = time.Now() // the executor ends the frame after its post-commit work
	}
	return e
}
