package otelpgxtx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// frameStarts counts the frame spans started, to compare with those ended.
type frameStarts struct {
	mu sync.Mutex
	n  int
}

func (c *frameStarts) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	if s.InstrumentationScope().Name == ScopeName && s.Name() == DefaultSpanName {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
	}
}
func (c *frameStarts) OnEnd(sdktrace.ReadOnlySpan)      {}
func (c *frameStarts) Shutdown(context.Context) error   { return nil }
func (c *frameStarts) ForceFlush(context.Context) error { return nil }

func (c *frameStarts) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *endCounter) count(id trace.SpanID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ends[id]
}

// waitFrames waits until h has exported n frame spans: some end on another goroutine
// (database/sql discards a connection in the background).
func waitFrames(t *testing.T, ctx context.Context, h *harness, n int) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for len(h.frames()) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("%d frames ended, want %d", len(h.frames()), n)
		case <-tick.C:
		}
	}
}

// wantEndedOnce checks that every frame span started was ended exactly once.
func wantEndedOnce(t *testing.T, h *harness, starts *frameStarts) {
	t.Helper()
	fs := h.frames()
	if starts.count() != len(fs) {
		t.Fatalf("%d frames started, %d ended", starts.count(), len(fs))
	}
	for _, f := range fs {
		if n := h.ends.count(f.SpanContext.SpanID()); n != 1 {
			t.Fatalf("frame %s ended %d times", f.SpanContext.SpanID(), n)
		}
	}
}

// TestDatabaseSQL runs database/sql through pgx's stdlib, on an instrumented pool
// (OpenDBFromPool) and on an instrumented connection config (OpenDB): a commit, a
// rollback, a transaction whose context is cancelled while it is open (database/sql rolls
// it back and discards the connection), a statement cancelled mid-flight, and a
// transaction begun with a plain statement on a connection database/sql then discards
// (pgx.Conn.Close, which has no hook: its frame used to stay open forever). Every frame
// ends exactly once, with the outcome of what happened.
func TestDatabaseSQL(t *testing.T) {
	for _, fromPool := range []bool{true, false} {
		t.Run(fmt.Sprintf("from pool %v", fromPool), func(t *testing.T) {
			ctx := pgtest.ContextFor(t)
			h := newHarness(t, "", 4)
			starts := &frameStarts{}
			h.tp.RegisterSpanProcessor(starts)
			table := srv.NewTable(t, ctx, tableColumns)
			var db *sql.DB
			if fromPool {
				db = stdlib.OpenDBFromPool(h.pool)
			} else {
				cfg, err := pgx.ParseConfig(srv.ConnString())
				if err != nil {
					t.Fatal(err)
				}
				if _, err := InstrumentConnConfig(cfg, WithTracerProvider(h.tp)); err != nil {
					t.Fatal(err)
				}
				db = stdlib.OpenDB(*cfg)
			}
			defer db.Close()
			insert := fmt.Sprintf("insert into %s (id) values ($1)", table)

			// Commit and rollback.
			for i, commit := range []bool{true, false} {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.ExecContext(ctx, insert, i+1); err != nil {
					t.Fatal(err)
				}
				if commit {
					err = tx.Commit()
				} else {
					err = tx.Rollback()
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			waitFrames(t, ctx, h, 2)

			// The transaction's context is cancelled while it is open.
			cctx, cancel := context.WithCancel(ctx)
			tx, err := db.BeginTx(cctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(cctx, insert, 3); err != nil {
				t.Fatal(err)
			}
			cancel()
			waitFrames(t, ctx, h, 3)
			if err := tx.Commit(); !errors.Is(err, sql.ErrTxDone) {
				t.Fatalf("commit after the cancellation: %v", err)
			}

			// A statement is cancelled while the server runs it.
			sctx, cancel := context.WithCancel(ctx)
			tx, err = db.BeginTx(sctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := tx.ExecContext(sctx, "select pg_sleep(30)")
				done <- err
			}()
			if err := waitSleeping(ctx); err != nil {
				t.Fatal(err)
			}
			cancel()
			if err := <-done; err == nil {
				t.Fatal("the cancelled statement succeeded")
			}
			waitFrames(t, ctx, h, 4)

			// A transaction begun with a plain statement, on a connection database/sql
			// then discards (its session check refuses a connection in a transaction).
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, "begin"); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, insert, 5); err != nil {
				t.Fatal(err)
			}
			conn.Close()
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			waitFrames(t, ctx, h, 5)

			wantOutcomes(t, h, "committed", "rolled_back", "rolled_back", "rolled_back", "rolled_back")
			fs := h.frames()
			wantAttr(t, fs[2], "error.type", "canceled")
			wantAttr(t, fs[3], "error.type", "canceled")
			reason := evidence.ReasonConnectionClosed
			if fromPool {
				reason = evidence.ReasonReleasedInTransaction
			}
			wantAttr(t, fs[4], "error.type", reason)
			wantEndedOnce(t, h, starts)
			for id := 1; id <= 5; id++ {
				if srv.RowExists(t, ctx, table, id) != (id == 1) {
					t.Fatalf("row %d: want only row 1", id)
				}
			}
		})
	}
}

// waitSleeping waits until some backend sleeps in pg_sleep.
func waitSleeping(ctx context.Context) error {
	conn, err := srv.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := conn.QueryRow(ctx, "select count(*) from pg_stat_activity where wait_event = 'PgSleep'").Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// TestPgxConnClosedMidTransaction closes a single instrumented *pgx.Conn in the middle of
// a transaction: pgx.Conn.Close has no hook, and the frame used to stay open. Its
// net.Conn's close ends it, once, as a rollback.
func TestPgxConnClosedMidTransaction(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	starts := &frameStarts{}
	h.tp.RegisterSpanProcessor(starts)
	conn, tx := beginOnInstrumentedConn(t, ctx, h)
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	f := onlyFrame(t, h)
	wantAttr(t, f, "tx.outcome", "rolled_back")
	wantAttr(t, f, "error.type", evidence.ReasonConnectionClosed)
	wantEvents(t, f, "tx.phase.active", "tx.phase.rolled_back")
	if err := tx.Rollback(ctx); err == nil {
		t.Fatal("rollback on a closed connection succeeded")
	}
	wantEndedOnce(t, h, starts)
}

// beginOnInstrumentedConn connects a single *pgx.Conn instrumented with h's tracer
// provider and begins a transaction on it with one statement.
func beginOnInstrumentedConn(t *testing.T, ctx context.Context, h *harness) (*pgx.Conn, pgx.Tx) {
	t.Helper()
	cfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InstrumentConnConfig(cfg, WithTracerProvider(h.tp)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	return conn, tx
}
