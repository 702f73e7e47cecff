package otelpgxtx

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// commitFault kills a transaction's session the way a real fault does, while the
// transaction on conn sits idle before COMMIT, and returns once the client's socket
// holds the evidence (the FATAL, or the reset).
type commitFault func(t *testing.T, ctx context.Context, conn *pgx.Conn)

// terminateIdle terminates the backend (pg_terminate_backend: FATAL 57P01) and waits
// for it to exit; the backend sends its FATAL before it exits.
func terminateIdle(t *testing.T, ctx context.Context, conn *pgx.Conn) {
	t.Helper()
	pid := conn.PgConn().PID()
	if err := srv.Terminate(ctx, pid); err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitBackendGone(ctx, pid); err != nil {
		t.Fatal(err)
	}
	waitSocket(t, ctx, conn, func(n int, err error) bool { return n > 0 })
}

// idleTimeout lets idle_in_transaction_session_timeout end the session (FATAL 25P03).
func idleTimeout(t *testing.T, ctx context.Context, conn *pgx.Conn) {
	t.Helper()
	pid := conn.PgConn().PID()
	mustExec(t, ctx, conn, "set local idle_in_transaction_session_timeout = '20ms'")
	if err := srv.WaitBackendGone(ctx, pid); err != nil {
		t.Fatal(err)
	}
	// Bytes waiting, or only the stream's end: on a loaded machine the read of SET's reply
	// may come after the FATAL 20 ms behind it, and take it into pgconn's buffer (or, over
	// TLS, the tls.Conn's) with the reply; the end, after it, shows it came.
	waitSocket(t, ctx, conn, func(n int, err error) bool { return n > 0 || n == 0 && err == nil })
}

// resetBy returns a fault that has proxy reset the connection (a TCP RST to the client).
func resetBy(proxyReset func()) commitFault {
	return func(t *testing.T, ctx context.Context, conn *pgx.Conn) {
		t.Helper()
		proxyReset()
		waitSocket(t, ctx, conn, func(n int, err error) bool { return errors.Is(err, syscall.ECONNRESET) })
	}
}

// waitSocket polls the connection's socket without consuming data until done says what
// it shows (a peek of waiting bytes, or the pending error) is there.
func waitSocket(t *testing.T, ctx context.Context, conn *pgx.Conn, done func(n int, err error) bool) {
	t.Helper()
	c := conn.PgConn().Conn().(*wire.Conn).NetConn()
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn() // ciphertext: only whether something came, or the reset, is read
	}
	if d, ok := c.(*wire.Dialed); ok {
		c = d.Conn
	}
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		var rerr error
		buf := make([]byte, 1)
		if err := rc.Control(func(fd uintptr) {
			n, _, rerr = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if n > 0 && rerr == nil && tcpState(fd) == tcpClose {
				// A reset behind bytes not read yet (the reply to the library's read after
				// the INSERT, say): the peek shows the bytes, never the error, so the state
				// says it, without taking the error from the socket.
				rerr = syscall.ECONNRESET
			}
		}); err != nil {
			t.Fatal(err)
		}
		if done(n, rerr) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the socket never showed the fault: last peek %d, %v", n, rerr)
		case <-tick.C:
		}
	}
}

// TestCommitNotExecuted, over plain TCP and TLS: a COMMIT the server provably never executed is a retryable
// rollback with its own error.type, for plain pgx and for Run, against the real faults
// each rule names; the row is absent. A write the kernel accepted (the proxy holding
// COMMIT back) stays unknown.
func TestCommitNotExecuted(t *testing.T) {
	overTransports(t, commitNotExecuted)
}

func commitNotExecuted(t *testing.T, base string) {
	marker := reconciletest.NewMarkerTable(t, pgtest.ContextFor(t), srv.Exec)
	noRef := DefaultPolicy()
	noRef.CommitReference = false
	// Each fault with the references off, with the xid read and with the marker: the
	// library's call in COMMIT's write changes none of the rules.
	for _, m := range []struct {
		name   string
		opts   []Option
		policy Policy
	}{
		{"references off", nil, noRef},
		{"xid", []Option{WithCommitReference()}, DefaultPolicy()},
		{"marker", []Option{WithCommitMarker(marker)}, markerPolicy(marker)},
	} {
		t.Run(m.name, func(t *testing.T) { commitNotExecutedWith(t, base, m.opts, m.policy) })
	}
}

