package otelpgxtx

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
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
				// Asked again once the server has handed out more xids: the same answer.
				for range 3 {
					mustOK(t, srv.Exec(w.ctx, "select pg_catalog.pg_current_xact_id()"))
				}
				if again, err := w.rec.Resolve(w.ctx, ref, trace.SpanContext{}); err != nil || again.Status() != got.Status() {
					t.Fatalf("asked again after more xids: %v %v, first %s", again, err, got.Status())
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

// TestReferenceLogsNoError: the xid read after a transaction's first write rides inside
// that write's Sync group, so that when the write fails the server skips it without a
// word: over the wire recording, the server answers a failed first write (23505) with its
// one ErrorResponse and never with 25P02, which it would log; the transaction's outcome
// and the application's error are the write's. Extended protocol, with the xid and the
// marker (whose transactions take the read too when no marker is armed).
func TestReferenceLogsNoError(t *testing.T) {
	for _, mode := range []string{"xid", "marker"} {
		t.Run(mode, func(t *testing.T) {
			ctx := pgtest.ContextFor(t)
			opt := WithCommitReference()
			if mode == "marker" {
				opt = WithCommitMarker(newMarkerTableFor(t, ctx))
			}
			h := newRefHarness(t, srv.ConnString(), opt)
			table := srv.NewTable(t, ctx, tableColumns)
			mustOK(t, plainInsert(ctx, h.pool, table, 1, nil)) // the connection checked, the row there
			vctx, v := NewVerdict(ctx)
			err := plainInsert(vctx, h.pool, table, 1, nil) // a unique violation at the first write
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
				t.Fatalf("the write answered %v, want its 23505", err)
			}
			if res, err := v.Result(); err != nil || res.Outcome() != outcome.OutcomeRolledBack {
				t.Fatalf("%v %v, want rolled back", res, err)
			}
			var server []byte
			for _, c := range h.rec.Conversations() {
				server = append(server, c.ServerBytes()...)
			}
			if n := bytes.Count(server, []byte("C25P02\x00")); n != 0 {
				t.Fatalf("the server answered 25P02 %d times: an error of the library's own, in its log", n)
			}
			if n := bytes.Count(server, []byte("C23505\x00")); n != 1 {
				t.Fatalf("the server answered 23505 %d times, want once", n)
			}
		})
	}
}
