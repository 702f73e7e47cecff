package otelpgxtx

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"

	"github.com/txevidence/otelpgxtx/internal/redact"
)

// AfterCommit registers hook to run after the physical commit of the transaction that
// [Run] put in ctx. From a participant (Required, Mandatory) it runs after the owner's
// commit; from a Nested call, only if its savepoint was released and the owner commits.
// A rollback discards it. A failing hook turns the owner's result into
// CommittedWithPostCommitFailure: the commit is not undone.
func AfterCommit(ctx context.Context, hook func(context.Context) error) error {
	if hook == nil {
		return invalid("AfterCommit: nil hook")
	}
	sc := scopeFromContext(ctx)
	if sc == nil {
		return invalid("AfterCommit: no transaction of Run in the context")
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closed {
		return errors.New("otelpgxtx: AfterCommit: the transaction has already ended")
	}
	sc.hooks = append(sc.hooks, hook)
	return nil
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
	ctx, span := tracer.Start(ctx, spanNamePostCommit)
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
		span.RecordError(redact.Error(err, f != nil && f.t.cfg.errorMessages))
		span.SetStatus(codes.Error, "post-commit work failed")
		return err
	}
	return nil
}

// runHook runs one hook, turning its panic into an error so that the others still run.
func runHook(ctx context.Context, h func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("otelpgxtx: panic in a post-commit hook: %v", p)
		}
	}()
	return h(ctx)
}
