package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestReconcileAfterFailover resolves references from the old timeline on the promoted
// standby: a commit lost while it waited for synchronous replication (the standby had
// stopped receiving) resolves aborted, asked before the new timeline hands its xid out
// again and after, when pg_xact_status says committed of the reuser; a transaction rolled back before the
// failover resolves aborted; a commit replicated before the failover stays unknown
// (other_timeline), since the server cannot prove no intermediate incarnation reused it.
func TestReconcileAfterFailover(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	c := pgtest.ClusterFor(t, ctx)
	table := c.Primary().NewTable(t, ctx, "id int primary key")
	app, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(context.Background()) // the crash closes it; this only frees it
	// Replicated before the failover (synchronous_commit = on waits for the standby).
	tx, replicated := insertRef(t, ctx, app, table, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx, _ = insertRef(t, ctx, app, table, 2)
	if _, err := tx.Exec(ctx, "insert into "+table+" values (1)"); err == nil { // duplicate key: rolled back
		t.Fatal("the duplicate insert succeeded")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Lost in the failover: the standby stops, the COMMIT waits for it, the standby is
	// promoted.
	if err := c.Standby().StopImmediate(); err != nil {
		t.Fatal(err)
	}
	tx, lost := insertRef(t, ctx, app, table, 3)
	done := commitWaiting(t, ctx, c.Primary(), app, tx, "SyncRep")
	if err := c.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("the COMMIT lost in the failover succeeded")
	}
	if lost.NoWrites() || lost.Timeline != 1 {
		t.Fatalf("reference %v, want an xid on timeline 1", lost)
	}
	// The promotion requests a checkpoint without waiting for it; until it is done
	// pg_control_checkpoint() shows the old timeline, while WAL is written on the new one.
	var ckptTLI, walTLI int
	if err := c.Primary().Exec(ctx, "checkpoint"); err != nil {
		t.Fatal(err)
	}
	conn := newConn(t, ctx, c.Primary())
	if err := conn.QueryRow(ctx, "select c.timeline_id, "+pg.TimelineSQL+"::int from pg_control_checkpoint() c").Scan(&ckptTLI, &walTLI); err != nil {
		t.Fatal(err)
	}
	if ckptTLI != 2 || walTLI != 2 {
		t.Fatalf("after the checkpoint: checkpoint timeline %d, WAL timeline %d; want 2, 2", ckptTLI, walTLI)
	}
	// A reconciler on a fresh connection that follows the primary.
	rconn, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close(context.Background())
	rec, err := reconcile.New(rconn, reconcile.WithWait(0, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Asked before the new timeline hands the lost xid out again: not assigned there yet.
	reconciletest.Check(t, ctx, rec, []reconciletest.Case{{Name: "lost in the failover, before the reuse", Ref: lost, Want: reconcile.Aborted}})
	// The new timeline hands the lost xid out again until it is passed, and commits it.
	// (synchronous_commit = local: the new primary's standby is down.)
	var reused bool
	for !reused {
		var xid uint64
		if err := conn.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
			t.Fatal(err)
		}
		if xid > lost.XID {
			t.Fatalf("the new timeline passed xid %d without reusing it (next: %d)", lost.XID, xid)
		}
		reused = xid == lost.XID
	}
	if st, _, err := c.Primary().XactStatus(ctx, lost.XID); err != nil || st != "committed" {
		t.Fatalf("pg_xact_status(%d) on the new timeline = %q, %v; want the reuser's committed", lost.XID, st, err)
	}

	reconciletest.Check(t, ctx, rec, []reconciletest.Case{
		{Name: "lost in the failover, xid reused", Ref: lost, Want: reconcile.Aborted},
		{Name: "replicated commit", Ref: replicated, Want: reconcile.Unknown, Reason: reconcile.ReasonOtherTimeline},
	})
	if c.Primary().RowExists(t, ctx, table, 3) || !c.Primary().RowExists(t, ctx, table, 1) || c.Primary().RowExists(t, ctx, table, 2) {
		t.Error("the table does not match: want row 1 only")
	}
}
