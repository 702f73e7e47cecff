package otelpgxtx

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/reference"
)

// A query, in this file, is one traced call of the driver: a query, batch, copy or
// prepare, with its Start and End hook; its SQL text holds one statement or several.
// This file turns each into the events of the connection's evidence (package evidence) —
// before the query reaches the driver, and after it completed — and records what the
// evidence decided: frames started and ended, phase events, savepoint events.

// startQuery is the body of every Start hook: it records the start of a query whose
// statements are of kinds set, may make it an event in place of a span (fold, op: see
// Tracer.fold), lets the inner tracer start its span (inner, told whether the query is
// folded), and pushes what its End needs. With no state on the connection, only inner
// runs.
func (t *core) startQuery(ctx context.Context, conn *pgx.Conn, set evidence.Set, sql string, fold foldKind, op string, inner func(context.Context, bool) context.Context) context.Context {
	st := t.connStateOf(conn)
	if st == nil {
		return inner(ctx, false) // no frame to parent to, but the statement span stays
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	ctx, q := t.enter(ctx, conn, st, set, sql)
	before := t.fold(ctx, &q, fold, op)
	ctx = inner(before, q.folded)
	if f := q.frame; f != nil && f.onStatement && !q.nested {
		f.attach(before, ctx) // the statement's span is the frame's
	}
	q.ctx = ctx
	st.push(q)
	return ctx
}

// endQuery is the body of every End hook: it pops what startQuery pushed, lets the inner
// tracer end its span (inner, told whether the query is folded), and judges the query. An
// End without its Start has nothing to judge.
func (t *core) endQuery(ctx context.Context, conn *pgx.Conn, tag pgconn.CommandTag, err error, inner func(context.Context, bool)) {
	st := madeStateOf(conn)
	var q queryState
	started := false
	if st != nil {
		st.mu.Lock()
		defer st.mu.Unlock()
		q, started = st.pop(ctx)
		if n := len(st.queries); started && q.nested && err != nil && n > 0 {
			st.queries[n-1].prepareFailed = true // the query it is part of never ran
		}
	}
	if started && !q.nested && q.frame != nil && q.frame.onStatement {
		// The frame's span is the statement's (an implicit transaction's): the frame
		// ends first, writing its outcome there, and the inner tracer ends the span.
		t.afterQuery(ctx, conn, st, &q, tag, err)
		inner(t.statementFrameEndCtx(ctx, q.frame, err), false)
		return
	}
	// A folded query's event: a prepare's now, a statement's with the frame's next event.
	answering := q.folded && !q.nested && q.frame.ev.Open()
	var answer statementAnswer
	if answering {
		answer = answerOf(q.op, q.start, err)
	} else if q.folded && q.nested {
		prepareEvent(ctx, &q, err)
	}
	inner(t.innerEndStatus(innerEndCtx(ctx, q.frame), err), q.folded)
	if started && !q.nested {
		if answering {
			q.frame.folds().answered(answer)
		}
		t.afterQuery(ctx, conn, st, &q, tag, err)
		if answering {
			q.frame.unanswered(q.savepoint)
		}
	}
}

// enter records the start of a query on conn and returns the context for the inner
// tracer. A call made while another is in flight on the same connection — pgx's implicit
// prepare inside a query — is part of that one: it neither moves the phase nor re-parents
// what the inner tracer starts to the frame.
func (t *core) enter(ctx context.Context, conn *pgx.Conn, st *connState, set evidence.Set, sql string) (context.Context, queryState) {
	if len(st.queries) > 0 {
		return ctx, queryState{set: set, frame: st.queries[len(st.queries)-1].frame, nested: true}
	}
	f := t.beforeQuery(ctx, conn, st, set, sql)
	q := queryState{set: set, frame: f, callerCtx: ctx}
	if set.MovesSavepoint() {
		q.savepoint = evidence.SavepointName(sql)
	}
	return innerStartCtx(ctx, f), q
}

// beforeQuery runs before a query reaches the driver: the evidence may end the open frame
// or ask for one (a BEGIN; COMMIT PREPARED or ROLLBACK PREPARED sent idle), and is fed
// the statement as it is handed over — a write recorded, a COMMIT committing — with what
// the library's addition to the write needs done first (the reference's read settled,
// COMMIT's position marked) and after (the read or the call armed). It returns the frame
// the query runs in, or nil.
func (t *core) beforeQuery(ctx context.Context, conn *pgx.Conn, st *connState, set evidence.Set, sql string) *frame {
	pg := conn.PgConn()
	idle := pg.TxStatus() == 'I'
	// A busy connection (a result the application has not read) refuses the statement
	// before sending a byte: COMMIT never leaves, so the phase stays. PREPARE TRANSACTION
	// is committing too: its reply decides whether the transaction is durable; so are
	// COMMIT PREPARED and ROLLBACK PREPARED, sent idle, in the frame they begin.
	commits := (set.Decides() || idle && set.EndsPrepared() || st.server() == classifier.ServerCockroachDB && releasesRestart(set, sql)) && !pg.IsBusy()
	s := evidence.Statement{Set: set, Idle: idle, Commits: commits, Implicit: idle && set.Implicit() && t.implicit(ctx, sql)}
	if f := st.frame(); f != nil && idle {
		st.refs.Unobserved(&f.commitRef) // its transaction ended unseen: Before ends it
		s.Seen = st.seenEnd()
	}
	ended, r, begins := st.ev.Before(s)
	if ended != nil {
		t.apply(st, ended, r, nil)
	}
	switch begins {
	case evidence.BeginsPrepared:
		f := t.startFrame(ctx, conn, st, evidence.Begun{}, sql, nil)
		t.referenceOff(st.refs.ArmPrepared(&f.commitRef, pg.ParameterStatus("server_version"), set.Single(), sql, evidence.GID(sql)))
	case evidence.BeginsBlock:
		f := t.startFrame(ctx, conn, st, evidence.Begun{}, sql, nil)
		t.armCheck(st, f, pg, set, sql)
	case evidence.BeginsImplicit:
		// Committing from the moment it leaves, as a COMMIT is: its write is marked, and
		// its reply watched from here (connState.repliedClean).
		f := t.startFrame(ctx, conn, st, evidence.Begun{Implicit: true, Wrote: true}, sql, nil)
		t.referenceOff(st.refs.ArmImplicit(&f.commitRef, refStatement(set, sql, pg), pg.ParameterStatus("server_version")))
		if st.nc != nil {
			st.nc.WatchEnds()
		}
		// A busy connection refuses it before a byte leaves: then it never commits, and
		// its end, not_started, is a rollback.
		commits = !pg.IsBusy()
		s.Commits = commits
	}
	f := st.frame()
	if f == nil {
		return nil
	}
	if commits {
		if c := st.refs.Settle(ctx, &f.commitRef); c.ReadFailed != nil {
			s.ReadFailed = &evidence.Failure{V: c.ReadFailedAs, Err: c.ReadFailed}
		}
		s.EndedBeforeCommit = st.markCommit()
	}
	t.apply(st, f, st.ev.Send(s), nil)
	if begins == evidence.BeginsImplicit {
		return f // what its reference needs is armed (ArmImplicit)
	}
	if set.Writes() {
		st.refs.ArmRead(ctx, &f.commitRef, refStatement(set, sql, pg))
	}
	if commits {
		st.refs.ArmCall(&f.commitRef, refStatement(set, sql, pg))
	}
	return f
}

// implicit reports whether the implicit transaction of sql, sent in ctx, is a frame
// (WithImplicitFilter).
func (t *core) implicit(ctx context.Context, sql string) bool {
	return t.cfg.implicitFilter == nil || t.cfg.implicitFilter(ctx, sql)
}

// afterQuery runs after a query made in ctx completed, when the connection's transaction
// status is known again: what the library's additions brought is collected, the failure
// judged for the span's status, and the evidence fed the query's end, whose decision
// apply carries out.
func (t *core) afterQuery(ctx context.Context, conn *pgx.Conn, st *connState, q *queryState, tag pgconn.CommandTag, err error) {
	pg := conn.PgConn()
	closed := pg.IsClosed()
	status := pg.TxStatus()
	inTx := !closed && (status == 'T' || status == 'E')
	f := q.frame
	open := f != nil && f.ev.Open() // the query's frame was going on: its end is judged
	var fr *reference.Frame
	if f != nil {
		fr = &f.commitRef
	}
	c := st.refs.Collect(fr, false) // what became of the library's addition, if any
	t.referenceOff(c.Off)
	if c.Checked {
		t.sawCheck(st)
	}
	if q.batch.err != nil && err == nil {
		err = q.batch.err
	}
	at := &queryEnd{ctx: ctx, callerCtx: q.callerCtx, conn: conn, set: q.set, err: err, inTx: inTx, open: open}
	notSent := st.commitNotSent(f)
	split, moreEnds := false, false
	if open {
		split, moreEnds = t.split(st, at)
	}
	if split {
		// The server ended the frame's transaction inside this query's reply: what the
		// query ran after that is the frame now open, which the query's end judges.
		f = st.frame()
		open = f != nil && f.ev.Open()
		at.open = open
		c = reference.Collected{} // what the addition brought was the ended frame's
	}
	if open {
		f.judgeErr(&t.cfg, ctx, err)
	}
	e := evidence.Ended{Set: q.set, Err: err, InTx: inTx, Closed: closed,
		RollbackTag: q.batch.rollbackTag || tag.String() == "ROLLBACK", CommitNotSent: notSent, Savepoint: q.savepoint,
		FatalBeforeCommit: c.FatalBeforeCommit, AbortedBeforeCommit: c.AbortedBefore,
		NothingRan: q.prepareFailed, MoreEnds: moreEnds,
		RepliedClean: open && f.ev.Implicit() && st.repliedClean()}
	if c.ReadFailed != nil {
		e.ReadFailed = &evidence.Failure{V: c.ReadFailedAs, Err: c.ReadFailed}
	}
	if open && f.ev.Implicit() && q.set.CommitsInside() && !q.prepareFailed && !closed && !inTx && serverError(err) {
		// Its failure proves no rollback unless it ran in one transaction: asked on this
		// failure path only, after everything above read the query's own reply.
		e.OneTransaction = st.refs.OneTransaction(ctx, &f.commitRef, pg)
	}
	r := st.ev.After(f, e)
	if st.nc != nil {
		st.nc.WatchEnds() // what ends the transaction now open, past the hooks, is watched from here
	}
	if !open {
		f = nil // nothing more of a frame that had ended is recorded
	}
	t.apply(st, f, r, at)
}

// split ends the frames whose transactions the server ended inside the reply of the
// query that ends (at), at each COMMIT, ROLLBACK or PREPARE TRANSACTION tag that more of
// the reply followed (wire.Splits), each with what its tag says, and starts the frame of
// what followed each (evidence.StartRest). It reports whether it ended any, and whether
// the reply held more than it could tell (wire.Splits.Over).
func (t *core) split(st *connState, at *queryEnd) (ended, more bool) {
	if st.nc == nil || at.set.Single() && !at.set.Decides() {
		return false, false // one statement that ends no transaction: nothing to split
	}
	splits := st.nc.Splits()
	for i := range splits.Len() {
		f := st.frame()
		if f == nil {
			break
		}
		// A reply cut off after its last ending tag: a string of one statement has no rest.
		rest := !(splits.Cut && i == splits.Len()-1 && at.set.Single())
		r := st.ev.Split(at.set, seenFromWire(splits.At(i)), rest)
		if !r.Ended {
			continue
		}
		ended = true
		t.apply(st, f, r, at)
	}
	return ended, splits.Over
}

// serverError reports whether err is the server's ERROR reply.
func serverError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && !pg.FatalError(err)
}

