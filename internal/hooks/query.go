package hooks

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/framespan"
	"github.com/txevidence/otelpgxtx/internal/inner"
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
// Adapter.fold), lets the inner tracer start its span (inner, told whether the query is
// folded), and pushes what its End needs. With no state on the connection, only inner
// runs.
func (t *Adapter) startQuery(ctx context.Context, conn *pgx.Conn, set evidence.Set, sql string, fold framespan.FoldKind, op string, innerHook func(context.Context, bool) context.Context) context.Context {
	st := t.State(frame.PgConn(conn))
	if st == nil {
		return innerHook(ctx, false) // no frame to parent to, but the statement span stays
	}
	st.Mu.Lock()
	defer st.Mu.Unlock()
	ctx, q := t.enter(ctx, conn, st, set, sql)
	before := t.fold(ctx, &q, fold, op)
	ctx = innerHook(before, q.Folded)
	if f := q.Frame; f != nil && f.OnStatement && !q.Nested {
		f.Attach(before, ctx) // the statement's span is the frame's
	}
	q.Ctx = ctx
	st.Push(q)
	return ctx
}

// endQuery is the body of every End hook: it pops what startQuery pushed, lets the inner
// tracer end its span (inner, told whether the query is folded), and judges the query. An
// End without its Start has nothing to judge.
func (t *Adapter) endQuery(ctx context.Context, conn *pgx.Conn, tag pgconn.CommandTag, err error, innerHook func(context.Context, bool)) {
	st := frame.Made(frame.PgConn(conn))
	var q frame.QueryState
	started := false
	if st != nil {
		st.Mu.Lock()
		defer st.Mu.Unlock()
		q, started = st.Pop(ctx)
		if n := len(st.Queries); started && q.Nested && err != nil && n > 0 {
			st.Queries[n-1].PrepareFailed = true // the query it is part of never ran
		}
	}
	if started && !q.Nested && q.Frame != nil && q.Frame.OnStatement {
		// The frame's span is the statement's (an implicit transaction's): the frame
		// ends first, writing its outcome there, and the inner tracer ends the span.
		t.afterQuery(ctx, conn, st, &q, tag, err)
		innerHook(t.Inner.StatementFrameEndCtx(ctx, &q.Frame.Ev, err), false)
		return
	}
	// A folded query's event: a prepare's now, a statement's with the frame's next event.
	answering := q.Folded && !q.Nested && q.Frame.Ev.Open()
	var answer framespan.StatementAnswer
	if answering {
		answer = framespan.AnswerOf(q.Op, q.Start, err)
	} else if q.Folded && q.Nested {
		framespan.PrepareEvent(ctx, q.Start, q.Op, err)
	}
	innerHook(t.Inner.EndStatus(inner.EndCtx(ctx, q.Frame.SpanOrNil()), err), q.Folded)
	if started && !q.Nested {
		if answering {
			q.Frame.Folds().Answered(answer)
		}
		t.afterQuery(ctx, conn, st, &q, tag, err)
		if answering {
			q.Frame.Unanswered(q.Savepoint)
		}
	}
}

// enter records the start of a query on conn and returns the context for the inner
// tracer. A call made while another is in flight on the same connection — pgx's implicit
// prepare inside a query — is part of that one: it neither moves the phase nor re-parents
// what the inner tracer starts to the frame.
func (t *Adapter) enter(ctx context.Context, conn *pgx.Conn, st *frame.Conn, set evidence.Set, sql string) (context.Context, frame.QueryState) {
	if len(st.Queries) > 0 {
		return ctx, frame.QueryState{Set: set, Frame: st.Queries[len(st.Queries)-1].Frame, Nested: true}
	}
	f := t.beforeQuery(ctx, conn, st, set, sql)
	q := frame.QueryState{Set: set, Frame: f, CallerCtx: ctx}
	if set.MovesSavepoint() {
		q.Savepoint = evidence.SavepointName(sql)
	}
	return inner.StartCtx(ctx, f.SpanOrNil()), q
}

