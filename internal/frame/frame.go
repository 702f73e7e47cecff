package frame

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/framespan"
	"github.com/txevidence/otelpgxtx/internal/record"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/internal/verdict"
	"github.com/txevidence/otelpgxtx/outcome"
)

// FrameOfTx returns the open frame of tx's connection, and the tracer whose frame it is;
// nil, nil if none is open.
func FrameOfTx(tx pgx.Tx) (*Frame, *Core) {
	conn := tx.Conn()
	if conn == nil {
		return nil, nil
	}
	if st := Made(conn.PgConn()); st != nil {
		st.Mu.Lock()
		defer st.Mu.Unlock()
		if f := st.Frame(); f != nil && f.Ev.Open() {
			return f, st.core
		}
	}
	return nil, nil
}

// Frame is one physical transaction as the instrumentation sees it: its evidence (the
// phases, what was observed, the verdict: package evidence), and one part for each
// consumer of what the evidence records — its span, what a Verdict is told, the
// executor's, its commit reference — so that a change to one concern reads one part. Its
// id, connection and parent are fixed at creation.
//
// Its life has two ends, kept apart because the executor runs post-commit work between
// them: the conclusion records the verdict and takes the frame off its connection (the
// evidence), and tells a Verdict; end hands the ending to the outputs — span, metrics, log
// record, reconciliation — once, at the conclusion unless the executor manages the frame.
// Both go through Apply.
//
// The owning connection's goroutine changes it; other goroutines only read its phase and
// end state (atomics) and add events to its span (which is safe for concurrent use),
// except that the close of its connection may conclude it on another goroutine, under the
// connection state's mutex (see CloseWatch).
type Frame struct {
	// Ev is its evidence, which only the connection's evidence.Conn changes; everything
	// else reads it (its exported methods read), and the outputs read its ending record.
	Ev             evidence.Frame
	framespan.Span // its span (package framespan) and the statements that are its events
	frameAnswer    // what a Verdict is told (package verdict)
	frameExecutor  // what Run sets (package executor)
	// CommitRef is its commit reference (package reference), nil when its COMMIT carries
	// none (the default): allocated with the frame when it does (newFrame).
	CommitRef *reference.Frame

	ID        outcome.OperationID
	Conn      *pgconn.PgConn
	parent    *Frame // the suspended outer frame, or nil
	startedAt time.Time
	ended     atomic.Bool // the outputs have its ending (Apply)
}

// Evidence returns f's evidence, for the connection's (evidence.Holder).
func (f *Frame) Evidence() *evidence.Frame { return &f.Ev }

// frameExecutor is what Run sets on the frames of its attempts.
type frameExecutor struct {
	Propagation string
	AttemptNo   int32 // the attempt of Run it is, from 1 (int32 beside Managed: 8 bytes less a frame)
	Managed     bool  // the executor ends the frame, after post-commit work
}

// chainCtx rebuilds the context f was begun in: the next frame of COMMIT AND CHAIN
// begins in it, under the same parent span and suspended frame.
func (f *Frame) chainCtx() context.Context {
	ctx := trace.ContextWithSpanContext(context.Background(), f.ParentSpan)
	if f.parent != nil {
		ctx = ContextWithFrame(ctx, f.parent)
	}
	return ctx
}

// Frames travel in contexts as an immutable linked list: a context holds the innermost
// frame, which points to its suspended parent. No cleanup can resurrect a frame there:
// a concluded frame is skipped, never reused.
type FrameKey struct{}

// ContextWithFrame returns ctx with f as its innermost frame.
func ContextWithFrame(ctx context.Context, f *Frame) context.Context {
	return context.WithValue(ctx, FrameKey{}, f)
}

// openFrameFromContext returns the innermost frame in ctx whose transaction is open.
func openFrameFromContext(ctx context.Context) *Frame {
	f, _ := ctx.Value(FrameKey{}).(*Frame)
	for f != nil && !f.Ev.Open() {
		f = f.parent
	}
	return f
}

// record returns f's record, ended with o.
func (f *Frame) record(o outcome.Outcome) record.Ending {
	ev := &f.Ev
	e := record.Ending{ID: f.ID, Outcome: o, Phase: ev.Phase(), Verdict: ev.Verdict(), EndedIn: ev.EndedIn(), Deliberate: ev.Deliberate(),
		CommittedLocally: ev.CommittedLocally(), FirstCause: ev.FirstCause(), Cause: ev.Cause(), EndErr: ev.EndErr(), Ref: f.CommitRef.Ref(), NoRef: f.CommitRef.Missing(),
		StartedAt: f.startedAt, CommittingAt: ev.CommittingAt(), ConcludedAt: ev.ConcludedAt(),
		Span: f.SpanContext(), ParentSpan: f.ParentSpan, Recorded: !f.Unrecorded, SpanCtx: f.SpanCtx, Awaited: f.awaited,
		Depth: ev.Depth(), Isolation: ev.Isolation(), AccessMode: ev.AccessMode(), Propagation: f.Propagation, AttemptNo: int(f.AttemptNo),
		Implicit: ev.Implicit()}
	e.At = e.ConcludedAt // the conclusion has just read the clock
	if f.Managed {
		e.At = time.Now() // the executor ends the frame after its post-commit work
	}
	return e
}

// frameAnswer is what the frame tells a Verdict: asked is the one in the context the
// frame began in, or nil; unsentAsked one in the context of a COMMIT that never left
// (evidence.Result.Waits), told when the frame ends, after that call returned; awaited is
// automatic reconciliation's answer, made when the frame ends unknown on a tracer that
// reconciles (WithAutoReconcile): a Retry told this frame waits for it.
type frameAnswer struct {
	asked       *verdict.State
	unsentAsked *verdict.State
	awaited     *record.Awaited
}

// SpanOrNil returns f's span, or nil for no frame.
func (f *Frame) SpanOrNil() *framespan.Span {
	if f == nil {
		return nil
	}
	return &f.Span
}