func commitNotExecutedWith(t *testing.T, base string, opts []Option, policy Policy) {
	proxy := pgtest.ProxyFor(t, srv)
	for _, tc := range []struct {
		name     string
		fault    commitFault
		reason   string
		sqlstate string
	}{
		{"terminated while idle", terminateIdle, classifier.ReasonSessionEndedBeforeCommit, "57P01"},
		{"idle in transaction timeout", idleTimeout, classifier.ReasonIdleInTransactionTimeout, "25P03"},
		{"connection reset", resetBy(proxy.ResetAll), classifier.ReasonCommitNotSent, ""},
	} {
		t.Run(tc.name+"/pgx", func(t *testing.T) {
			ctx := pgtest.ContextFor(t)
			h := newHarness(t, proxy.ConnString(base), 1, opts...)
			table := srv.NewTable(t, ctx, tableColumns)
			pc, err := h.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Release()
			tx := mustBegin(t, ctx, pc)
			if _, err := insertFn(table, 1)(ctx, tx); err != nil {
				t.Fatal(err)
			}
			tc.fault(t, ctx, pc.Conn())
			if err := tx.Commit(ctx); err == nil {
				t.Fatal("COMMIT on a dead session succeeded")
			}
			waitFrames(t, ctx, h, 1)
			f := h.frames()[0]
			wantAttr(t, f, string(OutcomeKey), "rolled_back")
			wantAttr(t, f, "error.type", tc.reason)
			if srv.RowExists(t, ctx, table, 1) {
				t.Fatal("row present")
			}
		})
		t.Run(tc.name+"/Run", func(t *testing.T) {
			ctx := pgtest.ContextFor(t)
			h := newHarness(t, proxy.ConnString(base), 1, opts...)
			table := srv.NewTable(t, ctx, tableColumns)
			attempts := 0
			res := Run(ctx, h.pool, policy, func(ctx context.Context, tx pgx.Tx) (int, error) {
				attempts++
				if _, err := insertFn(table, 1)(ctx, tx); err != nil {
					return 0, err
				}
				if attempts == 1 {
					tc.fault(t, ctx, tx.Conn())
				}
				return 1, nil
			})
			// The first attempt provably rolled back, so Run retried it.
			if res.Outcome() != outcome.OutcomeCommitted || attempts != 2 {
				t.Fatalf("result %T after %d attempts", res, attempts)
			}
			frames := h.frames()
			if len(frames) != 2 {
				t.Fatalf("%d frames", len(frames))
			}
			wantAttr(t, frames[0], string(OutcomeKey), "rolled_back")
			wantAttr(t, frames[0], "error.type", tc.reason)
			if !srv.RowExists(t, ctx, table, 1) {
				t.Fatal("row absent after the retry")
			}
		})
	}
	t.Run("commit held back by the proxy", func(t *testing.T) {
		// The kernel accepted COMMIT's bytes: whether the server read them is unknown.
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, proxy.ConnString(base), 1, opts...)
		table := srv.NewTable(t, ctx, tableColumns)
		res := Run(ctx, h.pool, policy, func(ctx context.Context, tx pgx.Tx) (int, error) {
			proxy.CutBeforeCommit()
			return insertFn(table, 1)(ctx, tx)
		})
		if _, ok := res.(outcome.Indeterminate[int]); !ok {
			t.Fatalf("result %T", res)
		}
	})
}

// BenchmarkMarkCommit is what marking a COMMIT costs on a real TCP connection: the peek
// for a waiting FATAL (one non-blocking system call) and the write bookkeeping.
func BenchmarkMarkCommit(b *testing.B) {
	conn := instrumentedConn(b, context.Background(), srv.ConnString())
	nc := conn.PgConn().Conn().(*wire.Conn)
	if _, ok := nc.NetConn().(interface{ SetReadBuffer(int) error }); !ok {
		b.Fatalf("no peek on %T", nc.NetConn())
	}
	b.ReportAllocs()
	for b.Loop() {
		if nc.MarkCommit(true) || nc.CommitNotSent() {
			b.Fatal("evidence on an idle connection")
		}
	}
}