// beforeQuery runs before a query reaches the driver: the evidence may end the open frame
// or ask for one (a BEGIN; COMMIT PREPARED or ROLLBACK PREPARED sent idle), and is fed
// the statement as it is handed over — a write recorded, a COMMIT committing — with what
// the library's addition to the write needs done first (the reference's read settled,
// COMMIT's position marked) and after (the read or the call armed). It returns the frame
// the query runs in, or nil.
func (t *Adapter) beforeQuery(ctx context.Context, conn *pgx.Conn, st *frame.Conn, set evidence.Set, sql string) *frame.Frame {
	pg := conn.PgConn()
	idle := pg.TxStatus() == 'I'
	// A busy connection (a result the application has not read) refuses the statement
	// before sending a byte: COMMIT never leaves, so the phase stays. PREPARE TRANSACTION
	// is committing too: its reply decides whether the transaction is durable; so are
	// COMMIT PREPARED and ROLLBACK PREPARED, sent idle, in the frame they begin.
	commits := (set.Decides() || idle && set.EndsPrepared() || st.Server() == classifier.ServerCockroachDB && releasesRestart(set, sql)) && !pg.IsBusy()
	s := evidence.Statement{Set: set, Idle: idle, Commits: commits, Implicit: idle && set.Implicit() && t.implicit(ctx, sql)}
	s.EndedPastHooks = st.NotePastHooks(pg) && pg.IsClosed()
	if f := st.Frame(); f != nil && (idle || s.EndedPastHooks) {
		st.Refs.Unobserved(f.CommitRef) // its transaction ended unseen: Before ends it
		s.Seen = st.SeenEnd()
	}
	ended, r := st.Ev.Before(s)
	begins := r.Start
	started := t.Apply(st, ended, r, &frame.Query{Ctx: ctx, CallerCtx: ctx, Conn: conn, Set: set, SQL: sql})
	switch begins {
	case evidence.StartPrepared:
		t.ReferenceOff(st.Refs.ArmPrepared(started.CommitRef, pg.ParameterStatus("server_version"), set.Single(), sql, evidence.GID(sql)))
	case evidence.StartBlock:
		t.ArmCheck(st, started, pg, set, sql)
	case evidence.StartImplicit:
		// Committing from the moment it leaves, as a COMMIT is: its write is marked, and
		// its reply watched from here (frame.Conn.RepliedClean).
		t.ReferenceOff(st.Refs.ArmImplicit(started.CommitRef, frame.RefStatement(set, sql, pg), pg.ParameterStatus("server_version")))
		if st.NetConn != nil {
			st.NetConn.WatchEnds()
		}
		// A busy connection refuses it before a byte leaves: then it never commits, and
		// its end, not_started, is a rollback.
		commits = !pg.IsBusy()
		s.Commits = commits
	}
	f := st.Frame()
	if f == nil {
		return nil
	}
	if commits {
		if c := st.Refs.Settle(ctx, f.CommitRef); c.ReadFailed != nil {
			s.ReadFailed = &evidence.Failure{V: c.ReadFailedAs, Err: c.ReadFailed}
		}
		s.EndedBeforeCommit = st.MarkCommit()
	}
	t.Apply(st, f, st.Ev.Send(s), nil)
	if begins == evidence.StartImplicit {
		f.HandedOver()
		return f // what its reference needs is armed (ArmImplicit)
	}
	if set.Writes() {
		st.Refs.ArmRead(ctx, f.CommitRef, frame.RefStatement(set, sql, pg))
	}
	if commits {
		st.Refs.ArmCall(f.CommitRef, frame.RefStatement(set, sql, pg))
	}
	return f
}

// implicit reports whether the implicit transaction of sql, sent in ctx, is a frame
// (WithImplicitFilter).
func (t *Adapter) implicit(ctx context.Context, sql string) bool {
	return t.Cfg.ImplicitFilter == nil || t.Cfg.ImplicitFilter(ctx, sql)
}

