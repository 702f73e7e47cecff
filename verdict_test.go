package otelpgxtx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/txevidence/otelpgxtx/internal/errs"
	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/verdict"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// mustResult is v's Result, which must be known.
func mustResult(t *testing.T, v *Verdict) outcome.Result[struct{}] {
	t.Helper()
	res, err := v.Result()
	if err != nil {
		t.Fatalf("Verdict.Result: %v", err)
	}
	return res
}

// wantFrameOf checks that res names frame span f, and has f's outcome.
func wantFrameOf(t *testing.T, res outcome.Result[struct{}], f tracetest.SpanStub) {
	t.Helper()
	if got, want := res.OperationID().String(), attrString(t, f, OperationIDKey); got != want {
		t.Errorf("verdict operation id %s, frame span's %s", got, want)
	}
	if got, want := res.Outcome().String(), attrString(t, f, OutcomeKey); got != want {
		t.Errorf("verdict %s, frame span's tx.outcome %s", got, want)
	}
}

// TestVerdictCommitted: a plain Begin … Commit answers Committed with its frame's
// operation id, whether the Verdict's context began the transaction, only committed it, or
// went through pgx.BeginFunc.
func TestVerdictCommitted(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2)
	table := srv.NewTable(t, ctx, tableColumns)
	for i, how := range []string{"begin", "commit", "BeginFunc", "by hand"} {
		t.Run(how, func(t *testing.T) {
			h.exp.Reset()
			vctx, v := NewVerdict(ctx)
			var err error
			switch how {
			case "begin", "commit":
				bctx := vctx
				if how == "commit" {
					bctx = ctx
				}
				tx := mustBegin(t, bctx, h.pool)
				mustExec(t, ctx, tx, fmt.Sprintf("insert into %s (id) values (%d)", table, i+1))
				err = tx.Commit(vctx)
			case "by hand":
				withConn(t, ctx, h, func(conn *pgx.Conn) {
					mustExec(t, ctx, conn, "begin", fmt.Sprintf("insert into %s (id) values (%d)", table, i+1))
					_, err = conn.Exec(vctx, "commit")
				})
			case "BeginFunc":
				err = pgx.BeginFunc(vctx, h.pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(vctx, fmt.Sprintf("insert into %s (id) values (%d)", table, i+1))
					return err
				})
			}
			if err != nil {
				t.Fatal(err)
			}
			res := mustResult(t, v)
			if _, ok := res.(outcome.Committed[struct{}]); !ok {
				t.Fatalf("verdict %T, want Committed", res)
			}
			wantFrameOf(t, res, onlyFrame(t, h))
		})
	}
}

// TestVerdictRollbacks: an application's ROLLBACK is a rollback that is not retryable;
// a statement that failed is the cause of the rollback that follows; a session terminated
// before COMMIT was sent is a retryable one (a real fault).
func TestVerdictRollbacks(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	table := srv.NewTable(t, ctx, tableColumns)
	rollback := func(t *testing.T, v *Verdict, retryable bool, phase outcome.Phase) outcome.DeterminateRollback[struct{}] {
		t.Helper()
		res := mustResult(t, v)
		rb, ok := res.(outcome.DeterminateRollback[struct{}])
		if !ok {
			t.Fatalf("verdict %T, want DeterminateRollback", res)
		}
		if rb.Retryable() != retryable || rb.Phase() != phase {
			t.Errorf("retryable %v phase %s, want %v %s (cause %v)", rb.Retryable(), rb.Phase(), retryable, phase, rb.Cause())
		}
		wantFrameOf(t, res, onlyFrame(t, h))
		return rb
	}
	t.Run("deliberate", func(t *testing.T) {
		h.exp.Reset()
		vctx, v := NewVerdict(ctx)
		tx := mustBegin(t, vctx, h.pool)
		if err := tx.Rollback(vctx); err != nil {
			t.Fatal(err)
		}
		if rb := rollback(t, v, false, outcome.PhaseActive); !errors.Is(rb.Cause(), errs.ErrRolledBack) {
			t.Errorf("cause %v, want errRolledBack", rb.Cause())
		}
	})
	t.Run("failed statement", func(t *testing.T) {
		h.exp.Reset()
		vctx, v := NewVerdict(ctx)
		err := pgx.BeginFunc(vctx, h.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(vctx, "select 1/0")
			return err
		})
		rb := rollback(t, v, false, outcome.PhaseActive)
		if rb.Cause() != err && !errors.Is(err, rb.Cause()) {
			t.Errorf("cause %v, want the statement's error %v", rb.Cause(), err)
		}
	})
	t.Run("terminated before COMMIT", func(t *testing.T) {
		h.exp.Reset()
		vctx, v := NewVerdict(ctx)
		pc, err := h.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Release()
		tx := mustBegin(t, vctx, pc.Conn())
		mustExec(t, ctx, tx, "insert into "+table+" (id) values (100)")
		terminateIdle(t, ctx, pc.Conn())
		if err := tx.Commit(vctx); err == nil {
			t.Fatal("COMMIT on a terminated session succeeded")
		}
		rollback(t, v, true, outcome.PhaseCommitting)
		if srv.RowExists(t, ctx, table, 100) {
			t.Fatal("the row of a rolled-back transaction is present")
		}
	})
}

