package otelpgxtx

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
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

// expectedSpan is a span that ended with an expected error: it takes every call but the
// Error status.
type expectedSpan struct{ trace.Span }

// SetStatus drops codes.Error, which an expected error must not set.
func (s expectedSpan) SetStatus(code codes.Code, description string) {
	if code != codes.Error {
		s.Span.SetStatus(code, description)
	}
}

// expectedCtx marks the context of a batch query that failed with an expected error:
// otelpgx starts and ends that span inside one hook, from its own tracer, so the mark
// travels to the tracer the default otelpgx is given (expectedStatusTracer), which wraps
// the span it starts.
type expectedCtx struct{ context.Context }
