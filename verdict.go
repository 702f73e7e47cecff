package otelpgxtx

import (
	"context"

	"github.com/txevidence/otelpgxtx/internal/verdict"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Verdict receives how the transaction that the caller ends ended, as the tracer
// concluded it, for code that uses pgx or database/sql directly rather than [Run]. Make
// one per transaction attempt with [NewVerdict], begin or end the transaction with the
// context it returns, and ask [Verdict.Result] once the call that ended it (Commit,
// Rollback, pgx.BeginFunc, a COMMIT sent by hand) has returned:
//
//	ctx, verdict := otelpgxtx.NewVerdict(ctx)
//	err := pgx.BeginFunc(ctx, pool, work) // or pool.Begin(ctx) … tx.Commit(ctx), or db.BeginTx(ctx, nil) … tx.Commit()
//	if err != nil {
//		res, verr := verdict.Result()
//		// DeterminateRollback with Retryable(): retry; Indeterminate: reconcile, never replay.
//	}
//
// It answers for one transaction, whether or not its frame was sampled or filtered:
//
//   - a transaction that never reached the server: an instrumented pool's Acquire, or an
//     instrumented pgx.Connect, failed with the context (the pool could not connect): a
//     DeterminateRollback in not_started, retryable as Run's is, unless something below
//     was recorded too;
//   - the frame begun (BEGIN) with its context, when that frame ends, by whatever call
//     or on whatever goroutine it ends (so database/sql's Commit, which takes no context,
//     answers through the context given to BeginTx);
//   - the frame ended by a call made with its context (Commit(ctx), Exec(ctx, "commit"));
//   - a savepoint released with its context (pgx's pseudo-nested Tx.Commit): Participating,
//     as [Run]'s Nested is: the work joined the transaction, which is not committed yet; a
//     savepoint rolled back to: a DeterminateRollback that is not retryable, its
//     transaction going on.
//
// The last of these to happen is the answer. A frame begun with the context and not yet
// ended, or no frame at all, is [ErrNoVerdict]. Since the context belongs to the caller,
// a pooled connection handed to another goroutine after Commit never writes to it: the
// answer is always about a transaction of the caller's. Do not share one Verdict between
// transactions that run at the same time.
//
// Asking costs three allocations per transaction (NewVerdict's two, Result's one), about
// 0.4 µs; the hooks allocate nothing for it, and until a process first calls NewVerdict they
// do not even look for one. It never changes what pgx or database/sql return. Its methods
// are safe for concurrent use.
type Verdict struct {
	s verdict.State
}

// NewVerdict returns a context carrying a new [Verdict], and the Verdict. Begin or end one
// transaction with the context (see Verdict). A nil ctx is a bad argument: the
// Verdict's Result then returns an error wrapping [ErrInvalidArgument], and the context
// returned is context.Background, so that nothing panics.
func NewVerdict(ctx context.Context) (context.Context, *Verdict) {
	v := &Verdict{}
	if ctx == nil {
		v.s.Err = invalid("NewVerdict: nil context")
		return context.Background(), v
	}
	verdict.Asked.Store(true)
	return context.WithValue(ctx, verdict.Key{}, &v.s), v
}

// Result returns how the transaction ended, as one of the variants of [outcome.Result]
// (with no value: struct{}):
//
//   - Committed: the commit was confirmed; CommittedLocally says its synchronous
//     replication was not;
//   - DeterminateRollback: rolled back for certain; Retryable() says whether running the
//     whole transaction again is safe and may succeed (serialization failure, deadlock,
//     connection lost before COMMIT was sent, no connection could be acquired or made);
//     Cause() is the first failure, or why it ended;
//   - Indeterminate: COMMIT was sent and its fate is unknown: never replay it. Reference()
//     is the reconciliation reference when the tracer took one ([WithCommitReference],
//     [WithCommitMarker]); hand it to package reconcile (reconcile.Indeterminate), or wait
//     for [WithAutoReconcile]'s callback with its OperationID();
//   - Participating: a savepoint was released: nothing is committed yet.
//
// OperationID() is the frame's tx.operation_id. When the tracer cannot know, the error
// wraps [ErrNoVerdict] and says why; a nil Verdict, or one from NewVerdict(nil), is an
// error wrapping [ErrInvalidArgument].
func (v *Verdict) Result() (outcome.Result[struct{}], error) {
	if v == nil {
		return nil, invalid("Verdict.Result: nil *Verdict")
	}
	return v.s.Answer()
}
