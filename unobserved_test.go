package otelpgxtx

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// A COMMIT the hooks did not see: sent on the *pgconn.PgConn, as a driver wrapper or a
// hand-made pipeline does, after the transaction began and wrote through pgx. Its reply
// then lost to a real fault, pgconn's transaction status never leaves the transaction,
// so the session's end looks like one that rolls the transaction back. It proves no
// rollback: the server may have committed. The wire saw a statement go past the hooks,
// and the frame ends indeterminate (ended_unobserved), never rolled_back; its xid
// reference settles what the server did.

// unobservedCommit is a way of sending COMMIT on the PgConn, past pgx's tracer; it
// returns the reply's error.
type unobservedCommit struct {
	name string
	send func(ctx context.Context, pg *pgconn.PgConn) error
}

var unobservedCommits = []unobservedCommit{
	{"simple query", func(ctx context.Context, pg *pgconn.PgConn) error {
		_, err := pg.Exec(ctx, "commit").ReadAll()
		return err
	}},
	{"extended protocol", func(ctx context.Context, pg *pgconn.PgConn) error {
		return pg.ExecParams(ctx, "commit", nil, nil, nil, nil).Read().Err
	}},
	{"pipeline", func(ctx context.Context, pg *pgconn.PgConn) error {
		p := pg.StartPipeline(ctx)
		p.SendQueryParams("commit", nil, nil, nil, nil)
		err := p.Sync()
		for err == nil {
			var res any
			if res, err = p.GetResults(); err == nil {
				switch r := res.(type) {
				case *pgconn.ResultReader:
					_, err = r.Close()
				case *pgconn.PipelineSync:
					return p.Close()
				}
			}
		}
		_ = p.Close()
		return err
	}},
}

// unobservedFault is a real fault that ends the session while, or before, the server runs
// the COMMIT; committed is what the server did.
type unobservedFault struct {
	name string
	// sync makes the COMMIT wait for synchronous replication (a standby that never
	// comes): its record is flushed locally before the wait.
	sync bool
	// arm, if set, arms the proxy's fault before COMMIT is sent.
	arm func(tp *twoPhase)
	// hit, if set, ends the backend pid while COMMIT is on its way.
	hit       func(t *testing.T, tp *twoPhase, pid uint32)
	committed bool
	// tls: the fault runs over TLS too (with the xid reference).
	tls bool
	// settled is what reconciliation answers the xid reference: committed, aborted, or
	// the reason of its unknown.
	settled string
}

var unobservedFaults = []unobservedFault{
	{name: "backend terminated in the synchronous-replication wait", sync: true, committed: true, settled: "committed", tls: true,
		hit: func(t *testing.T, tp *twoPhase, pid uint32) { mustOK(t, srv.TerminateInSyncRep(tp.ctx, pid)) }},
	{name: "backend SIGKILLed in the synchronous-replication wait", sync: true, committed: true, settled: reconcile.ReasonCrashRecovered,
		hit: func(t *testing.T, tp *twoPhase, pid uint32) {
			mustOK(t, srv.WaitForWaitEvent(tp.ctx, pid, "SyncRep"))
			mustOK(t, srv.KillBackend(tp.ctx, pid))
		}},
	{name: "server stopped immediately in the synchronous-replication wait", sync: true, committed: true, settled: reconcile.ReasonServerRestarted,
		hit: func(t *testing.T, tp *twoPhase, pid uint32) {
			mustOK(t, srv.WaitForWaitEvent(tp.ctx, pid, "SyncRep"))
			mustOK(t, srv.StopImmediate())
			mustOK(t, srv.Restart(tp.ctx))
		}},
	{name: "proxy cut after the server read it", committed: true, settled: "committed", tls: true, arm: func(tp *twoPhase) { tp.proxy.CutAfterCommit() }},
	{name: "proxy cut before the server read it", settled: "aborted", tls: true, arm: func(tp *twoPhase) { tp.proxy.CutBeforeCommit() }},
}

