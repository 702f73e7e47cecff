package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/inner"
	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// cancelWhen runs call with a context that is canceled once the backend of pid waits
// for event, and returns call's error.
func cancelWhen(t *testing.T, ctx context.Context, pid uint32, event string, call func(context.Context) error) error {
	t.Helper()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		err := srv.WaitForWaitEvent(ctx, pid, event)
		cancel()
		waited <- err
	}()
	err := call(cctx)
	if werr := <-waited; werr != nil {
		t.Fatal(werr)
	}
	return err
}

// spanNamed returns the last ended span named name.
func (h *harness) spanNamed(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	spans := h.exp.GetSpans()
	for i := len(spans) - 1; i >= 0; i-- {
		if spans[i].Name == name {
			return spans[i]
		}
	}
	t.Fatalf("no span %q in %v", name, names(spans))
	return tracetest.SpanStub{}
}

// expectedCase is what one configuration of the filter made of the same faults.
type expectedCase struct {
	frames              []tracetest.SpanStub // in start order
	statement, acquire  codes.Code           // the canceled SELECT's and acquire's status
	batchQuery          codes.Code           // the canceled batch query span's status
	counts              map[string]int64
	run                 outcome.Result[int]
	indeterminateReason string
}

// runExpectedFaults makes, for real, the failures the expected-error filter judges: a
// statement the caller cancels (then a Rollback), a Run whose caller cancels it, a
// unique violation, a statement whose deadline passes, an acquire the caller cancels, a
// batch the caller cancels, and a COMMIT the caller cancels while it waits for the
// synchronous standby (indeterminate).
func runExpectedFaults(t *testing.T, opts ...Option) expectedCase {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2, opts...)
	table := srv.NewTable(t, ctx, tableColumns)
	ctx, root := h.tp.Tracer("test").Start(ctx, "request")
	defer root.End()
	var c expectedCase

	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := conn.Conn().PgConn().PID()
	// 1. The caller cancels a statement, then rolls back (the connection is gone: the
	// frame ends when the pool gets it back).
	tx := mustBegin(t, ctx, conn)
	if err := cancelWhen(t, ctx, pid, "PgSleep", func(ctx context.Context) error {
		_, err := tx.Exec(ctx, "select pg_sleep(30)")
		return err
	}); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled statement: %v", err)
	}
	c.statement = h.spanNamed(t, "SELECT").Status.Code
	_ = tx.Rollback(ctx)
	conn.Release()

	// 2. Run: the caller cancels while fn's statement runs.
	conn, err = h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid = conn.Conn().PgConn().PID()
	conn.Release()
	_ = cancelWhen(t, ctx, pid, "PgSleep", func(ctx context.Context) error {
		c.run = Run(ctx, h.pool, Policy{Propagation: Required, MaxAttempts: 1}, func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, "select pg_sleep(30)")
			return 0, err
		})
		return nil
	})

	// 3. A unique violation; 4. a deadline.
	tx = mustBegin(t, ctx, h.pool)
	if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id) values (1), (1)", table)); err == nil {
		t.Fatal("duplicate insert succeeded")
	}
	_ = tx.Rollback(ctx)
	tx = mustBegin(t, ctx, h.pool)
	// Long enough that the deadline passes while the server sleeps, not before the
	// statement is sent, on a loaded machine too.
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	if _, err := tx.Exec(dctx, "select pg_sleep(30)"); err == nil {
		t.Fatal("pg_sleep outlived its deadline")
	}
	cancel()
	_ = tx.Rollback(ctx)

	// 5. The caller cancels an acquire that would wait for the pool's two connections.
	c1, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Release() // a second Release is a no-op; without it a failed test's pool never closes
	c2, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Release()
	actx, cancel := context.WithCancel(ctx)
	cancel() // the caller gave up: the acquire, which would wait, returns at once
	if _, err := h.pool.Acquire(actx); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled acquire: %v", err)
	}
	c.acquire = h.spanNamed(t, "pool.acquire").Status.Code
	c2.Release()

	// 6. The caller cancels a batch.
	pid = c1.Conn().PgConn().PID()
	_ = cancelWhen(t, ctx, pid, "PgSleep", func(ctx context.Context) error {
		b := &pgx.Batch{}
		b.Queue("select pg_sleep(30)")
		return c1.SendBatch(ctx, b).Close()
	})
	batch := h.spanNamed(t, "batch start")
	if qs := h.children(batch); len(qs) != 1 {
		t.Fatalf("batch: query spans %v, want the one canceled", names(qs))
	} else {
		c.batchQuery = qs[0].Status.Code
	}
	c1.Release()

	// 7. The caller cancels a COMMIT that waits for the synchronous standby.
	conn, err = h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx = mustBegin(t, ctx, conn)
	mustExec(t, ctx, tx, fmt.Sprintf("insert into %s (id) values (7)", table))
	mustExec(t, ctx, tx, "set local synchronous_commit = on")
	if err := cancelWhen(t, ctx, conn.Conn().PgConn().PID(), "SyncRep", tx.Commit); err == nil {
		t.Fatal("the canceled COMMIT succeeded")
	}
	conn.Release()
	if err := srv.Exec(ctx, "select pg_cancel_backend(pid) from pg_stat_activity where wait_event in ('SyncRep', 'PgSleep')"); err != nil {
		t.Fatal(err)
	}

	c.frames = h.frames()
	c.counts = nonZero(h.sums(t, ctx, metrics.MetricDuration, OutcomeKey, RollbackKey))
	for _, f := range c.frames {
		if v, _ := attr(f, OutcomeKey); v.AsString() == "indeterminate" {
			c.indeterminateReason = attrString(t, f, schema.ErrorTypeKey)
		}
	}
	return c
}