// afterQuery runs after a query made in ctx completed, when the connection's transaction
// status is known again: what the library's additions brought is collected, the failure
// judged for the span's status, and the evidence fed the query's end, whose decision
// apply carries out.
func (t *Adapter) afterQuery(ctx context.Context, conn *pgx.Conn, st *frame.Conn, q *frame.QueryState, tag pgconn.CommandTag, err error) {
	pg := conn.PgConn()
	closed := pg.IsClosed()
	status := pg.TxStatus()
	inTx := !closed && (status == 'T' || status == 'E')
	f := q.Frame
	open := f != nil && f.Ev.Open() // the query's frame was going on: its end is judged
	var fr *reference.Frame
	if f != nil {
		fr = f.CommitRef
	}
	c := st.Refs.Collect(fr, false) // what became of the library's addition, if any
	t.ReferenceOff(c.Off)
	if c.Checked {
		t.SawCheck(st)
	}
	if q.Batch.Err != nil && err == nil {
		err = q.Batch.Err
	}
	at := &frame.Query{Ctx: ctx, CallerCtx: q.CallerCtx, Conn: conn, Set: q.Set, Err: err, InTx: inTx, Open: open}
	notSent := st.CommitNotSent(f)
	split, moreEnds := false, false
	if open {
		split, moreEnds = t.split(st, at)
	}
	if split {
		// The server ended the frame's transaction inside this query's reply: what the
		// query ran after that is the frame now open, which the query's end judges.
		f = st.Frame()
		open = f != nil && f.Ev.Open()
		at.Open = open
		c = reference.Collected{} // what the addition brought was the ended frame's
	}
	if open {
		f.JudgeErr(&t.Cfg, ctx, err)
	}
	e := evidence.Ended{Set: q.Set, Err: err, InTx: inTx, Closed: closed,
		RollbackTag: q.Batch.RollbackTag || tag.String() == "ROLLBACK", CommitNotSent: notSent, Savepoint: q.Savepoint,
		FatalBeforeCommit: c.FatalBeforeCommit, AbortedBeforeCommit: c.AbortedBefore,
		NothingRan: q.PrepareFailed, MoreEnds: moreEnds,
		RepliedClean: open && f.Ev.Implicit() && st.RepliedClean()}
	if c.ReadFailed != nil {
		e.ReadFailed = &evidence.Failure{V: c.ReadFailedAs, Err: c.ReadFailed}
	}
	if open && f.Ev.Implicit() && q.Set.CommitsInside() && !q.PrepareFailed && !closed && !inTx && serverError(err) {
		// Its failure proves no rollback unless it ran in one transaction: asked on this
		// failure path only, after everything above read the query's own reply.
		e.OneTransaction = st.Refs.OneTransaction(ctx, f.CommitRef, pg)
	}
	r := st.Ev.After(f, e)
	if st.NetConn != nil {
		st.NetConn.WatchEnds() // what ends the transaction now open, past the hooks, is watched from here
	}
	if !open {
		f = nil // nothing more of a frame that had ended is recorded
	}
	t.Apply(st, f, r, at)
}

// split ends the frames whose transactions the server ended inside the reply of the
// query that ends (at), at each COMMIT, ROLLBACK or PREPARE TRANSACTION tag that more of
// the reply followed (wire.Splits), each with what its tag says, and starts the frame of
// what followed each (evidence.StartRest). It reports whether it ended any, and whether
// the reply held more than it could tell (wire.Splits.Over).
func (t *Adapter) split(st *frame.Conn, at *frame.Query) (ended, more bool) {
	if st.NetConn == nil || at.Set.Single() && !at.Set.Decides() {
		return false, false // one statement that ends no transaction: nothing to split
	}
	splits := st.NetConn.Splits()
	for i := range splits.Len() {
		f := st.Frame()
		if f == nil {
			break
		}
		// A reply cut off after its last ending tag: a string of one statement has no rest.
		rest := !(splits.Cut && i == splits.Len()-1 && at.Set.Single())
		r := st.Ev.Split(at.Set, frame.SeenFromWire(splits.At(i)), rest)
		if !r.Ended {
			continue
		}
		ended = true
		t.Apply(st, f, r, at)
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

// classifyBatch returns what the queued queries of b, sent on conn, do to the
// transaction, and the SQL of the query that begins the frame (the one with BEGIN, else
// the first).
func (t *Adapter) classifyBatch(conn *pgx.Conn, b *pgx.Batch) (evidence.Set, string) {
	var set evidence.Set
	beginSQL := ""
	if b != nil {
		for i, qq := range b.QueuedQueries {
			sql, s := t.statementOf(conn, qq.SQL, t.Sanitized.Get(qq.SQL).Set)
			if i == 0 || beginSQL == "" && s.Has(evidence.Begin) {
				beginSQL = sql
			}
			set |= s
		}
	}
	return evidence.Together(set), beginSQL
}

// prepareStarted records, on conn, that the statement name is being prepared with sql
// (see frame.NamedStatements).
func (t *Adapter) prepareStarted(conn *pgx.Conn, name, sql string) {
	if !frame.KeepsName(name, sql) {
		return
	}
	if st := t.State(frame.PgConn(conn)); st != nil {
		st.Named.Start(name, sql)
	}
}

// prepareEnded keeps, on conn, the statement being prepared, unless err says the server
// refused it.
func (t *Adapter) prepareEnded(conn *pgx.Conn, err error) {
	if st := frame.Made(frame.PgConn(conn)); st != nil && st.Named.End(err) {
		t.named.Store(true)
	}
}

// statementOf returns what a query of sql, whose kinds are set, runs on conn: the SQL and
// kinds of the statement prepared under the name sql, if there is one; else sql and set.
func (t *Adapter) statementOf(conn *pgx.Conn, sql string, set evidence.Set) (string, evidence.Set) {
	if !t.named.Load() {
		return sql, set
	}
	if st := frame.Made(frame.PgConn(conn)); st != nil {
		if real, ok := st.Named.Of(sql); ok {
			return real, t.Sanitized.Get(real).Set
		}
	}
	return sql, set
}
