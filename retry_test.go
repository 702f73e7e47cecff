package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// settleFault is a real fault that hits the first attempt's COMMIT.
type settleFault struct {
	name string
	// hold is what the first attempt does so that its COMMIT is under way when the fault
	// hits: "trigger" (a deferred trigger waits on an advisory lock the test holds),
	// "syncrep" (COMMIT waits for the phantom synchronous standby, its record flushed), or
	// "" (the fault is armed on the proxy before COMMIT).
	hold string
	hit  func(ctx context.Context, pid uint32, proxy *pgtest.Proxy) error
	// unknown is, per reference ("xid", "marker"), the reason an answer may stay unknown
	// when the first attempt did commit; "" when it must be settled.
	unknown map[string]string
}

// settleFaults are the faults of TestRetrySettles. The answers rest on the reconciler's
// rules (docs/reconciliation.md): a backend terminated or SIGKILLed before its commit
// record leaves the xid aborted (or, after the kill, above the recovered next xid, which
// answers aborted too) and its marker absent; a commit record flushed before the fault
// stays committed; after a SIGKILL the xid alone cannot tell its own commit from a reuse
// (crash_recovered) where the marker can. A cut after COMMIT is forwarded usually commits;
// it aborts when the cut's reset reaches the server before it has read COMMIT (Linux drops
// a socket's unread data on a reset), which the answer must then say.
var settleFaults = []settleFault{
	{name: "terminated at COMMIT", hold: "trigger",
		hit: func(ctx context.Context, pid uint32, _ *pgtest.Proxy) error { return srv.Terminate(ctx, pid) }},
	{name: "SIGKILLed at COMMIT", hold: "trigger", unknown: map[string]string{"xid": reconcile.ReasonCrashRecovered},
		hit: func(ctx context.Context, pid uint32, _ *pgtest.Proxy) error { return srv.KillBackend(ctx, pid) }},
	{name: "SIGKILLed in the synchronous-replication wait", hold: "syncrep", unknown: map[string]string{"xid": reconcile.ReasonCrashRecovered},
		hit: func(ctx context.Context, pid uint32, _ *pgtest.Proxy) error { return srv.KillBackend(ctx, pid) }},
	{name: "synchronous-replication wait ended early", hold: "syncrep",
		hit: func(ctx context.Context, pid uint32, _ *pgtest.Proxy) error { return srv.Terminate(ctx, pid) }},
	{name: "connection cut after COMMIT",
		hit: func(_ context.Context, _ uint32, p *pgtest.Proxy) error { p.CutAfterCommit(); return nil }},
	{name: "connection cut before COMMIT",
		hit: func(_ context.Context, _ uint32, p *pgtest.Proxy) error { p.CutBeforeCommit(); return nil }},
}

