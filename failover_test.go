package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// startCluster starts a pgtest.Cluster for the test, with table t (id int primary key).
func startCluster(t *testing.T, ctx context.Context) *pgtest.Cluster {
	t.Helper()
	c := pgtest.ClusterFor(t, ctx)
	if err := c.Primary().Exec(ctx, "create table t (id int primary key)"); err != nil {
		t.Fatal(err)
	}
	return c
}

// clusterRowExists reads table t on the cluster's primary.
func clusterRowExists(t *testing.T, ctx context.Context, c *pgtest.Cluster, id int) bool {
	t.Helper()
	conn, err := c.Primary().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "select count(*) from t where id = $1", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// clusterReconciler returns a reconciler on a fresh connection that follows the primary
// (the pool's connections to a crashed primary fail once before the pool drops them).
func clusterReconciler(t *testing.T, ctx context.Context, c *pgtest.Cluster) *reconcile.Reconciler {
	t.Helper()
	conn, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	rec, err := reconcile.New(conn, reconcile.WithWait(0, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// runInBackground starts Run with fn on pool under p and returns, once fn runs, its
// backend's pid and the result to come.
func runInBackground(ctx context.Context, pool *pgxpool.Pool, p Policy, fn func(context.Context, pgx.Tx) (int, error)) (uint32, <-chan outcome.Result[int]) {
	pids := make(chan uint32, 1)
	done := make(chan outcome.Result[int], 1)
	go func() {
		done <- Run(ctx, pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
			pids <- tx.Conn().PgConn().PID()
			return fn(ctx, tx)
		})
	}()
	return <-pids, done
}

// loseInFailover stops the standby, runs fn under p, promotes the standby while the
// COMMIT waits for synchronous replication and returns the indeterminate result's
// reference.
func loseInFailover(t *testing.T, ctx context.Context, c *pgtest.Cluster, pool *pgxpool.Pool, p Policy,
	fn func(context.Context, pgx.Tx) (int, error)) (outcome.ReconciliationRef, bool) {
	t.Helper()
	if err := c.Standby().StopImmediate(); err != nil {
		t.Fatal(err)
	}
	pid, done := runInBackground(ctx, pool, p, fn)
	if err := c.Primary().WaitForWaitEvent(ctx, pid, "SyncRep"); err != nil {
		t.Fatal(err)
	}
	if err := c.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	ind, ok := (<-done).(outcome.Indeterminate[int])
	if !ok {
		t.Fatal("the commit lost in the failover is not indeterminate")
	}
	return ind.Reference()
}

// resolveCase is a reference and the resolution the reconciler must give it.
type resolveCase struct {
	name   string
	ref    outcome.ReconciliationRef
	want   reconcile.Status
	reason string
}

// checkResolutions resolves every case with rec (reconciletest.Check, shared with the
// reconcile package's tests).
func checkResolutions(t *testing.T, ctx context.Context, rec *reconcile.Reconciler, cases []resolveCase) {
	t.Helper()
	for _, c := range cases {
		reconciletest.Check(t, ctx, rec, []reconciletest.Case{{Name: c.name, Ref: c.ref, Want: c.want, Reason: c.reason}})
	}
}

// frameRef returns the tx.reconciliation.ref of the only frame span whose outcome is want.
func frameRef(t *testing.T, h *harness, want string) outcome.ReconciliationRef {
	t.Helper()
	for _, f := range h.frames() {
		if v, _ := attr(f, OutcomeKey); v.AsString() != want {
			continue
		}
		ref, ok := refOf(t, f)
		if !ok {
			t.Fatalf("the %s frame has no %s", want, ReconciliationRefKey)
		}
		return ref
	}
	t.Fatalf("no %s frame", want)
	return outcome.ReconciliationRef{}
}

// TestAsyncCommitLostInFailover documents what asynchronous replication costs at a
// failover: Run returns Committed and the frame says committed (what the client saw),
// then the standby, which never received the commit, is promoted and the row is gone.
// The library cannot know at commit time — the old primary acknowledged the commit — but
// the frame's reference, reconciled on the new primary, says aborted: the next xid of the
// new timeline never passed the xid, so its commit record is not in the surviving history.
func TestAsyncCommitLostInFailover(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	c := startCluster(t, ctx)
	h := newHarness(t, c.ConnString(), 2)
	// The standby stops receiving, as when the network between the nodes fails.
	if err := c.Standby().StopImmediate(); err != nil {
		t.Fatal(err)
	}
	res := Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		if _, err := tx.Exec(ctx, "set local synchronous_commit = local"); err != nil {
			return 0, err
		}
		_, err := tx.Exec(ctx, "insert into t values (1)")
		return 1, err
	})
	if _, ok := res.(outcome.Committed[int]); !ok {
		t.Fatalf("result = %T %+v, want Committed", res, res)
	}
	ref := frameRef(t, h, "committed")
	if err := c.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if clusterRowExists(t, ctx, c, 1) {
		t.Fatal("the row is on the new primary: the standby had the commit after all")
	}
	got, err := clusterReconciler(t, ctx, c).Resolve(ctx, ref, trace.SpanContext{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("committed frame %s after the failover: %s %q", ref, got.Status(), got.Reason())
	if got.Status() != reconcile.Aborted {
		t.Errorf("Resolve = %s %q, want aborted: the commit is not in the surviving history", got.Status(), got.Reason())
	}
}

// TestReconcilerAsOrdinaryRole: everything the reconciler and the identity read use is
// readable by a role without privileges (pg_control_system(), pg_control_checkpoint(),
// pg_walfile_name(), pg_xact_status()), while what would place a fork exactly, the
// timeline history files, is not (pg_read_binary_file needs pg_read_server_files), and
// commit timestamps are off by default.
func TestReconcilerAsOrdinaryRole(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	if err := srv.Exec(ctx, "drop role if exists reconcile_app; create role reconcile_app login"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://reconcile_app@%s:%d/postgres?sslmode=disable", srv.Host(), srv.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var xid uint64
	if err := conn.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, identitySQL, pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		t.Fatal(err)
	}
	col := make([]string, reference.ColMarker)
	for rows.Next() {
		for i, v := range rows.RawValues() {
			col[i] = string(v) // the xid probe (reference.ColXIDRead) is NULL outside a transaction
		}
	}
	if rows.Close(); rows.Err() != nil {
		t.Fatalf("identity read as an ordinary role: %v", rows.Err())
	}
	if col[reference.ColCheckpointLSN] == "" || col[reference.ColFlushLSN] == "" {
		t.Fatalf("identity read as an ordinary role: no checkpoint or flush position in %q", col)
	}
	ref, err := outcome.ParseReconciliationRef(fmt.Sprintf("pg:%s/%s/%d/%s/%s;flushed=%s", col[reference.ColSystem],
		col[reference.ColTimeline], xid, col[reference.ColStart], col[reference.ColStatsReset], col[reference.ColFlushLSN]))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(conn, reconcile.WithWait(0, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	got, err := rec.Resolve(ctx, ref, trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Committed {
		t.Fatalf("Resolve as an ordinary role = %s %q, %v; want committed", got.Status(), got.Reason(), err)
	}
	for q, code := range map[string]string{
		"select pg_read_binary_file('pg_wal/00000001.history')": "42501",
		"select pg_ls_waldir()":                                 "42501",
		"select pg_xact_commit_timestamp('3'::xid)":             "55000", // track_commit_timestamp = off
	} {
		_, err := conn.Exec(ctx, q)
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != code {
			t.Errorf("%s as an ordinary role: %v, want SQLSTATE %s", q, err, code)
		}
	}
}

// TestIdentityOnStandby: the identity check ahead of BEGIN gives a connection to a
// standby no identity (no xid can be assigned there, and the timeline it would show is
// the one being replayed) and leaves the connection usable, and on the primary it reads
// the timeline the primary writes WAL on.
func TestIdentityOnStandby(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	c := startCluster(t, ctx)
	for _, tc := range []struct {
		name     string
		s        *pgtest.Server
		identity bool
	}{{"standby", c.Standby(), false}, {"primary", c.Primary(), true}} {
		conn := instrumentedConn(t, ctx, tc.s.ConnString())
		if err := checkReferences(ctx, conn, reference.Refs{Mode: reference.XID}); err != nil {
			t.Fatalf("%s: the identity read broke the connection: %v", tc.name, err)
		}
		if err := conn.Ping(ctx); err != nil {
			t.Fatalf("%s: connection unusable after the identity read: %v", tc.name, err)
		}
		sys, timeline, _, _ := frame.State(conn.PgConn()).Refs.Identity()
		if got := sys != 0; got != tc.identity || tc.identity && timeline != 1 {
			t.Errorf("%s: identity read %v (timeline %d), want %v", tc.name, got, timeline, tc.identity)
		}
		_ = conn.Close(ctx)
	}
}