// TestUnobservedCommitFaults: every fault × the three ways (a simple Query, the
// extended protocol, a pipeline) × the references off, xid and marker, over TCP; and
// over TLS (the wrapper reads the writes above it), the xid reference, terminated and
// the proxy's cuts; the frame found at the release (and, with the xid and the simple
// query, first at the next statement through pgx, which fails on the closed
// connection). The frame is indeterminate with error.type ended_unobserved and not
// retryable; the row is there exactly when the fault let the server commit; with the
// xid reference, reconciliation answers what the server did — committed, or unknown
// where a crash leaves an xid reuse possible (crash_recovered, server_restarted),
// aborted when the COMMIT never reached the server — and never contradicts the row.
func TestUnobservedCommitFaults(t *testing.T) {
	for _, transport := range []string{"tcp", "tls"} {
		for _, mode := range []string{"off", "xid", "marker"} {
			for _, way := range unobservedCommits {
				for _, fault := range unobservedFaults {
					if transport == "tls" && (mode != "xid" || !fault.tls) {
						continue // over TLS: the xid reference, terminated and the proxy's cuts
					}
					testUnobservedCommitFault(t, transport, mode, way, fault)
				}
			}
		}
	}
}

// testUnobservedCommitFault is one case of TestUnobservedCommitFaults.
func testUnobservedCommitFault(t *testing.T, transport, mode string, way unobservedCommit, fault unobservedFault) {
	t.Run(transport+"/"+mode+"/"+way.name+"/"+fault.name, func(t *testing.T) {
		base := srv.ConnString()
		if transport == "tls" {
			base = srv.TLSConnString()
		}
		tp := newTwoPhaseOn(t, mode, base)
		pc, err := tp.h.pool.Acquire(tp.ctx)
		mustOK(t, err)
		beginInsert(t, tp, pc.Conn())
		if fault.sync {
			mustExec(t, tp.ctx, pc.Conn(), "set local synchronous_commit = on")
		}
		if fault.arm != nil {
			fault.arm(tp)
		}
		pg := pc.Conn().PgConn()
		pid := pg.PID()
		done := make(chan error, 1)
		go func() { done <- way.send(tp.ctx, pg) }()
		if fault.hit != nil {
			fault.hit(t, tp, pid)
		}
		if err := <-done; err == nil {
			t.Fatal("COMMIT answered though the fault ended its session")
		}
		if mode == "xid" && way.name == "simple query" {
			// Found by the next statement through pgx, which fails on the
			// closed connection, before the release.
			if _, err := pc.Conn().Exec(tp.ctx, "select 1"); err == nil {
				t.Fatal("a statement on the closed connection succeeded")
			}
		}
		pc.Release()
		// The proxy's cut may reach the client before the server has run the COMMIT
		// it read: its session's end is when its transaction is settled.
		mustOK(t, srv.WaitBackendGone(tp.ctx, pid))
		if got := srv.RowExists(t, tp.ctx, tp.table, 1); got != fault.committed {
			t.Fatalf("row there %v, want %v", got, fault.committed)
		}
		checkUnobserved(t, tp.ctx, tp.h, tp.rec, srv, mode, fault.settled)
	})
}

// beginInsert begins a transaction on c and inserts row 1 through pgx, with an argument:
// the extended protocol, inside whose Sync group the xid reference reads the xid, so that
// its reply is in when the insert's is.
func beginInsert(t *testing.T, tp *twoPhase, c *pgx.Conn) {
	t.Helper()
	mustExec(t, tp.ctx, c, "begin")
	_, err := c.Exec(tp.ctx, "insert into "+tp.table+" (id, k) values ($1, $1)", 1)
	mustOK(t, err)
}

