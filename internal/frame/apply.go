package frame

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/framespan"
	"github.com/txevidence/otelpgxtx/internal/logs"
	"github.com/txevidence/otelpgxtx/internal/record"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/internal/verdict"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Apply is the one door through which what the evidence decided (a Result, which the
// connection's evidence.Conn returned for one event) reaches everything else. It takes
// the Results in a loop, each in one fixed order, written here and nowhere else:
//
//  1. the evidence: it has changed already, and r is its account;
//  2. the span: the phase events, the savepoint event, the retry event, the outer
//     frame's resumption;
//  3. when the frame ended, unless the executor manages it, or when the executor
//     finished it: the metrics, the log record of an indeterminate one, and the span's end;
//  4. the Verdicts: the one the frame began with, the one of a COMMIT that never left,
//     and the one of the query whose end this is (q);
//  5. automatic reconciliation, of an indeterminate frame, once its span has ended, so
//     that a reconciliation never starts before the frame it settles has ended;
//  6. a frame the evidence asks for (Result.Start): made, and begun by the evidence,
//     whose Result for it goes round the loop once more.
//
// f is the frame the event concerned (nil when none was open); q is the query that fed
// the evidence (its start, or its end), nil for the other events (a connection's end, the
// executor's). It returns the frame it started, if any. st.Mu is held: the hooks, a
// close on another goroutine and Run all apply under it, so that a frame ends once, in
// this order; nothing Apply calls calls it back.
func (t *Core) Apply(st *Conn, f *Frame, r evidence.Result, q *Query) (started *Frame) {
	for {
		if f != nil {
			t.applyTo(st, f, r, q)
		}
		if r.Start == evidence.StartNone || q == nil {
			return started
		}
		b, ctx, begin, chained := evidence.Begun{}, q.CallerCtx, "", (*Frame)(nil)
		switch r.Start {
		case evidence.StartBlock, evidence.StartPrepared:
			begin = q.SQL
		case evidence.StartImplicit:
			// Committing from the moment it leaves, as a COMMIT is (Send moves it).
			b, begin = evidence.Begun{Implicit: true, Wrote: true}, q.SQL
		case evidence.StartUnseen:
			b = evidence.Begun{Phase: outcome.PhaseActive, Wrote: q.Set.Writes()}
		case evidence.StartChained:
			b, ctx, chained = evidence.Begun{Phase: outcome.PhaseActive}, f.chainCtx(), f
		case evidence.StartRest:
			// What the query ran after the server ended f's transaction inside its reply: a
			// transaction block still open after it, else an implicit transaction, which the
			// query's end judges (a span of its own: the statement's is f's).
			b = evidence.Begun{Phase: outcome.PhaseActive, Wrote: q.Set.Writes()}
			if !q.InTx {
				b.Phase, b.Implicit, b.Rest = outcome.PhaseCommitting, true, true
			}
		}
		started = t.newFrame(ctx, q.Conn, st, &b, begin, chained)
		f, r, q = started, st.Ev.Start(started, b), nil
	}
}

// applyTo is Apply's steps 2 to 5 for f and r.
func (t *Core) applyTo(st *Conn, f *Frame, r evidence.Result, q *Query) {
	if r.Moved != 0 && f.Recording {
		for p := outcome.PhaseNotStarted; p <= outcome.PhaseUnknown; p++ {
			if r.Moved.Has(p) {
				f.PhaseEvent(p)
			}
		}
	}
	if r.Savepoint && f.Recording {
		f.SavepointEvent(r.SavepointMove, r.SavepointDepth, r.SavepointName)
	}
	if r.Retried {
		f.RetryEvent(int(f.AttemptNo)+1, f.Ev.Verdict().Reason())
	}
	if r.Waits && q != nil {
		f.unsentAsked = verdict.From(q.Ctx) // told when the frame ends, after this call returned
	}
	var e record.Ending // on the stack: every output reads it, none keeps it
	output := false     // the outputs got e now
	if r.Ended {
		e, output = t.onConcluded(st, f)
		if f.asked != nil {
			f.asked.FrameEnded(&e)
		}
		if v := f.unsentAsked; r.UnsentEnded && v != nil && v != f.asked {
			v.FrameEnded(&e)
		}
	}
	if r.Finished && f.ended.CompareAndSwap(false, true) {
		// The executor's end, after its post-commit work: its Verdict was told at the
		// conclusion.
		e, output = f.record(r.Outcome), true
		t.emit(&e, f, r.FailedAfter)
	}
	if q != nil && q.Open {
		if v := verdict.From(q.Ctx); v != nil {
			callVerdict(v, f, q, &e)
		}
	}
	if output && e.Outcome == outcome.OutcomeIndeterminate && t.Auto != nil {
		t.Auto.Enqueue(&e)
	}
}

// Query is what a query brings to apply beside the evidence's Result — at its start (a
// frame to begin for it) or at its end (what it ended): values only, so that nothing of
// the hook's own moves to the heap.
type Query struct {
	Ctx       context.Context // the query's: its Verdict is told what the query ended
	CallerCtx context.Context // where a frame it begins or reveals begins
	Conn      *pgx.Conn
	Set       evidence.Set
	SQL       string // its statement, for a frame it begins (a BEGIN's options, the span's name)
	Err       error
	InTx      bool // the session is in a transaction block after it
	Open      bool // at its end: the query's frame was going on, so its end was judged
}