// TestCommitContextDoneBeforeWrite: a COMMIT whose context is done before pgconn writes it
// never leaves the process (pgconn refuses it, nothing is written), and pgx's Commit then
// closes the connection, in the transaction: the server rolls it back. The frame is
// rolled back, commit_not_sent, retryable — not indeterminate — for plain pgx with the
// Verdict in Commit's context, and for Run, with each reference option; the row is not
// there. After a server fault while the transaction waited (its backend terminated or
// SIGKILLed, the server stopped immediately), it is rolled back too. On a connection the
// application goes on using, a second COMMIT commits in the same frame. (The long
// failover soak found such COMMITs, each one indeterminate and, with the marker, without a
// reference, though nothing had been sent.)
func TestCommitContextDoneBeforeWrite(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	done := func() context.Context {
		c, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		cancel()
		return c
	}
	for i, opts := range [][]Option{nil, {WithCommitReference()}, {WithCommitMarker(marker)}} {
		h := newHarness(t, "", 1, opts...)
		id := 10 * (i + 1)
		tx := mustBegin(t, ctx, h.pool)
		mustExec(t, ctx, tx, fmt.Sprintf("insert into %s (id) values (%d)", table, id))
		vctx, v := NewVerdict(done())
		if err := tx.Commit(vctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("options %d: Commit with a done context: %v", i, err)
		}
		f := lastFrame(t, h)
		wantAttr(t, f, "tx.outcome", "rolled_back")
		wantAttr(t, f, "error.type", classifier.ReasonCommitNotSent)
		wantAttr(t, f, "tx.retryable", "true")
		if res, err := v.Result(); err != nil || res.Outcome() != outcome.OutcomeRolledBack {
			t.Fatalf("options %d: the Verdict of Commit's context: %v, %v", i, res, err)
		}

		runCtx, cancel := context.WithCancel(ctx)
		res := Run(runCtx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			_, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id) values (%d)", table, id+1))
			cancel() // the context ends before Run commits
			return struct{}{}, err
		})
		rb, ok := res.(outcome.DeterminateRollback[struct{}])
		if !ok || !errors.Is(rb.Cause(), context.Canceled) {
			t.Fatalf("options %d: Run: %v, want a rollback caused by the cancel", i, res.Outcome())
		}
		for _, r := range []int{id, id + 1} {
			if srv.RowExists(t, ctx, table, r) {
				t.Fatalf("options %d: row %d is there", i, r)
			}
		}
	}

	// A server fault while the transaction waits, before the COMMIT that never leaves: its
	// backend terminated, SIGKILLed (the postmaster recovers in place), or the server stopped
	// immediately and restarted. The verdict rests on no answer of the server's — COMMIT
	// never reached it — so it is the same whatever the server's history.
	for i, fault := range []struct {
		name string
		do   func(pid uint32)
	}{
		{"terminated", func(pid uint32) { pgtest.NoError(t, srv.Terminate(ctx, pid)) }},
		{"SIGKILLed", func(pid uint32) { pgtest.NoError(t, srv.KillBackend(ctx, pid)) }},
		{"stopped immediately", func(uint32) {
			pgtest.NoError(t, srv.StopImmediate())
			pgtest.NoError(t, srv.Restart(ctx))
		}},
	} {
		h := newHarness(t, "", 1, WithCommitReference())
		id := 50 + i
		tx := mustBegin(t, ctx, h.pool)
		mustExec(t, ctx, tx, fmt.Sprintf("insert into %s (id) values (%d)", table, id))
		fault.do(tx.Conn().PgConn().PID())
		if err := tx.Commit(done()); err == nil {
			t.Fatalf("%s: Commit with a done context succeeded", fault.name)
		}
		wantAttr(t, lastFrame(t, h), "tx.outcome", "rolled_back")
		pgtest.NoError(t, srv.WaitQuiet(ctx))
		if srv.RowExists(t, ctx, table, id) {
			t.Fatalf("%s: row %d is there", fault.name, id)
		}
	}

	// Raw statements on one connection: the first COMMIT never leaves, the second commits.
	h := newHarness(t, "", 1, WithCommitReference())
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	mustExec(t, ctx, conn, "begin", fmt.Sprintf("insert into %s (id) values (99)", table))
	if _, err := conn.Exec(done(), "commit"); err == nil {
		t.Fatal("COMMIT with a done context succeeded")
	}
	mustExec(t, ctx, conn, "commit")
	if fs := h.frames(); len(fs) != 1 {
		t.Fatalf("%d frames, want 1", len(fs))
	}
	wantAttr(t, lastFrame(t, h), "tx.outcome", "committed")
	if !srv.RowExists(t, ctx, table, 99) {
		t.Fatal("the second COMMIT's row is not there")
	}
}

// tcpClose is Linux's TCP_CLOSE: the state a socket enters when a reset arrives.
const tcpClose = 7

// tcpState returns the TCP state of socket fd (the first byte of its TCP_INFO), 0 if it
// cannot be read.
func tcpState(fd uintptr) byte {
	var info [232]byte
	l := uint32(len(info))
	if _, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0); errno != 0 {
		return 0
	}
	return info[0]
}
