package reconcile_test

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestReconcileXIDReusedAfterCrash is the regression test for a misclassification found
// by the soundness work: a reconciliation reference names (system identifier, timeline,
// xid8), but a crash restart keeps both the system identifier and the timeline while it
// can hand the same xid to a new transaction. PostgreSQL does not WAL-log xid assignment:
// after crash recovery nextXid is the last checkpoint's, advanced past the xids of the
// records that were replayed. A transaction whose records were still in WAL buffers when
// the server died (it cannot have committed: its commit record is not on disk) leaves
// its xid free, and the next transaction after the restart takes it. pg_xact_status then
// describes that other transaction.
//
// Here COMMIT is held in a deferred trigger (after the xid was read, before the commit
// record), the server crashes, the first transaction after the restart takes the same xid
// and commits, and the reconciler must not resolve the lost transaction committed: the
// end-of-recovery checkpoint's next xid is the boundary, and it resolves aborted.
func TestReconcileXIDReusedAfterCrash(t *testing.T) {
	pgtest.LeakCheck(t) // registered first, so it runs after the pool's Close
	ctx := pgtest.ContextFor(t)
	if err := srv.Exec(ctx, `drop table if exists xr_held, xr_next;
		create table xr_held (id int primary key);
		create table xr_next (id int primary key);
		create or replace function xr_hold() returns trigger language plpgsql as $$
		begin perform pg_advisory_lock(4242); perform pg_advisory_unlock(4242); return null; end $$;
		create constraint trigger xr_hold after insert on xr_held deferrable initially deferred
		for each row execute function xr_hold()`); err != nil {
		t.Fatal(err)
	}
	pool := srv.Pool(t, ctx)
	holder := newConn(t, ctx, srv)
	if _, err := holder.Exec(ctx, "select pg_advisory_lock(4242)"); err != nil {
		t.Fatal(err)
	}
	held := newConn(t, ctx, srv)
	tx, ref := insertRef(t, ctx, held, "xr_held", 1)
	// COMMIT is in the deferred trigger: the xid was read, the commit record not written.
	done := commitWaiting(t, ctx, srv, held, tx, "advisory")
	if err := srv.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("COMMIT succeeded on a server that crashed before its commit record")
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if ref.NoWrites() {
		t.Fatalf("reference %v, want an xid", ref)
	}
	// The first transaction after the restart that needs an xid.
	conn := newConn(t, ctx, srv)
	tx, nextRef := insertRef(t, ctx, conn, "xr_next", 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	var got reconcile.Answer
	for range 3 { // the pool's connections to the crashed server fail once each
		if got, err = rec.ResolveOperation(ctx, outcome.NewOperationID(), &ref, trace.SpanContext{}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	present := srv.RowExists(t, ctx, "xr_held", 1)
	t.Logf("taken %s; the first transaction after the restart got xid %d; ResolveOperation: %s %q; row present: %v",
		ref, nextRef.XID, got.Status(), got.Reason(), present)
	if got.Status() == reconcile.Committed && !present || got.Status() == reconcile.Aborted && present ||
		got.Status() == reconcile.Unknown && got.Reason() == "" {
		t.Fatalf("ResolveOperation contradicts the database: %s, row present %v (xid %d was reused by a transaction after the crash restart)", got.Status(), present, ref.XID)
	}
	// The end-of-recovery checkpoint's next xid is the boundary: the xid is at or above
	// it (reused) or below it with its own "aborted" (its insert reached the WAL).
	if got.Status() != reconcile.Aborted {
		t.Fatalf("ResolveOperation = %s %q, want aborted", got.Status(), got.Reason())
	}
}

// TestReconcileAfterCrashRestart resolves references read before a crash restart
// (pg_ctl stop -m immediate): an xid assigned but never WAL-logged, which the restarted
// server has not handed out again, resolves aborted (the next xid restarted below it); a
// commit that reached the WAL stays unknown (server_restarted), because another restart
// in between could have reused its xid and the server keeps no record of it.
func TestReconcileAfterCrashRestart(t *testing.T) {
	pgtest.LeakCheck(t) // registered first, so it runs after the pool's Close
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, "id int primary key")
	pool := srv.Pool(t, ctx)
	conn := newConn(t, ctx, srv)
	tx, durable := insertRef(t, ctx, conn, table, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// An xid assigned inside an open transaction writes no WAL.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xid uint64
	if err := tx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	unlogged := durable
	unlogged.XID = xid
	if err := srv.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(pool, reconcile.WithWait(0, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	reconciletest.Check(t, ctx, rec, []reconciletest.Case{
		{Name: "assigned, never logged", Ref: unlogged, Want: reconcile.Aborted},
		{Name: "committed before the crash", Ref: durable, Want: reconcile.Unknown, Reason: reconcile.ReasonServerRestarted},
	})
	if !srv.RowExists(t, ctx, table, 1) {
		t.Error("the committed row is gone after the crash restart")
	}
}