// TestVerdictIndeterminate: a COMMIT whose backend is terminated in its
// synchronous-replication wait is Indeterminate, with the reference the tracer taken,
// which reconciliation settles: it had committed.
func TestVerdictIndeterminate(t *testing.T) {
	for _, opt := range []Option{WithCommitReference(), WithCommitMarker(pgx.Identifier{"public", "verdict_marker"})} {
		ctx := pgtest.ContextFor(t)
		if err := srv.Exec(ctx, "drop table if exists verdict_marker; "+mustMarkerDDL(t, pgx.Identifier{"public", "verdict_marker"})); err != nil {
			t.Fatal(err)
		}
		h := newHarness(t, "", 1, opt)
		table := srv.NewTable(t, ctx, tableColumns)
		vctx, v := NewVerdict(ctx)
		if err := plainInsert(vctx, h.pool, table, 1, func(tx pgx.Tx) { terminateInSyncRepWait(t, ctx, tx) }); err == nil {
			t.Fatal("COMMIT succeeded after its backend was terminated")
		}
		res := mustResult(t, v)
		ind, ok := res.(outcome.Indeterminate[struct{}])
		if !ok {
			t.Fatalf("verdict %T, want Indeterminate", res)
		}
		f := onlyFrame(t, h)
		wantFrameOf(t, res, f)
		ref, ok := ind.Reference()
		if !ok {
			t.Fatal("no reference")
		}
		if fref, _ := refOf(t, f); fref.String() != ref.String() {
			t.Errorf("reference %v, the frame span's %v", ref, fref)
		}
		if ind.Cause() == nil || !ind.CommittedLocally() || ind.TraceParent() == "" {
			t.Errorf("cause %v, committed locally %v, traceparent %q", ind.Cause(), ind.CommittedLocally(), ind.TraceParent())
		}
		rec, err := reconcile.New(srv.Pool(t, ctx))
		if err != nil {
			t.Fatal(err)
		}
		ans, err := reconcile.Indeterminate(ctx, rec, ind)
		if err != nil {
			t.Fatal(err)
		}
		if ans.Status() != reconcile.Committed || !srv.RowExists(t, ctx, table, 1) {
			t.Fatalf("reconciled %s (%s), row present %v: want committed, present", ans.Status(), ans.Reason(), srv.RowExists(t, ctx, table, 1))
		}
	}
}

// mustMarkerDDL is the commit-marker table's DDL.
func mustMarkerDDL(t *testing.T, table pgx.Identifier) string {
	t.Helper()
	ddl, err := reconcile.MarkerTableDDL(table)
	if err != nil {
		t.Fatal(err)
	}
	return ddl
}

