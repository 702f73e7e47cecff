package otelpgxtx

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestLedgerWorkloadUnderSyncRepTerminations is the workload of the moment indeterminate
// commits cluster: a non-idempotent ledger (each operation a data-modifying statement that
// updates a hot row and inserts the operation's ledger row), every write waiting for a
// synchronous standby that never answers and its backend terminated there (committed
// locally, unknown to the client, the connection gone: every operation's write goes on a
// new connection), each operation run through the README's one call, Retry with a
// reconciler. Autocommit writes (pgx's pool, database/sql) and the same write in an
// explicit transaction, with the xid and with the marker. The ledger is read afterwards:
// no operation is applied twice, none is believed contrary to its row, and autocommit
// writes stay unknown no more often than explicit ones.
func TestLedgerWorkloadUnderSyncRepTerminations(t *testing.T) {
	const workers, ops = 3, 20
	ctx := pgtest.ContextFor(t)
	rec, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithWait(20*time.Millisecond, time.Millisecond))
	mustOK(t, err)
	marker := newMarkerTableFor(t, ctx)
	nemesis, stop := context.WithCancel(ctx)
	var terminated sync.WaitGroup
	terminated.Add(1)
	kills := 0
	go func() { // terminates every backend that waits for the standby, until stopped
		defer terminated.Done()
		c, err := srv.Conn(ctx)
		if err != nil {
			return
		}
		defer c.Close(context.WithoutCancel(ctx))
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for nemesis.Err() == nil {
			var n int
			if err := c.QueryRow(nemesis, "select count(*) filter (where pg_terminate_backend(pid)) from pg_stat_activity where wait_event = 'SyncRep'").Scan(&n); err == nil {
				kills += n
			}
			select {
			case <-tick.C:
			case <-nemesis.Done():
			}
		}
	}()
	unknown := map[string]int{}
	for _, mode := range []string{"xid", "marker"} {
		for _, kind := range []string{"pgx autocommit", "database/sql autocommit", "pgx explicit"} {
			ledger := srv.NewTable(t, ctx, "op bigint not null, n bigint")
			hot := srv.NewTable(t, ctx, "id int primary key, n bigint")
			mustOK(t, srv.Exec(ctx, "insert into "+hot+" values (1, 0)"))
			opt := WithCommitReference()
			if mode == "marker" {
				opt = WithCommitMarker(marker)
			}
			h := newHarness(t, srv.ConnString(), workers, opt, harnessConfig(func(c *pgxpool.Config) {
				c.ConnConfig.RuntimeParams["synchronous_commit"] = "on" // every commit waits for the phantom standby
			}))
			db := stdlib.OpenDBFromPool(h.pool)
			write := "with u as (update " + hot + " set n = n + 1 where id = 1 returning n) insert into " + ledger + " (op, n) select $1, n from u"
			results := make([]outcome.Outcome, workers*ops)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range ops {
						op := int64(w*ops + i)
						res, _ := Retry(ctx, 3, func(ctx context.Context) error {
							return ledgerWrite(ctx, kind, h.pool, db, write, op)
						}, WithReconciler(rec), WithReconcileWait(5*time.Second))
						if res != nil {
							results[op] = res.Outcome()
						}
					}
				}()
			}
			wg.Wait()
			_ = db.Close()
			counts := map[int64]int{}
			c, err := srv.Conn(ctx)
			mustOK(t, err)
			rows, err := c.Query(ctx, "select op, count(*) from "+ledger+" group by op")
			mustOK(t, err)
			for rows.Next() {
				var op int64
				var n int
				mustOK(t, rows.Scan(&op, &n))
				counts[op] = n
			}
			mustOK(t, rows.Err())
			_ = c.Close(ctx)
			key := mode + "/" + kind
			double, wrong := 0, 0
			for op, o := range results {
				n := counts[int64(op)]
				switch {
				case n > 1:
					double++
				case o == outcome.OutcomeCommitted && n != 1, o == outcome.OutcomeRolledBack && n != 0:
					wrong++
				case o == outcome.OutcomeIndeterminate:
					unknown[key]++
				}
			}
			t.Logf("%s: %d operations, %d unknown, %d applied twice, %d believed contrary to the ledger", key, len(results), unknown[key], double, wrong)
			if double != 0 || wrong != 0 {
				t.Errorf("%s: %d applied twice, %d wrong beliefs", key, double, wrong)
			}
			h.pool.Close()
		}
		for _, kind := range []string{"pgx autocommit", "database/sql autocommit"} {
			if a, e := unknown[mode+"/"+kind], unknown[mode+"/pgx explicit"]; a > e {
				t.Errorf("%s, %s: %d unknown, the explicit workload %d", mode, kind, a, e)
			}
		}
	}
	stop()
	terminated.Wait()
	t.Logf("%d backends terminated in their synchronous-replication wait", kills)
	if kills == 0 {
		t.Fatal("no write waited for the standby: the workload tested nothing")
	}
}

// ledgerWrite sends the operation op's write: an autocommit statement on the pool or
// through database/sql, or the same statement in an explicit transaction.
func ledgerWrite(ctx context.Context, kind string, pool *pgxpool.Pool, db *sql.DB, write string, op int64) error {
	switch kind {
	case "pgx autocommit":
		_, err := pool.Exec(ctx, write, op)
		return err
	case "database/sql autocommit":
		_, err := db.ExecContext(ctx, write, op)
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, write, op)
		return err
	})
}

// newMarkerTableFor makes a marker table of its own for t.
func newMarkerTableFor(t *testing.T, ctx context.Context) pgx.Identifier {
	t.Helper()
	m := pgx.Identifier{"public", fmt.Sprintf("wl_marker_%d", tableSeq.Add(1))}
	ddl, err := reconcile.MarkerTableDDL(m)
	mustOK(t, err)
	mustOK(t, srv.Exec(ctx, ddl))
	return m
}