// onConcluded is apply's steps 2 and 3 for f, just concluded on st's connection: the outer
// frame resumes, and, unless the executor manages f, its outputs get its ending, once
// (output). It returns the ending for the Verdicts and reconciliation.
func (t *Core) onConcluded(st *Conn, f *Frame) (e record.Ending, output bool) {
	if f.parent != nil {
		f.parent.SpanEvent(schema.EventResumed, f.ID)
	}
	o := f.Ev.Outcome()
	if t.Auto != nil && o == outcome.OutcomeIndeterminate {
		f.awaited = record.NewAwaited() // before any Verdict is told, so that each is told this one
	}
	if f.OnStatement && !f.Recording && o != outcome.OutcomeCommitted {
		// Before the ending is made: the log record, the Verdicts and reconciliation's
		// link name the span it starts.
		t.Spans.StartUnspanned(&f.Span, &f.Ev, f.startedAt, &st.attrs)
	}
	e = f.record(o)
	if !f.Managed && f.ended.CompareAndSwap(false, true) {
		t.emit(&e, f, f.Ev.FailedAfterCommit())
		output = true
	}
	return e, output
}

// emit hands e, f's ending, to the metrics, the log record of an indeterminate one, and
// the span, which it ends.
func (t *Core) emit(e *record.Ending, f *Frame, postCommitErr error) {
	t.Metrics.Record(e)
	if e.Outcome == outcome.OutcomeIndeterminate {
		logs.Indeterminate(t.Cfg.Logger(), e)
	}
	f.Span.EndWith(e, &t.Cfg, postCommitErr)
}

// callVerdict records in v, the Verdict in the context of a query of f's transaction, what
// that query (q) ended: f itself, with its ending e (apply's, built as the query ended
// it), or a savepoint of it. A Verdict f began with already has f's verdict.
func callVerdict(v *verdict.State, f *Frame, q *Query, e *record.Ending) {
	set := q.Set
	switch {
	case !f.Ev.Open():
		if v != f.asked {
			v.FrameEnded(e)
		}
	case q.Err == nil && q.InTx && (set.Has(evidence.Release) || set.Has(evidence.RollbackTo)) && !set.Has(evidence.Savepoint):
		v.SavepointEnded(f.ID, set.Has(evidence.RollbackTo))
	}
}

// frameWithRef is a frame and its reference part, in one allocation.
type frameWithRef struct {
	f   Frame
	ref reference.Frame
}

// allocFrame allocates a frame whose COMMIT carries refs: with its reference part if it
// carries one, else without (TestFrameSize: a frame of the defaults fits the 512-byte
// size class, where the allocator adds no header).
func allocFrame(refs reference.Refs) *Frame {
	if refs.Mode == reference.None {
		return &Frame{}
	}
	fr := &frameWithRef{}
	fr.f.CommitRef = &fr.ref
	return &fr.f
}

// newFrame makes a frame for a transaction that conn is beginning with the statement
// begin ("" when none was seen), or that COMMIT AND CHAIN began after chained, whose
// filter decision, span name and characteristics it keeps, and completes b, how the
// evidence is to begin it (its depth, what its BEGIN says). Its span is a child of the
// span in ctx; if ctx carries an open frame on another connection, that frame is
// suspended and the new one is one level deeper. The evidence begins it next (Apply).
func (t *Core) newFrame(ctx context.Context, conn *pgx.Conn, st *Conn, b *evidence.Begun, begin string, chained *Frame) *Frame {
	refs := st.Refs.FrameRefs(t.Cfg.References())
	if chained != nil {
		refs = chained.CommitRef.Refs()
	}
	f := allocFrame(refs)
	f.Conn, f.ID = conn.PgConn(), outcome.NewOperationID()
	if !b.Implicit || b.Rest {
		f.startedAt = time.Now()
	} // else its statement's hand-over starts it: HandedOver
	if f.CommitRef != nil {
		f.CommitRef.Init(refs, &f.Ev, f.ID)
	}
	if outer := openFrameFromContext(ctx); outer != nil && outer.Conn != f.Conn {
		f.parent, b.Depth = outer, outer.Ev.Depth()+1
	}
	var chainedSpan *framespan.Span
	if chained != nil {
		chainedSpan = &chained.Span
		b.Chained = &chained.Ev
	}
	f.Span.Start(&t.Spans, ctx, conn, &st.attrs, begin, chainedSpan, b.Implicit && !b.Rest && !t.Cfg.InnerSet && !t.Cfg.ImplicitSpans)
	if f.parent != nil {
		f.parent.SpanEvent(schema.EventSuspended, f.ID)
	}
	if begin != "" && (f.Recording || refs.Mode != reference.None) { // attributes, and whether a reference can be taken
		b.Isolation, b.AccessMode = evidence.BeginOptions(begin)
	}
	if f.asked = verdict.From(ctx); f.asked != nil {
		f.asked.Began()
		if f.AttemptNo == 0 {
			f.AttemptNo = int32(f.asked.Attempt) // a Retry attempt's
		}
	}
	return f
}

// HandedOver starts f, an implicit transaction's frame that its statement begins, at the
// moment the evidence recorded that statement handed over (committing, Conn.Send): the
// same moment, read once, where a clock read of its own at its making would be a few
// microseconds earlier; now, if the statement never left (a busy connection refused it).
func (f *Frame) HandedOver() {
	if f.startedAt = f.Ev.CommittingAt(); f.startedAt.IsZero() {
		f.startedAt = time.Now()
	}
}

// Feed feeds the evidence of f's connection one event of the executor's — event returns
// its Result — and applies it, under the connection's lock: the executor's way through
// the one door. It reports false, and feeds nothing, where the connection has no state of
// the tracer's (then f is no frame of its).
func (t *Core) Feed(f *Frame, event func(ev *evidence.Conn[*Frame]) evidence.Result) bool {
	st := Made(f.Conn)
	if st == nil {
		return false
	}
	st.Mu.Lock()
	defer st.Mu.Unlock()
	t.Apply(st, f, event(&st.Ev), nil)
	return true
}