// TestRetrySettles: Retry with a reconciler settles an indeterminate commit before it
// answers, on real faults, for plain pgx and database/sql, with the xid and with the
// marker. The workload is not idempotent — each operation adds one to its own counter — so
// a replay of a commit that applied would show as 2, and each attempt writes a row of its
// own, which tells whether the first one committed: the ground truth the answer must
// match. The first committed: Retry says Committed after 1 call (or, where the fault's
// table allows, Indeterminate with that reason); it aborted: Retry ran the attempt again,
// which commits, after 2 calls. Every counter ends at exactly 1. With automatic
// reconciliation on the tracer, Retry takes its answer: one tx.reconcile span per
// indeterminate frame, not two.
func TestRetrySettles(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	ops := srv.NewTable(t, ctx, "id int primary key, n int not null")
	attempts := srv.NewTable(t, ctx, "op int, n int, primary key (op, n)")
	held := srv.NewTable(t, ctx, "id int primary key")
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	pgtest.NoError(t, srv.Exec(ctx, `create or replace function retry_hold() returns trigger language plpgsql as $$
		begin perform pg_advisory_lock(4244); perform pg_advisory_unlock(4244); return null; end $$;
		create constraint trigger retry_hold after insert on `+held+` deferrable initially deferred
		for each row execute function retry_hold()`))
	refs := map[string]Option{"xid": WithCommitReference(), "marker": WithCommitMarker(marker)}
	type tally struct{ cases, calls, doubles, mismatches, firstCommitted, firstAborted int }
	var total tally
	answers := map[string]int{}
	id := 0
	for _, f := range settleFaults {
		for _, refName := range []string{"xid", "marker"} {
			for _, api := range []string{"pgx", "database/sql"} {
				autoToo := api == "pgx" && (f.name == "connection cut after COMMIT" || f.name == "terminated at COMMIT")
				for _, auto := range []bool{false, true} {
					if auto && !autoToo {
						continue
					}
					id++
					name := fmt.Sprintf("%s/%s/%s", f.name, refName, api)
					if auto {
						name += "/auto"
					}
					t.Run(name, func(t *testing.T) {
						res, calls := retrySettleCase(t, ctx, f, refs[refName], api, auto, ops, attempts, held, id)
						total.cases++
						total.calls += calls
						n := srv.CountOf(t, ctx, "select coalesce(sum(n), 0) from "+ops+" where id = $1", id)
						if n > 1 {
							total.doubles++
							t.Errorf("applied %d times", n)
						}
						if n != 1 {
							t.Errorf("counter %d, want 1: every case commits once", n)
						}
						first := srv.CountOf(t, ctx, "select count(*) from "+attempts+" where op = $1 and n = 1", id) == 1
						reason := ""
						if ind, ok := res.(outcome.Indeterminate[struct{}]); ok {
							var ae *reconcile.AnswerError
							if errors.As(ind.Cause(), &ae) {
								reason = ae.Answer.Reason()
							}
						}
						answers[res.Outcome().String()+" "+reason]++
						ok := false
						switch {
						case first:
							total.firstCommitted++
							ok = calls == 1 && (res.Outcome() == outcome.OutcomeCommitted ||
								res.Outcome() == outcome.OutcomeIndeterminate && reason != "" && reason == f.unknown[refName])
						default:
							total.firstAborted++
							ok = calls == 2 && res.Outcome() == outcome.OutcomeCommitted
						}
						if !ok {
							total.mismatches++
							t.Errorf("Retry: %s %q after %d calls; the first attempt committed: %v", res.Outcome(), reason, calls, first)
						}
					})
				}
			}
		}
	}
	t.Logf("%d cases, %d attempts, %d double applications, %d answers off the table; first attempts committed %d, aborted %d; outcomes: %v",
		total.cases, total.calls, total.doubles, total.mismatches, total.firstCommitted, total.firstAborted, answers)
}

// retrySettleCase runs one operation through Retry with a reconciler, on a pool through a
// proxy, with the fault f hitting its first COMMIT, and returns Retry's result and the
// number of attempts; each attempt n writes (id, n) into attempts.
func retrySettleCase(t *testing.T, ctx context.Context, f settleFault, ref Option, api string, auto bool, ops, attempts, held string, id int) (outcome.Result[struct{}], int) {
	pgtest.NoError(t, srv.Exec(ctx, fmt.Sprintf("insert into %s values (%d, 0)", ops, id)))
	proxy := pgtest.ProxyFor(t, srv)
	opts := []Option{ref}
	recDB := srv.Pool(t, ctx)
	if auto {
		opts = append(opts, withAutoReconcile(t, recDB))
	}
	h := newHarness(t, proxy.ConnString(srv.ConnString()), 2, opts...)
	t.Cleanup(func() { _ = h.tracer.Close(context.Background()) })
	rec, err := reconcile.New(recDB, reconcile.WithWait(2*time.Second, 10*time.Millisecond), reconcile.WithTracerProvider(h.tp))
	pgtest.NoError(t, err)
	var holder *pgx.Conn
	if f.hold == "trigger" {
		holder, err = srv.Conn(ctx)
		pgtest.NoError(t, err)
		t.Cleanup(func() { _ = holder.Close(context.Background()) })
		mustExec(t, ctx, holder, "select pg_advisory_lock(4244)")
	}
	hit := make(chan error, 1)
	// body is the operation's transaction, the same through either API; the first call
	// also arms the fault.
	calls := 0
	body := func(ctx context.Context, exec func(string, ...any) error, pid func() (uint32, error)) error {
		calls++
		if err := exec("update "+ops+" set n = n + 1 where id = $1", id); err != nil {
			return err
		}
		if err := exec("insert into "+attempts+" values ($1, $2)", id, calls); err != nil {
			return err
		}
		if calls > 1 {
			return nil
		}
		switch f.hold {
		case "trigger":
			if err := exec("insert into "+held+" values ($1)", id); err != nil {
				return err
			}
		case "syncrep":
			if err := exec("set local synchronous_commit = on"); err != nil {
				return err
			}
		}
		p, err := pid()
		if err != nil {
			return err
		}
		if f.hold == "" {
			hit <- f.hit(ctx, p, proxy)
			return nil
		}
		event := map[string]string{"trigger": "advisory", "syncrep": "SyncRep"}[f.hold]
		go func() {
			err := srv.WaitForWaitEvent(ctx, p, event)
			if err == nil {
				err = f.hit(ctx, p, proxy)
			}
			hit <- err
		}()
		return nil
	}
	var attempt func(context.Context) error
	switch api {
	case "pgx":
		attempt = func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
				return body(ctx, func(q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err },
					func() (uint32, error) { return tx.Conn().PgConn().PID(), nil })
			})
		}
	default:
		db := stdlib.OpenDBFromPool(h.pool)
		t.Cleanup(func() { _ = db.Close() })
		attempt = func(ctx context.Context) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			err = body(ctx, func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err },
				func() (uint32, error) {
					var pid uint32
					return pid, tx.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&pid)
				})
			if err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}
	}
	res, err := Retry(ctx, 3, attempt, WithReconciler(rec), WithReconcileWait(20*time.Second))
	if err := <-hit; err != nil {
		t.Fatalf("the fault: %v", err)
	}
	if res == nil {
		t.Fatalf("Retry: no verdict: %v", err)
	}
	if res.Outcome() == outcome.OutcomeCommitted && err != nil {
		t.Errorf("Retry: committed with error %v, want nil", err)
	}
	pgtest.NoError(t, srv.WaitQuiet(ctx))
	if auto {
		// Automatic reconciliation asked, once per indeterminate frame; Retry did not.
		indeterminate := 0
		for _, fs := range h.frames() {
			if attrString(t, fs, OutcomeKey) == "indeterminate" {
				indeterminate++
			}
		}
		if n := len(spansNamed(h, SpanNameReconcile)); n != indeterminate || n == 0 {
			t.Errorf("%d tx.reconcile spans for %d indeterminate frames, want one each (and at least one)", n, indeterminate)
		}
	}
	return res, calls
}

