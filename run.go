package otelpgxtx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Run runs fn in a transaction according to policy and returns how it ended, as one of
// the five variants of [outcome.Result]. fn commits by returning a nil error and rolls
// back by returning an error; it must not call Commit or Rollback on tx.
//
//   - A retryable rollback (serialization failure, deadlock, connection lost before
//     COMMIT was sent) is retried up to policy.MaxAttempts, with jittered exponential
//     backoff. An Indeterminate outcome is never retried: replaying it could apply the
//     work twice.
//   - A call that joins an outer transaction returns Participating, never Committed.
//   - A function that prepares the transaction (PREPARE TRANSACTION, two-phase commit)
//     hands it to its coordinator: Run returns Participating (Indeterminate, with fn's
//     error, if fn then failed, or if PREPARE's reply was lost), runs no AfterCommit
//     hook, and never runs fn again. Run's own COMMIT or ROLLBACK after it changes
//     nothing (the server warns that no transaction is in progress).
//   - fn runs in a transaction block, so a procedure it CALLs cannot COMMIT or ROLLBACK
//     inside (PostgreSQL answers 2D000, invalid transaction termination, and the whole
//     transaction rolls back): Run's transaction is one transaction, whatever fn calls.
//     Call such a procedure outside Run (pool.Exec, inside [Retry]), where the library
//     tells a failure after an inner COMMIT from a rollback.
//   - A panic in fn rolls back, ends the frame as rolled_back, and panics again.
//   - Once Run has returned, tx and every handle derived from it (savepoints,
//     LargeObjects) fail with an error wrapping pgx.ErrTxClosed and send nothing.
//   - Bad input (a nil context, db or fn, an invalid policy, RequiresNew on the outer
//     transaction's own connection) returns a DeterminateRollback in phase not_started
//     whose cause wraps [ErrInvalidArgument]; nothing was begun.
func Run[T any](ctx context.Context, db DB, policy Policy, fn func(ctx context.Context, tx pgx.Tx) (T, error)) outcome.Result[T] {
	if err := checkRun(ctx, db, fn != nil, policy); err != nil {
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
		return join(ctx, policy.Propagation.String(), sc, fn)
	case Required:
		if sc != nil {
			return join(ctx, policy.Propagation.String(), sc, fn)
		}
	case Nested:
		if sc != nil {
			return nested(ctx, policy.Propagation.String(), sc, fn)
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

// checkRun refuses Run's bad input before anything is begun.
func checkRun(ctx context.Context, db DB, hasFn bool, p Policy) error {
	switch {
	case ctx == nil:
		return invalid("Run: nil context")
	case db == nil:
		return invalid("Run: nil db")
	case pg.IsNilHandle(db):
		return invalid("Run: nil %T", db)
	case !hasFn:
		return invalid("Run: nil function")
	}
	return p.validate()
}

// checkSecondConnection refuses a RequiresNew that could only wait for itself: on the
// outer transaction's own connection, or on a pool whose every connection is held by a
// suspended transaction of this call chain (transactions on other pools hold none of it).
func checkSecondConnection(ctx context.Context, db txBeginner, sc *scope) error {
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

// join runs fn as a participant of sc. Its failure dooms the owner's transaction, so
// the rollback it reports is certain; it is never retried on its own.
func join[T any](ctx context.Context, propagation string, sc *scope, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	v, err := fn(ctx, sc.tx)
	if err != nil {
		sc.markRollbackOnly(err)
		r := determinateRollback[T](sc.id, outcome.PhaseActive, err, false)
		sc.participated(propagation, r.Outcome())
		return r
	}
	sc.participated(propagation, outcome.OutcomeParticipating)
	return outcome.NewParticipating(sc.id, v)
}

// nested runs fn inside a savepoint of sc's transaction. A failure rolls back to the
// savepoint and discards the hooks fn registered; success releases it and hands them to
// the parent. Either way nothing is committed yet: success is Participating.
func nested[T any](ctx context.Context, propagation string, sc *scope, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	res := nestedSavepoint(ctx, sc, fn)
	sc.participated(propagation, res.Outcome())
	return res
}

// nestedSavepoint is nested without its participant event: the savepoint, fn in a child
// scope, and the savepoint's release or rollback.
func nestedSavepoint[T any](ctx context.Context, sc *scope, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	sp, err := sc.tx.tx.Begin(ctx)
	if err != nil {
		if !txIntact(sc.tx.tx) {
			// The SAVEPOINT failed in the server or lost the connection: the outer
			// transaction cannot commit. A context that had already expired sent nothing.
			sc.markRollbackOnly(err)
		}
		return determinateRollback[T](sc.id, outcome.PhaseActive, err, false)
	}
	child := &scope{tx: &runTx{tx: sp}, frame: sc.frame, t: sc.t, id: sc.id, parent: sc}
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
		return determinateRollback[T](sc.id, outcome.PhaseActive, err, false)
	}
	if err := sp.Commit(octx); err != nil {
		sc.markRollbackOnly(err)
		return determinateRollback[T](sc.id, outcome.PhaseActive, err, false)
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
	ap := attemptPolicy{opts: p.txOptions(), refs: p.references(), propagation: p.Propagation.String(), maxAttempts: p.MaxAttempts}
	for n := 1; ; n++ {
		res, retry := runAttempt(ctx, db, ap, fn, n)
		if !retry || !waitBackoff(ctx, p, n) {
			return res
		}
	}
}
