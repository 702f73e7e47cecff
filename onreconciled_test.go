package otelpgxtx

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestOnReconciledAfterCloseOutsideLock: a frame that ends indeterminate after
// Tracer.Close is handed to the WithOnReconciled callback with no lock of the library's
// held, so a callback that uses the frame's own connection (its hooks take the lock the
// COMMIT's hook held while the frame ended) runs and returns, where it deadlocked the
// committing goroutine when it ran on it.
func TestOnReconciledAfterCloseOutsideLock(t *testing.T) {
	pgtest.LeakCheck(t) // first: it runs after every cleanup below
	ctx := pgtest.ContextFor(t)
	rec, err := reconcile.New(srv.Pool(t, ctx))
	if err != nil {
		t.Fatal(err)
	}
	proxy := pgtest.ProxyFor(t, srv)
	cfg, err := pgx.ParseConfig(proxy.ConnString(srv.ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	var conn *pgx.Conn // set before any frame can end
	used := make(chan error, 1)
	tracer, err := InstrumentConnConfig(cfg, WithTracerProvider(noop.NewTracerProvider()), WithLogger(slog.New(slog.DiscardHandler)),
		WithAutoReconcile(rec, WithOnReconciled(func(r Reconciliation) {
			if r.Answer.Reason() != reconcile.ReasonStopped {
				t.Errorf("after Close: %+v, want unknown, stopped", r)
			}
			// The connection was cut: the statement fails, but its hooks ran.
			_, err := conn.Exec(ctx, "select 1")
			used <- err
		})))
	if err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	table := srv.NewTable(t, ctx, tableColumns)
	if err := tracer.Close(ctx); err != nil {
		t.Fatal(err)
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "insert into "+table+" values (1)"); err != nil {
		t.Fatal(err)
	}
	proxy.CutAfterCommit()
	committed := make(chan error, 1)
	go func() { committed <- tx.Commit(ctx) }()
	// A deadlock would hold both forever: a deadline fails the test instead (the stuck
	// goroutine is then reported too).
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	select {
	case err := <-committed:
		if err == nil {
			t.Fatal("the cut commit succeeded")
		}
	case <-deadline.C:
		t.Fatal("Commit did not return: the callback ran under the connection's lock")
	}
	select {
	case err := <-used:
		if err == nil {
			t.Error("a statement on the cut connection succeeded")
		}
	case <-deadline.C:
		t.Fatal("the callback did not return")
	}
}
