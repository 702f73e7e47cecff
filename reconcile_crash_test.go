package otelpgxtx

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
// Here COMMIT is held in a deferred trigger (after Run captured the xid, before the
// commit record), the server crashes, the first transaction after the restart takes
// the same xid and commits, and the reconciler resolves the lost transaction committed.
func TestReconcileXIDReusedAfterCrash(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := testCtx(t)
	h := newHarness(t, "", 2)
	if err := srv.Exec(ctx, `drop table if exists xr_held, xr_next;
		create table xr_held (id int primary key);
		create table xr_next (id int primary key);
		create or replace function xr_hold() returns trigger language plpgsql as $$
		begin perform pg_advisory_lock(4242); perform pg_advisory_unlock(4242); return null; end $$;
		create constraint trigger xr_hold after insert on xr_held deferrable initially deferred
		for each row execute function xr_hold()`); err != nil {
		t.Fatal(err)
	}
	holder, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background()) // the crash closes it; this only frees it
	if _, err := holder.Exec(ctx, "select pg_advisory_lock(4242)"); err != nil {
		t.Fatal(err)
	}
	pid, done := runInBackground(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, "insert into xr_held values (1)")
		return 1, err
	})
	// COMMIT is in the deferred trigger: the xid was read, the commit record not written.
	if err := srv.WaitForWaitEvent(ctx, pid, "advisory"); err != nil {
		t.Fatal(err)
	}
	if err := srv.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	ind, ok := res.(outcome.Indeterminate[int])
	if !ok {
		t.Fatalf("result = %T %+v, want Indeterminate", res, res)
	}
	ref, ok := ind.Reference()
	if !ok || ref.NoWrites() {
		t.Fatalf("reference %v %v, want a captured xid", ref, ok)
	}
	// The first transaction after the restart that needs an xid.
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var next uint64
	if _, err := tx.Exec(ctx, "insert into xr_next values (1)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&next); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(h.pool)
	if err != nil {
		t.Fatal(err)
	}
	got, err := reconcile.Indeterminate(ctx, rec, ind)
	if err != nil {
		t.Fatal(err)
	}
	present := rowExists(t, ctx, "xr_held", 1)
	t.Logf("captured %s; the first transaction after the restart got xid %d; Reconcile: %s %q; row present: %v",
		ref, next, got.Status(), got.Reason(), present)
	if msg := soakResolutionContradicts(got, present); msg != "" {
		t.Fatalf("Reconcile contradicts the database: %s (xid %d was reused by a transaction after the crash restart)", msg, ref.XID)
	}
	// The end-of-recovery checkpoint's next xid is the boundary: the xid is at or above
	// it (reused) or below it with its own "aborted" (its insert reached the WAL).
	if got.Status() != reconcile.Aborted {
		t.Fatalf("Reconcile = %s %q, want aborted", got.Status(), got.Reason())
	}
}

// TestReconcileAfterCrashRestart resolves references read before a crash restart
// (pg_ctl stop -m immediate): an xid assigned but never WAL-logged, which the restarted
// server has not handed out again, resolves aborted (the next xid restarted below it); a
// commit that reached the WAL stays unknown (server_restarted), because another restart
// in between could have reused its xid and the server keeps no record of it.
func TestReconcileAfterCrashRestart(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := testCtx(t)
	h := newHarness(t, "", 2)
	table := newTable(t, ctx)
	if res := Run(ctx, h.pool, DefaultPolicy(), insertFn(table, 1)); res.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("result = %T", res)
	}
	var durable outcome.ReconciliationRef
	for _, f := range h.frames() {
		if v, ok := attr(f, ReconciliationRefKey); ok {
			r, err := outcome.ParseReconciliationRef(v.AsString())
			if err != nil {
				t.Fatal(err)
			}
			durable = r
		}
	}
	// An xid assigned inside an open transaction writes no WAL.
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background()) // the crash closes it; this only frees it
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
	rec, err := reconcile.New(h.pool, reconcile.WithWait(0, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	checkResolutions(t, ctx, rec, []resolveCase{
		{"assigned, never logged", unlogged, reconcile.Aborted, ""},
		{"committed before the crash", durable, reconcile.Unknown, reconcile.ReasonServerRestarted},
	})
	if !rowExists(t, ctx, table, 1) {
		t.Error("the committed row is gone after the crash restart")
	}
}
