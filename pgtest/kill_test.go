package pgtest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

// incarnationFacts is what a server shows of its incarnation: the start time, the timeline
// written on, and the statistics' reset times (the archiver's and the background
// writer's), all as text.
type incarnationFacts struct{ start, timeline, archiverReset, bgwriterReset string }

func readIncarnation(t *testing.T, ctx context.Context, c *pgx.Conn) incarnationFacts {
	t.Helper()
	var f incarnationFacts
	if err := c.QueryRow(ctx, `SELECT pg_postmaster_start_time()::text, substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8),
		(SELECT stats_reset::text FROM pg_stat_archiver), (SELECT stats_reset::text FROM pg_stat_bgwriter)`).Scan(
		&f.start, &f.timeline, &f.archiverReset, &f.bgwriterReset); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestKillBackend shows what the library's crash rule relies on, on each major the tests
// run on: a backend killed with SIGKILL makes the postmaster end every connection and
// replay WAL in place; the start time and the timeline stay, the statistics' reset time
// moves (and is readable by a role without privileges), the killed transaction's insert
// is gone, and its xid, never WAL-logged past its insert's unflushed record, is handed
// to the next transaction. Neither a checkpoint nor ordinary work moves the reset time.
func TestKillBackend(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	srv.FreshTable(t, ctx, "killed", "id int primary key")
	if err := srv.Exec(ctx, "DROP ROLE IF EXISTS kill_reader; CREATE ROLE kill_reader LOGIN"); err != nil {
		t.Fatal(err)
	}
	admin, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	before := readIncarnation(t, ctx, admin)
	if _, err := admin.Exec(ctx, "INSERT INTO killed VALUES (1); CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	if got := readIncarnation(t, ctx, admin); got != before {
		t.Fatalf("a commit and a checkpoint changed the incarnation: %+v, was %+v", got, before)
	}
	reader, err := pgx.Connect(ctx, srv.ConnString()+"&user=kill_reader")
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(context.Background())
	if got := readIncarnation(t, ctx, reader); got != before {
		t.Fatalf("a role without privileges reads %+v, the superuser %+v", got, before)
	}

	victim, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(context.Background())
	release, err := srv.HoldBackgroundWriters(ctx) // the insert's record stays in WAL buffers
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	tx, err := victim.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xid uint64
	if err := tx.QueryRow(ctx, "INSERT INTO killed VALUES (2) RETURNING pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if err := srv.KillBackend(ctx, victim.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("COMMIT on a killed backend succeeded")
	}
	if err := admin.Ping(ctx); err == nil {
		t.Fatal("another connection survived the crash recovery")
	}
	after, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close(context.Background())
	got := readIncarnation(t, ctx, after)
	t.Logf("before: %+v; after: %+v", before, got)
	if got.start != before.start || got.timeline != before.timeline {
		t.Errorf("crash recovery changed the start time or the timeline: %+v, was %+v", got, before)
	}
	if got.archiverReset == before.archiverReset || got.bgwriterReset == before.bgwriterReset {
		t.Errorf("crash recovery kept a statistics reset time: %+v, was %+v", got, before)
	}
	var rows []int
	if err := after.QueryRow(ctx, "SELECT array_agg(id ORDER BY id) FROM killed").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0] != 1 {
		t.Errorf("rows after crash recovery: %v, want [1]", rows)
	}
	// The next transaction that takes an xid is handed the killed one's.
	var next uint64
	if err := after.QueryRow(ctx, "INSERT INTO killed VALUES (3) RETURNING pg_current_xact_id()::text::bigint").Scan(&next); err != nil {
		t.Fatal(err)
	}
	if next != xid {
		t.Errorf("the first xid after crash recovery is %d, want the killed transaction's %d", next, xid)
	}
	if st := srv.Settled(t, ctx, xid); st != "committed" {
		t.Errorf("pg_xact_status(%d) = %s, want committed (the reuser's)", xid, st)
	}
	if err := srv.KillBackend(ctx, 1<<22+1); err == nil {
		t.Error("KillBackend of no process succeeded")
	}
	if err := srv.KillBackend(ctx, uint32(os.Getpid())); err == nil { // survived: it refused
		t.Error("KillBackend of a process that is not the server's succeeded")
	}
	// Released without a kill, the background processes go on: a checkpoint completes.
	release, err = srv.HoldBackgroundWriters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release()
	release()
	if _, err := after.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
}
