package otelpgxtx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// metricAttrs returns the attribute sets of the duration histogram's data points: one per
// series a frame was counted in.
func (h *harness) metricAttrs(t *testing.T, ctx context.Context) []attribute.Set {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	var out []attribute.Set
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != metrics.MetricDuration {
				continue
			}
			for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				if dp.Count > 0 {
					out = append(out, dp.Attributes)
				}
			}
		}
	}
	return out
}

// commitOne runs BEGIN, one insert and COMMIT through the harness's pool in ctx.
func commitOne(t *testing.T, ctx context.Context, h *harness, table string, id int) {
	t.Helper()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id) values ($1)", table), id); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSpanAndMeterAttributes: span attributes go to the frame span and to the default
// otelpgx statement spans, never to metrics; meter attributes go to the metrics only.
func TestSpanAndMeterAttributes(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1,
		WithSpanAttributes(attribute.String("deployment", "blue")),
		WithMeterAttributes(attribute.String("cell", "c1")))
	commitOne(t, ctx, h, srv.NewTable(t, ctx, tableColumns), 1)
	f := onlyFrame(t, h)
	wantAttr(t, f, "deployment", "blue")
	if _, ok := attr(f, "cell"); ok {
		t.Error("a meter attribute is on the frame span")
	}
	stmts := h.children(f)
	if len(stmts) == 0 {
		t.Fatal("no statement spans")
	}
	for _, s := range stmts {
		wantAttr(t, s, "deployment", "blue")
	}
	sets := h.metricAttrs(t, ctx)
	if len(sets) != 1 {
		t.Fatalf("counted series %v, want the one committed", sets)
	}
	if v, _ := sets[0].Value("cell"); v.AsString() != "c1" {
		t.Errorf("counter attributes %v: want cell=c1", sets[0].ToSlice())
	}
	if sets[0].HasValue("deployment") {
		t.Errorf("counter attributes %v: a span attribute is on the metric", sets[0].ToSlice())
	}
}

type nameKey struct{}

// TestSpanNameCtxFunc: the function gets the caller's context and BEGIN as pgx sent it;
// an empty name keeps the fixed one.
func TestSpanNameCtxFunc(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	var begins []string
	h := newHarness(t, "", 1, WithSpanName("tx"), WithSpanNameCtxFunc(func(ctx context.Context, begin string) string {
		begins = append(begins, begin)
		name, _ := ctx.Value(nameKey{}).(string)
		return name
	}))
	tx, err := h.pool.BeginTx(context.WithValue(ctx, nameKey{}, "checkout"), pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	commitOne(t, ctx, h, srv.NewTable(t, ctx, tableColumns), 1)
	// The transaction COMMIT AND CHAIN begins keeps its predecessor's name.
	withConn(t, ctx, h, func(c *pgx.Conn) {
		mustExec(t, context.WithValue(ctx, nameKey{}, "batch job"), c, "BEGIN", "commit and chain")
		mustExec(t, ctx, c, "commit")
		// A name leaves the process: the function sees the text without its literals.
		mustExec(t, ctx, c, "begin; select 'card 4111111111111111'", "commit")
	})
	var got []string
	for _, f := range h.frames() {
		got = append(got, f.Name)
	}
	if !slices.Equal(got, []string{"checkout", "tx", "batch job", "batch job", "tx"}) {
		t.Fatalf("frame spans %v, want [checkout tx batch job batch job tx]", got)
	}
	if !slices.Equal(begins, []string{"begin isolation level serializable", "begin", "BEGIN", "begin; select ?"}) {
		t.Fatalf("the function got %q, want pgx's BEGIN statements as the statement spans record them", begins)
	}
}

// TestStatementSpanNames: the default otelpgx inner tracer takes its span names and
// db.operation.name from the Tracer's cache, and they are the ones otelpgx makes itself
// (otelpgx.SQLOperationName of the db.query.text it was given), for sanitized and raw
// text, first and cached use, statements, prepares and batches alike; a user's own
// otelpgx.WithSpanNameFunc still decides.
func TestStatementSpanNames(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	stmts := []struct {
		sql  string
		args []any
	}{{"select 1", nil}, {"SeLeCt $1::int", []any{1}}, {"-- name: GetOne :one\nselect 2", nil}, {"/* hint */ values (3)", nil}, {"  \n\tselect 'x'", nil}}
	for _, tc := range []struct {
		name string
		opts []Option
		mine bool
	}{
		{"sanitized", nil, false},
		{"raw", []Option{WithRawQueryText()}, false},
		{"user's", []Option{WithOtelpgxOptions(otelpgx.WithSpanNameFunc(func(string) string { return "mine" }))}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// BEGIN's and COMMIT's spans too, in place of the frame's events.
			h := newHarness(t, "", 1, append(tc.opts, WithInnerSpans(InnerSpanTransactionControl))...)
			withConn(t, ctx, h, func(c *pgx.Conn) {
				for range 2 { // the first use fills the cache, the second finds it there
					tx, err := c.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					for _, st := range stmts {
						if _, err := tx.Exec(ctx, st.sql, st.args...); err != nil {
							t.Fatal(err)
						}
					}
					if _, err := tx.Prepare(ctx, "p", "select 4"); err != nil {
						t.Fatal(err)
					}
					b := &pgx.Batch{}
					b.Queue("select 5")
					b.Queue("/* b */ select 6")
					if err := tx.SendBatch(ctx, b).Close(); err != nil {
						t.Fatal(err)
					}
					if err := tx.Commit(ctx); err != nil {
						t.Fatal(err)
					}
				}
			})
			n := 0
			for _, s := range h.exp.GetSpans() {
				text, ok := attr(s, "db.query.text")
				if !ok || s.InstrumentationScope.Name == ScopeName {
					continue
				}
				n++
				want := otelpgx.SQLOperationName(ctx, text.AsString())
				if tc.mine {
					want = "mine"
				}
				if op, _ := attr(s, "db.operation.name"); s.Name != want || op.AsString() != want {
					t.Errorf("span of %q is %q with db.operation.name %q, want %q", text.AsString(), s.Name, op.AsString(), want)
				}
			}
			if n < 2*(len(stmts)+4) { // BEGIN, the statements, the prepare, the batch's two, COMMIT
				t.Fatalf("%d statement spans with db.query.text, want at least %d", n, 2*(len(stmts)+4))
			}
		})
	}
}

