package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// policyWith is the default policy with propagation prop.
func policyWith(prop Propagation) Policy {
	p := DefaultPolicy()
	p.Propagation = prop
	return p
}

func TestRunCommitted(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2)
	table := srv.NewTable(t, ctx, tableColumns)
	res := Run(ctx, h.pool, DefaultPolicy(), insertFn(table, 1))
	c, ok := res.(outcome.Committed[int])
	if !ok {
		t.Fatalf("result = %T %+v, want Committed", res, res)
	}
	if c.Value() != 1 || c.OperationID().IsZero() {
		t.Fatalf("value %d id %v", c.Value(), c.OperationID())
	}
	f := onlyFrame(t, h)
	wantAttr(t, f, "tx.outcome", "committed")
	wantAttr(t, f, "tx.operation_id", c.OperationID().String())
	wantAttr(t, f, "tx.propagation", "required")
	wantAttr(t, f, "tx.attempt", "1")
	wantEvents(t, f, "tx.phase.active", "tx.phase.committing", "tx.phase.committed")
	wantStatus(t, f, codes.Ok, "")
	ref := attrString(t, f, ReconciliationRefKey)
	if _, err := outcome.ParseReconciliationRef(ref); err != nil {
		t.Fatalf("tx.reconciliation.ref %q: %v", ref, err)
	}
	if !srv.RowExists(t, ctx, table, 1) {
		t.Fatal("row absent")
	}
}

func TestRunParticipating(t *testing.T) {
	for _, outerCommits := range []bool{true, false} {
		t.Run(fmt.Sprintf("outer commits %v", outerCommits), func(t *testing.T) {
			ctx := pgtest.ContextFor(t)
			h := newHarness(t, "", 2)
			table := srv.NewTable(t, ctx, tableColumns)
			var inner outcome.Result[int]
			res := Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
				inner = Run(ctx, h.pool, DefaultPolicy(), insertFn(table, 2))
				if !outerCommits {
					return 0, errors.New("outer gives up")
				}
				return insertFn(table, 1)(ctx, tx)
			})
			p, ok := inner.(outcome.Participating[int])
			if !ok {
				t.Fatalf("inner result = %T, want Participating", inner)
			}
			if p.OperationID() != res.OperationID() || p.Value() != 2 {
				t.Fatal("participant does not name the owner's frame")
			}
			if outerCommits {
				if _, ok := res.(outcome.Committed[int]); !ok {
					t.Fatalf("outer = %T", res)
				}
			} else if _, ok := res.(outcome.DeterminateRollback[int]); !ok {
				t.Fatalf("outer = %T", res)
			}
			// Still Participating: a participant never claims the owner's commit.
			if inner.Outcome() != outcome.OutcomeParticipating {
				t.Fatal("participant changed its outcome")
			}
			if got := srv.RowExists(t, ctx, table, 2); got != outerCommits {
				t.Fatalf("participant's row present = %v", got)
			}
			if n := len(h.frames()); n != 1 {
				t.Fatalf("%d frames, want one (participants have none)", n)
			}
			// The participant is an event on the owner's frame, and counted.
			if outerCommits {
				wantEvents(t, onlyFrame(t, h), "tx.phase.active", "tx.participant", "tx.phase.committing", "tx.phase.committed")
			} else {
				wantEvents(t, onlyFrame(t, h), "tx.phase.active", "tx.participant", "tx.phase.rolled_back")
			}
			if got := h.sums(t, ctx, metrics.MetricParticipations, schema.ParticipantOutcomeKey)["tx.participant.outcome=participating"]; got != 1 {
				t.Fatalf("participating counted %d times", got)
			}
		})
	}
}

func TestRunParticipantFailureDoomsOwner(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2)
	table := srv.NewTable(t, ctx, tableColumns)
	boom := errors.New("participant failed")
	res := Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		r := Run(ctx, h.pool, Policy{Propagation: Mandatory, MaxAttempts: 1}, func(ctx context.Context, tx pgx.Tx) (int, error) {
			insertFn(table, 2)(ctx, tx)
			return 0, boom
		})
		if rb, ok := r.(outcome.DeterminateRollback[int]); !ok || rb.Retryable() {
			t.Errorf("participant failure = %T", r)
		}
		return insertFn(table, 1)(ctx, tx) // the owner ignores the failure
	})
	rb, ok := res.(outcome.DeterminateRollback[int])
	if !ok || !errors.Is(rb.Cause(), boom) {
		t.Fatalf("owner = %T %+v, want a rollback caused by the participant", res, res)
	}
	if srv.RowExists(t, ctx, table, 1) || srv.RowExists(t, ctx, table, 2) {
		t.Fatal("a doomed transaction committed")
	}
}

