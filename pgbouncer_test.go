package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// checkReference checks that frame f's reference names the transaction that wrote row
// id of table (if id > 0) and that rec resolves it as want.
func checkReference(t *testing.T, ctx context.Context, rec *reconcile.Reconciler, f tracetest.SpanStub, table string, id int, want reconcile.Status) {
	t.Helper()
	ref, err := outcome.ParseReconciliationRef(attrString(t, f, ReconciliationRefKey))
	if err != nil {
		t.Fatal(err)
	}
	if id > 0 {
		xid, err := strconv.ParseUint(attrString(t, f, ReconciliationXIDKey), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if xid != ref.XID {
			t.Fatalf("frame's xid %d, its reference's %d", xid, ref.XID)
		}
		wantWrittenBy(t, ctx, table, id, xid)
	}
	res, err := rec.Resolve(ctx, ref, trace.SpanContext{})
	if err != nil || res.Status() != want {
		t.Fatalf("Resolve(%s): %v %q, %v; want %v", ref, res.Status(), res.Reason(), err, want)
	}
}

// TestReferenceThroughPgBouncer: commit references and reconciliation through a real
// PgBouncer. In transaction mode a client connection's transactions run on whatever
// server connection the pooler hands it; in session mode a client that disconnects
// leaves its server connection, reset with DISCARD ALL, to the next. The reference needs
// no session state (the xid read is a fast-path call by OID, FunctionCall, which
// PgBouncer forwards inside the transaction like a query, after the transaction's
// insert, in its write), and the cluster identity is checked by each client connection
// ahead of its first BEGIN, outside its transactions. So in transaction mode over
// one server connection, in both of pgx's query modes that prepare nothing named (named
// statements do not follow a client to another server connection before PgBouncer
// 1.21), and in session mode with pgx's default mode:
//   - three client connections held at once, taking turns, and six goroutines on a pool
//     of client connections, each commit with a reference whose xid wrote the row,
//     which a reconciler working through PgBouncer resolves as committed;
//   - so do new client connections, after the pool closed all of its own;
//   - a read-only transaction commits with a no-writes reference, and a transaction
//     the function fails rolls back, with no reference;
//   - a commit marker is written and found.
func TestReferenceThroughPgBouncer(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	for _, c := range []struct {
		pooling, queryMode string
		servers            int
		clients            int32
	}{
		{"transaction", "exec", 1, 6},
		{"transaction", "simple_protocol", 1, 6},
		{"session", "cache_statement", 3, 3}, // a session holds its server connection
	} {
		t.Run(c.pooling+"/"+c.queryMode, func(t *testing.T) {
			bouncer := pgtest.PgBouncerFor(t, ctx, srv, c.pooling, c.servers)
			h := newHarness(t, bouncer.ConnString()+"&default_query_exec_mode="+c.queryMode, c.clients)
			rec, err := reconcile.New(h.pool)
			if err != nil {
				t.Fatal(err)
			}
			table := srv.NewTable(t, ctx, tableColumns)
			var mu sync.Mutex
			rows := map[trace.SpanID]int{} // frame span → the row its transaction wrote
			write := func(id int) func(context.Context, pgx.Tx) (int, error) {
				return func(ctx context.Context, tx pgx.Tx) (int, error) {
					mu.Lock()
					rows[trace.SpanContextFromContext(ctx).SpanID()] = id
					mu.Unlock()
					return insertFn(table, id)(ctx, tx)
				}
			}

			// Three client connections held at once take turns.
			held := acquireConns(t, ctx, h.pool, 3)
			for id := 1; id <= 9; id++ {
				if res := Run(ctx, held[id%3].Conn(), DefaultPolicy(), write(id)); res.Outcome() != outcome.OutcomeCommitted {
					t.Fatalf("Run %d on client %d: %T %+v", id, id%3, res, res)
				}
			}
			pids := map[uint32]bool{}
			for _, c := range held {
				pids[c.Conn().PgConn().PID()] = true
			}
			if len(pids) != 3 {
				t.Fatalf("client connections with PgBouncer's PIDs %v, want three", pids)
			}

			for _, c := range held {
				c.Release()
			}

			// Six goroutines, each with a connection of the pool's while it runs.
			var wg sync.WaitGroup
			errs := make(chan error, 24)
			for g := range 6 {
				wg.Go(func() {
					for i := range 4 {
						id := 100 + g*4 + i
						if res := Run(ctx, h.pool, DefaultPolicy(), write(id)); res.Outcome() != outcome.OutcomeCommitted {
							errs <- fmt.Errorf("Run %d: %T %+v", id, res, res)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if t.Failed() {
				return
			}

			// New client connections: in session mode, on server connections that
			// PgBouncer reset with DISCARD ALL when the old clients left.
			h.pool.Reset()
			for id := 200; id < 203; id++ {
				if res := Run(ctx, h.pool, DefaultPolicy(), write(id)); res.Outcome() != outcome.OutcomeCommitted {
					t.Fatalf("Run %d after the reset: %T %+v", id, res, res)
				}
			}

			frames := h.frames()
			if len(frames) != 9+24+3 {
				t.Fatalf("%d frames, want %d", len(frames), 9+24+3)
			}
			xids := map[string]bool{}
			for _, f := range frames {
				id, ok := rows[f.SpanContext.SpanID()]
				if !ok {
					t.Fatalf("frame %s ran no function", f.SpanContext.SpanID())
				}
				checkReference(t, ctx, rec, f, table, id, reconcile.Committed)
				xids[attrString(t, f, ReconciliationXIDKey)] = true
			}
			if len(xids) != len(frames) {
				t.Fatalf("%d distinct xids for %d transactions", len(xids), len(frames))
			}

			// Read-only: a reference without an xid; failed: a rollback without one.
			h.exp.Reset()
			res := Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
				var n int
				err := tx.QueryRow(ctx, "select count(*) from "+table).Scan(&n)
				return n, err
			})
			if c, ok := res.(outcome.Committed[int]); !ok || c.Value() != 36 {
				t.Fatalf("read-only Run: %T %+v, want committed with 36 rows", res, res)
			}
			checkReference(t, ctx, rec, onlyFrame(t, h), table, 0, reconcile.NoWrites)
			h.exp.Reset()
			boom := errors.New("boom")
			res = Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
				if _, err := insertFn(table, 999)(ctx, tx); err != nil {
					return 0, err
				}
				return 0, boom
			})
			if rb, ok := res.(outcome.DeterminateRollback[int]); !ok || !errors.Is(rb.Cause(), boom) {
				t.Fatalf("failing Run: %T %+v, want a rollback caused by the function", res, res)
			}
			if srv.RowExists(t, ctx, table, 999) {
				t.Fatal("the rolled-back row is there")
			}
			if _, ok := attr(onlyFrame(t, h), ReconciliationRefKey); ok {
				t.Fatal("a reference for a transaction that rolled back")
			}

			// A commit marker, written inside the transaction, is found through PgBouncer
			// too (its fence and lock timeout are set for the transaction only).
			marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
			res = Run(ctx, h.pool, markerPolicy(marker), insertFn(table, 300))
			if res.Outcome() != outcome.OutcomeCommitted {
				t.Fatalf("Run with a commit marker: %T %+v", res, res)
			}
			got, err := rec.ResolveAssertedMarker(ctx, marker, res.OperationID(), trace.SpanContext{})
			if err != nil || got.Status() != reconcile.Committed {
				t.Fatalf("ResolveMarker: %v %q, %v; want committed", got.Status(), got.Reason(), err)
			}
		})
	}
}

// TestReferenceThroughPgBouncerIndeterminate: a COMMIT that never answers through
// PgBouncer still leaves a reference, for the server flushed the xid before it read
// COMMIT, and PgBouncer passed it on. A deferred trigger makes COMMIT wait on a lock the
// test holds; once the backend shows that wait and the client has taken every byte
// PgBouncer sent it, the caller gives up (its context is cancelled), and the lock is
// released. The transaction commits on the server, and a reconciler working through
// PgBouncer says so, from the reference alone.
func TestReferenceThroughPgBouncerIndeterminate(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	bouncer := pgtest.PgBouncerFor(t, ctx, srv, "transaction", 1)
	gate := newDialGate()
	h := newHarness(t, bouncer.ConnString()+"&default_query_exec_mode=exec", 2, gate.config())
	rec, err := reconcile.New(h.pool)
	if err != nil {
		t.Fatal(err)
	}
	table := srv.NewTable(t, ctx, tableColumns)
	unlock := commitWaitsOnLock(t, ctx, table)
	pc, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	conn := pc.Conn()
	// Through PgBouncer, conn's PID is PgBouncer's: the backend is found by its query.
	ind, _ := cutWhileCommitWaits(t, ctx, gate, conn, conn, insertFn(table, 1),
		"select count(*) from pg_stat_activity where wait_event = 'advisory' and query = 'commit'")
	unlock()
	got, err := reconcile.Indeterminate(ctx, rec, ind)
	if err != nil || got.Status() != reconcile.Committed {
		t.Fatalf("Reconcile: %v %q, %v; want committed", got.Status(), got.Reason(), err)
	}
	checkReference(t, ctx, rec, onlyFrame(t, h), table, 1, reconcile.Committed)
}

// TestPgBouncerBackendTerminated: through PgBouncer, what the client learns of a backend
// that died is PgBouncer's word, not the server's, and the outcome stays sound. A backend
// terminated in its synchronous-replication wait, after its commit record, is answered by
// PgBouncer with its own FATAL 08P01 "server conn crashed?"; the server's "committed
// locally" warning comes first, passed on: indeterminate, committed locally, never rolled
// back (the truth is committed). One terminated while its COMMIT waits before the commit
// record (on a lock, in a deferred trigger) passes on the server's FATAL 57P01:
// indeterminate, for nothing shows how far COMMIT got (the truth is aborted). One
// terminated during a statement: rolled back, as it is.
func TestPgBouncerBackendTerminated(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	bouncer := pgtest.PgBouncerFor(t, ctx, srv, "transaction", 1)
	for _, c := range []struct {
		name, wait         string
		commit             bool
		truth, out, errTyp string
		locally            bool
	}{
		{"sync-rep wait", "SyncRep", true, "committed", "indeterminate", "connection_lost", true},
		{"commit before its record", "advisory", true, "aborted", "indeterminate", "server_fatal", false},
		{"statement", "PgSleep", false, "aborted", "rolled_back", "server_fatal", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, bouncer.ConnString()+"&default_query_exec_mode=exec", 1)
			table := srv.NewTable(t, ctx, tableColumns)
			unlock := func() {}
			if c.wait == "advisory" {
				unlock = commitWaitsOnLock(t, ctx, table)
			}
			tx := mustBegin(t, ctx, h.pool)
			mustExec(t, ctx, tx, "insert into "+table+" (id, k) values (1, 1)")
			var pid uint32 // the backend's: through PgBouncer the connection's PID is PgBouncer's
			var xid uint64
			if err := tx.QueryRow(ctx, "select pg_backend_pid(), pg_current_xact_id()::text::bigint").Scan(&pid, &xid); err != nil {
				t.Fatal(err)
			}
			if c.wait == "SyncRep" {
				mustExec(t, ctx, tx, "set local synchronous_commit = on")
			}
			done := make(chan error, 1)
			go func() {
				if c.commit {
					done <- tx.Commit(ctx)
					return
				}
				_, err := tx.Exec(ctx, "select pg_sleep(60)")
				done <- err
			}()
			if err := srv.WaitForWaitEvent(ctx, pid, c.wait); err != nil {
				t.Fatal(err)
			}
			if err := srv.Terminate(ctx, pid); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err == nil {
				t.Fatal("no error from a terminated backend")
			}
			unlock()
			if !c.commit {
				_ = tx.Rollback(ctx)
			}
			if err := srv.WaitBackendGone(ctx, pid); err != nil {
				t.Fatal(err)
			}
			if st, ok, err := srv.XactStatus(ctx, xid); err != nil || !ok || st != c.truth {
				t.Fatalf("pg_xact_status = %q %v %v, want %s", st, ok, err, c.truth)
			}
			f := onlyFrame(t, h)
			wantAttr(t, f, "tx.outcome", c.out)
			wantAttr(t, f, "error.type", c.errTyp)
			if _, locally := attr(f, CommittedLocallyKey); locally != c.locally {
				t.Fatalf("tx.commit.committed_locally present %v, want %v", locally, c.locally)
			}
		})
	}
}
