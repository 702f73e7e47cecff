package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// DB is what [Run] begins transactions on: *pgxpool.Pool and *pgx.Conn are. With a
// pool, Run acquires a connection itself, so that it can commit with reference capture;
// any other DB is used through BeginTx and Tx.Commit, without capture.
type DB interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// Run runs fn in a transaction according to policy and returns how it ended, as one of
// the five variants of [outcome.Result]. fn commits by returning a nil error and rolls
// back by returning an error; it must not call Commit or Rollback on tx.
//
//   - A retryable rollback (serialization failure, deadlock, connection lost before
//     COMMIT was sent) is retried up to policy.MaxAttempts, with jittered exponential
//     backoff. An Indeterminate outcome is never retried: replaying it could apply the
//     work twice.
//   - A call that joins an outer transaction returns Participating, never Committed.
//   - A panic in fn rolls back, ends the frame as rolled_back, and panics again.
//   - Once Run has returned, tx and every handle derived from it (savepoints,
//     LargeObjects) fail with an error wrapping pgx.ErrTxClosed and send nothing.
//   - Bad input (nil db or fn, an invalid policy, RequiresNew on the outer
//     transaction's own connection) returns a DeterminateRollback in phase not_started
//     whose cause wraps [ErrInvalidArgument]; nothing was begun.
func Run[T any](ctx context.Context, db DB, policy Policy, fn func(ctx context.Context, tx pgx.Tx) (T, error)) outcome.Result[T] {
	if err := checkRun(db, fn != nil, policy); err != nil {
		return notStarted[T](err)
	}
	sc := scopeFromContext(ctx)
	if sc != nil && !sc.open() {
		sc = nil
	}
	switch policy.Propagation {
	case Mandatory:
		if sc == nil {
			return notStarted[T](invalid("Mandatory propagation needs a transaction of Run in the context"))
		}
		return join(ctx, policy, sc, fn)
	case Required:
		if sc != nil {
			return join(ctx, policy, sc, fn)
		}
	case Nested:
		if sc != nil {
			return nested(ctx, policy, sc, fn)
		}
	case RequiresNew:
		if sc != nil {
			if err := checkSecondConnection(ctx, db, sc); err != nil {
				return notStarted[T](err)
			}
		}
	}
	return runOwner(ctx, db, policy, fn)
}

func checkRun(db DB, hasFn bool, p Policy) error {
	switch {
	case db == nil:
		return invalid("Run: nil db")
	case isNilHandle(db):
		return invalid("Run: nil %T", db)
	case !hasFn:
		return invalid("Run: nil function")
	}
	return p.validate()
}

// isNilHandle reports a typed nil pool or connection, which would panic on first use.
func isNilHandle(v any) bool {
	switch v := v.(type) {
	case *pgxpool.Pool:
		return v == nil
	case *pgx.Conn:
		return v == nil
	}
	return false
}

// checkSecondConnection refuses a RequiresNew that could only wait for itself: on the
// outer transaction's own connection, or on a pool whose every connection is held by a
// suspended transaction of this call chain (transactions on other pools hold none of it).
func checkSecondConnection(ctx context.Context, db DB, sc *scope) error {
	switch db := db.(type) {
	case *pgx.Conn:
		if db == sc.owner().tx.Conn() {
			return invalid("RequiresNew needs a second connection, and db is the outer transaction's *pgx.Conn")
		}
	case *pgxpool.Pool:
		held := 0
		for s := sc; s != nil; s = s.owner().suspended { // each suspended owner holds one
			if s.owner().pool == db {
				held++
			}
		}
		if max := db.Config().MaxConns; int(max) <= held {
			return invalid("RequiresNew needs a second connection, and the pool's %d connection(s) are held by the suspended transactions of this call", max)
		}
	}
	return nil
}

// notStarted is the result of a call that began nothing: err is never nil here, and
// not_started is a rollback phase, so the constructor cannot refuse it.
func notStarted[T any](err error) outcome.Result[T] {
	r, _ := outcome.NewDeterminateRollback[T](outcome.OperationID{}, outcome.PhaseNotStarted, err, false)
	return r
}

