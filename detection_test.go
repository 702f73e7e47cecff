package otelpgxtx

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// outcomes returns each frame's tx.outcome, in start order.
func (h *harness) outcomes() []string {
	var out []string
	for _, f := range h.frames() {
		v, _ := attr(f, OutcomeKey)
		out = append(out, v.AsString())
	}
	return out
}

func wantOutcomes(t *testing.T, h *harness, want ...string) {
	t.Helper()
	if got := h.outcomes(); !slices.Equal(got, want) {
		t.Fatalf("frame outcomes = %v, want %v", got, want)
	}
}

// withConn runs fn on one pooled connection and releases it.
func withConn(t *testing.T, ctx context.Context, h *harness, fn func(*pgx.Conn)) {
	t.Helper()
	pc, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	fn(pc.Conn())
}

// acquireInTransaction acquires a pooled connection and leaves it in a transaction the
// tracer saw begin, for tests that end it behind the tracer's back or not at all.
func acquireInTransaction(t *testing.T, ctx context.Context, h *harness) *pgxpool.Conn {
	t.Helper()
	pc, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, ctx, pc.Conn(), "begin", "select 1")
	return pc
}

// beginner is what mustBegin needs of db.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// mustBegin begins a transaction on db (a pool, a *pgx.Conn, or a pgx.Tx for a
// savepoint) and fails the test if it cannot.
func mustBegin(t *testing.T, ctx context.Context, db beginner) pgx.Tx {
	t.Helper()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// execer is what mustExec runs statements on: a *pgx.Conn, a pgx.Tx or a pool.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// mustExec runs each of sqls on conn and fails the test at the first error.
func mustExec(t *testing.T, ctx context.Context, conn execer, sqls ...string) {
	t.Helper()
	for _, sql := range sqls {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// TestDetectionFromWhatPgxSends covers every way a transaction begins and ends that pgx
// or a user can send, each against the real server.
func TestDetectionFromWhatPgxSends(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, ctx context.Context, h *harness, table string)
		want []string
	}{
		{"user BEGIN and COMMIT via Exec", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) {
				mustExec(t, ctx, c, "BEGIN", "insert into "+table+" (id) values (1)", "COMMIT")
			})
		}, []string{"committed"}},
		{"START TRANSACTION and END", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) {
				mustExec(t, ctx, c, "  start   transaction isolation level serializable", "select 1", "end")
			})
		}, []string{"committed"}},
		{"ABORT", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) { mustExec(t, ctx, c, "Begin Work", "abort") })
		}, []string{"rolled_back"}},
		{"COMMIT AND CHAIN", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) {
				mustExec(t, ctx, c, "begin isolation level repeatable read", "insert into "+table+" (id) values (1)",
					"commit and chain", "insert into "+table+" (id) values (2)", "rollback")
			})
		}, []string{"committed", "rolled_back"}},
		{"ROLLBACK AND CHAIN", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) {
				mustExec(t, ctx, c, "begin", "rollback and chain", "commit")
			})
		}, []string{"rolled_back", "committed"}},
		{"custom BeginQuery and CommitQuery", func(t *testing.T, ctx context.Context, h *harness, table string) {
			tx, err := h.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: "START TRANSACTION READ WRITE", CommitQuery: "COMMIT WORK"})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}, []string{"committed"}},
		{"Batch with BeginTx", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) {
				b := &pgx.Batch{}
				b.BeginTx(pgx.TxOptions{IsoLevel: pgx.Serializable})
				b.Queue("insert into " + table + " (id) values (1)")
				br := c.SendBatch(ctx, b)
				if err := br.Close(); err != nil {
					t.Fatal(err)
				}
				tx := br.(interface{ Tx() pgx.Tx }).Tx()
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}, []string{"committed"}},
		{"a batch that begins and commits", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) {
				b := &pgx.Batch{}
				b.Queue("begin")
				b.Queue("insert into " + table + " (id) values (1)")
				b.Queue("commit")
				if err := c.SendBatch(ctx, b).Close(); err != nil {
					t.Fatal(err)
				}
			})
		}, []string{"committed"}},
		{"a batch whose insert fails before its commit", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) {
				b := &pgx.Batch{}
				b.Queue("begin")
				b.Queue("insert into " + table + " (id) values (1), (1)")
				b.Queue("commit")
				if err := c.SendBatch(ctx, b).Close(); err == nil {
					t.Fatal("duplicate insert succeeded")
				}
			})
		}, []string{"rolled_back"}},
		{"simple protocol string with BEGIN and COMMIT", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) {
				if _, err := c.Exec(ctx, "begin; insert into "+table+" (id) values (1); commit", pgx.QueryExecModeSimpleProtocol); err != nil {
					t.Fatal(err)
				}
			})
		}, []string{"committed"}},
		{"COMMIT with no transaction in progress", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) {
				mustExec(t, ctx, c, "commit", "rollback", "select 1")
			})
		}, nil},
		{"nested BEGIN inside a transaction is one frame", func(t *testing.T, ctx context.Context, h *harness, table string) {
			withConn(t, ctx, h, func(c *pgx.Conn) { mustExec(t, ctx, c, "begin", "begin", "commit") })
		}, []string{"committed"}},
		{"Rollback after a failed Commit", func(t *testing.T, ctx context.Context, h *harness, table string) {
			if err := srv.Exec(ctx, "insert into "+table+" (id, k) values (1, 1)"); err != nil {
				t.Fatal(err)
			}
			tx := mustBegin(t, ctx, h.pool)
			mustExec(t, ctx, tx.Conn(), "insert into "+table+" (id, k) values (2, 1)")
			if err := tx.Commit(ctx); err == nil {
				t.Fatal("commit succeeded")
			}
			if err := tx.Rollback(ctx); err != pgx.ErrTxClosed {
				t.Fatalf("rollback after failed commit = %v", err)
			}
		}, []string{"rolled_back"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			h := newHarness(t, "", 1)
			table := newTable(t, ctx)
			tc.run(t, ctx, h, table)
			wantOutcomes(t, h, tc.want...)
			h.wantNoFrames(t, ctx)
			for id, n := range h.ends.ends {
				if n != 1 {
					t.Fatalf("span %v ended %d times", id, n)
				}
			}
		})
	}
}

