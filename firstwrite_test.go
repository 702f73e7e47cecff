package otelpgxtx

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestImplicitFirstWriteReference: a connection's first autocommit write carries a
// reference as every later one does — the check of the connection rides ahead of it as a
// Query of its own, the xid read inside its transaction —, so that a new connection's
// write whose commit becomes unknown (its backend terminated in its synchronous-replication
// wait: committed locally) is settled: committed, and the row is there. With the marker on,
// the first write carries the xid, the next ones the marker. Through pgx's pool and
// database/sql.
func TestImplicitFirstWriteReference(t *testing.T) {
	for _, mode := range []string{"xid", "marker"} {
		for _, way := range []string{"pgx", "database/sql"} {
			t.Run(mode+"/"+way, func(t *testing.T) {
				w := newImplicit(t, mode)
				var opts []Option
				if mode == "xid" {
					opts = append(opts, WithCommitReference())
				} else {
					opts = append(opts, WithCommitMarker(w.marker))
				}
				cold := newHarness(t, srv.ConnString(), 1, opts...) // a connection that has sent nothing yet
				var pid uint32
				withConn(t, w.ctx, cold, func(conn *pgx.Conn) {
					pid = conn.PgConn().PID()
					_, err := conn.Exec(w.ctx, "set synchronous_commit = on") // no write: no frame, no check
					mustOK(t, err)
				})
				cold.exp.Reset()
				ctx, root := rootSpan(w.ctx, cold)
				vctx, v := NewVerdict(ctx)
				done := make(chan error, 1)
				go func() {
					if way == "pgx" {
						_, err := cold.pool.Exec(vctx, w.insert(), 1)
						done <- err
						return
					}
					db := stdlib.OpenDBFromPool(cold.pool)
					defer db.Close()
					_, err := db.ExecContext(vctx, w.insert(), 1)
					done <- err
				}()
				mustOK(t, srv.TerminateInSyncRep(w.ctx, pid))
				if err := <-done; err == nil {
					t.Fatal("the write answered through the termination")
				}
				root.End()
				res, err := v.Result()
				mustOK(t, err)
				ind, ok := res.(outcome.Indeterminate[struct{}])
				if !ok {
					t.Fatalf("%T %v, want indeterminate", res, res)
				}
				ref, ok := ind.Reference()
				if !ok {
					t.Fatalf("no reference: %s", cold.implicitFrames()[0].Attributes)
				}
				if ref.HasMarker() {
					t.Fatalf("the first write's reference has the marker: %+v", ref)
				}
				got, err := w.rec.Resolve(w.ctx, ref, trace.SpanContext{})
				mustOK(t, err)
				if got.Status() != reconcile.Committed || !srv.RowExists(t, w.ctx, w.table, 1) {
					t.Fatalf("reconciled %s %q, row there: %v", got.Status(), got.Reason(), srv.RowExists(t, w.ctx, w.table, 1))
				}
				// The connection's next write (a new one: the first died) carries its reference.
				cold.exp.Reset()
				ctx2, root2 := rootSpan(w.ctx, cold)
				_, err = cold.pool.Exec(ctx2, w.insert(), 2)
				mustOK(t, err)
				root2.End()
				if fs := cold.implicitFrames(); len(fs) != 1 {
					t.Fatalf("%d implicit frames", len(fs))
				} else if r, ok := refOf(t, fs[0]); !ok || r.XID == 0 {
					t.Fatalf("the next connection's first write: reference %+v, %v", r, ok)
				} else if mode == "marker" && r.HasMarker() {
					t.Fatalf("a first write with the marker: %s", fmt.Sprint(r))
				}
			})
		}
	}
}
