package otelpgxtx

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// TestUnsampledSDKSpansDoNotPanic: with the SDK, a frame that is not sampled has a
// non-recording span whose type is not comparable. Neither a statement under an
// unsampled request span nor a statement inside Run (whose context carries the frame's
// span) may compare spans with ==.
func TestUnsampledSDKSpansDoNotPanic(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarnessSampled(t, "", 2, sdktrace.NeverSample())
	rctx, span := h.tp.Tracer("app").Start(ctx, "request")
	defer span.End()
	tx := mustBegin(t, rctx, h.pool)
	mustExec(t, rctx, tx, "select 1")
	if err := tx.Commit(rctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []context.Context{ctx, rctx} {
		res := Run(c, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, "select 1")
			return 0, err
		})
		if res.Outcome() != outcome.OutcomeCommitted {
			t.Fatalf("Run: %+v", res)
		}
	}
}

// TestNoSDKDoesNotPanic: with no OpenTelemetry SDK installed, the global provider hands
// out its own non-recording spans; Run and plain transactions must work the same.
func TestNoSDKDoesNotPanic(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	cfg, err := pgxpool.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InstrumentPool(cfg); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	res := Run(ctx, pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		inner := Run(ctx, pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, "select $1::int", 1)
			return 0, err
		})
		if inner.Outcome() != outcome.OutcomeParticipating {
			t.Errorf("inner: %+v", inner)
		}
		_, err := tx.Exec(ctx, "select 1")
		return 0, err
	})
	if res.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("Run: %+v", res)
	}
	tx := mustBegin(t, ctx, pool)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
