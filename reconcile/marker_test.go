package reconcile_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// insertMarked is insertRef with the commit marker of marker written in the transaction,
// as the instrumentation's call in COMMIT's write does, and the reference naming it: the
// connection's database and clock read before BEGIN, a fresh operation id. Committed, the
// marker row stands; rolled back, it is gone with the insert, as when the COMMIT never
// reached the server.
func insertMarked(t *testing.T, ctx context.Context, conn *pgx.Conn, marker pgx.Identifier, table string, id int) (pgx.Tx, outcome.ReconciliationRef) {
	t.Helper()
	var database string
	var checkedAt int64
	if err := conn.QueryRow(ctx, "select current_database(), (extract(epoch from now()) * 1000000)::bigint").Scan(&database, &checkedAt); err != nil {
		t.Fatal(err)
	}
	tx, ref := insertRef(t, ctx, conn, table, id)
	quoted, err := markertable.Quote(marker...)
	if err != nil {
		t.Fatal(err)
	}
	if ref.MarkerTable, err = markertable.RefTable(database, quoted); err != nil {
		t.Fatal(err)
	}
	ref.Operation, ref.CheckedAt = outcome.NewOperationID(), checkedAt
	var wrote string
	if err := tx.QueryRow(ctx, "select "+quoted+"($1::uuid)", ref.Operation.String()).Scan(&wrote); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("m%d", ref.XID); wrote != want {
		t.Fatalf("the marker function returned %q, want %q: the marker and the xid", wrote, want)
	}
	return tx, ref
}

