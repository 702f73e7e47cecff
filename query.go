package otelpgxtx

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// A query, in this file, is one traced call of the driver: a query, batch, copy or
// prepare, with its Start and End hook; its SQL text holds one statement or several.
// Each query moves its connection's frame through the phases: before it reaches the
// driver (a BEGIN starts a frame, a COMMIT marks committing) and after it completed
// (the evidence becomes a verdict).

// startQuery is the body of every Start hook: it records the start of a query whose
// statements are of kinds set, may make it an event in place of a span (fold, op: see
// Tracer.fold), lets the inner tracer start its span (inner, told whether the query is
// folded), and pushes what its End needs. With no state on the connection, only inner
// runs.
func (t *Tracer) startQuery(ctx context.Context, conn *pgx.Conn, set stmtSet, sql string, fold foldKind, op string, inner func(context.Context, bool) context.Context) context.Context {
	st := connStateOf(conn)
	if st == nil {
		return inner(ctx, false) // no frame to parent to, but the statement span stays
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	ctx, q := t.enter(ctx, conn, st, set, sql)
	ctx = inner(t.fold(ctx, &q, fold, op), q.folded)
	q.ctx = ctx
	st.push(q)
	return ctx
}

// endQuery is the body of every End hook: it pops what startQuery pushed, lets the inner
// tracer end its span (inner, told whether the query is folded), and judges the query. An
// End without its Start has nothing to judge.
func (t *Tracer) endQuery(ctx context.Context, conn *pgx.Conn, tag pgconn.CommandTag, err error, inner func(context.Context, bool)) {
	st := connStateOf(conn)
	var q queryState
	started := false
	if st != nil {
		st.mu.Lock()
		defer st.mu.Unlock()
		q, started = st.pop(ctx)
	}
	// A folded query's event: a prepare's now, a statement's with the frame's next event.
	answering := q.folded && !q.nested && q.frame.open()
	var answer statementAnswer
	if answering {
		answer = answerOf(q.op, q.start, err)
	} else if q.folded && q.nested {
		prepareEvent(ctx, &q, err)
	}
	inner(t.innerEndStatus(innerEndCtx(ctx, q.frame), err), q.folded)
	if started {
		if answering {
			q.frame.answered(answer)
		}
		t.leave(ctx, conn, st, &q, tag, err)
		if answering {
			q.frame.unanswered(&q)
		}
	}
}

// enter records the start of a query on conn and returns the context for the inner
// tracer. A call made while another is in flight on the same
// connection — pgx's implicit prepare inside a query — is part of that one: it neither
// moves the phase nor re-parents what the inner tracer starts to the frame.
func (t *Tracer) enter(ctx context.Context, conn *pgx.Conn, st *connState, set stmtSet, sql string) (context.Context, queryState) {
	if len(st.queries) > 0 {
		return ctx, queryState{set: set, frame: st.queries[len(st.queries)-1].frame, nested: true}
	}
	f := t.beforeQuery(ctx, conn, st, set, sql)
	q := queryState{set: set, frame: f, callerCtx: ctx}
	if set.savepoint() {
		q.savepoint = savepointName(sql)
	}
	return innerStartCtx(ctx, f), q
}

// leave records the end of what enter started, in ctx.
func (t *Tracer) leave(ctx context.Context, conn *pgx.Conn, st *connState, q *queryState, tag pgconn.CommandTag, err error) {
	if !q.nested {
		t.afterQuery(ctx, conn, st, q, tag, err)
	}
}

// beforeQuery runs before a query reaches the driver: it starts a frame for a BEGIN,
// and marks committing before a COMMIT is handed over.
func (t *Tracer) beforeQuery(ctx context.Context, conn *pgx.Conn, st *connState, set stmtSet, beginSQL string) *frame {
	pg := conn.PgConn()
	f := st.frame
	if f != nil && f.commitUnsent {
		// A statement after a COMMIT that never left, on the same open transaction: another
		// COMMIT goes on in the frame; anything else, and the frame is judged as its
		// COMMIT's failure alone judges it (unknown: nothing tells what the application
		// will do), and what follows is a frame of its own.
		if set.commits() {
			f.commitUnsent = false
		} else {
			f.concludeUnsent(st, classifier.Facts{})
			f = nil
		}
	}
	if f != nil && pg.TxStatus() == 'I' {
		// The transaction ended where we could not see it; its frame must not ride
		// into this unrelated work.
		t.abandon(st, f, reasonEndedUnobserved)
		f = nil
	}
	if f == nil && set.has(stmtBegin) && pg.TxStatus() == 'I' {
		f = t.startFrame(ctx, conn, st, outcome.PhaseNotStarted, beginSQL, nil)
		t.armCheck(st, f.refs, pg, set, beginSQL)
		if f.recording || f.refs.mode != referenceNone { // attributes, and whether a reference can be taken
			_, rest := classifyOne(beginSQL)
			f.isolation, f.accessMode = beginOptions(rest)
			f.readOnly = f.accessMode == "read only"
		}
	}
	if f != nil && set.writes() {
		f.wrote = true
		t.armXIDRead(ctx, st, f, pg, set, beginSQL)
	}
	if f != nil && (set.commits() || st.server == classifier.ServerCockroachDB && releasesRestart(set, beginSQL)) && !pg.IsBusy() {
		// A busy connection (a result the application has not read) refuses the
		// statement before sending a byte: COMMIT never leaves, so the phase stays.
		if f.currentPhase() == outcome.PhaseNotStarted {
			f.transition(outcome.PhaseActive) // BEGIN and COMMIT in one string
		}
		t.settleXIDRead(ctx, st, f)
		f.transition(outcome.PhaseCommitting)
		st.markCommit(f)
		t.armReference(st, f, pg, set, beginSQL)
	}
	return f
}

// afterQuery runs after a query made in ctx completed, when the connection's transaction
// status is known again. It is where evidence becomes a verdict.
func (t *Tracer) afterQuery(ctx context.Context, conn *pgx.Conn, st *connState, q *queryState, tag pgconn.CommandTag, err error) {
	pg := conn.PgConn()
	closed := pg.IsClosed()
	status := pg.TxStatus()
	inTx := !closed && (status == 'T' || status == 'E')
	f := q.frame
	if !inTx {
		st.committedInBlock = false
	}
	if t.collectAddition(st, f, false) && f != nil {
		f.endedBeforeCommit = true // the server answered the xid read with a FATAL
	}
	if f == nil || !f.open() {
		if inTx && st.frame == nil && !st.committedInBlock {
			// A transaction we did not see begin (BEGIN inside a string we could not
			// read): track it from here rather than not at all.
			nf := t.startFrame(q.callerCtx, conn, st, outcome.PhaseActive, "", nil)
			nf.wrote = q.set.writes()
		}
		return
	}
	facts := classifier.Facts{ConnClosed: closed, CommittedLocally: f.committedLocally,
		RollbackTag: q.batch.rollbackTag || tag.String() == "ROLLBACK"}
	if q.batch.err != nil && err == nil {
		err = q.batch.err
	}
	f.judgeErr(ctx, err)
	if err != nil {
		f.endErr = err // the cause, should this query conclude the frame
	}
	switch f.currentPhase() {
	case outcome.PhaseNotStarted:
		if !inTx {
			f.conclude(st, classifier.Classify(outcome.PhaseNotStarted, err, facts))
			break
		}
		f.transition(outcome.PhaseActive)
		t.afterActiveQuery(st, f, q, err, facts, inTx)
	case outcome.PhaseCommitting:
		st.commitFacts(f, &facts)
		if facts.CommitNotSent && inTx && err != nil {
			// COMMIT never left (pgconn refused it, its context already done) and the
			// transaction is still open: it ends with the connection, which pgx's Commit
			// closes on such a failure (rolled back: abandon), or, should the application
			// go on using it, at its next statement (beforeQuery).
			f.commitUnsent, f.unsentAsked = true, verdictFrom(ctx)
			break
		}
		f.conclude(st, classifier.Classify(outcome.PhaseCommitting, err, facts))
		st.committedInBlock = inTx && f.currentPhase() == outcome.PhaseCommitted
	case outcome.PhaseActive:
		t.afterActiveQuery(st, f, q, err, facts, inTx)
	}
	if q.set.chains() && inTx && st.frame == nil && err == nil {
		// AND CHAIN began the next transaction at once, with the same characteristics.
		next := t.startFrame(f.chainCtx(), conn, st, outcome.PhaseActive, "", f)
		next.isolation, next.accessMode = f.isolation, f.accessMode
	}
	if v := verdictFrom(ctx); v != nil {
		callVerdict(v, f, q, err, inTx)
	}
}

// callVerdict records in v, the Verdict in the context of a query of f's transaction, what
// that query ended: f itself, or a savepoint of it. A Verdict f began with already has
// f's verdict.
func callVerdict(v *Verdict, f *frame, q *queryState, err error, inTx bool) {
	switch {
	case !f.open():
		if v != f.asked {
			v.frameEnded(f)
		}
	case err == nil && inTx && (q.set.has(stmtRelease) || q.set.has(stmtRollbackTo)) && !q.set.has(stmtSavepoint):
		v.savepointEnded(f, q.set.has(stmtRollbackTo))
	}
}

// afterActiveQuery judges a query that ran while f was active: a failure is kept as the
// cause of the rollback that must follow, a rollback concludes f, and a savepoint
// statement becomes an event (savepoints never change the frame's phase).
func (t *Tracer) afterActiveQuery(st *connState, f *frame, q *queryState, err error, facts classifier.Facts, inTx bool) {
	if classifier.CompletionUnknown(err) {
		// The server says it cannot tell whether the statement completed (40003): on
		// CockroachDB that can be the commit (RELEASE SAVEPOINT cockroach_restart), and no
		// server that sends it has proven a rollback. The frame is committing from the
		// moment the answer came, and unknown.
		f.transition(outcome.PhaseCommitting)
		facts.Server = st.server
		f.conclude(st, classifier.Classify(outcome.PhaseCommitting, err, facts))
		return
	}
	if err != nil && !f.hasErr {
		f.firstErr, f.hasErr = classifier.Classify(outcome.PhaseActive, err, facts), true
		f.firstCause = err
	}
	switch {
	case q.set.rollsBack() || !inTx:
		v := classifier.Classify(outcome.PhaseActive, err, facts)
		if f.hasErr {
			// The rollback is the consequence; the first failure is the cause.
			v = f.firstErr
		}
		f.conclude(st, v)
	case err == nil && q.set.savepoint() && f.recording:
		name, depth := f.savepointMoved(q.set, q.savepoint)
		if depth == 0 { // a savepoint made before the frame was found
			f.event(name, savepointNameKey.String(q.savepoint))
			break
		}
		f.event(name, savepointNameKey.String(q.savepoint), savepointDepthKey.Int(depth))
	}
}

// releasesRestart reports whether sql, of kinds set, is RELEASE SAVEPOINT
// cockroach_restart: CockroachDB commits the transaction there (the client retry protocol
// of its documentation and of cockroach-go), and the COMMIT after it only ends the block.
func releasesRestart(set stmtSet, sql string) bool {
	return set.has(stmtRelease) && strings.EqualFold(savepointName(sql), "cockroach_restart")
}

// concludeUnsent concludes f, whose COMMIT never left (commitUnsent), as facts and that
// COMMIT's failure judge it, and tells the Verdict of that COMMIT's call.
func (f *frame) concludeUnsent(st *connState, facts classifier.Facts) {
	f.commitUnsent = false
	facts.Server = st.server
	f.conclude(st, classifier.Classify(outcome.PhaseCommitting, f.endErr, facts))
	if v := f.unsentAsked; v != nil && v != f.asked {
		v.frameEnded(f)
	}
}

// abandon concludes a frame whose transaction ended where no query showed it: the
// connection was released mid-transaction, closed, or found idle. Evidence of commit it
// cannot have; if COMMIT was sent, the outcome is unknown.
func (t *Tracer) abandon(st *connState, f *frame, reason string) {
	if !f.open() {
		return
	}
	if f.commitUnsent {
		// Its COMMIT never left. If the session ends with the transaction open (closed, or
		// released to the pool, which destroys it), the server rolls it back (the
		// classifier's commit_not_sent rule); if the transaction ended unseen (a COMMIT past
		// the tracer, on the PgConn), nothing is known.
		closed := reason == reasonConnectionClosed || reason == reasonReleasedInTransaction
		f.concludeUnsent(st, classifier.Facts{ConnClosed: closed, CommitNotSent: closed})
		return
	}
	if f.currentPhase() == outcome.PhaseCommitting {
		v, _ := classifier.NewClassification(classifier.EvidenceUnknown, false, "", reason)
		f.conclude(st, v)
		return
	}
	v, _ := classifier.NewClassification(classifier.EvidenceRolledBack, false, "", reason)
	f.hasErr = true
	f.conclude(st, v)
}