// spansNamed returns the ended spans called name.
func spansNamed(h *harness, name string) []string {
	var out []string
	for _, s := range h.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s.SpanContext.SpanID().String())
		}
	}
	return out
}

// TestRetryOptions: Retry refuses a nil reconciler and a negative wait before it calls
// the attempt; an Indeterminate that stays unknown keeps its operation, reference and
// trace parent, and says the answer in its cause.
func TestRetryOptions(t *testing.T) {
	called := false
	ok := func(context.Context) error { called = true; return nil }
	for name, opt := range map[string]RetryOption{"nil reconciler": WithReconciler(nil), "negative wait": WithReconcileWait(-time.Second)} {
		if _, err := Retry(context.Background(), 1, ok, opt); !errors.Is(err, ErrInvalidArgument) || called {
			t.Errorf("%s: %v (called %v), want ErrInvalidArgument and no call", name, err, called)
		}
	}
	if _, err := Retry(context.Background(), 1, ok, nil); err == nil || !strings.Contains(err.Error(), "no transaction") {
		t.Errorf("a nil option: %v, want it ignored (then no verdict)", err)
	}
	called = false

	// A commit whose reply the proxy cuts, on a frame without a reference: the answer is
	// no_reference, and stays unknown.
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	proxy := pgtest.ProxyFor(t, srv)
	h := newHarness(t, proxy.ConnString(srv.ConnString()), 1)
	rec, err := reconcile.New(srv.Pool(t, ctx))
	pgtest.NoError(t, err)
	calls := 0
	res, err := Retry(ctx, 3, func(ctx context.Context) error {
		calls++
		return pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
			mustExec(t, ctx, tx, fmt.Sprintf("insert into %s (id) values (1)", table))
			proxy.CutAfterCommit()
			return nil
		})
	}, WithReconciler(rec), WithReconcileWait(0))
	ind, isInd := res.(outcome.Indeterminate[struct{}])
	var ae *reconcile.AnswerError
	if !isInd || calls != 1 || err == nil || !errors.As(ind.Cause(), &ae) || ae.Answer.Reason() != reconcile.ReasonNoReference {
		t.Fatalf("Retry without a reference: %v (%v) after %d calls, want Indeterminate no_reference after 1", res, err, calls)
	}
	if ae.Err == nil || !strings.Contains(ind.Cause().Error(), "no_reference") {
		t.Errorf("the cause %q: want the answer and the commit's failure", ind.Cause())
	}
	if f := lastFrame(t, h); ind.OperationID().String() != attrString(t, f, OperationIDKey) || ind.TraceParent() == "" {
		t.Errorf("the settled Indeterminate lost its operation %s or trace parent %q", ind.OperationID(), ind.TraceParent())
	}
	pgtest.NoError(t, srv.WaitQuiet(ctx))
}
