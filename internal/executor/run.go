package executor

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/outcome"
)

// Join runs fn as a participant of sc. Its failure dooms the owner's transaction, so
// the rollback it reports is certain; it is never retried on its own.
func Join[T any](ctx context.Context, propagation string, sc *Scope, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	v, err := fn(ctx, sc.Tx)
	if err != nil {
		sc.markRollbackOnly(err)
		r := determinateRollback[T](sc.ID, outcome.PhaseActive, err, false)
		sc.participated(propagation, r.Outcome())
		return r
	}
	sc.participated(propagation, outcome.OutcomeParticipating)
	return outcome.NewParticipating(sc.ID, v)
}

// Nested runs fn inside a savepoint of sc's transaction. A failure rolls back to the
// savepoint and discards the hooks fn registered; success releases it and hands them to
// the parent. Either way nothing is committed yet: success is Participating.
func Nested[T any](ctx context.Context, propagation string, sc *Scope, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	res := nestedSavepoint(ctx, sc, fn)
	sc.participated(propagation, res.Outcome())
	return res
}

// nestedSavepoint is nested without its participant event: the savepoint, fn in a child
// scope, and the savepoint's release or rollback.
func nestedSavepoint[T any](ctx context.Context, sc *Scope, fn func(context.Context, pgx.Tx) (T, error)) outcome.Result[T] {
	sp, err := sc.Tx.tx.Begin(ctx)
	if err != nil {
		if !txIntact(sc.Tx.tx) {
			// The SAVEPOINT failed in the server or lost the connection: the outer
			// transaction cannot commit. A context that had already expired sent nothing.
			sc.markRollbackOnly(err)
		}
		return determinateRollback[T](sc.ID, outcome.PhaseActive, err, false)
	}
	child := &Scope{Tx: &runTx{tx: sp}, frame: sc.frame, t: sc.t, ID: sc.ID, parent: sc}
	var v T
	func() {
		defer func() {
			if p := recover(); p != nil {
				_ = sp.Rollback(context.WithoutCancel(ctx))
				child.takeHooks()
				child.Tx.end()
				panic(p)
			}
		}()
		v, err = fn(context.WithValue(ctx, scopeKey{}, child), child.Tx)
	}()
	hooks := child.takeHooks()
	child.Tx.end()
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
		return determinateRollback[T](sc.ID, outcome.PhaseActive, err, false)
	}
	if err := sp.Commit(octx); err != nil {
		sc.markRollbackOnly(err)
		return determinateRollback[T](sc.ID, outcome.PhaseActive, err, false)
	}
	sc.Mu.Lock()
	sc.Hooks = append(sc.Hooks, hooks...)
	sc.Mu.Unlock()
	return outcome.NewParticipating(sc.ID, v)
}

// txIntact reports whether tx's connection is open and in a transaction that can still
// commit.
func txIntact(tx pgx.Tx) bool {
	conn := tx.Conn()
	return conn != nil && !conn.IsClosed() && conn.PgConn().TxStatus() == 'T'
}
