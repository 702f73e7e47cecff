package reconcile_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestReconcileBackendKilled: a backend killed with SIGKILL, as the OOM killer does,
// makes the postmaster replay WAL in place, keeping its start time and timeline, and
// the xids whose records were lost are handed out again. Six transactions are caught by
// one kill, each with the xid alone and with the commit marker: two in the synchronous-
// replication wait of their COMMIT (the commit record flushed: they committed), two in a
// deferred trigger of their COMMIT and two idle in the transaction (nothing flushed: they
// did not). After recovery, transactions that commit take every lost xid again, so
// pg_xact_status says "committed" of each. Asked before that reuse and after it, the
// reconciler must never answer committed for a row that is not there nor aborted for one
// that is; with the marker it settles every one. A reference taken after the recovery is
// answered committed.
func TestReconcileBackendKilled(t *testing.T) {
	pgtest.LeakCheck(t) // registered first, so it runs after the pool's Close
	ctx := pgtest.ContextFor(t)
	plain, held := srv.NewTable(t, ctx, "id int primary key"), srv.NewTable(t, ctx, "id int primary key")
	reuse := srv.NewTable(t, ctx, "id int primary key")
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	if err := srv.Exec(ctx, `create or replace function kill_hold() returns trigger language plpgsql as $$
		begin perform pg_advisory_lock(4243); perform pg_advisory_unlock(4243); return null; end $$;
		create constraint trigger kill_hold after insert on `+held+` deferrable initially deferred
		for each row execute function kill_hold()`); err != nil {
		t.Fatal(err)
	}
	holder := newConn(t, ctx, srv)
	if _, err := holder.Exec(ctx, "select pg_advisory_lock(4243)"); err != nil {
		t.Fatal(err)
	}
	type victim struct {
		name  string
		table string
		id    int
		ref   outcome.ReconciliationRef
		conn  *pgx.Conn
		done  <-chan error // the COMMIT's error, nil while idle in the transaction
		want  reconcile.Status
		why   string
	}
	begin := func(v *victim, marked bool, setup string) pgx.Tx {
		v.conn = newConn(t, ctx, srv)
		if setup != "" {
			if _, err := v.conn.Exec(ctx, setup); err != nil {
				t.Fatal(err)
			}
		}
		var tx pgx.Tx
		if marked {
			tx, v.ref = insertMarked(t, ctx, v.conn, marker, v.table, v.id)
		} else {
			tx, v.ref = insertRef(t, ctx, v.conn, v.table, v.id)
		}
		return tx
	}
	// No WAL reaches the disk but by the victims' own commits: the others' records stay in
	// WAL buffers, and the kill loses them.
	release, err := srv.HoldBackgroundWriters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	// The synchronous-replication waits first: flushing their commit records flushes
	// every record before them, and the others' must stay unflushed.
	syncXID := victim{name: "sync wait, xid", table: plain, id: 1, want: reconcile.Unknown, why: reconcile.ReasonCrashRecovered}
	syncMarker := victim{name: "sync wait, marker", table: plain, id: 2, want: reconcile.Committed}
	for i, v := range []*victim{&syncXID, &syncMarker} {
		tx := begin(v, i == 1, "set synchronous_commit = on")
		v.done = commitWaiting(t, ctx, srv, v.conn, tx, "SyncRep")
	}
	triggerXID := victim{name: "deferred trigger, xid", table: held, id: 3, want: reconcile.Unknown, why: reconcile.ReasonCrashRecovered}
	triggerMarker := victim{name: "deferred trigger, marker", table: held, id: 4, want: reconcile.Aborted}
	for i, v := range []*victim{&triggerXID, &triggerMarker} {
		tx := begin(v, i == 1, "")
		v.done = commitWaiting(t, ctx, srv, v.conn, tx, "advisory")
	}
	idleXID := victim{name: "idle in transaction, xid", table: plain, id: 5, want: reconcile.Unknown, why: reconcile.ReasonCrashRecovered}
	idleMarker := victim{name: "idle in transaction, marker", table: plain, id: 6, want: reconcile.Aborted}
	begin(&idleXID, false, "")
	begin(&idleMarker, true, "")
	victims := []*victim{&syncXID, &syncMarker, &triggerXID, &triggerMarker, &idleXID, &idleMarker}

	if err := srv.KillBackend(ctx, triggerXID.conn.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	for _, v := range victims {
		if v.done != nil {
			if err := <-v.done; err == nil {
				t.Fatalf("%s: COMMIT succeeded on a backend ended by crash recovery", v.name)
			}
		}
	}
	rec, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithWait(time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Asked before the lost xids are handed out again: the server's next xid fell below
	// them, and the xid alone answers aborted for those. The xid references first: a
	// marker's fence is a transaction, which takes the next xid.
	before := map[*victim]reconcile.Status{&syncXID: reconcile.Unknown, &syncMarker: reconcile.Committed, &triggerXID: reconcile.Aborted,
		&triggerMarker: reconcile.Aborted, &idleXID: reconcile.Aborted, &idleMarker: reconcile.Aborted}
	var early []reconciletest.Case
	for _, v := range []*victim{&syncXID, &triggerXID, &idleXID, &syncMarker, &triggerMarker, &idleMarker} {
		c := reconciletest.Case{Name: v.name + ", before the reuse", Ref: v.ref, Want: before[v]}
		if c.Want == reconcile.Unknown {
			c.Reason = reconcile.ReasonCrashRecovered
		}
		early = append(early, c)
	}
	reconciletest.Check(t, ctx, rec, early)
	// Transactions after the recovery take the lost xids again, and commit.
	last := uint64(0)
	for _, v := range victims {
		last = max(last, v.ref.XID)
	}
	conn := newConn(t, ctx, srv)
	var after outcome.ReconciliationRef
	for n := 0; after.XID < last; n++ {
		if n > len(victims) {
			t.Fatalf("%d transactions after the recovery reached xid %d, short of %d: the lost xids were not handed out again", n, after.XID, last)
		}
		var tx pgx.Tx
		tx, after = insertRef(t, ctx, conn, reuse, n)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range victims {
		if st, _, err := srv.XactStatus(ctx, v.ref.XID); err != nil || st != "committed" {
			t.Fatalf("%s: pg_xact_status(%d) = %q, %v after the reusers; want committed", v.name, v.ref.XID, st, err)
		}
	}
	cases := []reconciletest.Case{{Name: "committed after the recovery", Ref: after, Want: reconcile.Committed}}
	for _, v := range victims {
		present := srv.RowExists(t, ctx, v.table, v.id)
		if present != (v.want == reconcile.Committed || v.done != nil && v.table == plain) {
			t.Errorf("%s: row present %v after crash recovery", v.name, present)
		}
		cases = append(cases, reconciletest.Case{Name: v.name, Ref: v.ref, Want: v.want, Reason: v.why})
	}
	reconciletest.Check(t, ctx, rec, cases)
}