// TestRunRetriesSerializationFailure: two goroutines force a 40001; the loser is
// retried to success.
func TestRunRetriesSerializationFailure(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 4)
	table := srv.NewTable(t, ctx, tableColumns)
	if err := srv.Exec(ctx, "insert into "+table+" (id, k, v) values (1, 1, 0), (2, 2, 0)"); err != nil {
		t.Fatal(err)
	}
	p := DefaultPolicy()
	p.IsoLevel, p.MaxAttempts = pgx.Serializable, 5
	var calls [2]atomic.Int32
	readDone := make(chan struct{}, 2)
	bothRead := make(chan struct{})
	go func() { <-readDone; <-readDone; close(bothRead) }()
	var wg sync.WaitGroup
	results := make([]outcome.Result[int], 2)
	for w := range 2 {
		wg.Go(func() {
			results[w] = Run(ctx, h.pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
				attempt := calls[w].Add(1)
				var sum int
				if err := tx.QueryRow(ctx, fmt.Sprintf("select coalesce(sum(v), 0) from %s where k = %d", table, w+1)).Scan(&sum); err != nil {
					return 0, err
				}
				if attempt == 1 {
					readDone <- struct{}{}
					<-bothRead // both first attempts read before either writes: write skew
				}
				_, err := tx.Exec(ctx, fmt.Sprintf("update %s set v = v + %d where k = %d", table, sum+1, 2-w))
				return int(attempt), err
			})
		})
	}
	wg.Wait()
	retried := 0
	for w, r := range results {
		c, ok := r.(outcome.Committed[int])
		if !ok {
			t.Fatalf("worker %d: %T %+v", w, r, r)
		}
		if c.Value() > 1 {
			retried++
		}
	}
	if retried != 1 {
		t.Fatalf("want exactly one worker retried, got %d (calls %d, %d)", retried, calls[0].Load(), calls[1].Load())
	}
	var retryEvents, failedFrames int
	for _, f := range h.frames() {
		if v, _ := attr(f, OutcomeKey); v.AsString() == "rolled_back" {
			failedFrames++
			wantAttr(t, f, "tx.retryable", "true")
			wantAttr(t, f, "error.type", "serialization_failure")
		}
		for _, e := range eventNames(f) {
			if e == schema.EventRetry {
				retryEvents++
			}
		}
	}
	if failedFrames != 1 || retryEvents != 1 {
		t.Fatalf("failed frames %d, retry events %d; want 1 and 1", failedFrames, retryEvents)
	}
}

func TestRunDeferredViolationNotRetried(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2)
	table := srv.NewTable(t, ctx, tableColumns)
	if err := srv.Exec(ctx, "insert into "+table+" (id, k) values (1, 7)"); err != nil {
		t.Fatal(err)
	}
	p := DefaultPolicy()
	p.MaxAttempts = 5
	calls := 0
	res := Run(ctx, h.pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
		calls++
		_, err := tx.Exec(ctx, "insert into "+table+" (id, k) values (2, 7)")
		return 0, err
	})
	rb, ok := res.(outcome.DeterminateRollback[int])
	var pgErr *pgconn.PgError
	if !ok || rb.Retryable() || rb.Phase() != outcome.PhaseCommitting || !errors.As(rb.Cause(), &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("result = %T %+v", res, res)
	}
	if calls != 1 {
		t.Fatalf("fn called %d times", calls)
	}
}

// TestRunIndeterminateNeverRetried: the backend dies in the synchronous-replication wait.
// The result is Indeterminate with a reference, fn ran once, and the reconciler finds the
// commit.
func TestRunIndeterminateNeverRetried(t *testing.T) {
	overTransports(t, overRunIndeterminateNeverRetried)
}