// TestExpectedErrors: with the default, the caller's own cancellation leaves the frame,
// statement, acquire and batch-query spans' status Unset, while a deadline and a unique
// violation stay Error; an application's predicate makes the unique violation expected
// too; WithExpectedErrors() with none makes every failure Error. tx.outcome, error.type,
// tx.rollback, the metrics and Run's result are the same in all three, and the canceled
// COMMIT stays indeterminate.
func TestExpectedErrors(t *testing.T) {
	uniqueViolation := func(_ context.Context, err error) bool {
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && pgErr.Code == "23505"
	}
	def := runExpectedFaults(t)
	none := runExpectedFaults(t, WithExpectedErrors())
	custom := runExpectedFaults(t, WithExpectedErrors(CallerCanceled, uniqueViolation))

	// Frames in order: canceled statement, Run, unique violation, deadline, canceled COMMIT.
	status := func(c expectedCase) []codes.Code {
		var out []codes.Code
		for _, f := range c.frames {
			out = append(out, f.Status.Code)
		}
		return append(out, c.statement, c.acquire, c.batchQuery)
	}
	E, U := codes.Error, codes.Unset
	for _, w := range []struct {
		name string
		c    expectedCase
		want []codes.Code
	}{
		{"default", def, []codes.Code{U, U, E, E, U, U, U, U}},
		{"none", none, []codes.Code{E, E, E, E, U, E, E, E}},
		{"custom", custom, []codes.Code{U, U, U, E, U, U, U, U}},
	} {
		if got := status(w.c); fmt.Sprint(got) != fmt.Sprint(w.want) {
			t.Errorf("%s: statuses (frames…, statement, acquire, batch query) %v, want %v", w.name, got, w.want)
		}
	}
	var errorTypes []string
	for _, f := range def.frames {
		errorTypes = append(errorTypes, attrString(t, f, schema.ErrorTypeKey))
	}
	if want := "[canceled canceled constraint_violation deadline_exceeded canceled]"; fmt.Sprint(errorTypes) != want {
		t.Errorf("frames' error.type %v, want %s", errorTypes, want)
	}
	wantCounts := map[string]int64{
		"tx.outcome=rolled_back,tx.rollback=failure": 4,
		"tx.outcome=indeterminate":                   1,
	}
	for name, c := range map[string]expectedCase{"default": def, "none": none, "custom": custom} {
		if len(c.frames) != 5 {
			t.Fatalf("%s: %d frames: %v", name, len(c.frames), names(c.frames))
		}
		if c.indeterminateReason != "canceled" {
			t.Errorf("%s: the canceled COMMIT's frame error.type %q, want indeterminate, canceled", name, c.indeterminateReason)
		}
		for i, f := range c.frames {
			if want := def.frames[i]; fmt.Sprint(outcomeAttrs(f)) != fmt.Sprint(outcomeAttrs(want)) {
				t.Errorf("%s frame %d: %v, default %v: the filter changed more than the status", name, i, outcomeAttrs(f), outcomeAttrs(want))
			}
		}
		if !maps.Equal(c.counts, wantCounts) {
			t.Errorf("%s: %s = %v, want %v", name, metrics.MetricDuration, c.counts, wantCounts)
		}
		rb, ok := c.run.(outcome.DeterminateRollback[int])
		if !ok || rb.Retryable() || rb.Phase() != outcome.PhaseActive || !errors.Is(rb.Cause(), context.Canceled) {
			t.Errorf("%s: Run = %#v, want a rollback in active, caused by the cancellation", name, c.run)
		}
	}
}

// outcomeAttrs are a frame's attributes that say what happened: everything but ids.
func outcomeAttrs(f tracetest.SpanStub) []attribute.KeyValue {
	var out []attribute.KeyValue
	for _, kv := range f.Attributes {
		switch kv.Key {
		case OutcomeKey, PhaseKey, RollbackKey, schema.ErrorTypeKey, schema.DBResponseStatusKey, RetryableKey, PropagationKey:
			out = append(out, kv)
		}
	}
	return out
}

// TestExpectedErrorsBadInput: a nil function is an error, not a panic later.
func TestExpectedErrorsBadInput(t *testing.T) {
	cfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InstrumentConnConfig(cfg, WithExpectedErrors(CallerCanceled, nil)); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Fatalf("InstrumentConnConfig with a nil ExpectedErrorFunc: %v, want an error", err)
	}
}

// TestExpectedErrorsLeaveUserTracerAlone: a tracer of the user's own ends its spans in
// the context pgx gives, never a wrapped span.
func TestExpectedErrorsLeaveUserTracerAlone(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	rec := &endSpanRecorder{}
	h := newHarness(t, "", 1, WithInnerTracer(rec))
	ctx, root := h.tp.Tracer("test").Start(ctx, "request")
	defer root.End()
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := cancelWhen(t, ctx, conn.Conn().PgConn().PID(), "PgSleep", func(ctx context.Context) error {
		_, err := conn.Exec(ctx, "select pg_sleep(30)")
		return err
	}); err == nil {
		t.Fatal("pg_sleep outlived its cancellation")
	}
	if rec.ends == 0 || rec.wrapped != 0 {
		t.Fatalf("the user's tracer ended %d queries, %d of them with a wrapped span", rec.ends, rec.wrapped)
	}
}

// endSpanRecorder is a user's query tracer that notes the span its End hooks are given.
type endSpanRecorder struct{ ends, wrapped int }

func (r *endSpanRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (r *endSpanRecorder) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	r.ends++
	if _, ok := trace.SpanFromContext(ctx).(inner.ExpectedSpan); ok {
		r.wrapped++
	}
}