// wantNoFrames asserts that no idle connection of the pool holds a frame.
func (h *harness) wantNoFrames(t *testing.T, ctx context.Context) {
	t.Helper()
	conns := h.pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for _, c := range conns {
		if st := connStateOf(c.Conn()); st != nil && st.frame != nil {
			t.Fatalf("an idle connection still holds a frame in phase %s", st.frame.currentPhase())
		}
	}
}

// TestChainKeepsParent: the transaction that COMMIT AND CHAIN begins has the same parent
// span as the one it follows, and a transaction found only after a statement has that
// statement's caller's.
func TestChainKeepsParent(t *testing.T) {
	ctx := testCtx(t)
	h := newHarness(t, "", 1)
	rctx, root := rootSpan(ctx, h)
	withConn(t, rctx, h, func(c *pgx.Conn) {
		mustExec(t, rctx, c, "begin", "commit and chain", "commit")
		// A BEGIN the tracer cannot see (sent through pgconn directly): the next
		// statement finds the transaction and frames it under its caller's span.
		if _, err := c.PgConn().Exec(rctx, "begin").ReadAll(); err != nil {
			t.Fatal(err)
		}
		mustExec(t, rctx, c, "select 1")
		mustExec(t, rctx, c, "rollback")
	})
	root.End()
	fs := h.frames()
	if len(fs) != 3 {
		t.Fatalf("%d frames", len(fs))
	}
	for _, f := range fs {
		wantParent(t, f, root)
	}
	wantOutcomes(t, h, "committed", "committed", "rolled_back")
}
