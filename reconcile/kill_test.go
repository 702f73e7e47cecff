package reconcile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/pg"
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
// that is; with the marker it settles every one. With the xid alone, the two that did not
// commit (the deferred trigger's, the idle one's) are aborted after the reuse too: the
// end-of-recovery checkpoint is at or beyond their references' flush position and its
// next xid at or below their xids (every record of theirs lost); the one that committed
// (the synchronous-replication wait's) stays unknown (crash_recovered: below the boundary
// a reuser after an earlier crash cannot be told from the original). After a
// checkpoint, only a reconciler that saw the end of the recovery, or was told of it (its
// text, as the command reads it from a log record), still answers. A reference taken
// after the recovery is answered committed.
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
	triggerXID := victim{name: "deferred trigger, xid", table: held, id: 3, want: reconcile.Aborted}
	triggerMarker := victim{name: "deferred trigger, marker", table: held, id: 4, want: reconcile.Aborted}
	for i, v := range []*victim{&triggerXID, &triggerMarker} {
		tx := begin(v, i == 1, "")
		v.done = commitWaiting(t, ctx, srv, v.conn, tx, "advisory")
	}
	idleXID := victim{name: "idle in transaction, xid", table: plain, id: 5, want: reconcile.Aborted}
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

	// A checkpoint overwrites the end of the recovery in pg_control: a reconciler that saw
	// it (rec, above) or was told of it (from the record's text, as the command reads it)
	// still answers; one that never saw it cannot, and says so.
	recovery, err := reconcile.ParseRecovery(lastRecovery(t, ctx))
	if err != nil {
		t.Fatal(err)
	}
	pgtest.NoError(t, srv.Exec(ctx, "checkpoint"))
	told, err := reconcile.New(srv.Pool(t, ctx))
	pgtest.NoError(t, err)
	told.Remember(recovery)
	blind, err := reconcile.New(srv.Pool(t, ctx))
	pgtest.NoError(t, err)
	for _, v := range []*victim{&triggerXID, &idleXID} {
		reconciletest.Check(t, ctx, rec, []reconciletest.Case{{Name: v.name + ", after a checkpoint, seen", Ref: v.ref, Want: reconcile.Aborted}})
		reconciletest.Check(t, ctx, told, []reconciletest.Case{{Name: v.name + ", after a checkpoint, told", Ref: v.ref, Want: reconcile.Aborted}})
		reconciletest.Check(t, ctx, blind, []reconciletest.Case{{Name: v.name + ", after a checkpoint, never seen", Ref: v.ref,
			Want: reconcile.Unknown, Reason: reconcile.ReasonCrashRecovered}})
	}
	reconciletest.Check(t, ctx, told, []reconciletest.Case{{Name: "sync wait, xid, after a checkpoint, told", Ref: syncXID.ref,
		Want: reconcile.Unknown, Reason: reconcile.ReasonCrashRecovered}})
}

// lastRecovery is the end of the crash recovery the server's latest checkpoint is, in
// Recovery's text form, as an instrumented connection's check would log it.
func lastRecovery(t *testing.T, ctx context.Context) string {
	t.Helper()
	var sys, start, lsn, next string
	var tli int64
	conn := newConn(t, ctx, srv)
	if err := conn.QueryRow(ctx, "select s.system_identifier::text, k.timeline_id, "+pg.ServerStartSQL+", k.checkpoint_lsn::text, k.next_xid::text"+
		" from pg_control_system() s, pg_control_checkpoint() k where k.redo_lsn = k.checkpoint_lsn").Scan(&sys, &tli, &start, &lsn, &next); err != nil {
		t.Fatalf("the latest checkpoint is not the end of a recovery: %v", err)
	}
	full, err := pg.ParseFullXID(next)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("pgrecovery:%s/%d/%s/%s/%d", sys, tli, start, lsn, full)
}

// TestReconcileTwoCrashes is why a committed status below a crash recovery's next xid is
// not taken for the reference's own: a transaction idle in it loses its xid to a first
// crash recovery, a reuser takes the xid and commits (its commit record flushed), and a
// second crash recovery replays that commit, so that its next xid is above the xid and
// pg_xact_status says committed: the reuser's. The row is not there. Told nothing, or
// seeing only the second recovery, the reconciler answers unknown (crash_recovered); told
// of the first (its log record's text), aborted.
func TestReconcileTwoCrashes(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	plain, reuse := srv.NewTable(t, ctx, "id int primary key"), srv.NewTable(t, ctx, "id int primary key")
	release, err := srv.HoldBackgroundWriters(ctx) // the victim's insert stays in WAL buffers
	pgtest.NoError(t, err)
	t.Cleanup(release)
	victim := newConn(t, ctx, srv)
	_, ref := insertRef(t, ctx, victim, plain, 1)
	pgtest.NoError(t, srv.KillBackend(ctx, victim.PgConn().PID()))
	first, err := reconcile.ParseRecovery(lastRecovery(t, ctx))
	pgtest.NoError(t, err)
	if ref.XID < first.NextXID {
		t.Fatalf("the first recovery's next xid %d is not above the victim's %d: its records were flushed", first.NextXID, ref.XID)
	}
	conn := newConn(t, ctx, srv)
	for n := 0; ; n++ {
		if n > 10 {
			t.Fatalf("%d transactions after the recovery did not reach xid %d", n, ref.XID)
		}
		tx, r := insertRef(t, ctx, conn, reuse, n)
		pgtest.NoError(t, tx.Commit(ctx))
		if r.XID >= ref.XID {
			break
		}
	}
	pgtest.NoError(t, srv.KillBackend(ctx, conn.PgConn().PID()))
	second, err := reconcile.ParseRecovery(lastRecovery(t, ctx))
	pgtest.NoError(t, err)
	if second.NextXID <= ref.XID || second == first {
		t.Fatalf("the second recovery %v does not have the reuser's commit of xid %d", second, ref.XID)
	}
	if st, _, err := srv.XactStatus(ctx, ref.XID); err != nil || st != "committed" {
		t.Fatalf("pg_xact_status(%d) = %q, %v after the second recovery; want committed (the reuser's)", ref.XID, st, err)
	}
	if srv.RowExists(t, ctx, plain, 1) {
		t.Fatal("the victim's row is there")
	}
	seen, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithWait(time.Second, 10*time.Millisecond))
	pgtest.NoError(t, err)
	reconciletest.Check(t, ctx, seen, []reconciletest.Case{{Name: "seeing the second recovery", Ref: ref,
		Want: reconcile.Unknown, Reason: reconcile.ReasonCrashRecovered}})
	told, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithWait(time.Second, 10*time.Millisecond))
	pgtest.NoError(t, err)
	told.Remember(first)
	reconciletest.Check(t, ctx, told, []reconciletest.Case{{Name: "told of the first recovery", Ref: ref, Want: reconcile.Aborted}})
}
