package reconcile_test

import (
	"errors"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestReconcilerOptions: the reconciler's options are package reconcile's (a tracer
// option passed to reconcile.New, or the reverse, does not compile); a refused option or
// an empty reference is an error wrapping reconcile.ErrInvalidArgument.
func TestReconcilerOptions(t *testing.T) {
	pgtest.LeakCheck(t) // registered first, so it runs after the pool's Close
	ctx := pgtest.ContextFor(t)
	pool := srv.Pool(t, ctx)
	if _, err := reconcile.New(pool, reconcile.WithWait(-time.Second, 0)); !errors.Is(err, reconcile.ErrInvalidArgument) {
		t.Errorf("reconcile.New with a negative wait: %v, want ErrInvalidArgument", err)
	}
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	rec, err := reconcile.New(pool, reconcile.WithTracerProvider(tp), reconcile.WithWait(0, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Resolve(ctx, outcome.ReconciliationRef{}, trace.SpanContext{}); !errors.Is(err, reconcile.ErrInvalidArgument) {
		t.Errorf("Resolve of an empty reference: %v, want ErrInvalidArgument", err)
	}
}
