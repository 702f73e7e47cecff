package otelpgxtx

import (
	"context"
	"errors"
)

// ExpectedErrorFunc reports whether err, which a statement, a connect, a pool acquire or
// a transaction of the caller's failed with, is one the application expects: a span
// that failed with an expected error keeps status Unset instead of Error (its exception
// event stays). ctx is the caller's context of the failed call, err the error as the
// driver returned it, never redacted: the function runs in the process and records
// nothing. It must be fast and safe for concurrent use; it runs only on failures.
//
// Only the status changes: tx.outcome, error.type, tx.rollback, the metrics and [Run]'s
// results are the same whatever it says — an indeterminate commit stays indeterminate.
type ExpectedErrorFunc func(ctx context.Context, err error) bool

// CallerCanceled is the default [ExpectedErrorFunc]: err is a cancellation and ctx, the
// caller's context, was canceled — the caller gave up (a user navigated away, a hedged
// request lost its race), which is not a failure of the database or of the query. A
// deadline that passed is not a cancellation (it is a timeout an operator should see),
// nor is a cancellation the caller did not ask for (the server's query_canceled, 57014,
// or a context of the library's own).
func CallerCanceled(ctx context.Context, err error) bool {
	return errors.Is(err, context.Canceled) && ctx != nil && ctx.Err() == context.Canceled
}

// defaultExpected is the default of [WithExpectedErrors].
var defaultExpected = []func(context.Context, error) bool{CallerCanceled}
