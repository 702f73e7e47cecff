package otelpgxtx

import (
	"context"
	"errors"

	"github.com/txevidence/otelpgxtx/outcome"
)

// Retry is the retry loop of code that uses pgx or database/sql directly, made safe: it
// calls attempt — one transaction of the caller's own, a pgx.BeginFunc, or a
// database/sql BeginTx … Commit — with a context carrying a fresh [Verdict], and calls it
// again only when that verdict is a retryable rollback (serialization failure, deadlock,
// connection lost before COMMIT was sent, a transaction that never reached the server
// because no connection could be acquired or made), up to maxAttempts calls in all, after a
// jittered exponential backoff (DefaultPolicy's), while ctx lasts. Begin and end the
// transaction with the context attempt is given.
//
// It returns the last call's verdict and error, as the call returned it:
//
//   - Committed: done (err is nil, unless attempt failed after its commit);
//   - DeterminateRollback: rolled back for certain, and not retried: not retryable, or no
//     attempt or time left;
//   - Indeterminate: COMMIT was sent and its fate is unknown. Retry never replays it: hand
//     it to reconciliation (reconcile.Indeterminate, or the callback of
//     [WithAutoReconcile]), which says whether running it again is safe.
//
// When the tracer cannot tell how a call ended (its transaction was on a connection that
// is not instrumented, or was not begun or ended with the context given, and no
// instrumented pool failed to connect with it), nothing is retried and the error wraps [ErrNoVerdict] and attempt's error, if any. A nil ctx or
// attempt, or maxAttempts below 1, is an error wrapping [ErrInvalidArgument]; attempt is
// not called.
//
// Retry is not an executor: the caller's code begins and ends its transaction as before.
// [Run] is the executor, with propagation, isolation and post-commit work; use it where
// the code can change.
func Retry(ctx context.Context, maxAttempts int, attempt func(ctx context.Context) error) (outcome.Result[struct{}], error) {
	switch {
	case ctx == nil:
		return nil, invalid("Retry: nil context")
	case attempt == nil:
		return nil, invalid("Retry: nil attempt function")
	case maxAttempts < 1:
		return nil, invalid("Retry: maxAttempts %d, want at least 1", maxAttempts)
	}
	p := DefaultPolicy()
	for n := 1; ; n++ {
		vctx, v := NewVerdict(ctx)
		err := attempt(vctx)
		res, verr := v.Result()
		if verr != nil {
			return nil, errors.Join(err, verr)
		}
		if !shouldRetry(ctx, Policy{MaxAttempts: maxAttempts}, res, n) || !waitBackoff(ctx, p, n) {
			return res, err
		}
	}
}