func overRunIndeterminateNeverRetried(t *testing.T, base string) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, base, 2)
	table := srv.NewTable(t, ctx, tableColumns)
	p := DefaultPolicy()
	p.MaxAttempts = 5
	var calls atomic.Int32
	pids := make(chan uint32, 1)
	go func() {
		pid := <-pids
		if err := srv.TerminateInSyncRep(ctx, pid); err != nil {
			t.Error(err)
		}
	}()
	res := Run(ctx, h.pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
		calls.Add(1)
		if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
			return 0, err
		}
		pids <- tx.Conn().PgConn().PID()
		return insertFn(table, 1)(ctx, tx)
	})
	ind, ok := res.(outcome.Indeterminate[int])
	if !ok {
		t.Fatalf("result = %T %+v, want Indeterminate", res, res)
	}
	if calls.Load() != 1 {
		t.Fatalf("fn called %d times: an indeterminate commit was replayed", calls.Load())
	}
	ref, ok := ind.Reference()
	if !ok || ref.NoWrites() || !ind.CommittedLocally() || ind.TraceParent() == "" {
		t.Fatalf("reference %v %v, committed locally %v, traceparent %q", ref, ok, ind.CommittedLocally(), ind.TraceParent())
	}
	f := onlyFrame(t, h)
	wantAttr(t, f, "tx.outcome", "indeterminate")
	wantAttr(t, f, "tx.reconciliation.xid", fmt.Sprint(ref.XID))
	wantStatus(t, f, codes.Unset, "")

	rec, err := reconcile.New(h.pool, reconcile.WithTracerProvider(h.tp))
	if err != nil {
		t.Fatal(err)
	}
	got, err := reconcile.Indeterminate(ctx, rec, ind)
	if err != nil || got.Status() != reconcile.Committed {
		t.Fatalf("reconciled %v (%s), %v; want committed", got.Status(), got.Reason(), err)
	}
	if !srv.RowExists(t, ctx, table, 1) {
		t.Fatal("row absent after a reconciled commit")
	}
	// The reconciliation span links to the frame.
	var linked bool
	for _, s := range h.exp.GetSpans() {
		if s.Name == SpanNameReconcile {
			wantAttr(t, s, "tx.outcome.resolved", "committed")
			if s.SpanKind != trace.SpanKindInternal {
				t.Fatalf("tx.reconcile kind %v, want INTERNAL", s.SpanKind)
			}
			for _, l := range s.Links {
				linked = linked || l.SpanContext.SpanID() == f.SpanContext.SpanID()
			}
			// Reconcile was called on a context without a span: the span is the frame's child.
			if s.Parent.TraceID() != f.SpanContext.TraceID() || s.Parent.SpanID() != f.SpanContext.SpanID() {
				t.Fatalf("tx.reconcile parent %v, want the frame span %v", s.Parent, f.SpanContext)
			}
		}
	}
	if !linked {
		t.Fatal("no tx.reconcile span linked to the frame")
	}
}

// TestRunIdleTermination: the backend is terminated while the transaction is idle; its
// FATAL waits in the socket before COMMIT is written, so the commit provably never ran:
// a retryable rollback (session_ended_before_commit), not an indeterminate outcome. The
// ground truth is aborted.
func TestRunIdleTermination(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2)
	table := srv.NewTable(t, ctx, tableColumns)
	p := DefaultPolicy()
	p.MaxAttempts = 1
	res := Run(ctx, h.pool, p, insertThen(table, func(ctx context.Context, tx pgx.Tx) (int, error) {
		terminateIdle(t, ctx, tx.Conn())
		return 1, nil
	}))
	rb, ok := res.(outcome.DeterminateRollback[int])
	if !ok || !rb.Retryable() || rb.Phase() != outcome.PhaseCommitting {
		t.Fatalf("result = %T %+v", res, res)
	}
	wantAttr(t, onlyFrame(t, h), "error.type", "session_ended_before_commit")
	if srv.RowExists(t, ctx, table, 1) {
		t.Fatal("row present")
	}
}