type skipKey struct{}

// TestFilter: a rejected frame has no span; its statements are children of the caller's
// span, its outcome is still counted and logged, and Run still returns the verdict the
// evidence proves, indeterminate with its reference included, which reconciles.
func TestFilter(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	var logs bytes.Buffer
	var asked atomic.Int32
	h := newHarness(t, "", 2, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithFilter(
		func(ctx context.Context, begin string) bool { asked.Add(1); return true },
		func(ctx context.Context, begin string) bool { return ctx.Value(skipKey{}) == nil },
	))
	table := srv.NewTable(t, ctx, tableColumns)
	rctx, root := rootSpan(ctx, h)
	skip := context.WithValue(rctx, skipKey{}, true)

	commitOne(t, skip, h, table, 1)
	// The transaction COMMIT AND CHAIN begins keeps its predecessor's decision.
	withConn(t, skip, h, func(c *pgx.Conn) {
		mustExec(t, skip, c, "begin", "commit and chain")
		mustExec(t, ctx, c, "commit")
	})
	rb := Run(skip, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		if _, err := insertFn(table, 2)(ctx, tx); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("rejected")
	})
	if _, ok := rb.(outcome.DeterminateRollback[int]); !ok {
		t.Fatalf("Run = %T, want DeterminateRollback", rb)
	}
	pids := make(chan uint32, 1)
	watched := make(chan error, 1)
	go func() {
		pid := <-pids
		err := srv.WaitForWaitEvent(ctx, pid, "SyncRep")
		if err == nil {
			err = srv.Terminate(ctx, pid)
		}
		watched <- err
	}()
	var calls atomic.Int32
	res := Run(skip, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		calls.Add(1)
		if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
			return 0, err
		}
		pids <- tx.Conn().PgConn().PID()
		return insertFn(table, 3)(ctx, tx)
	})
	if err := <-watched; err != nil {
		t.Fatal(err)
	}
	root.End()
	ind, ok := res.(outcome.Indeterminate[int])
	if !ok || calls.Load() != 1 {
		t.Fatalf("Run = %T after %d calls, want Indeterminate after 1", res, calls.Load())
	}
	if ref, ok := ind.Reference(); !ok || ref.NoWrites() {
		t.Fatalf("indeterminate without a reference: %v %v", ref, ok)
	}
	want := fmt.Sprintf("00-%s-%s-01", root.SpanContext().TraceID(), root.SpanContext().SpanID())
	if ind.TraceParent() != want {
		t.Errorf("TraceParent %q, want the caller's span %q", ind.TraceParent(), want)
	}

	if fs := h.frames(); len(fs) != 0 {
		t.Fatalf("filtered frames recorded: %v", names(fs))
	}
	// As without this package: otelpgx's spans (and the pool's) are in the caller's trace,
	// its top-level statements children of the caller's span.
	var stmts, underRoot []string
	for _, s := range h.exp.GetSpans() {
		if s.Name == "test-root" {
			continue
		}
		stmts = append(stmts, s.Name)
		if s.SpanContext.TraceID() != root.SpanContext().TraceID() {
			t.Errorf("span %q is not in the caller's trace", s.Name)
		}
		if s.Parent.SpanID() == root.SpanContext().SpanID() {
			underRoot = append(underRoot, s.Name)
		}
	}
	for _, want := range []string{"BEGIN", "INSERT", "COMMIT"} {
		if !slices.Contains(underRoot, want) {
			t.Errorf("spans under the caller's span %v: no %s (all spans: %v)", underRoot, want, stmts)
		}
	}
	counts := h.countsByOutcome(t, ctx)
	if counts["committed"] != 3 || counts["rolled_back"] != 1 || counts["indeterminate"] != 1 {
		t.Errorf("counts %v, want 3 committed, one rolled_back, one indeterminate", counts)
	}
	if !strings.Contains(logs.String(), "indeterminate") || !strings.Contains(logs.String(), "trace_id="+root.SpanContext().TraceID().String()) {
		t.Errorf("no indeterminate log record: %q", logs.String())
	}
	rec, err := reconcile.New(h.pool, reconcile.WithTracerProvider(h.tp))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := reconcile.Indeterminate(ctx, rec, ind); err != nil || got.Status() != reconcile.Committed {
		t.Fatalf("reconciled %v (%s), %v; want committed", got.Status(), got.Reason(), err)
	}

	// Not rejected: recorded as usual.
	commitOne(t, ctx, h, table, 4)
	if fs := h.frames(); len(fs) != 1 {
		t.Fatalf("frames %v, want the one accepted", names(fs))
	}
	if asked.Load() != 5 {
		t.Errorf("the filter ran %d times, want once per transaction begun by a statement (5)", asked.Load())
	}
}

