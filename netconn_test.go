package otelpgxtx

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/pgtest"
)

// TestNetConnPassThrough: on an instrumented connection pgconn uses the wrapper, a
// chained AfterNetConnect's net.Conn is inside it, and what pgconn does with the
// net.Conn — deadlines for a context, Ping's round trip (pgxpool's and database/sql's
// liveness check) — works.
func TestNetConnPassThrough(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	cfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	var userConn net.Conn
	var calls atomic.Int32
	cfg.AfterNetConnect = func(_ context.Context, _ *pgconn.Config, c net.Conn) (net.Conn, error) {
		calls.Add(1)
		userConn = c
		return c, nil
	}
	if _, err := InstrumentConnConfig(cfg, WithTracerProvider(h.tp)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	nc, ok := conn.PgConn().Conn().(interface{ NetConn() net.Conn })
	if !ok || calls.Load() != 1 || nc.NetConn() != userConn {
		t.Fatalf("PgConn().Conn() = %T, user's AfterNetConnect called %d times", conn.PgConn().Conn(), calls.Load())
	}
	if err := conn.PgConn().Ping(ctx); err != nil {
		t.Fatalf("Ping on an idle connection: %v", err)
	}
	dctx, cancel := context.WithCancel(ctx) // pgconn sets deadlines on the net.Conn for it
	defer cancel()
	var n int
	if err := conn.QueryRow(dctx, "select 41 + 1").Scan(&n); err != nil || n != 42 {
		t.Fatalf("query: %d %v", n, err)
	}
	if err := conn.PgConn().Ping(ctx); err != nil {
		t.Fatalf("Ping after a query: %v", err)
	}
}

// TestNetConnClosedUnderStatements closes the net.Conn of a connection in a transaction
// from other goroutines (as pgconn's asynchronous close does) while its user keeps
// running statements: the frame ends exactly once, as a rollback, race-free.
func TestNetConnClosedUnderStatements(t *testing.T) {
	for i := range 20 {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 1)
		starts := &frameStarts{}
		h.tp.RegisterSpanProcessor(starts)
		conn, tx := beginOnInstrumentedConn(t, ctx, h)
		nc := conn.PgConn().Conn()
		started := make(chan struct{})
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-started
				nc.Close()
			}()
		}
		close(started)
		for {
			if _, err := tx.Exec(ctx, "select 1"); err != nil {
				break
			}
		}
		wg.Wait()
		_ = tx.Rollback(ctx)
		conn.Close(ctx)
		f := onlyFrame(t, h)
		if o := attrString(t, f, "tx.outcome"); o != "rolled_back" {
			t.Fatalf("round %d: outcome %s", i, o)
		}
		wantEndedOnce(t, h, starts)
	}
}