func TestRunPostCommitFailure(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2)
	table := srv.NewTable(t, ctx, tableColumns)
	var ran []string
	hookErr := errors.New("publish failed")
	res := Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		if err := AfterCommit(ctx, func(context.Context) error { ran = append(ran, "owner"); return hookErr }); err != nil {
			return 0, err
		}
		Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
			return 0, AfterCommit(ctx, func(context.Context) error { ran = append(ran, "participant"); return nil })
		})
		return insertFn(table, 1)(ctx, tx)
	})
	pc, ok := res.(outcome.CommittedWithPostCommitFailure[int])
	if !ok || !errors.Is(pc.Failure(), hookErr) {
		t.Fatalf("result = %T %+v", res, res)
	}
	if strings.Join(ran, ",") != "owner,participant" {
		t.Fatalf("hooks ran: %v", ran)
	}
	if !srv.RowExists(t, ctx, table, 1) {
		t.Fatal("the commit was undone")
	}
	f := onlyFrame(t, h)
	wantAttr(t, f, "tx.outcome", "committed_with_post_commit_failure")
	wantStatus(t, f, codes.Ok, "")
	kids := h.children(f)
	var post bool
	for _, k := range kids {
		if k.Name == schema.SpanNamePostCommit {
			post = true
			if k.Status.Code != codes.Error {
				t.Fatalf("post-commit span status %v", k.Status)
			}
		}
	}
	if !post {
		t.Fatal("no tx.post_commit child span")
	}
	// A rollback discards hooks.
	ran = nil
	Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		AfterCommit(ctx, func(context.Context) error { ran = append(ran, "discarded"); return nil })
		return 0, errors.New("no")
	})
	if len(ran) != 0 {
		t.Fatalf("hooks of a rolled-back transaction ran: %v", ran)
	}
}

func TestRunRequiresNewInsideRequired(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2)
	table := srv.NewTable(t, ctx, tableColumns)
	var inner outcome.Result[int]
	res := Run(ctx, h.pool, DefaultPolicy(), insertThen(table, func(ctx context.Context, tx pgx.Tx) (int, error) {
		p := policyWith(RequiresNew)
		inner = Run(ctx, h.pool, p, insertFn(table, 2))
		return 0, errors.New("outer rolls back")
	}))
	if _, ok := inner.(outcome.Committed[int]); !ok {
		t.Fatalf("inner = %T %+v", inner, inner)
	}
	if _, ok := res.(outcome.DeterminateRollback[int]); !ok {
		t.Fatalf("outer = %T", res)
	}
	if srv.RowExists(t, ctx, table, 1) || !srv.RowExists(t, ctx, table, 2) {
		t.Fatal("want the inner row kept and the outer row gone")
	}
	fs := h.frames()
	if len(fs) != 2 {
		t.Fatalf("%d frames", len(fs))
	}
	o, i := fs[0], fs[1]
	if i.Parent.SpanID() != o.SpanContext.SpanID() {
		t.Fatal("inner frame is not a child of the outer")
	}
	wantAttr(t, i, "tx.frame.depth", "1")
	wantAttr(t, i, "tx.propagation", "requires_new")
	wantEvents(t, o, "tx.phase.active", "tx.suspended", "tx.resumed", "tx.phase.rolled_back")
	wantStatus(t, o, codes.Error, schema.StatusDescriptionRolledBack)
}

func TestRunNestedSavepoint(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2)
	table := srv.NewTable(t, ctx, tableColumns)
	var hooks []string
	var nested outcome.Result[int]
	res := Run(ctx, h.pool, DefaultPolicy(), insertThen(table, func(ctx context.Context, tx pgx.Tx) (int, error) {
		p := policyWith(Nested)
		nested = Run(ctx, h.pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
			AfterCommit(ctx, func(context.Context) error { hooks = append(hooks, "nested"); return nil })
			insertFn(table, 2)(ctx, tx)
			return 0, errors.New("undo the nested part")
		})
		ok := Run(ctx, h.pool, p, insertFn(table, 3))
		if _, is := ok.(outcome.Participating[int]); !is {
			t.Errorf("released savepoint = %T", ok)
		}
		return 1, nil
	}))
	if _, ok := res.(outcome.Committed[int]); !ok {
		t.Fatalf("outer = %T %+v", res, res)
	}
	if rb, ok := nested.(outcome.DeterminateRollback[int]); !ok || rb.Retryable() {
		t.Fatalf("nested = %T", nested)
	}
	if !srv.RowExists(t, ctx, table, 1) || srv.RowExists(t, ctx, table, 2) || !srv.RowExists(t, ctx, table, 3) {
		t.Fatal("savepoint rollback not as expected in the table")
	}
	if len(hooks) != 0 {
		t.Fatalf("hooks of a rolled-back savepoint ran: %v", hooks)
	}
	wantEvents(t, onlyFrame(t, h), "tx.phase.active", "tx.savepoint.created", "tx.savepoint.rolled_back", "tx.participant",
		"tx.savepoint.created", "tx.savepoint.released", "tx.participant", "tx.phase.committing", "tx.phase.committed")
}