// releasesRestart reports whether sql, of kinds set, is RELEASE SAVEPOINT
// cockroach_restart: CockroachDB commits the transaction there (the client retry protocol
// of its documentation and of cockroach-go), and the COMMIT after it only ends the block.
func releasesRestart(set evidence.Set, sql string) bool {
	return set.Has(evidence.Release) && strings.EqualFold(evidence.SavepointName(sql), "cockroach_restart")
}

// abandon ends the frame open on st, whose transaction ended where no query showed it,
// for reason: the connection was released mid-transaction, closed, or found idle.
func (t *core) abandon(st *connState, reason string) {
	if f := st.frame(); f != nil {
		seen := evidence.SeenNothing
		if reason == evidence.ReasonEndedUnobserved {
			st.refs.Unobserved(&f.commitRef)
			seen = st.seenEnd()
		}
		t.apply(st, f, st.ev.Abandon(reason, seen), nil)
	}
}

// classifyBatch returns what the queued queries of b, sent on conn, do to the
// transaction, and the SQL of the query that begins the frame (the one with BEGIN, else
// the first).
func (t *core) classifyBatch(conn *pgx.Conn, b *pgx.Batch) (evidence.Set, string) {
	var set evidence.Set
	beginSQL := ""
	if b != nil {
		for i, qq := range b.QueuedQueries {
			sql, s := t.statementOf(conn, qq.SQL, t.sanitized.get(qq.SQL).set)
			if i == 0 || beginSQL == "" && s.Has(evidence.Begin) {
				beginSQL = sql
			}
			set |= s
		}
	}
	return evidence.Together(set), beginSQL
}

// prepareStarted records, on conn, that the statement name is being prepared with sql
// (see prepared_names.go).
func (t *core) prepareStarted(conn *pgx.Conn, name, sql string) {
	if !keepsName(name, sql) {
		return
	}
	if st := t.connStateOf(conn); st != nil {
		st.named.start(name, sql)
	}
}

// prepareEnded keeps, on conn, the statement being prepared, unless err says the server
// refused it.
func (t *core) prepareEnded(conn *pgx.Conn, err error) {
	if st := madeStateOf(conn); st != nil && st.named.end(err) {
		t.named.Store(true)
	}
}

// statementOf returns what a query of sql, whose kinds are set, runs on conn: the SQL and
// kinds of the statement prepared under the name sql, if there is one; else sql and set.
func (t *core) statementOf(conn *pgx.Conn, sql string, set evidence.Set) (string, evidence.Set) {
	if !t.named.Load() {
		return sql, set
	}
	if st := madeStateOf(conn); st != nil {
		if real, ok := st.named.of(sql); ok {
			return real, t.sanitized.get(real).set
		}
	}
	return sql, set
}
