package otelpgxtx

import (
	"context"
	"errors"
	"strconv"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// waitCount polls a count(*) query on s (pgtest's WaitForCount) until it answers want; the
// test fails with what and the last count if ctx ends first.
func waitCount(t *testing.T, ctx context.Context, s *pgtest.Server, want int, what, sql string, args ...any) {
	t.Helper()
	if err := s.WaitForCount(ctx, want, what, sql, args...); err != nil {
		t.Fatal(err)
	}
}

// TestReferenceAfterDiscardAll: the xid read keeps no session state (a fast-path call by
// OID, no prepared statement), so a connection whose session was reset — DISCARD ALL, as
// PgBouncer in session mode does between clients (its server_reset_query) — still commits
// with a reference: no missing statement can abort the transaction being committed.
func TestReferenceAfterDiscardAll(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, srv.ConnString()+"&default_query_exec_mode=simple_protocol", 1)
	table := srv.NewTable(t, ctx, tableColumns)
	for id := 1; id <= 2; id++ {
		if id == 2 {
			if _, err := h.pool.Exec(ctx, "discard all"); err != nil {
				t.Fatal(err)
			}
		}
		if res := Run(ctx, h.pool, DefaultPolicy(), insertFn(table, id)); res.Outcome() != outcome.OutcomeCommitted {
			t.Fatalf("Run %d: %T %+v", id, res, res)
		}
		if !srv.RowExists(t, ctx, table, id) {
			t.Fatalf("row %d missing", id)
		}
	}
	frames := h.frames()
	if len(frames) != 2 {
		t.Fatalf("%d frames, want the two Runs'", len(frames))
	}
	for _, f := range frames {
		if _, ok := attr(f, ReconciliationXIDKey); !ok {
			t.Errorf("frame %s has no reconciliation xid", f.SpanContext.SpanID())
		}
	}
}

// TestReferenceFailedTransaction: in a transaction that had already failed, the xid read
// gets 25P02 and COMMIT is still read, answered ROLLBACK: a certain rollback, with no
// reference, on a connection left idle and usable.
func TestReferenceFailedTransaction(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	table := srv.NewTable(t, ctx, tableColumns)
	res := Run(ctx, h.pool, DefaultPolicy(), insertThen(table, func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, _ = tx.Exec(ctx, "select 1/0") // swallowed: the transaction has failed
		return 1, nil
	}))
	rb, ok := res.(outcome.DeterminateRollback[int])
	if !ok || !errors.Is(rb.Cause(), pgx.ErrTxCommitRollback) || rb.Phase() != outcome.PhaseCommitting {
		t.Fatalf("result %T %+v, want a rollback in committing, pgx.ErrTxCommitRollback", res, res)
	}
	f := onlyFrame(t, h)
	wantAttr(t, f, "error.type", "commit_rollback")
	if _, ok := attr(f, ReconciliationRefKey); ok {
		t.Fatal("a reference for a transaction that had failed")
	}
	if srv.RowExists(t, ctx, table, 1) {
		t.Fatal("row present")
	}
	// The pool's only connection is idle and answers the next transaction.
	if r := Run(ctx, h.pool, DefaultPolicy(), insertFn(table, 2)); r.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("next Run: %T %+v", r, r)
	}
}

// commitWaitsOnLock makes every COMMIT that inserted into table wait, in a deferred
// trigger, on a lock a connection of its own holds until unlock is called; the
// connection is closed when t ends.
func commitWaitsOnLock(t *testing.T, ctx context.Context, table string) (unlock func()) {
	t.Helper()
	lockKey := strconv.FormatInt(tableSeq.Add(1)+1<<40, 10)
	if err := srv.Exec(ctx, "create function "+table+"_wait() returns trigger language plpgsql as "+
		"$$ begin perform pg_advisory_xact_lock("+lockKey+"); return null; end $$; "+
		"create constraint trigger w after insert on "+table+" deferrable initially deferred "+
		"for each row execute function "+table+"_wait()"); err != nil {
		t.Fatal(err)
	}
	holder, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	if _, err := holder.Exec(ctx, "select pg_advisory_lock("+lockKey+")"); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if _, err := holder.Exec(ctx, "select pg_advisory_unlock("+lockKey+")"); err != nil {
			t.Fatal(err)
		}
	}
}

