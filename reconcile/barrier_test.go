package reconcile_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// commitLocallyOnly inserts id into table on conn in a transaction whose COMMIT waits for
// synchronous replication (setup runs first, in the transaction), and cancels that wait
// on server s: PostgreSQL then warns "committed locally" and reports success. It returns
// the transaction's reference, whose commit record the synchronous standbys never
// confirmed.
func commitLocallyOnly(t *testing.T, ctx context.Context, s *pgtest.Server, conn *pgx.Conn, setup, table string, id int) outcome.ReconciliationRef {
	t.Helper()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, setup); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "insert into "+table+" values ($1)", id); err != nil {
		t.Fatal(err)
	}
	ref := xactRef(t, ctx, tx)
	done := commitWaiting(t, ctx, s, conn, tx, "SyncRep")
	if err := s.Cancel(ctx, conn.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("COMMIT whose synchronous-replication wait was cancelled: %v, want success (committed locally)", err)
	}
	return ref
}

// waitNoBarrier waits until no replication barrier of the reconciler is left on s: one
// given up must have been cancelled, or it would hold a backend until the standbys answer.
func waitNoBarrier(t *testing.T, ctx context.Context, s *pgtest.Server) {
	t.Helper()
	if err := s.WaitForCount(ctx, 0, "replication barriers still waiting",
		"select count(*) from pg_stat_activity where application_name like 'otelpgxtx barrier %'"); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileReplicationBarrier: on a primary with a synchronous standby, a commit
// whose synchronous-replication wait was cancelled is committed locally only, and
// pg_xact_status says committed. Asked while the standby is down, the reconciler must
// not say committed: a failover now would lose the transaction. It says unknown
// not_replicated and leaves no barrier behind. Once the standby is back and confirms, the
// barrier returns and the answer is committed, and a failover after that keeps the row.
func TestReconcileReplicationBarrier(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	c := pgtest.ClusterFor(t, ctx)
	table := c.Primary().NewTable(t, ctx, "id int primary key")
	if err := c.Standby().StopImmediate(); err != nil {
		t.Fatal(err)
	}
	conn := newConn(t, ctx, c.Primary())
	ref := commitLocallyOnly(t, ctx, c.Primary(), conn, "select 1", table, 1)
	if status, _, err := c.Primary().XactStatus(ctx, ref.XID); err != nil || status != "committed" {
		t.Fatalf("pg_xact_status = %q, %v; want committed (locally)", status, err)
	}

	rec, err := reconcile.New(conn, reconcile.WithWait(200*time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	got, err := rec.Resolve(ctx, ref, trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonNotReplicated {
		t.Fatalf("standby down: %s/%s, %v; want unknown/%s", got.Status(), got.Reason(), err, reconcile.ReasonNotReplicated)
	}
	waitNoBarrier(t, ctx, c.Primary())

	// A caller's context that ends during the barrier ends the call with its error, and
	// the barrier is cancelled as well.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	slow, err := reconcile.New(conn, reconcile.WithWait(time.Minute, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_, err = slow.Resolve(short, ref, trace.SpanContext{})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("caller's deadline during the barrier: %v, want context.DeadlineExceeded", err)
	}
	waitNoBarrier(t, ctx, c.Primary())

	if err := c.ResumeStandby(ctx); err != nil {
		t.Fatal(err)
	}
	if conn.IsClosed() {
		// pgx closes a connection whose cancel request did not end the statement within
		// its delay (a second, by default): on a loaded machine the barrier's cancel can
		// take longer. The reconciler works on a connection that is open.
		conn = newConn(t, ctx, c.Primary())
		if rec, err = reconcile.New(conn, reconcile.WithWait(200*time.Millisecond, 20*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	// The reconciler's connection was idle meanwhile; its next statement works.
	got, err = rec.Resolve(ctx, ref, trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Committed {
		t.Fatalf("standby back: %s/%s, %v; want committed", got.Status(), got.Reason(), err)
	}
	if err := c.Failover(ctx); err != nil {
		t.Fatal(err)
	}
	if !c.Primary().RowExists(t, ctx, table, 1) {
		t.Fatal("resolved committed, then lost in the failover")
	}
}

// TestReconcileBarrierLevel: the barrier commits at the synchronous_commit of the
// reconciler's connection. The test server's phantom synchronous standby never answers:
// a reconciler whose connection commits with synchronous_commit = on says not_replicated
// of a commit that only committed locally, for the xid and for the marker; one at the
// server's default (local) says committed, as an acknowledged commit there would be.
func TestReconcileBarrierLevel(t *testing.T) {
	pgtest.LeakCheck(t) // registered first, so it runs after the pool's Close
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, "id int primary key")
	conn := newConn(t, ctx, srv)
	ref := commitLocallyOnly(t, ctx, srv, conn, "set local synchronous_commit = on", table, 1)

	local, err := reconcile.New(conn, reconcile.WithWait(100*time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := local.Resolve(ctx, ref, trace.SpanContext{}); err != nil || got.Status() != reconcile.Committed {
		t.Fatalf("synchronous_commit = local: %s/%s, %v; want committed", got.Status(), got.Reason(), err)
	}

	cfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["synchronous_commit"] = "on"
	onConn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer onConn.Close(ctx)
	poolCfg, err := pgxpool.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	poolCfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	onPool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer onPool.Close()
	var on *reconcile.Reconciler
	// A connection and a pool are cancelled by their cancel key; any other reconcile.Querier by the
	// barrier's name. Each is asked twice: the connection stays usable after a give-up.
	for _, db := range []struct {
		name string
		q    reconcile.Querier
	}{{"pool", onPool}, {"other reconcile.Querier", struct{ reconcile.Querier }{onPool}}, {"conn", onConn}} {
		rec, err := reconcile.New(db.q, reconcile.WithWait(100*time.Millisecond, 10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if got, err := rec.Resolve(ctx, ref, trace.SpanContext{}); err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonNotReplicated {
				t.Fatalf("%s, synchronous_commit = on: %s/%s, %v; want unknown/%s", db.name, got.Status(), got.Reason(), err, reconcile.ReasonNotReplicated)
			}
			waitNoBarrier(t, ctx, srv)
		}
		on = rec
	}

	// The marker's committed answer goes through the same barrier (no commit on this
	// server ever reaches the phantom standby).
	ddl, err := reconcile.MarkerTableDDL(pgx.Identifier{"public", "barrier_markers"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	op := outcome.NewOperationID()
	if _, err := conn.Exec(ctx, "insert into barrier_markers (operation_id) values ($1)", op.String()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rec  *reconcile.Reconciler
		want reconcile.Status
		why  string
	}{{on, reconcile.Unknown, reconcile.ReasonNotReplicated}, {local, reconcile.Committed, ""}} {
		got, err := tc.rec.ResolveAssertedMarker(ctx, pgx.Identifier{"public", "barrier_markers"}, op, trace.SpanContext{})
		if err != nil || got.Status() != tc.want || got.Reason() != tc.why {
			t.Fatalf("marker: %s/%s, %v; want %s/%s", got.Status(), got.Reason(), err, tc.want, tc.why)
		}
		waitNoBarrier(t, ctx, srv)
	}
}