func TestRunPanicRollsBack(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	table := srv.NewTable(t, ctx, tableColumns)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want the original panic", p)
			}
		}()
		Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
			insertFn(table, 1)(ctx, tx)
			panic("boom")
		})
	}()
	f := onlyFrame(t, h)
	wantAttr(t, f, "tx.outcome", "rolled_back")
	wantStatus(t, f, codes.Error, schema.StatusDescriptionRolledBack)
	if srv.RowExists(t, ctx, table, 1) {
		t.Fatal("row present after panic")
	}
	h.wantNoFrames(t, ctx)
	// The pool's only connection is back and usable.
	if r := Run(ctx, h.pool, DefaultPolicy(), insertFn(table, 2)); r.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("after panic: %T", r)
	}
}

func TestRunBadInput(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	fn := func(context.Context, pgx.Tx) (int, error) { return 0, nil }
	bad := func(p Policy) Policy { return p }
	zero := DefaultPolicy()
	zero.MaxAttempts = 0
	neg := DefaultPolicy()
	neg.MaxAttempts = -1
	iso := DefaultPolicy()
	iso.IsoLevel = "snapshot"
	conn, err := pgx.Connect(ctx, srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for name, res := range map[string]outcome.Result[int]{
		"nil db":               Run[int](ctx, nil, DefaultPolicy(), fn),
		"typed nil pool":       Run(ctx, (*pgxpool.Pool)(nil), DefaultPolicy(), fn),
		"nil fn":               Run[int](ctx, h.pool, DefaultPolicy(), nil),
		"zero attempts":        Run(ctx, h.pool, zero, fn),
		"negative attempts":    Run(ctx, h.pool, neg, fn),
		"unknown propagation":  Run(ctx, h.pool, bad(Policy{Propagation: 42, MaxAttempts: 1}), fn),
		"zero policy":          Run(ctx, h.pool, Policy{}, fn),
		"unknown isolation":    Run(ctx, h.pool, iso, fn),
		"mandatory, no outer":  Run(ctx, h.pool, Policy{Propagation: Mandatory, MaxAttempts: 1}, fn),
		"requires new on conn": Run(ctx, conn, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) { return requiresNewOn(ctx, conn) }),
		"requires new, pool of one": Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
			return requiresNewOn(ctx, h.pool)
		}),
	} {
		rb, ok := res.(outcome.DeterminateRollback[int])
		if !ok || !errors.Is(rb.Cause(), ErrInvalidArgument) || rb.Retryable() {
			t.Errorf("%s: %T %+v, want a non-retryable rollback wrapping ErrInvalidArgument", name, res, res)
			continue
		}
		t.Logf("%s: %v", name, rb.Cause())
		// An invalid policy's error names the fix.
		if strings.Contains(name, "policy") || strings.Contains(name, "propagation") || strings.Contains(name, "attempts") {
			if !strings.Contains(rb.Cause().Error(), "DefaultPolicy()") {
				t.Errorf("%s: %q does not point at DefaultPolicy()", name, rb.Cause())
			}
		}
	}
	if _, err := reconcile.New(nil); !errors.Is(err, reconcile.ErrInvalidArgument) {
		t.Fatalf("reconcile.New(nil) = %v", err)
	}
	// Reconciling commits transactions of its own: a transaction as its db is refused.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := reconcile.New(tx); !errors.Is(err, reconcile.ErrInvalidArgument) {
		t.Fatalf("reconcile.New(a pgx.Tx) = %v", err)
	}
	if err := AfterCommit(ctx, func(context.Context) error { return nil }); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("AfterCommit outside Run = %v", err)
	}
}