// TestVerdictUnrecordedFrames: a frame the filter rejected, or whose trace is not sampled,
// has its verdict all the same.
func TestVerdictUnrecordedFrames(t *testing.T) {
	for name, h := range map[string]*harness{
		"filtered":  newHarness(t, "", 1, WithFilter(func(context.Context, string) bool { return false })),
		"unsampled": newHarnessSampled(t, "", 1, sdktrace.NeverSample()),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := pgtest.ContextFor(t)
			vctx, v := NewVerdict(ctx)
			if err := pgx.BeginFunc(vctx, h.pool, func(tx pgx.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
			res := mustResult(t, v)
			if res.Outcome() != outcome.OutcomeCommitted || res.OperationID().IsZero() {
				t.Fatalf("verdict %s %s, want committed with an operation id", res.Outcome(), res.OperationID())
			}
			if n := len(h.frames()); n != 0 {
				t.Fatalf("%d frame spans recorded", n)
			}
		})
	}
}

// TestVerdictCannotKnow: a transaction on a connection without the tracer, one begun and
// ended with another context, and one not ended yet, are ErrNoVerdict, never a rollback.
func TestVerdictCannotKnow(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	plain := srv.Pool(t, ctx)
	h := newHarness(t, "", 1)
	vctx, v := NewVerdict(ctx)
	if err := pgx.BeginFunc(vctx, plain, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Result(); !errors.Is(err, ErrNoVerdict) {
		t.Errorf("uninstrumented: %v, want ErrNoVerdict", err)
	}
	_, v = NewVerdict(ctx)
	if err := pgx.BeginFunc(ctx, h.pool, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Result(); !errors.Is(err, ErrNoVerdict) {
		t.Errorf("another context: %v, want ErrNoVerdict", err)
	}
	vctx, v = NewVerdict(ctx)
	tx := mustBegin(t, vctx, h.pool)
	if _, err := v.Result(); !errors.Is(err, ErrNoVerdict) {
		t.Errorf("not ended: %v, want ErrNoVerdict", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if res := mustResult(t, v); res.Outcome() != outcome.OutcomeCommitted {
		t.Errorf("after Commit: %s", res.Outcome())
	}
	calls := 0
	res, err := Retry(ctx, 3, func(ctx context.Context) error {
		calls++
		return pgx.BeginFunc(ctx, plain, func(pgx.Tx) error { return errors.New("app") })
	})
	if res != nil || !errors.Is(err, ErrNoVerdict) || calls != 1 {
		t.Errorf("Retry on an uninstrumented pool: %v, %v after %d calls; want nil, ErrNoVerdict after 1", res, err, calls)
	}
}

// TestVerdictSavepointsAndNesting: a savepoint released answers Participating and one
// rolled back to a rollback that is not retryable, both with the frame's id; a frame
// nested on a second connection answers for itself, and its outer frame's Verdict is
// still waiting for the outer COMMIT.
func TestVerdictSavepointsAndNesting(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2)
	outerCtx, outerV := NewVerdict(ctx)
	outerCtx, tx, err := Begin(outerCtx, h.pool, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a failed check must not leave the pool's Close waiting
	spCtx, spV := NewVerdict(ctx)
	sp, err := tx.Begin(spCtx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Commit(spCtx); err != nil {
		t.Fatal(err)
	}
	if res := mustResult(t, spV); res.Outcome() != outcome.OutcomeParticipating {
		t.Errorf("released savepoint: %s, want participating", res.Outcome())
	}
	sp, err = tx.Begin(spCtx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Rollback(spCtx); err != nil {
		t.Fatal(err)
	}
	if rb, ok := mustResult(t, spV).(outcome.DeterminateRollback[struct{}]); !ok || rb.Retryable() {
		t.Errorf("rolled back to a savepoint: %#v, want a rollback that is not retryable", mustResult(t, spV))
	}
	innerCtx, innerV := NewVerdict(outerCtx)
	inner, err := h.pool.Begin(innerCtx)
	if err != nil {
		t.Fatal(err)
	}
	if err := inner.Commit(innerCtx); err != nil {
		t.Fatal(err)
	}
	innerRes := mustResult(t, innerV)
	if _, err := outerV.Result(); !errors.Is(err, ErrNoVerdict) {
		t.Errorf("outer frame, still open: %v, want ErrNoVerdict", err)
	}
	if err := tx.Commit(outerCtx); err != nil {
		t.Fatal(err)
	}
	outerRes := mustResult(t, outerV)
	if mustResult(t, spV).OperationID() != outerRes.OperationID() || innerRes.OperationID() == outerRes.OperationID() {
		t.Errorf("savepoint %s, inner %s, outer %s: want the savepoint's the outer frame's", mustResult(t, spV).OperationID(), innerRes.OperationID(), outerRes.OperationID())
	}
	for _, f := range h.frames() {
		want := outerRes
		if attrString(t, f, FrameDepthKey) == "1" {
			want = innerRes
		}
		wantFrameOf(t, want, f)
	}
}

// TestVerdictPooledConnectionReused: once Commit returned, the connection is back in the
// pool and another goroutine's transaction runs on it; the first caller's Verdict still
// answers for its own transaction.
func TestVerdictPooledConnectionReused(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1) // one connection: the second transaction reuses it
	vctx, v := NewVerdict(ctx)
	if err := pgx.BeginFunc(vctx, h.pool, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "select 1/0")
			return err
		})
	})
	wg.Wait()
	frames := h.frames()
	if len(frames) != 2 {
		t.Fatalf("%d frames, want 2", len(frames))
	}
	wantFrameOf(t, mustResult(t, v), frames[0])
}

// TestVerdictDatabaseSQL: database/sql's Commit takes no context; the context given to
// BeginTx carries the Verdict, committed or indeterminate.
func TestVerdictDatabaseSQL(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1, WithCommitReference())
	db := stdlib.OpenDBFromPool(h.pool)
	defer db.Close()
	table := srv.NewTable(t, ctx, tableColumns)
	insert := func(id int, fault bool) (*Verdict, error) {
		vctx, v := NewVerdict(ctx)
		tx, err := db.BeginTx(vctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(vctx, fmt.Sprintf("insert into %s (id) values (%d)", table, id)); err != nil {
			t.Fatal(err)
		}
		if fault {
			var pid uint32
			if _, err := tx.ExecContext(vctx, "set local synchronous_commit = on"); err != nil {
				t.Fatal(err)
			}
			if err := tx.QueryRowContext(vctx, "select pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				err := srv.WaitForWaitEvent(ctx, pid, "SyncRep")
				if err == nil {
					err = srv.Terminate(ctx, pid)
				}
				done <- err
			}()
			defer func() {
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
		}
		return v, tx.Commit()
	}
	v, err := insert(1, false)
	if err != nil {
		t.Fatal(err)
	}
	if res := mustResult(t, v); res.Outcome() != outcome.OutcomeCommitted {
		t.Errorf("database/sql commit: %s", res.Outcome())
	}
	v, err = insert(2, true)
	if err == nil || errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("Commit: %v, want the connection's error", err)
	}
	ind, ok := mustResult(t, v).(outcome.Indeterminate[struct{}])
	if !ok {
		t.Fatalf("database/sql commit terminated in its wait: %s, want indeterminate", mustResult(t, v).Outcome())
	}
	if _, ok := ind.Reference(); !ok {
		t.Error("no reference")
	}
}

// TestVerdictBadInput: nil arguments are errors wrapping ErrInvalidArgument, never a panic.
func TestVerdictBadInput(t *testing.T) {
	var nilCtx context.Context // the bad input under test
	_, v := NewVerdict(nilCtx)
	if _, err := v.Result(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NewVerdict(nil): %v", err)
	}
	if _, err := (*Verdict)(nil).Result(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("nil Verdict: %v", err)
	}
	ok := func(context.Context) error { return nil }
	for name, call := range map[string]func() error{
		"nil context":   func() error { _, err := Retry(nilCtx, 1, ok); return err },
		"nil attempt":   func() error { _, err := Retry(context.Background(), 1, nil); return err },
		"zero attempts": func() error { _, err := Retry(context.Background(), 0, ok); return err },
	} {
		if err := call(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Retry, %s: %v", name, err)
		}
	}
}

// TestRetry: a retryable rollback (the session terminated before COMMIT was sent) is
// tried again and commits once; an indeterminate commit is never replayed.
func TestRetry(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1, WithCommitReference())
	table := srv.NewTable(t, ctx, tableColumns)
	calls := 0
	res, err := Retry(ctx, 3, func(ctx context.Context) error {
		calls++
		return pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "insert into "+table+" (id) values (1)"); err != nil {
				return err
			}
			if calls == 1 {
				terminateIdle(t, ctx, tx.Conn())
			}
			return nil
		})
	})
	if err != nil || res.Outcome() != outcome.OutcomeCommitted || calls != 2 {
		t.Fatalf("Retry: %v %v after %d calls, want committed after 2", res, err, calls)
	}
	if n := srv.CountOf(t, ctx, "select count(*) from "+table); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
	calls = 0
	res, err = Retry(ctx, 3, func(ctx context.Context) error {
		calls++
		return plainInsert(ctx, h.pool, table, 2, func(tx pgx.Tx) { terminateInSyncRepWait(t, ctx, tx) })
	})
	if _, ok := res.(outcome.Indeterminate[struct{}]); !ok || err == nil || calls != 1 {
		t.Fatalf("Retry: %v %v after %d calls, want indeterminate after 1", res, err, calls)
	}
	if err := srv.WaitQuiet(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestVerdictCauses: the cause a rollback's Result carries when no error of the
// application's showed one (unit test, fabricated verdicts).
func TestVerdictCauses(t *testing.T) {
	id := outcome.NewOperationID()
	errAppRollback := errors.New("the application rolls back")
	for _, tc := range []struct {
		d    verdict.Data
		want error
		text string
	}{
		{verdict.Data{Reason: "rolled_back"}, errs.ErrRolledBack, ""},
		{verdict.Data{Reason: "commit_rollback"}, pgx.ErrTxCommitRollback, ""},
		{verdict.Data{Reason: evidence.ReasonConnectionClosed}, nil, "rolled back: connection_closed"},
		{verdict.Data{Reason: "commit_rollback", Cause: errAppRollback}, errAppRollback, ""},
	} {
		tc.d.Set, tc.d.Outcome, tc.d.ID, tc.d.Phase = true, outcome.OutcomeRolledBack, id, outcome.PhaseActive
		rb, ok := tc.d.Result().(outcome.DeterminateRollback[struct{}])
		switch {
		case !ok:
			t.Errorf("%s: not a rollback", tc.d.Reason)
		case tc.want != nil && !errors.Is(rb.Cause(), tc.want):
			t.Errorf("%s: cause %v, want %v", tc.d.Reason, rb.Cause(), tc.want)
		case tc.text != "" && !strings.Contains(rb.Cause().Error(), tc.text):
			t.Errorf("%s: cause %q, want it to say %q", tc.d.Reason, rb.Cause(), tc.text)
		}
	}
	ind := verdict.Data{Set: true, Outcome: outcome.OutcomeIndeterminate, ID: id}
	if r, ok := ind.Result().(outcome.Indeterminate[struct{}]); !ok || !errors.Is(r.Cause(), errs.ErrCommitUnobserved) {
		t.Errorf("indeterminate without an error: %#v", ind.Result())
	}
}

// TestRetryNotReached: an attempt whose transaction never reached the server is a
// retryable rollback in not_started, and Retry runs it again: the pool could not connect
// (the server is down, then back), and the pool's idle connections were ended by a
// backend's SIGKILL (crash recovery). The row is written once; an uninstrumented pool
// still gives no verdict.
func TestRetryNotReached(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	h := newHarness(t, "", 2) // no connection yet: the first Acquire connects
	if err := srv.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	insert := func(id int) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "insert into "+table+" (id) values ($1)", id)
				return err
			})
		}
	}
	calls := 0
	var first outcome.Result[struct{}]
	res, err := Retry(ctx, 5, func(ctx context.Context) error {
		calls++
		if calls == 3 {
			if err := srv.Restart(ctx); err != nil {
				t.Fatal(err)
			}
		}
		err := insert(1)(ctx)
		if calls == 1 {
			vctx, v := NewVerdict(ctx)
			_ = insert(1)(vctx)
			first = mustResult(t, v)
		}
		return err
	})
	if err != nil || res.Outcome() != outcome.OutcomeCommitted || calls != 3 {
		t.Fatalf("Retry against a server down for two attempts: %v %v after %d calls, want committed after 3", res, err, calls)
	}
	rb, ok := first.(outcome.DeterminateRollback[struct{}])
	if !ok || !rb.Retryable() || rb.Phase() != outcome.PhaseNotStarted || rb.Cause() == nil {
		t.Fatalf("the verdict of a transaction whose pool could not connect: %#v, want a retryable rollback in not_started with its cause", first)
	}
	t.Logf("no connection: %v", rb.Cause())

	// Every connection of the pool is ended by crash recovery.
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := conn.Conn().PgConn().PID()
	conn.Release()
	if err := srv.KillBackend(ctx, pid); err != nil {
		t.Fatal(err)
	}
	calls = 0
	res, err = Retry(ctx, 5, func(ctx context.Context) error { calls++; return insert(2)(ctx) })
	if err != nil || res.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("Retry after crash recovery: %v %v after %d calls, want committed", res, err, calls)
	}
	if n := srv.CountOf(t, ctx, "select count(*) from "+table); n != 2 {
		t.Fatalf("%d rows, want 2: each once", n)
	}
	// A commit recorded stays when the context later fails to connect elsewhere: the
	// attempt committed, then failed — never a rollback to run again.
	vctx, v := NewVerdict(ctx)
	if err := insert(3)(vctx); err != nil {
		t.Fatal(err)
	}
	down := newHarness(t, srv.ConnString()+"&port=1", 1)
	if _, err := down.pool.Acquire(vctx); err == nil {
		t.Fatal("acquired a connection to port 1")
	}
	if res := mustResult(t, v); res.Outcome() != outcome.OutcomeCommittedWithPostCommitFailure {
		t.Errorf("a commit, then a failed Acquire with its context: %s, want committed_with_post_commit_failure", res.Outcome())
	}
	plain, err := pgxpool.New(ctx, srv.ConnString()+"&port=1")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	calls = 0
	res, err = Retry(ctx, 3, func(ctx context.Context) error {
		calls++
		return pgx.BeginFunc(ctx, plain, func(pgx.Tx) error { return nil })
	})
	if res != nil || !errors.Is(err, ErrNoVerdict) || calls != 1 {
		t.Errorf("Retry on an uninstrumented pool that cannot connect: %v, %v after %d calls; want nil, ErrNoVerdict after 1", res, err, calls)
	}
}

