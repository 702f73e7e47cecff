package otelpgxtx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// createMarker runs MarkerTableDDL for table through exec.
func createMarker(t *testing.T, ctx context.Context, exec func(context.Context, string, ...any) error, table pgx.Identifier) {
	t.Helper()
	ddl, err := reconcile.MarkerTableDDL(table)
	if err != nil {
		t.Fatal(err)
	}
	if err := exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
}

// commitInSyncRepWait commits, on h's only connection, a plain pgx transaction that
// inserts row id of table after the session statements, and terminates its backend in
// the synchronous-replication wait: the COMMIT committed locally, its reply never came.
// It returns the indeterminate frame's reference.
func commitInSyncRepWait(t *testing.T, ctx context.Context, h *harness, table string, id int, session ...string) outcome.ReconciliationRef {
	t.Helper()
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	mustExec(t, ctx, conn, session...)
	if err, _ := syncRepTerminate(t, ctx, conn.Conn(), table, id); err == nil {
		t.Fatal("COMMIT terminated in its wait returned no error")
	}
	if !rowExists(t, ctx, table, id) {
		t.Fatal("the transaction terminated in its synchronous-replication wait did not commit locally")
	}
	return frameRef(t, h, "indeterminate")
}

// TestMarkerSearchPath is the wrong answer of the issue that made the marker a function:
// an application whose session runs SET search_path TO tenant, public, where tenant has a
// marker table of its own. An unqualified marker is refused; with the qualified one, a
// COMMIT made indeterminate (terminated in its synchronous-replication wait) that
// committed writes its marker where the option named, its reference names that database
// and table, and the reconciler — whatever its own search_path — answers committed and
// fences nothing anywhere.
func TestMarkerSearchPath(t *testing.T) {
	ctx := testCtx(t)
	if _, err := newTracer([]Option{WithCommitMarker(pgx.Identifier{"sp_marker"})}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("an unqualified marker: %v, want ErrInvalidArgument", err)
	}
	configured, decoy := pgx.Identifier{"public", "sp_marker"}, pgx.Identifier{"tenant_sp", "sp_marker"}
	createMarker(t, ctx, srv.Exec, configured)
	createMarker(t, ctx, srv.Exec, decoy)
	table := newTable(t, ctx)
	h := newHarness(t, "", 1, WithCommitMarker(configured))
	ref := commitInSyncRepWait(t, ctx, h, table, 1, "set search_path to tenant_sp, public")
	if !ref.HasMarker() || ref.MarkerDatabase() != "postgres" || ref.MarkerRelation() != `"public"."sp_marker"` || ref.XID == 0 {
		t.Fatalf("reference %s, want the marker in postgres.public.sp_marker and the xid", ref)
	}
	// The reconciler's session has the application's search_path, the decoy first.
	rconn, err := pgx.Connect(ctx, srv.ConnString()+"&search_path=tenant_sp,public")
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close(ctx)
	rec, err := reconcile.New(rconn, reconcile.WithWait(5*time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	got, err := rec.Resolve(ctx, ref, trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Committed {
		t.Fatalf("Resolve(%s) = %s %q, %v; want committed", ref, got.Status(), got.Reason(), err)
	}
	if n := srvCount(t, ctx, "select count(*) from tenant_sp.sp_marker"); n != 0 {
		t.Errorf("%d rows in the decoy marker table, want none", n)
	}
	if n := srvCount(t, ctx, "select count(*) from public.sp_marker where operation_id = $1::uuid and not fenced", ref.Operation.String()); n != 1 {
		t.Errorf("%d unfenced marker rows of the operation in the configured table, want 1", n)
	}
}

// TestMarkerOtherDatabase: a marker reference asked of a reconciler connected to another
// database of the same cluster, which has a marker table of the same name, is unknown
// other_database and fences nothing there; asked of the right one, committed.
func TestMarkerOtherDatabase(t *testing.T) {
	ctx := testCtx(t)
	if srvCount(t, ctx, "select count(*) from pg_database where datname = 'otelpgxtx_other'") == 0 {
		if err := srv.Exec(ctx, "create database otelpgxtx_other"); err != nil {
			t.Fatal(err)
		}
	}
	marker := pgx.Identifier{"public", "db_marker"}
	createMarker(t, ctx, srv.Exec, marker)
	otherURL := strings.Replace(srv.ConnString(), "/postgres?", "/otelpgxtx_other?", 1)
	other, err := pgx.Connect(ctx, otherURL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	createMarker(t, ctx, func(ctx context.Context, sql string, args ...any) error {
		_, err := other.Exec(ctx, sql, args...)
		return err
	}, marker)
	table := newTable(t, ctx)
	h := newHarness(t, "", 1, WithCommitMarker(marker))
	ref := commitInSyncRepWait(t, ctx, h, table, 1)
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
	rec, err = reconcile.New(h.pool, reconcile.WithWait(5*time.Second, 10*time.Millisecond))
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
	ctx, proxy, h, table, marker := markerProxied(t, srv.ConnString(), 2)
	rec, err := reconcile.New(h.pool, reconcile.WithWait(time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cut := func(arm func(), id int) outcome.Indeterminate[int] { return cutRun(t, ctx, h, marker, table, arm, id) }
	after := cut(proxy.CutAfterCommit, 1)
	ref, ok := after.Reference()
	if !ok || !ref.HasMarker() || ref.XID != 0 || ref.CheckedAt == 0 {
		t.Fatalf("reference %s (%v), want the marker alone, its xid never arrived", ref, ok)
	}
	if err := srv.WaitQuiet(ctx); err != nil {
		t.Fatal(err)
	}
	count := func() int { return srvCount(t, ctx, "select count(*) from "+marker.Sanitize()) }
	// A prune keeping an hour: nothing removed, a horizon recorded, nothing changes.
	if n, err := reconcile.PruneMarkers(ctx, h.pool, marker, time.Hour); err != nil || n != 0 {
		t.Fatalf("PruneMarkers(1h) = %d, %v", n, err)
	}
	before := cut(proxy.CutBeforeCommit, 2)
	checkResolutions(t, ctx, rec, []resolveCase{{"cut after COMMIT", ref, reconcile.Committed, ""}})
	bref, _ := before.Reference()
	checkResolutions(t, ctx, rec, []resolveCase{{"cut before COMMIT, after an old horizon", bref, reconcile.Aborted, ""}})
	rows := count() // the committed marker, the horizon, the fence of the one cut before
	if n, err := reconcile.PruneMarkers(ctx, h.pool, marker, time.Microsecond); err != nil || n != 2 {
		t.Fatalf("PruneMarkers(1µs) = %d, %v; want the marker and the fence", n, err)
	}
	checkResolutions(t, ctx, rec, []resolveCase{{"cut after COMMIT, pruned", ref, reconcile.Unknown, reconcile.ReasonMarkerPruned}})
	got, err := rec.ResolveAssertedMarker(ctx, marker, after.OperationID(), trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonMarkerPruned {
		t.Fatalf("ResolveAssertedMarker after the prune: %s %q, %v; want unknown marker_pruned", got.Status(), got.Reason(), err)
	}
	if n := count(); n != rows-2 {
		t.Fatalf("%d marker rows after the prune and the questions, want %d: the horizon alone, nothing fenced", n, rows-2)
	}
	if !rowExists(t, ctx, table, 1) || rowExists(t, ctx, table, 2) {
		t.Fatal("the table does not match: want row 1 only")
	}
}

// TestMarkerEvidenceConflict: where the reference's xid is conclusive on the server asked,
// a marker that says otherwise is no answer: unknown evidence_conflict, logged, nothing
// fenced. A committed transaction whose marker row was deleted by hand, and an aborted
// one whose marker row was inserted by hand; where they agree, the xid answers and the
// marker table is left as it was.
func TestMarkerEvidenceConflict(t *testing.T) {
	ctx := testCtx(t)
	marker := newMarkerTable(t, ctx, srv.Exec)
	table := newTable(t, ctx)
	h := newHarness(t, "", 1, WithCommitMarker(marker))
	var logs bytes.Buffer
	rec, err := reconcile.New(h.pool, reconcile.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	tx := mustBegin(t, ctx, h.pool)
	mustExec(t, ctx, tx, fmt.Sprintf("insert into %s values (1)", table))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committed := frameRef(t, h, "committed")
	if !committed.HasMarker() || committed.XID == 0 {
		t.Fatalf("reference %s, want a marker and an xid", committed)
	}
	// An aborted xid of the same incarnation, given a marker reference of its own.
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var abortedXID uint64
	atx := mustBegin(t, ctx, conn)
	if err := atx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&abortedXID); err != nil {
		t.Fatal(err)
	}
	_ = atx.Rollback(ctx)
	conn.Release()
	aborted := committed
	aborted.XID, aborted.Operation = abortedXID, outcome.NewOperationID()
	count := func() int { return srvCount(t, ctx, "select count(*) from "+marker.Sanitize()) }
	checkResolutions(t, ctx, rec, []resolveCase{
		{"committed, its marker there", committed, reconcile.Committed, ""},
		{"aborted, no marker", aborted, reconcile.Aborted, ""},
	})
	if n := count(); n != 1 {
		t.Fatalf("%d marker rows, want the committed one alone: the xid decided, nothing fenced", n)
	}
	mustExec(t, ctx, h.pool, "delete from "+marker.Sanitize())
	mustExec(t, ctx, h.pool, "insert into "+marker.Sanitize()+" (operation_id) values ('"+aborted.Operation.String()+"')")
	checkResolutions(t, ctx, rec, []resolveCase{
		{"committed, its marker deleted", committed, reconcile.Unknown, reconcile.ReasonEvidenceConflict},
		{"aborted, a marker inserted", aborted, reconcile.Unknown, reconcile.ReasonEvidenceConflict},
	})
	if n := count(); n != 1 || srvCount(t, ctx, "select count(*) from "+marker.Sanitize()+" where fenced") != 0 {
		t.Fatalf("%d marker rows, want the hand-inserted one alone, unfenced", n)
	}
	if !strings.Contains(logs.String(), "contradicts") || strings.Count(logs.String(), "\n") < 2 {
		t.Fatalf("the conflicts were not logged: %q", logs.String())
	}
}