// checkUnobserved checks the one frame of h, whose COMMIT went past the hooks: ended
// indeterminate for ended_unobserved, not retryable, and, with the xid reference (mode),
// settled by rec as want says: committed, aborted, or unknown for that reason (a crash or
// a failover, after which the xid may have been handed out again), the same when asked
// again after s handed out more xids.
func checkUnobserved(t *testing.T, ctx context.Context, h *harness, rec *reconcile.Reconciler, s *pgtest.Server, mode, want string) {
	t.Helper()
	frames := h.frames()
	if len(frames) != 1 {
		t.Fatalf("%d frames (outcomes %v), want 1", len(frames), h.outcomes())
	}
	f := frames[0]
	get := func(k attribute.Key) string { v, _ := attr(f, k); return v.String() }
	if got := get(OutcomeKey); got != "indeterminate" {
		t.Fatalf("tx.outcome %q, want indeterminate", got)
	}
	if got := get("error.type"); got != "ended_unobserved" {
		t.Fatalf("error.type %q, want ended_unobserved", got)
	}
	if get("tx.retryable") == "true" {
		t.Fatal("a transaction whose COMMIT went past the tracer is retryable")
	}
	raw := get(ReconciliationRefKey)
	if mode != "xid" {
		if raw != "" {
			// The marker is written by a COMMIT the hooks see; the xid is read only with
			// the xid reference.
			t.Fatalf("mode %s: reference %q, want none", mode, raw)
		}
		return
	}
	ref, err := outcome.ParseReconciliationRef(raw)
	mustOK(t, err)
	got := resolveTwice(t, ctx, rec, ref, s)
	answer := got.Status().String()
	if got.Status() == reconcile.Unknown {
		answer = got.Reason()
	}
	if answer != want {
		t.Fatalf("reconciled %s %q, want %s", got.Status(), got.Reason(), want)
	}
}

// TestUnobservedCommitReplyUnread: COMMIT sent on the PgConn past the tracer and its
// reply never read; a statement through pgx is refused (busy); the connection goes back
// to the pool busy, in the transaction as far
// as pgconn knows, and the pool destroys it. The server committed: the frame is
// indeterminate (ended_unobserved), never released_in_transaction's rollback. Statements
// past the tracer that run nothing — pgx's Deallocate (Close, Sync), the PgConn's Close
// (Terminate) — leave the rollback the session's end proves.
func TestUnobservedCommitReplyUnread(t *testing.T) {
	for _, mode := range []string{"off", "xid"} {
		t.Run(mode+"/commit, reply unread, released", func(t *testing.T) {
			tp := newTwoPhase(t, mode)
			pc, err := tp.h.pool.Acquire(tp.ctx)
			mustOK(t, err)
			beginInsert(t, tp, pc.Conn())
			pg := pc.Conn().PgConn()
			_ = pg.Exec(tp.ctx, "commit") // sent; its reply left unread
			mustOK(t, srv.WaitForCount(tp.ctx, 1, "the committed row", fmt.Sprintf("select count(*) from %s where id = 1", tp.table)))
			if _, err := pc.Conn().Exec(tp.ctx, "select 1"); err == nil { // pgconn, busy, refuses it
				t.Fatal("a statement on the busy connection succeeded")
			}
			pc.Release()
			checkUnobserved(t, tp.ctx, tp.h, tp.rec, srv, mode, "committed")
		})
	}
	for _, end := range []string{"deallocate, released", "pgconn closed"} {
		t.Run("off/"+end, func(t *testing.T) {
			tp := newTwoPhase(t, "off")
			pc, err := tp.h.pool.Acquire(tp.ctx)
			mustOK(t, err)
			beginInsert(t, tp, pc.Conn())
			switch end {
			case "deallocate, released":
				_, err := pc.Conn().Prepare(tp.ctx, "s", "select 1")
				mustOK(t, err)
				mustOK(t, pc.Conn().Deallocate(tp.ctx, "s"))
				pc.Release()
			case "pgconn closed":
				mustOK(t, pc.Conn().PgConn().Close(tp.ctx))
				pc.Release()
			}
			f := tp.frame(t, "rolled_back")
			if got := f.attrs("error.type"); got == "ended_unobserved" {
				t.Fatalf("error.type %q: nothing that runs a statement went past the tracer", got)
			}
			if srv.RowExists(t, tp.ctx, tp.table, 1) {
				t.Fatal("the row of the rolled-back transaction is there")
			}
		})
	}
}