// TestDisableConnectionDetailsInAttributes: no server.address, server.port or
// db.namespace on frame or statement spans; they are there without the option.
func TestDisableConnectionDetailsInAttributes(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	details := []attribute.Key{"server.address", "server.port", "db.namespace"}
	for _, disable := range []bool{false, true} {
		var opts []Option
		if disable {
			opts = append(opts, WithDisableConnectionDetailsInAttributes())
		}
		h := newHarness(t, "", 1, opts...)
		commitOne(t, ctx, h, table, map[bool]int{false: 1, true: 2}[disable])
		f := onlyFrame(t, h)
		wantAttr(t, f, "db.system.name", "postgresql")
		for _, s := range append([]tracetest.SpanStub{f}, h.children(f)...) {
			for _, k := range details {
				if _, has := attr(s, k); has == disable {
					t.Errorf("disabled %v: span %q has %s = %v", disable, s.Name, k, has)
				}
			}
		}
	}
}

// innerTracer is a user's inner tracer: a QueryTracer that is also a BatchTracer.
type innerTracer struct {
	queries, batches atomic.Int32
	parents          chan trace.SpanContext
}

func (it *innerTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	it.queries.Add(1)
	select {
	case it.parents <- trace.SpanContextFromContext(ctx):
	default:
	}
	return ctx
}
func (it *innerTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (it *innerTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	it.batches.Add(1)
	return ctx
}
func (it *innerTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (it *innerTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestWithInnerTracer: an inner pgx.QueryTracer replaces otelpgx; the other tracer
// interfaces it implements are forwarded too, and inside a transaction it sees the frame
// span as the parent.
func TestWithInnerTracer(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	inner := &innerTracer{parents: make(chan trace.SpanContext, 8)}
	h := newHarness(t, "", 1, WithInnerTracer(inner))
	table := srv.NewTable(t, ctx, tableColumns)
	commitOne(t, ctx, h, table, 1)
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue(fmt.Sprintf("insert into %s (id) values (2)", table))
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	fs := h.frames()
	if len(fs) != 2 {
		t.Fatalf("frames %v, want 2", names(fs))
	}
	if inner.queries.Load() < 3 || inner.batches.Load() != 1 {
		t.Fatalf("inner tracer saw %d queries and %d batches, want >= 3 and 1", inner.queries.Load(), inner.batches.Load())
	}
	// BEGIN, insert, COMMIT of the first transaction: each under its frame span.
	for range 3 {
		if p := <-inner.parents; p.SpanID() != fs[0].SpanContext.SpanID() {
			t.Errorf("inner tracer's parent %v, want the frame span %v", p.SpanID(), fs[0].SpanContext.SpanID())
		}
	}
	for _, s := range h.exp.GetSpans() {
		if s.InstrumentationScope.Name != ScopeName {
			t.Errorf("span %q of %s: otelpgx was not replaced", s.Name, s.InstrumentationScope.Name)
		}
	}
}

// TestRefusedOptionsWrapErrInvalidArgument: every option value the Instrument functions
// refuse is an error wrapping ErrInvalidArgument that names the option, and leaves the
// config without a tracer, so that a caller can tell bad input from a database failure;
// it is the reconciler's ErrInvalidArgument too, one error for the whole module.
func TestRefusedOptionsWrapErrInvalidArgument(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	pcfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.ConnectConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	rec, err := reconcile.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	for name, opt := range map[string]Option{
		"WithSpanName":                 WithSpanName(""),
		"WithStatusMapping":            WithStatusMapping(StatusMapping(9)),
		"WithCommitMarker":             WithCommitMarker(pgx.Identifier{}),
		"WithCommitMarker unqualified": WithCommitMarker(pgx.Identifier{"tx_marker"}),
		"WithExpectedErrors":           WithExpectedErrors(nil),
		"WithoutInnerSpans":            WithoutInnerSpans(InnerSpan(9)),
		"WithInnerSpans":               WithInnerSpans(InnerSpan(9)),
		"WithPoolName":                 WithPoolName(""),
		"WithAutoReconcile":            WithAutoReconcile(nil),
		"WithQueue":                    WithAutoReconcile(rec, WithQueue(0, 1)),
		"WithRetryBackoff":             WithAutoReconcile(rec, WithRetryBackoff(time.Second, time.Millisecond)),
	} {
		cfg := pcfg.Copy()
		cfg.Tracer = nil
		_, err := InstrumentConnConfig(cfg, opt)
		if !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, reconcile.ErrInvalidArgument) || !strings.Contains(err.Error(), strings.Fields(name)[0]+":") {
			t.Errorf("%s: err = %v, want one wrapping ErrInvalidArgument that names %s", name, err, name)
		}
		wantOwnPrefix(t, name, err, "otelpgxtx")
		if cfg.Tracer != nil {
			t.Errorf("%s: a refused option left a tracer on the config", name)
		}
	}
}

// TestFirstRefusedOptionReported: with several refused option values, the error reports the
// first, as the docs say: for the tracer's options, automatic reconciliation's and the
// reconciler's.
func TestFirstRefusedOptionReported(t *testing.T) {
	cfg, err := pgx.ParseConfig("postgres://localhost/db")
	if err != nil {
		t.Fatal(err)
	}
	_, err = InstrumentConnConfig(cfg, WithSpanName(""), WithPoolName(""), WithCommitMarker(pgx.Identifier{"x"}))
	if err == nil || !strings.Contains(err.Error(), "WithSpanName") || strings.Contains(err.Error(), "WithPoolName") {
		t.Errorf("tracer options: %v, want WithSpanName's refusal", err)
	}
	conn := &pgx.Conn{} // never used: New only keeps it
	rec, err := reconcile.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = InstrumentConnConfig(cfg.Copy(), WithAutoReconcile(rec, WithQueue(0, 1), WithRetryBackoff(time.Second, time.Millisecond)))
	if err == nil || !strings.Contains(err.Error(), "WithQueue") {
		t.Errorf("automatic reconciliation's options: %v, want WithQueue's refusal", err)
	}
	_, err = reconcile.New(conn, reconcile.WithWait(-time.Second, time.Millisecond), reconcile.WithWait(-2*time.Second, time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "got -1s") {
		t.Errorf("the reconciler's options: %v, want the first WithWait's refusal", err)
	}
}