// TestVerdictNotStarted: what the classifier makes of a connection refused during crash
// recovery (57P03, FATAL), of a context given up, and that a frame's record wins (unit
// test, fabricated errors, in addition to TestRetryNotReached's real ones).
func TestVerdictNotStarted(t *testing.T) {
	for _, tc := range []struct {
		err       error
		retryable bool
	}{
		{&pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P03", Message: "the database system is in recovery mode"}, true},
		{&pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "53300", Message: "sorry, too many clients already"}, true},
		{context.Canceled, false},
	} {
		_, v := NewVerdict(context.Background())
		v.s.NotStarted(tc.err)
		rb, ok := mustResult(t, v).(outcome.DeterminateRollback[struct{}])
		if !ok || rb.Retryable() != tc.retryable || rb.Phase() != outcome.PhaseNotStarted || !errors.Is(rb.Cause(), tc.err) {
			t.Errorf("%v: %#v, want a rollback in not_started, retryable %v", tc.err, rb, tc.retryable)
		}
		v.s.Began()
		v.s.NotStarted(tc.err)
		if _, err := v.Result(); !errors.Is(err, ErrNoVerdict) {
			t.Errorf("%v after a frame began: %v, want the frame's (not ended: ErrNoVerdict)", tc.err, err)
		}
	}
}
