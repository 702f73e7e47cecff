package otelpgxtx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

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
	if _, err := syncRepTerminate(t, ctx, conn.Conn(), table, id); err == nil {
		t.Fatal("COMMIT terminated in its wait returned no error")
	}
	if !srv.RowExists(t, ctx, table, id) {
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
	ctx := pgtest.ContextFor(t)
	if _, err := newTracer([]Option{WithCommitMarker(pgx.Identifier{"sp_marker"})}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("an unqualified marker: %v, want ErrInvalidArgument", err)
	}
	configured, decoy := pgx.Identifier{"public", "sp_marker"}, pgx.Identifier{"tenant_sp", "sp_marker"}
	reconciletest.CreateMarker(t, ctx, srv.Exec, configured)
	reconciletest.CreateMarker(t, ctx, srv.Exec, decoy)
	table := srv.NewTable(t, ctx, tableColumns)
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
	if n := srv.CountOf(t, ctx, "select count(*) from tenant_sp.sp_marker"); n != 0 {
		t.Errorf("%d rows in the decoy marker table, want none", n)
	}
	if n := srv.CountOf(t, ctx, "select count(*) from public.sp_marker where operation_id = $1::uuid and not fenced", ref.Operation.String()); n != 1 {
		t.Errorf("%d unfenced marker rows of the operation in the configured table, want 1", n)
	}
}