// TestMarkerOtherDatabase: a marker reference asked of a reconciler connected to another
// database of the same cluster, which has a marker table of the same name, is unknown
// other_database and fences nothing there; asked of the right one, committed.
func TestMarkerOtherDatabase(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	if count(t, ctx, srv, "select count(*) from pg_database where datname = 'otelpgxtx_other'") == 0 {
		if err := srv.Exec(ctx, "create database otelpgxtx_other"); err != nil {
			t.Fatal(err)
		}
	}
	marker := pgx.Identifier{"public", "db_marker"}
	reconciletest.CreateMarker(t, ctx, srv.Exec, marker)
	otherURL := strings.Replace(srv.ConnString(), "/postgres?", "/otelpgxtx_other?", 1)
	other, err := pgx.Connect(ctx, otherURL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	reconciletest.CreateMarker(t, ctx, func(ctx context.Context, sql string, args ...any) error {
		_, err := other.Exec(ctx, sql, args...)
		return err
	}, marker)
	table := srv.NewTable(t, ctx, "id int primary key")
	conn := newConn(t, ctx, srv)
	tx, ref := insertMarked(t, ctx, conn, marker, table, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !ref.HasMarker() || ref.MarkerDatabase() != "postgres" || !srv.RowExists(t, ctx, table, 1) {
		t.Fatalf("reference %s, want the marker in postgres, and the row committed", ref)
	}
	rec, err := reconcile.New(other, reconcile.WithWait(time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rec.Resolve(ctx, ref, trace.SpanContext{}); err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonOtherDatabase {
		t.Fatalf("asked of the other database: %s %q, %v; want unknown other_database", got.Status(), got.Reason(), err)
	}
	var n int
	if err := other.QueryRow(ctx, "select count(*) from public.db_marker").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows in the other database's marker table (%v), want none: nothing fenced", n, err)
	}
	rec, err = reconcile.New(conn, reconcile.WithWait(5*time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rec.Resolve(ctx, ref, trace.SpanContext{}); err != nil || got.Status() != reconcile.Committed {
		t.Fatalf("asked of the right database: %s %q, %v; want committed", got.Status(), got.Reason(), err)
	}
}

// TestMarkerPruned: a marker reference whose reply never came (the proxy cut the
// connection after COMMIT) is committed while its row is there; once PruneMarkers has
// removed it, unknown marker_pruned — not aborted — and nothing is fenced, by reference
// and by the operator's asserted marker alike. A reference made after a prune whose
// horizon is older than it is still answered: aborted, for a cut before COMMIT.
func TestMarkerPruned(t *testing.T) {
	pgtest.LeakCheck(t) // registered first, so it runs after the pool's Close
	ctx := pgtest.ContextFor(t)
	table, marker := srv.NewTable(t, ctx, "id int primary key"), reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	pool := srv.Pool(t, ctx)
	rec, err := reconcile.New(pool, reconcile.WithWait(time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	conn := newConn(t, ctx, srv)
	// A reply that never came: the marker is committed, the xid never arrived.
	tx, ref := insertMarked(t, ctx, conn, marker, table, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ref.XID = 0
	if !ref.HasMarker() || ref.CheckedAt == 0 {
		t.Fatalf("reference %s, want the marker alone, its xid never arrived", ref)
	}
	markers := func() int { return count(t, ctx, srv, "select count(*) from "+marker.Sanitize()) }
	// A prune keeping an hour: nothing removed, a horizon recorded, nothing changes.
	if n, err := reconcile.PruneMarkers(ctx, pool, marker, time.Hour); err != nil || n != 0 {
		t.Fatalf("PruneMarkers(1h) = %d, %v", n, err)
	}
	// COMMIT never sent: rolled back, the marker with it; the xid never arrived.
	tx, bref := insertMarked(t, ctx, conn, marker, table, 2)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	bref.XID = 0
	reconciletest.Check(t, ctx, rec, []reconciletest.Case{{Name: "cut after COMMIT", Ref: ref, Want: reconcile.Committed}})
	reconciletest.Check(t, ctx, rec, []reconciletest.Case{{Name: "cut before COMMIT, after an old horizon", Ref: bref, Want: reconcile.Aborted}})
	rows := markers() // the committed marker, the horizon, the fence of the one cut before
	if n, err := reconcile.PruneMarkers(ctx, pool, marker, time.Microsecond); err != nil || n != 2 {
		t.Fatalf("PruneMarkers(1µs) = %d, %v; want the marker and the fence", n, err)
	}
	reconciletest.Check(t, ctx, rec, []reconciletest.Case{{Name: "cut after COMMIT, pruned", Ref: ref, Want: reconcile.Unknown, Reason: reconcile.ReasonMarkerPruned}})
	got, err := rec.ResolveAssertedMarker(ctx, marker, ref.Operation, trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonMarkerPruned {
		t.Fatalf("ResolveAssertedMarker after the prune: %s %q, %v; want unknown marker_pruned", got.Status(), got.Reason(), err)
	}
	if n := markers(); n != rows-2 {
		t.Fatalf("%d marker rows after the prune and the questions, want %d: the horizon alone, nothing fenced", n, rows-2)
	}
	if !srv.RowExists(t, ctx, table, 1) || srv.RowExists(t, ctx, table, 2) {
		t.Fatal("the table does not match: want row 1 only")
	}
}

// TestMarkerEvidenceConflict: where the reference's xid is conclusive on the server asked,
// a marker that says otherwise is no answer: unknown evidence_conflict, logged, nothing
// fenced. A committed transaction whose marker row was deleted by hand, and an aborted
// one whose marker row was inserted by hand; where they agree, the xid answers and the
// marker table is left as it was.
func TestMarkerEvidenceConflict(t *testing.T) {
	pgtest.LeakCheck(t) // registered first, so it runs after the pool's Close
	ctx := pgtest.ContextFor(t)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	table := srv.NewTable(t, ctx, "id int primary key")
	pool := srv.Pool(t, ctx)
	var logs bytes.Buffer
	rec, err := reconcile.New(pool, reconcile.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	conn := newConn(t, ctx, srv)
	tx, committed := insertMarked(t, ctx, conn, marker, table, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !committed.HasMarker() || committed.XID == 0 {
		t.Fatalf("reference %s, want a marker and an xid", committed)
	}
	// An aborted xid of the same incarnation, given a marker reference of its own.
	atx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var abortedXID uint64
	if err := atx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&abortedXID); err != nil {
		t.Fatal(err)
	}
	if err := atx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	aborted := committed
	aborted.XID, aborted.Operation = abortedXID, outcome.NewOperationID()
	markers := func() int { return count(t, ctx, srv, "select count(*) from "+marker.Sanitize()) }
	reconciletest.Check(t, ctx, rec, []reconciletest.Case{
		{Name: "committed, its marker there", Ref: committed, Want: reconcile.Committed},
		{Name: "aborted, no marker", Ref: aborted, Want: reconcile.Aborted},
	})
	if n := markers(); n != 1 {
		t.Fatalf("%d marker rows, want the committed one alone: the xid decided, nothing fenced", n)
	}
	if err := srv.Exec(ctx, "delete from "+marker.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Exec(ctx, "insert into "+marker.Sanitize()+" (operation_id) values ($1)", aborted.Operation.String()); err != nil {
		t.Fatal(err)
	}
	reconciletest.Check(t, ctx, rec, []reconciletest.Case{
		{Name: "committed, its marker deleted", Ref: committed, Want: reconcile.Unknown, Reason: reconcile.ReasonEvidenceConflict},
		{Name: "aborted, a marker inserted", Ref: aborted, Want: reconcile.Unknown, Reason: reconcile.ReasonEvidenceConflict},
	})
	if n := markers(); n != 1 || count(t, ctx, srv, "select count(*) from "+marker.Sanitize()+" where fenced") != 0 {
		t.Fatalf("%d marker rows, want the hand-inserted one alone, unfenced", n)
	}
	if !strings.Contains(logs.String(), "contradicts") || strings.Count(logs.String(), "\n") < 2 {
		t.Fatalf("the conflicts were not logged: %q", logs.String())
	}
}
