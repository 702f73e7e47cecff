package otelpgxtx

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/reference"
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
func (t *core) apply(st *connState, f *frame, r evidence.Result, at *queryEnd) {
	if f != nil {
		if r.Moved != 0 && f.recording {
			for p := outcome.PhaseNotStarted; p <= outcome.PhaseUnknown; p++ {
				if r.Moved.Has(p) {
					f.phaseEvent(p)
				}
			}
		}
		if r.Savepoint && f.recording {
			f.savepointEvent(r.SavepointMove, r.SavepointDepth, r.SavepointName)
		}
		if r.Waits && at != nil {
			f.unsentAsked = verdictFrom(at.ctx) // told when the frame ends, after this call returned
		}
		var e ending // on the stack: every output reads it, none keeps it
		if r.Ended {
			e = t.concluded(st, f)
			if f.asked != nil {
				f.asked.frameEnded(&e)
			}
			if v := f.unsentAsked; r.UnsentEnded && v != nil && v != f.asked {
				v.frameEnded(&e)
			}
		}
		if at != nil && at.open {
			if v := verdictFrom(at.ctx); v != nil {
				callVerdict(v, f, at, &e)
			}
		}
		if r.Ended && !f.managed && e.outcome == outcome.OutcomeIndeterminate && t.auto != nil {
			t.auto.enqueue(&e)
		}
	}
	if at == nil {
		return
	}
	switch r.Start {
	case evidence.StartUnseen:
		t.startFrame(at.callerCtx, at.conn, st, evidence.Begun{Phase: outcome.PhaseActive, Wrote: at.set.Writes()}, "", nil)
	case evidence.StartChained:
		t.startFrame(f.chainCtx(), at.conn, st, evidence.Begun{Phase: outcome.PhaseActive}, "", f)
	case evidence.StartRest:
		// What the query ran after the server ended f's transaction inside its reply: a
		// transaction block still open after it, else an implicit transaction, which the
		// query's end judges (a span of its own: the statement's is f's).
		b := evidence.Begun{Phase: outcome.PhaseActive, Wrote: at.set.Writes()}
		if !at.inTx {
			b.Phase, b.Implicit, b.Rest = outcome.PhaseCommitting, true, true
		}
		t.startFrame(at.callerCtx, at.conn, st, b, "", nil)
	}
}

// queryEnd is what a query's end brings to apply beside the evidence's Result: values
// only, so that nothing of the hook's own moves to the heap.
type queryEnd struct {
	ctx       context.Context // the query's: its Verdict is told what the query ended
	callerCtx context.Context // where a frame it reveals begins
	conn      *pgx.Conn
	set       evidence.Set
	err       error
	inTx      bool // the session is in a transaction block after it
	open      bool // the query's frame was going on when it ended: its end was judged
}

// concluded is apply's step 2 and 3 for f, just concluded on st's connection: the outer
// frame resumes, and, unless the executor manages f, its outputs get its ending, once. It
// returns the ending for the Verdicts and reconciliation.
func (t *core) concluded(st *connState, f *frame) ending {
	if f.parent != nil {
		f.parent.spanEvent(eventResumed, f.id)
	}
	o := f.ev.Outcome()
	if t.auto != nil && o == outcome.OutcomeIndeterminate {
		f.awaited = newAwaited() // before any Verdict is told, so that each is told this one
	}
	if f.onStatement && !f.recording && o != outcome.OutcomeCommitted {
		// Before the ending is made: the log record, the Verdicts and reconciliation's
		// link name the span it starts.
		t.startUnspanned(f, &st.attrs)
	}
	e := f.ending(o)
	if !f.managed && f.ended.CompareAndSwap(false, true) {
		t.output(&e, f, f.ev.FailedAfterCommit())
	}
	return e
}

// end hands the ending of f, a frame the executor manages, with outcome o, to every
// output, exactly once, after its post-commit work (postCommitErr is that work's failure,
// for a committed_with_post_commit_failure frame): the metrics, the log record, the span,
// then automatic reconciliation. Its Verdict was told at its conclusion.
func (t *core) end(f *frame, o outcome.Outcome, postCommitErr error) {
	if !f.ended.CompareAndSwap(false, true) {
		return
	}
	e := f.ending(o)
	t.output(&e, f, postCommitErr)
	if o == outcome.OutcomeIndeterminate && t.auto != nil {
		t.auto.enqueue(&e)
	}
}

// output hands e, f's ending, to the metrics, the log record of an indeterminate one, and
// the span, which it ends.
func (t *core) output(e *ending, f *frame, postCommitErr error) {
	t.metrics.record(e)
	if e.outcome == outcome.OutcomeIndeterminate {
		t.logIndeterminate(e)
	}
	f.frameSpan.end(e, &t.cfg, postCommitErr)
}

// callVerdict records in v, the Verdict in the context of a query of f's transaction, what
// that query (at) ended: f itself, with its ending e (apply's, built as the query ended
// it), or a savepoint of it. A Verdict f began with already has f's verdict.
func callVerdict(v *verdictState, f *frame, at *queryEnd, e *ending) {
	set := at.set
	switch {
	case !f.ev.Open():
		if v != f.asked {
			v.frameEnded(e)
		}
	case at.err == nil && at.inTx && (set.Has(evidence.Release) || set.Has(evidence.RollbackTo)) && !set.Has(evidence.Savepoint):
		v.savepointEnded(f.id, set.Has(evidence.RollbackTo))
	}
}

// startFrame begins a frame for a transaction that conn is beginning with the statement
// begin ("" when none was seen), or that COMMIT AND CHAIN began after chained, whose
// filter decision, span name and characteristics it keeps, as b says (its phase; its
// depth and characteristics are startFrame's to find). Its span is a child of the span in
// ctx; if ctx carries an open frame on another connection, that frame is suspended and
// the new one is one level deeper.
func (t *core) startFrame(ctx context.Context, conn *pgx.Conn, st *connState, b evidence.Begun, begin string, chained *frame) *frame {
	f := &frame{conn: conn.PgConn(), id: outcome.NewOperationID(), startedAt: time.Now()}
	refs := st.refs.FrameRefs(t.cfg.references())
	if chained != nil {
		refs = chained.commitRef.Refs
	}
	f.commitRef.Init(refs, &f.ev, f.id)
	if outer := openFrameFromContext(ctx); outer != nil && outer.conn != f.conn {
		f.parent, b.Depth = outer, outer.ev.Depth()+1
	}
	var chainedSpan *frameSpan
	if chained != nil {
		chainedSpan = &chained.frameSpan
		b.Chained = &chained.ev
	}
	f.frameSpan.start(t, ctx, conn, &st.attrs, begin, chainedSpan, b.Implicit && !b.Rest && !t.cfg.innerSet && !t.cfg.implicitSpans)
	if f.parent != nil {
		f.parent.spanEvent(eventSuspended, f.id)
	}
	if begin != "" && (f.recording || refs.Mode != reference.None) { // attributes, and whether a reference can be taken
		b.Isolation, b.AccessMode = evidence.BeginOptions(begin)
	}
	if f.asked = verdictFrom(ctx); f.asked != nil {
		f.asked.began()
		if f.attemptNo == 0 {
			f.attemptNo = f.asked.attempt // a Retry attempt's
		}
	}
	t.apply(st, f, st.ev.Start(f, b), nil)
	return f
}