// TestUnobservedCommitFailover: a COMMIT sent on the PgConn, past the tracer, waits for
// the synchronous standby of a real pair, which is down; the primary crashes and the
// standby, which never received the commit, is promoted. The new primary has no row; the
// frame is indeterminate (ended_unobserved), never rolled_back (the old primary had
// committed it locally), and the xid reference, reconciled on the new primary, answers
// aborted: the work is not in the history that survived.
func TestUnobservedCommitFailover(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	c := startCluster(t, ctx)
	for i, mode := range []string{"off", "xid"} {
		if i > 0 { // the old primary back, as the new one's synchronous standby
			mustOK(t, c.Rejoin(ctx))
		}
		var opts []Option
		if mode == "xid" {
			opts = append(opts, WithCommitReference())
		}
		h := newHarness(t, c.ConnString(), 1, opts...)
		pc, err := h.pool.Acquire(ctx)
		mustOK(t, err)
		mustExec(t, ctx, pc.Conn(), "begin")
		_, err = pc.Conn().Exec(ctx, "insert into t values ($1)", i+1)
		mustOK(t, err)
		mustOK(t, c.Standby().StopImmediate())
		pg := pc.Conn().PgConn()
		pid := pg.PID()
		done := make(chan error, 1)
		go func() {
			_, err := pg.Exec(ctx, "commit").ReadAll()
			done <- err
		}()
		mustOK(t, c.Primary().WaitForWaitEvent(ctx, pid, "SyncRep"))
		mustOK(t, c.Promote(ctx))
		if err := <-done; err == nil {
			t.Fatalf("%s: COMMIT answered though its primary crashed", mode)
		}
		pc.Release()
		if clusterRowExists(t, ctx, c, i+1) {
			t.Fatalf("%s: the new primary has the row its standby never received", mode)
		}
		// The promotion requests the new timeline's first checkpoint and does not wait for
		// it; made, it bounds the lost xid, asked again after it is handed out again.
		mustOK(t, c.Primary().Exec(ctx, "checkpoint"))
		checkUnobserved(t, ctx, h, clusterReconciler(t, ctx, c), c.Primary(), mode, "aborted")
	}
}

// TestUnobservedCommitThroughPgBouncer: the same through PgBouncer in transaction mode,
// which answers a terminated backend with its own FATAL: the COMMIT sent on the PgConn
// waits for synchronous replication, its backend is terminated after the commit record,
// and the client's connection ends. The frame is indeterminate (ended_unobserved), never
// rolled_back; the row is there; the xid reference, reconciled through PgBouncer, says
// committed.
func TestUnobservedCommitThroughPgBouncer(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	bouncer := pgtest.PgBouncerFor(t, ctx, srv, "transaction", 1)
	for _, mode := range []string{"off", "xid"} {
		t.Run(mode, func(t *testing.T) {
			var opts []Option
			if mode == "xid" {
				opts = append(opts, WithCommitReference())
			}
			h := newHarness(t, bouncer.ConnString()+"&default_query_exec_mode=exec", 2, opts...)
			rec, err := reconcile.New(h.pool)
			mustOK(t, err)
			table := srv.NewTable(t, ctx, tableColumns)
			pc, err := h.pool.Acquire(ctx)
			mustOK(t, err)
			mustExec(t, ctx, pc.Conn(), "begin")
			_, err = pc.Conn().Exec(ctx, "insert into "+table+" (id, k) values ($1, $1)", 1)
			mustOK(t, err)
			var pid uint32 // the backend's: through PgBouncer the connection's PID is PgBouncer's
			mustOK(t, pc.Conn().QueryRow(ctx, "select pg_backend_pid()").Scan(&pid))
			mustExec(t, ctx, pc.Conn(), "set local synchronous_commit = on")
			pg := pc.Conn().PgConn()
			done := make(chan error, 1)
			go func() {
				_, err := pg.Exec(ctx, "commit").ReadAll()
				done <- err
			}()
			mustOK(t, srv.TerminateInSyncRep(ctx, pid))
			if err := <-done; err == nil {
				t.Fatal("COMMIT answered though its backend was terminated")
			}
			pc.Release()
			if !srv.RowExists(t, ctx, table, 1) {
				t.Fatal("the row committed locally is not there")
			}
			checkUnobserved(t, ctx, h, rec, srv, mode, "committed")
		})
	}
}
