package otelpgxtx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx/internal/executor"
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
		return executor.NotStarted[T](err)
	}
	sc := executor.ScopeFromContext(ctx)
	if sc != nil && !sc.Open() {
		sc = nil
	}
	switch policy.Propagation {
	case Mandatory:
		if sc == nil {
			return executor.NotStarted[T](invalid("Mandatory propagation needs a transaction of Run in the context"))
		}
		return executor.Join(ctx, policy.Propagation.String(), sc, fn)
	case Required:
		if sc != nil {
			return executor.Join(ctx, policy.Propagation.String(), sc, fn)
		}
	case Nested:
		if sc != nil {
			return executor.Nested(ctx, policy.Propagation.String(), sc, fn)
		}
	case RequiresNew:
		if sc != nil {
			if err := checkSecondConnection(ctx, db, sc); err != nil {
				return executor.NotStarted[T](err)
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
func checkSecondConnection(ctx context.Context, db executor.TxBeginner, sc *executor.Scope) error {
	switch db := db.(type) {
	case *pgx.Conn:
		if db == sc.Owner().Tx.Conn() {
			return invalid("RequiresNew needs a second connection, and db is the outer transaction's *pgx.Conn")
		}
	case *pgxpool.Pool:
		held := 0
		for s := sc; s != nil; s = s.Owner().Suspended { // each suspended owner holds one
			if s.Owner().Pool == db {
				held++
			}
		}
		if max := db.Config().MaxConns; int(max) <= held {
			return invalid("RequiresNew needs a second connection, and the pool's %d connection(s) are held by the suspended transactions of this call", max)
		}
	}
	return nil
}

// runOwner begins, runs and ends the physical transaction, retrying a retryable rollback.
func runOwner[T any](ctx context.Context, db DB, p Policy, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	ap := executor.AttemptPolicy{Opts: p.txOptions(), Refs: p.references(), Propagation: p.Propagation.String(), MaxAttempts: p.MaxAttempts}
	for n := 1; ; n++ {
		res, retry := executor.RunAttempt(ctx, db, ap, fn, n)
		if !retry || !waitBackoff(ctx, p, n) {
			return res
		}
	}
}