// join runs fn as a participant of sc. Its failure dooms the owner's transaction, so
// the rollback it reports is certain; it is never retried on its own.
func join[T any](ctx context.Context, p Policy, sc *scope, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	v, err := fn(ctx, sc.tx)
	if err != nil {
		sc.markRollbackOnly(err)
		r, _ := outcome.NewDeterminateRollback[T](sc.id, outcome.PhaseActive, err, false)
		sc.participated(p, r.Outcome())
		return r
	}
	sc.participated(p, outcome.OutcomeParticipating)
	return outcome.NewParticipating(sc.id, v)
}

// nested runs fn inside a savepoint of sc's transaction. A failure rolls back to the
// savepoint and discards the hooks fn registered; success releases it and hands them to
// the parent. Either way nothing is committed yet: success is Participating.
func nested[T any](ctx context.Context, p Policy, sc *scope, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	res := nestedSavepoint(ctx, sc, fn)
	sc.participated(p, res.Outcome())
	return res
}

func nestedSavepoint[T any](ctx context.Context, sc *scope, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	sp, err := sc.tx.tx.Begin(ctx)
	if err != nil {
		if !txIntact(sc.tx.tx) {
			// The SAVEPOINT failed in the server or lost the connection: the outer
			// transaction cannot commit. A context that had already expired sent nothing.
			sc.markRollbackOnly(err)
		}
		r, _ := outcome.NewDeterminateRollback[T](sc.id, outcome.PhaseActive, err, false)
		return r
	}
	child := &scope{tx: &runTx{tx: sp}, frame: sc.frame, id: sc.id, parent: sc}
	var v T
	func() {
		defer func() {
			if p := recover(); p != nil {
				_ = sp.Rollback(context.WithoutCancel(ctx))
				child.takeHooks()
				child.tx.end()
				panic(p)
			}
		}()
		v, err = fn(context.WithValue(ctx, scopeKey{}, child), child.tx)
	}()
	hooks := child.takeHooks()
	child.tx.end()
	if err == nil && ctx.Err() != nil {
		// The call's deadline passed (or it was cancelled) while fn ran: its work is not
		// what the caller asked for in time, so it is undone, as a failed call's is.
		err = context.Cause(ctx)
	}
	// The savepoint belongs to the outer transaction, which outlives this call's context:
	// ending it with an expired context would send nothing, leave the savepoint open and
	// doom the outer transaction for a deadline that was only the inner call's.
	octx := context.WithoutCancel(ctx)
	if err != nil {
		if rbErr := sp.Rollback(octx); rbErr != nil {
			sc.markRollbackOnly(rbErr)
		}
		r, _ := outcome.NewDeterminateRollback[T](sc.id, outcome.PhaseActive, err, false)
		return r
	}
	if err := sp.Commit(octx); err != nil {
		sc.markRollbackOnly(err)
		r, _ := outcome.NewDeterminateRollback[T](sc.id, outcome.PhaseActive, err, false)
		return r
	}
	sc.mu.Lock()
	sc.hooks = append(sc.hooks, hooks...)
	sc.mu.Unlock()
	return outcome.NewParticipating(sc.id, v)
}

// txIntact reports whether tx's connection is open and in a transaction that can still
// commit.
func txIntact(tx pgx.Tx) bool {
	conn := tx.Conn()
	return conn != nil && !conn.IsClosed() && conn.PgConn().TxStatus() == 'T'
}

