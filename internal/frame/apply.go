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

// apply is the one door through which what the evidence decided (a Result, which the
// connection's evidence.Conn returned for one event) reaches everything else, in one
// fixed order, written here and nowhere else:
//
//  1. the evidence: it has changed already, and r is its account;
//  2. the span: the phase events, the savepoint event, the outer frame's resumption;
//  3. when the frame ended, unless the executor manages it: the metrics, the log record
//     of an indeterminate one, and the span's end;
//  4. the Verdicts: the one the frame began with, the one of a COMMIT that never left,
//     and the one of the query whose end this is (at);
//  5. automatic reconciliation, of an indeterminate frame, once its span has ended, so
//     that a reconciliation never starts before the frame it settles has ended;
//  6. a frame the evidence asks for.
//
// f is the frame the event concerned (nil when none was open); at is the query's end
// that fed the evidence, nil for the other events (a statement handed over, a
// connection's end, the executor's conclusion). st.mu is held: the hooks, a close on
// another goroutine and Run all apply under it, so that a frame ends once, in this order.
func (t *Core) Apply(st *Conn, f *Frame, r evidence.Result, at *QueryEnd) {
	if f != nil {
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
		if r.Waits && at != nil {
			f.unsentAsked = verdict.From(at.Ctx) // told when the frame ends, after this call returned
		}
		var e record.Ending // on the stack: every output reads it, none keeps it
		if r.Ended {
			e = t.concluded(st, f)
			if f.asked != nil {
				f.asked.FrameEnded(&e)
			}
			if v := f.unsentAsked; r.UnsentEnded && v != nil && v != f.asked {
				v.FrameEnded(&e)
			}
		}
		if at != nil && at.Open {
			if v := verdict.From(at.Ctx); v != nil {
				callVerdict(v, f, at, &e)
			}
		}
		if r.Ended && !f.Managed && e.Outcome == outcome.OutcomeIndeterminate && t.Auto != nil {
			t.Auto.Enqueue(&e)
		}
	}
	if at == nil {
		return
	}
	switch r.Start {
	case evidence.StartUnseen:
		t.StartFrame(at.CallerCtx, at.Conn, st, evidence.Begun{Phase: outcome.PhaseActive, Wrote: at.Set.Writes()}, "", nil)
	case evidence.StartChained:
		t.StartFrame(f.chainCtx(), at.Conn, st, evidence.Begun{Phase: outcome.PhaseActive}, "", f)
	case evidence.StartRest:
		// What the query ran after the server ended f's transaction inside its reply: a
		// transaction block still open after it, else an implicit transaction, which the
		// query's end judges (a span of its own: the statement's is f's).
		b := evidence.Begun{Phase: outcome.PhaseActive, Wrote: at.Set.Writes()}
		if !at.InTx {
			b.Phase, b.Implicit, b.Rest = outcome.PhaseCommitting, true, true
		}
		t.StartFrame(at.CallerCtx, at.Conn, st, b, "", nil)
	}
}

// queryEnd is what a query's end brings to apply beside the evidence's Result: values
// only, so that nothing of the hook's own moves to the heap.
type QueryEnd struct {
	Ctx       context.Context // the query's: its Verdict is told what the query ended
	CallerCtx context.Context // where a frame it reveals begins
	Conn      *pgx.Conn
	Set       evidence.Set
	Err       error
	InTx      bool // the session is in a transaction block after it
	Open      bool // the query's frame was going on when it ended: its end was judged
}

// concluded is apply's step 2 and 3 for f, just concluded on st's connection: the outer
// frame resumes, and, unless the executor manages f, its outputs get its ending, once. It
// returns the ending for the Verdicts and reconciliation.
func (t *Core) concluded(st *Conn, f *Frame) record.Ending {
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
	e := f.ending(o)
	if !f.Managed && f.ended.CompareAndSwap(false, true) {
		t.output(&e, f, f.Ev.FailedAfterCommit())
	}
	return e
}

// end hands the ending of f, a frame the executor manages, with outcome o, to every
// output, exactly once, after its post-commit work (postCommitErr is that work's failure,
// for a committed_with_post_commit_failure frame): the metrics, the log record, the span,
// then automatic reconciliation. Its Verdict was told at its conclusion.
func (t *Core) End(f *Frame, o outcome.Outcome, postCommitErr error) {
	if !f.ended.CompareAndSwap(false, true) {
		return
	}
	e := f.ending(o)
	t.output(&e, f, postCommitErr)
	if o == outcome.OutcomeIndeterminate && t.Auto != nil {
		t.Auto.Enqueue(&e)
	}
}

// output hands e, f's ending, to the metrics, the log record of an indeterminate one, and
// the span, which it ends.
func (t *Core) output(e *record.Ending, f *Frame, postCommitErr error) {
	t.Metrics.Record(e)
	if e.Outcome == outcome.OutcomeIndeterminate {
		logs.Indeterminate(t.Cfg.Logger(), e)
	}
	f.Span.End(e, &t.Cfg, postCommitErr)
}

// callVerdict records in v, the Verdict in the context of a query of f's transaction, what
// that query (at) ended: f itself, with its ending e (apply's, built as the query ended
// it), or a savepoint of it. A Verdict f began with already has f's verdict.
func callVerdict(v *verdict.State, f *Frame, at *QueryEnd, e *record.Ending) {
	set := at.Set
	switch {
	case !f.Ev.Open():
		if v != f.asked {
			v.FrameEnded(e)
		}
	case at.Err == nil && at.InTx && (set.Has(evidence.Release) || set.Has(evidence.RollbackTo)) && !set.Has(evidence.Savepoint):
		v.SavepointEnded(f.ID, set.Has(evidence.RollbackTo))
	}
}

// startFrame begins a frame for a transaction that conn is beginning with the statement
// begin ("" when none was seen), or that COMMIT AND CHAIN began after chained, whose
// filter decision, span name and characteristics it keeps, as b says (its phase; its
// depth and characteristics are startFrame's to find). Its span is a child of the span in
// ctx; if ctx carries an open frame on another connection, that frame is suspended and
// the new one is one level deeper.
func (t *Core) StartFrame(ctx context.Context, conn *pgx.Conn, st *Conn, b evidence.Begun, begin string, chained *Frame) *Frame {
	f := &Frame{Conn: conn.PgConn(), ID: outcome.NewOperationID(), startedAt: time.Now()}
	refs := st.Refs.FrameRefs(t.Cfg.References())
	if chained != nil {
		refs = chained.CommitRef.Refs
	}
	f.CommitRef.Init(refs, &f.Ev, f.ID)
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
			f.AttemptNo = f.asked.Attempt // a Retry attempt's
		}
	}
	t.Apply(st, f, st.Ev.Start(f, b), nil)
	return f
}