// requiresNewOn runs a RequiresNew on db and returns the inner result's cause as error.
func requiresNewOn(ctx context.Context, db DB) (int, error) {
	p := policyWith(RequiresNew)
	r := Run(ctx, db, p, func(context.Context, pgx.Tx) (int, error) { return 0, nil })
	if rb, ok := r.(outcome.DeterminateRollback[int]); ok {
		return 0, rb.Cause()
	}
	return 0, fmt.Errorf("RequiresNew gave %T", r)
}

// TestRunReferenceAddsNoRoundTrip counts round trips at the proxy: a Run with one statement
// takes as many with commit references as without.
func TestRunReferenceAddsNoRoundTrip(t *testing.T) {
	overTransports(t, overRunReferenceAddsNoRoundTrip)
}

func overRunReferenceAddsNoRoundTrip(t *testing.T, base string) {
	ctx := pgtest.ContextFor(t)
	proxy := pgtest.ProxyFor(t, srv)
	h := newHarness(t, proxy.ConnString(base), 1)
	table := srv.NewTable(t, ctx, tableColumns)
	count := func(withRef bool, id int) int64 {
		p := DefaultPolicy()
		p.CommitReference = withRef
		proxy.ResetRoundTrips()
		if r := Run(ctx, h.pool, p, insertFn(table, id)); r.Outcome() != outcome.OutcomeCommitted {
			t.Fatalf("%T", r)
		}
		return proxy.RoundTrips()
	}
	count(true, 1) // warm up: the pool connects and Run reads the cluster identity here
	with, without := count(true, 2), count(false, 3)
	t.Logf("round trips: with references %d, without %d", with, without)
	if with != without {
		t.Fatalf("round trips with references %d, without %d", with, without)
	}
}

// TestRunUnreadResult: fn returns nil with a pgx.Rows it never closed. pgconn refuses
// COMMIT on the busy connection before sending a byte, so nothing can have committed:
// Run rolls back (the failed ROLLBACK closes the connection) and says so, never
// indeterminate, with references on and off; the frame agrees. Through plain pgx the same
// COMMIT never marks committing, and the frame ends rolled back when the pool drops the
// connection pgx closed.
func TestRunUnreadResult(t *testing.T) {
	for _, withRef := range []bool{false, true} {
		t.Run(fmt.Sprintf("references %v", withRef), func(t *testing.T) {
			ctx := pgtest.ContextFor(t)
			h := newHarness(t, "", 2)
			table := srv.NewTable(t, ctx, tableColumns)
			p := DefaultPolicy()
			p.CommitReference = withRef
			res := Run(ctx, h.pool, p, insertThen(table, func(ctx context.Context, tx pgx.Tx) (int, error) {
				_, err := tx.Query(ctx, "select generate_series(1, 100000)")
				return 1, err // the rows are left open
			}))
			rb, ok := res.(outcome.DeterminateRollback[int])
			if !ok {
				t.Fatalf("result = %T %+v, want DeterminateRollback", res, res)
			}
			if !errors.Is(rb.Cause(), ErrUnreadResult) || rb.Retryable() || rb.Phase() != outcome.PhaseActive {
				t.Fatalf("rollback cause %v retryable %v phase %s; want ErrUnreadResult, not retryable, active",
					rb.Cause(), rb.Retryable(), rb.Phase())
			}
			f := onlyFrame(t, h)
			wantAttr(t, f, "tx.outcome", "rolled_back")
			wantAttr(t, f, "tx.phase", "rolled_back")
			wantEvents(t, f, "tx.phase.active", "tx.phase.rolled_back")
			if srv.RowExists(t, ctx, table, 1) {
				t.Fatal("the row committed")
			}
			h.wantNoFrames(t, ctx)
		})
	}
	t.Run("plain pgx", func(t *testing.T) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 1)
		table := srv.NewTable(t, ctx, tableColumns)
		tx, err := h.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := insertFn(table, 1)(ctx, tx); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "select generate_series(1, 100000)")
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("COMMIT on a busy connection succeeded")
		}
		rows.Close()
		f := onlyFrame(t, h)
		wantAttr(t, f, "tx.outcome", "rolled_back")
		wantEvents(t, f, "tx.phase.active", "tx.phase.rolled_back")
		if srv.RowExists(t, ctx, table, 1) {
			t.Fatal("the row committed")
		}
		h.wantNoFrames(t, ctx)
	})
}