// cutWhileCommitWaits runs fn through Run on db, holding conn, with a COMMIT that waits
// on commitWaitsOnLock's lock. Once the server shows that wait (waitSQL, with args,
// counts 1) and conn has taken every byte from its socket, the caller gives up: Run's
// context is cancelled, with gate (the harness's dialGate) refusing the CancelRequest
// pgconn would send as it closes conn (seen through PgBouncer, in 3 runs of 20, before the
// gate: the cancel rolled the COMMIT back). The result must be indeterminate with an xid
// reference.
func cutWhileCommitWaits(t *testing.T, ctx context.Context, gate *dialGate, db DB, conn *pgx.Conn, fn func(context.Context, pgx.Tx) (int, error),
	waitSQL string, args ...any) (outcome.Indeterminate[int], outcome.ReconciliationRef) {
	t.Helper()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan outcome.Result[int], 1)
	go func() { done <- Run(rctx, db, DefaultPolicy(), fn) }()
	waitCount(t, ctx, srv, 1, "COMMIT never waited for the lock", waitSQL, args...)
	waitSocket(t, ctx, conn, func(n int, err error) bool { return errors.Is(err, syscall.EAGAIN) })
	gate.refuse.Store(true)
	cancel()
	res := <-done
	<-gate.refused // the CancelRequest of conn's close (asyncClose) was tried
	gate.refuse.Store(false)
	ind, ok := res.(outcome.Indeterminate[int])
	if !ok {
		t.Fatalf("result %T %+v, want indeterminate", res, res)
	}
	ref, ok := ind.Reference()
	if !ok || ref.XID == 0 {
		t.Fatalf("no xid reference for a COMMIT cut while running: %+v %v", ref, ok)
	}
	return ind, ref
}

// TestReferenceBeforeCommitAnswers: the server flushes the xid before it reads
// COMMIT, so a COMMIT that never answers still leaves a reference, naming the transaction
// that commits later. A deferred trigger makes COMMIT wait, silently, on a lock the test
// holds; once the server shows that wait and the client has taken every byte from its
// socket, the caller gives up (its context is cancelled), and the lock is released.
func TestReferenceBeforeCommitAnswers(t *testing.T) {
	overTransports(t, overReferenceBeforeCommitAnswers)
}

func overReferenceBeforeCommitAnswers(t *testing.T, base string) {
	ctx := pgtest.ContextFor(t)
	gate := newDialGate()
	h := newHarness(t, base, 1, gate.config())
	table := srv.NewTable(t, ctx, tableColumns)
	unlock := commitWaitsOnLock(t, ctx, table)
	pc, err := h.pool.Acquire(ctx) // the pool's only connection, which Run will hold
	if err != nil {
		t.Fatal(err)
	}
	conn := pc.Conn()
	pid := conn.PgConn().PID()
	pc.Release()
	_, ref := cutWhileCommitWaits(t, ctx, gate, h.pool, conn, insertFn(table, 1),
		"select count(*) from pg_stat_activity where pid = $1 and wait_event = 'advisory'", pid)
	unlock()
	if status, err := srv.WaitXactSettled(ctx, ref.XID); err != nil || status != "committed" {
		t.Fatalf("the referenced transaction is %q, %v; want committed", status, err)
	}
	wantWrittenBy(t, ctx, table, 1, ref.XID)
}

// wantWrittenBy fails t unless row id of table was written by the transaction xid names
// (its xmin is the xid's low 32 bits), read on the server directly.
func wantWrittenBy(t *testing.T, ctx context.Context, table string, id int, xid uint64) {
	t.Helper()
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var xmin uint64
	if err := conn.QueryRow(ctx, "select xmin::text::bigint from "+table+" where id = $1", id).Scan(&xmin); err != nil {
		t.Fatalf("row %d: %v", id, err)
	}
	if xmin != xid&0xffffffff {
		t.Fatalf("row %d was written by xid %d; the reference names %d", id, xmin, xid)
	}
}
