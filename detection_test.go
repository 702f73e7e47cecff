package otelpgxtx

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/pgtest"
)

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
			ctx := pgtest.ContextFor(t)
			h := newHarness(t, "", 1)
			table := srv.NewTable(t, ctx, tableColumns)
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

// TestChainKeepsParent: the transaction that COMMIT AND CHAIN begins has the same parent
// span as the one it follows, and a transaction found only after a statement has that
// statement's caller's.
func TestChainKeepsParent(t *testing.T) {
	ctx := pgtest.ContextFor(t)
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
