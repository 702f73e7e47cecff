package reconcile_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestReconcileTerminate: a client gone with its transaction open — its backend idle in
// that transaction, which the server has not noticed — leaves its xid in progress, so the
// answer stays unknown (in_progress). With WithTerminate the reconciler ends that backend
// after the wait, as its fence: a role with pg_signal_backend gets aborted (the row is
// absent, the client's connection is gone); a COMMIT in a synchronous-replication wait
// ended the same way stays committed. A role without the right to signal the backend gets
// the refusal as the Resolve's error, and the transaction is untouched.
func TestReconcileTerminate(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, "id int primary key")
	// A run before this one (go test -count) left fence_app the grants on its own table:
	// dropped with the role, so that the test runs again on the same server.
	if err := srv.Exec(ctx, "do $$ begin if exists (select from pg_roles where rolname = 'fence_app') then drop owned by fence_app; end if; end $$;"+
		" drop role if exists fence_app; create role fence_app login; grant all on "+table+" to fence_app;"+
		" drop role if exists fence_rec; create role fence_rec login; grant pg_signal_backend to fence_rec;"+
		" drop role if exists fence_weak; create role fence_weak login"); err != nil {
		t.Fatal(err)
	}
	as := func(role, extra string) *pgx.Conn {
		t.Helper()
		conn, err := pgx.Connect(ctx, strings.Replace(srv.ConnString(), "postgres@", role+"@", 1)+extra)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	// The reconciler's commits need no synchronous standby: a committed answer is final.
	local := "&options=-c%20synchronous_commit%3Dlocal"
	reconciler := func(role string, opts ...reconcile.Option) *reconcile.Reconciler {
		t.Helper()
		rec, err := reconcile.New(as(role, local), append([]reconcile.Option{reconcile.WithWait(50*time.Millisecond, 10*time.Millisecond)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}

	app := as("fence_app", "")
	tx, ref := insertRef(t, ctx, app, table, 1)
	got, err := reconciler("fence_rec").Resolve(ctx, ref, trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonInProgress {
		t.Fatalf("without the option: %v %q, %v; want unknown in_progress", got.Status(), got.Reason(), err)
	}
	got, err = reconciler("fence_weak", reconcile.WithTerminate()).Resolve(ctx, ref, trace.SpanContext{})
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "42501" {
		t.Fatalf("a role that may not signal the backend: %v %q, %v; want the refusal, 42501", got.Status(), got.Reason(), err)
	}
	if _, err := tx.Exec(ctx, "select 1"); err != nil {
		t.Fatalf("the refused fence touched the transaction: %v", err)
	}
	got, err = reconciler("fence_rec", reconcile.WithTerminate()).Resolve(ctx, ref, trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Aborted || srv.RowExists(t, ctx, table, 1) {
		t.Fatalf("fenced: %v %q, %v, row present %v; want aborted, absent", got.Status(), got.Reason(), err, srv.RowExists(t, ctx, table, 1))
	}
	if _, err := tx.Exec(ctx, "select 1"); err == nil {
		t.Fatal("the fenced backend still answers")
	}

	app = as("fence_app", "")
	tx, ref = insertRef(t, ctx, app, table, 2)
	if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
		t.Fatal(err)
	}
	done := commitWaiting(t, ctx, srv, app, tx, "SyncRep")
	got, err = reconciler("fence_rec", reconcile.WithTerminate()).Resolve(ctx, ref, trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Committed || !srv.RowExists(t, ctx, table, 2) {
		t.Fatalf("a COMMIT in a synchronous-replication wait, fenced: %v %q, %v; want committed, row present", got.Status(), got.Reason(), err)
	}
	if err := <-done; err == nil {
		t.Fatal("the fenced COMMIT answered")
	}
}