// runOwner begins, runs and ends the physical transaction, retrying a retryable rollback.
func runOwner[T any](ctx context.Context, db DB, p Policy, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	for attempt := 1; ; attempt++ {
		res, f := runAttempt(ctx, db, p, fn, attempt)
		rb, retry := res.(outcome.DeterminateRollback[T])
		if !retry || !rb.Retryable() || attempt >= p.MaxAttempts || ctx.Err() != nil {
			if f != nil {
				f.endSpan(res.Outcome(), postCommitFailure(res))
			}
			return res
		}
		wait := backoff(p, attempt)
		if f != nil {
			if f.span.IsRecording() {
				f.span.AddEvent(EventRetry, trace.WithAttributes(AttemptKey.Int(attempt+1),
					errorTypeKey.String(f.verdict.Reason())))
			}
			f.endSpan(res.Outcome(), nil)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return res
		case <-timer.C:
		}
	}
}

func postCommitFailure[T any](res outcome.Result[T]) error {
	if r, ok := res.(outcome.CommittedWithPostCommitFailure[T]); ok {
		return r.Failure()
	}
	return nil
}

// backoff draws the wait before attempt+1 uniformly from [0, min(max, base·2^(attempt-1))].
func backoff(p Policy, attempt int) time.Duration {
	d := p.BackoffBase << min(attempt-1, 30)
	if d <= 0 || (p.BackoffMax > 0 && d > p.BackoffMax) {
		d = p.BackoffMax
	}
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// heldConn is the connection Run holds for one attempt, and how to give it back.
type heldConn struct {
	conn    *pgx.Conn
	release func()
}

func acquire(ctx context.Context, db DB) (heldConn, error) {
	switch db := db.(type) {
	case *pgxpool.Pool:
		pc, err := db.Acquire(ctx)
		if err != nil {
			return heldConn{}, err
		}
		return heldConn{conn: pc.Conn(), release: pc.Release}, nil
	case *pgx.Conn:
		return heldConn{conn: db, release: func() {}}, nil
	}
	return heldConn{}, nil // any other DB: BeginTx, then Tx.Commit
}

// runAttempt is one attempt. It returns the result and the frame, which the caller
// ends (the frame is managed: its span outlives the commit, for post-commit work).
func runAttempt[T any](ctx context.Context, db DB, p Policy, fn func(context.Context, pgx.Tx) (T, error), attempt int) (outcome.Result[T], *frame) {
	opts := p.txOptions()
	held, err := acquire(ctx, db)
	if err != nil {
		v := classifier.Classify(outcome.PhaseNotStarted, err, classifier.Facts{})
		r, _ := outcome.NewDeterminateRollback[T](outcome.OperationID{}, outcome.PhaseNotStarted, err, v.Retryable())
		return r, nil
	}
	var tx pgx.Tx
	if held.conn != nil && p.CaptureReference {
		// Before BEGIN, so that the library's own query never runs inside the transaction;
		// a connection it broke is handled like a failed BEGIN, and the pool discards it.
		err = prepareCapture(ctx, held.conn)
	}
	if err == nil && held.conn != nil {
		tx, err = held.conn.BeginTx(ctx, opts)
	} else if err == nil {
		tx, err = db.BeginTx(ctx, opts)
	}
	if err != nil {
		closed := held.conn != nil && held.conn.IsClosed()
		if held.release != nil {
			held.release()
		}
		v := classifier.Classify(outcome.PhaseNotStarted, err, classifier.Facts{ConnClosed: closed})
		r, _ := outcome.NewDeterminateRollback[T](outcome.OperationID{}, outcome.PhaseNotStarted, err, v.Retryable())
		return r, nil
	}
	a := &runAlloc{}
	a.tx.tx = tx
	a.sc = scope{tx: &a.tx, frame: frameOfTx(tx), suspended: scopeFromContext(ctx)}
	sc := &a.sc
	sc.pool, _ = db.(*pgxpool.Pool)
	f := sc.frame
	if f != nil {
		f.managed, f.propagation, f.attempt = true, p.Propagation.String(), attempt
		sc.id = f.id
	} else {
		sc.id = outcome.NewOperationID()
	}
	a.ctx = runContext{Context: ctx, sc: sc}
	var fctx context.Context = &a.ctx
	if f != nil {
		fctx = f.withSpan(fctx)
	}
	finish := func() {
		sc.tx.end()
		if held.release != nil {
			held.release()
		}
	}

	var value T
	func() {
		defer func() {
			if pv := recover(); pv != nil {
				cause := fmt.Errorf("otelpgxtx: panic in the transaction function: %v", pv)
				rollback(ctx, sc, tx, cause)
				sc.takeHooks()
				finish()
				if f != nil {
					f.endSpan(outcome.OutcomeRolledBack, nil)
				}
				panic(pv)
			}
		}()
		value, err = fn(fctx, sc.tx)
	}()
	if err == nil {
		err = sc.rollbackCause()
	}
	if err == nil && tx.Conn() != nil && tx.Conn().PgConn().IsBusy() {
		// pgconn would refuse COMMIT on a busy connection before sending a byte, so the
		// transaction is rolled back, for certain, instead of being left to look unknown.
		err = ErrUnreadResult
	}
	if err != nil {
		v := rollback(ctx, sc, tx, err)
		sc.takeHooks()
		finish()
		r, _ := outcome.NewDeterminateRollback[T](sc.id, outcome.PhaseActive, err, v.Retryable())
		return r, f
	}

	cr := commit(ctx, sc, tx, held, p, opts)
	hooks := sc.takeHooks()
	finish()
	v := cr.verdict
	switch v.Evidence() {
	case classifier.EvidenceCommitted:
		if perr := runHooks(ctx, f, hooks); perr != nil {
			r, _ := outcome.NewCommittedWithPostCommitFailure(sc.id, value, perr)
			return r, f
		}
		return outcome.NewCommitted(sc.id, value, v.CommittedLocally()), f
	case classifier.EvidenceUnknown:
		cause := cr.err
		if cause == nil {
			cause = errCommitUnobserved
		}
		// Committing, a cause and a fresh id: the constructor has nothing to refuse.
		r, _ := outcome.NewIndeterminate[T](sc.id, cause, cr.ref, v.CommittedLocally())
		if f != nil {
			r = r.WithTraceParent(traceParent(f.span.SpanContext()))
		}
		return r, f
	}
	cause := cr.err
	if cause == nil {
		cause = pgx.ErrTxCommitRollback
	}
	r, _ := outcome.NewDeterminateRollback[T](sc.id, outcome.PhaseCommitting, cause, v.Retryable())
	return r, f
}

// errCommitUnobserved is the cause of an unknown commit whose end no statement showed
// (the frame was abandoned while committing).
var errCommitUnobserved = errors.New("otelpgxtx: the COMMIT's reply was never observed")

// rollback ends the transaction after fn failed with cause, and returns the verdict:
// the cause decides whether a retry can help.
func rollback(ctx context.Context, sc *scope, tx pgx.Tx, cause error) classifier.Verdict {
	conn := tx.Conn()
	closed := conn != nil && conn.IsClosed()
	v := classifier.Classify(outcome.PhaseActive, cause, classifier.Facts{ConnClosed: closed})
	if f := sc.frame; f != nil {
		f.cause = cause
		if !f.hasErr {
			f.firstErr, f.hasErr = v, true
		}
	}
	// The caller's context may be what failed; the rollback must still be sent. Its error
	// changes nothing: a failed rollback closes the connection, which rolls back too.
	_ = tx.Rollback(context.WithoutCancel(ctx))
	if f := sc.frame; f != nil {
		if st := stateOf(f.conn); st != nil {
			st.mu.Lock()
			defer st.mu.Unlock()
		}
		if f.open() {
			// The rollback never reached the tracer (the connection was gone).
			f.conclude(stateOf(f.conn), f.firstErr)
		}
		return f.verdict
	}
	return v
}

type commitOutcome struct {
	verdict classifier.Verdict
	err     error
	ref     *outcome.ReconciliationRef
}

// commit ends the transaction with COMMIT — with reference capture when Run holds the
// connection — and returns the verdict: the frame's, which has seen the server's
// notices, or else the classifier's on the error alone.
func commit(ctx context.Context, sc *scope, tx pgx.Tx, held heldConn, p Policy, opts pgx.TxOptions) commitOutcome {
	f := sc.frame
	var st *connState
	if held.conn != nil {
		st = connStateOf(held.conn)
	}
	if !p.CaptureReference || !st.identityKnown() {
		err := tx.Commit(ctx)
		if f != nil && !f.open() {
			return commitOutcome{verdict: f.verdict, err: err}
		}
		return commitOutcome{verdict: classifier.Classify(outcome.PhaseCommitting, err,
			classifier.Facts{RollbackTag: errors.Is(err, pgx.ErrTxCommitRollback)}), err: err}
	}
	pg := held.conn.PgConn()
	st.mu.Lock()
	st.committing = true // no hook marks this COMMIT in flight
	if f != nil {
		f.transition(outcome.PhaseCommitting) // before COMMIT reaches the driver
		st.armCommit(f)
	}
	st.mu.Unlock()
	var marker string
	if p.CommitMarker != nil && p.AccessMode != pgx.ReadOnly { // a read-only one writes nothing to mark
		marker, _ = outcome.QuoteMarkerTable(p.CommitMarker...) // validated with the policy
	}
	commitSQL := commitSQLOf(opts)
	// The COMMIT statement span the inner tracer makes when pgx sends COMMIT, so that
	// traces look the same with capture on and off; the capture itself makes none.
	var qctx context.Context
	if f != nil {
		qctx = f.t.innerQueryStart(innerStartCtx(ctx, f), held.conn, pgx.TraceQueryStartData{SQL: commitSQL})
	}
	cr := commitWithCapture(ctx, pg, st, commitSQL, marker, sc.id)
	if f != nil {
		f.t.innerQueryEnd(innerEndCtx(qctx, f), held.conn, pgx.TraceQueryEndData{CommandTag: cr.tag, Err: cr.err})
	}
	if cr.err != nil && !pg.IsClosed() && pg.TxStatus() != 'I' {
		// pgx closes a connection whose failed COMMIT left it in a transaction; so do we.
		_ = held.conn.Close(context.WithoutCancel(ctx))
	}
	closePgxTx(tx, st)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.committing = false
	facts := classifier.Facts{RollbackTag: cr.rollbackTag, ConnClosed: pg.IsClosed()}
	if f != nil {
		f.ref = cr.ref
		facts.CommittedLocally = f.committedLocally
		st.commitFacts(f, &facts)
	}
	facts.SessionEndedBeforeCommit = facts.SessionEndedBeforeCommit || cr.endedBeforeCommit
	v := classifier.Classify(outcome.PhaseCommitting, cr.err, facts)
	if f != nil {
		f.conclude(st, v)
	}
	return commitOutcome{verdict: v, err: cr.err, ref: cr.ref}
}

// runHooks runs the post-commit hooks in a tx.post_commit span under the frame. A
// failure (or a panic) in one does not stop the others and never undoes the commit.
func runHooks(ctx context.Context, f *frame, hooks []func(context.Context) error) error {
	if len(hooks) == 0 {
		return nil
	}
	tracer := otel.GetTracerProvider().Tracer(ScopeName)
	if f != nil {
		tracer = f.t.tracer
		ctx = f.withSpan(ctx)
	}
	ctx, span := tracer.Start(ctx, SpanNamePostCommit)
	defer span.End()
	if f != nil && span.IsRecording() {
		span.SetAttributes(OperationIDKey.String(f.id.String()))
	}
	var errs []error
	for _, h := range hooks {
		if err := runHook(ctx, h); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	if len(errs) == 1 {
		err = errs[0] // keep its type for exception.type
	}
	if err != nil {
		// A hook's error is the application's own and may quote its data.
		span.RecordError(recordedError(err, f != nil && f.t.cfg.errorMessages))
		span.SetStatus(codes.Error, "post-commit work failed")
		return err
	}
	return nil
}

func runHook(ctx context.Context, h func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("otelpgxtx: panic in a post-commit hook: %v", p)
		}
	}()
	return h(ctx)
}
