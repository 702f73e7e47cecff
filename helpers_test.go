package otelpgxtx

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/metrics"
)

// The test server's tables.

// tableSeq makes each table name unique within the test binary.
var tableSeq atomic.Int64

// mustTracer returns a tracer made with opts, set on a connection config by the test
// itself (the hooks alone, without InstrumentConnConfig's wrapper), failing tb on an
// invalid option.
func mustTracer(tb testing.TB, opts ...Option) *Tracer {
	tb.Helper()
	t, err := newTracer(opts)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// tableColumns are the columns of a test's table (pgtest's NewTable): an int primary key
// "id", and a deferred unique column, so that a violation can be made to surface at COMMIT.
const tableColumns = "id int primary key, k int unique deferrable initially deferred, v int"

// Connections and statements.

// instrumentedConn connects to connString with InstrumentConnConfig's defaults; the
// connection is closed when tb ends.
func instrumentedConn(tb testing.TB, ctx context.Context, connString string) *pgx.Conn {
	tb.Helper()
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := InstrumentConnConfig(cfg); err != nil {
		tb.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	return conn
}

// withConn runs fn on one pooled connection and releases it.
func withConn(t *testing.T, ctx context.Context, h *harness, fn func(*pgx.Conn)) {
	t.Helper()
	pc, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	fn(pc.Conn())
}

// acquireInTransaction acquires a pooled connection and leaves it in a transaction the
// tracer saw begin, for tests that end it behind the tracer's back or not at all.
func acquireInTransaction(t *testing.T, ctx context.Context, h *harness) *pgxpool.Conn {
	t.Helper()
	pc, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, ctx, pc.Conn(), "begin", "select 1")
	return pc
}

// acquireConns acquires n connections of pool, held at once. Those the test has not
// released are released when it ends, ahead of the pool's Close, which would wait for them.
func acquireConns(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int) []*pgxpool.Conn {
	t.Helper()
	conns := make([]*pgxpool.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Release() // a second Release is ignored
		}
	})
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	return conns
}

// beginner is what mustBegin needs of db.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// mustBegin begins a transaction on db (a pool, a *pgx.Conn, or a pgx.Tx for a
// savepoint) and fails the test if it cannot.
func mustBegin(t *testing.T, ctx context.Context, db beginner) pgx.Tx {
	t.Helper()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// execer is what mustExec runs statements on: a *pgx.Conn, a pgx.Tx or a pool.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// mustExec runs each of sqls on conn and fails the test at the first error.
func mustExec(t *testing.T, ctx context.Context, conn execer, sqls ...string) {
	t.Helper()
	for _, sql := range sqls {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// Run's functions.

// insertFn returns a Run function that inserts id into table and returns it.
func insertFn(table string, id int) func(context.Context, pgx.Tx) (int, error) {
	return func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id, k) values (%d, %d)", table, id, id))
		return id, err
	}
}

// insertThen returns a Run function that inserts row 1 into table and then runs fn: the
// outer transaction of the tests that run more work, or a nested call, inside one.
func insertThen(table string, fn func(context.Context, pgx.Tx) (int, error)) func(context.Context, pgx.Tx) (int, error) {
	return func(ctx context.Context, tx pgx.Tx) (int, error) {
		if _, err := insertFn(table, 1)(ctx, tx); err != nil {
			return 0, err
		}
		return fn(ctx, tx)
	}
}

// Reading spans.

// attr returns the value of the span's attribute k, if it has one.
func attr(s tracetest.SpanStub, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// attrString returns the span's attribute k as text, failing the test if it has none.
func attrString(t *testing.T, s tracetest.SpanStub, k attribute.Key) string {
	t.Helper()
	v, ok := attr(s, k)
	if !ok {
		t.Fatalf("span %q has no attribute %s; attributes: %v", s.Name, k, s.Attributes)
	}
	return v.String()
}

// attributeKey is attribute.Key(k), for the helpers that take a key as a string.
func attributeKey(k string) attribute.Key { return attribute.Key(k) }

// eventNames returns the span's event names in timestamp order.
func eventNames(s tracetest.SpanStub) []string {
	evs := append([]sdktrace.Event(nil), s.Events...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Time.Before(evs[j].Time) })
	names := make([]string, len(evs))
	for i, e := range evs {
		names[i] = e.Name
	}
	return names
}

// names renders spans as name/attributes, for failure messages.
func names(ss []tracetest.SpanStub) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name + "/" + fmt.Sprint(s.Attributes)
	}
	return out
}

// onlyFrame returns the single frame span, failing otherwise.
func onlyFrame(t *testing.T, h *harness) tracetest.SpanStub {
	t.Helper()
	fs := h.frames()
	if len(fs) != 1 {
		t.Fatalf("want 1 frame span, got %d: %v", len(fs), names(fs))
	}
	return fs[0]
}

// outcomes returns each frame's tx.outcome, in start order.
func (h *harness) outcomes() []string {
	var out []string
	for _, f := range h.frames() {
		v, _ := attr(f, OutcomeKey)
		out = append(out, v.AsString())
	}
	return out
}

// wantOutcomes asserts the frames' tx.outcome values, in start order.
func wantOutcomes(t *testing.T, h *harness, want ...string) {
	t.Helper()
	if got := h.outcomes(); !slices.Equal(got, want) {
		t.Fatalf("frame outcomes = %v, want %v", got, want)
	}
}

// wantAttr asserts the span's attribute k as text.
func wantAttr(t *testing.T, s tracetest.SpanStub, k, want string) {
	t.Helper()
	if got := attrString(t, s, attributeKey(k)); got != want {
		t.Fatalf("%s = %q, want %q", k, got, want)
	}
}

// wantEvents asserts the span's event names, in time order.
func wantEvents(t *testing.T, s tracetest.SpanStub, want ...string) {
	t.Helper()
	if got := eventNames(s); !slices.Equal(got, want) {
		t.Fatalf("events of %q in time order = %v, want %v", s.Name, got, want)
	}
}

// wantStatus asserts the span's status code and description.
func wantStatus(t *testing.T, s tracetest.SpanStub, code codes.Code, desc string) {
	t.Helper()
	if s.Status.Code != code || s.Status.Description != desc {
		t.Fatalf("status = %v %q, want %v %q", s.Status.Code, s.Status.Description, code, desc)
	}
}

// rootSpan starts a test span to parent the frame.
func rootSpan(ctx context.Context, h *harness) (context.Context, trace.Span) {
	return h.tp.Tracer("test").Start(ctx, "test-root")
}

// wantNoFrames asserts that no idle connection of the pool holds a frame.
func (h *harness) wantNoFrames(t *testing.T, ctx context.Context) {
	t.Helper()
	conns := h.pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for _, c := range conns {
		if st := frame.State(c.Conn().PgConn()); st != nil && st.Frame() != nil {
			t.Fatalf("an idle connection still holds a frame in phase %s", st.Frame().Ev.Phase())
		}
	}
}

// Reading metrics.

// sums reads the int64 sum metric name from the harness's reader, or the counts of the
// histogram name: its data points' values by their attributes, each key the sorted key=value pairs of the keys asked for
// (db.system.name and the like left out), "" for a point that has none of them.
func (h *harness) sums(t *testing.T, ctx context.Context, name string, keys ...attribute.Key) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					out[pointKey(dp.Attributes, keys)] += dp.Value
				}
			case metricdata.Histogram[float64]: // its count: otelpgxtx.transaction.duration counts the frames
				for _, dp := range data.DataPoints {
					out[pointKey(dp.Attributes, keys)] += int64(dp.Count)
				}
			default:
				t.Fatalf("%s: %T, want a sum or a histogram", name, m.Data)
			}
		}
	}
	return out
}

// pointKey renders the keys of set that are there, in the order given.
func pointKey(set attribute.Set, keys []attribute.Key) string {
	var parts []string
	for _, k := range keys {
		if v, ok := set.Value(k); ok {
			parts = append(parts, string(k)+"="+v.String())
		}
	}
	return strings.Join(parts, ",")
}

// nonZero drops the series still at 0 (the counters' series are born at 0).
func nonZero(m map[string]int64) map[string]int64 {
	maps.DeleteFunc(m, func(_ string, v int64) bool { return v == 0 })
	return m
}

// countsByOutcome reads the frames counted by the duration histogram from the manual
// reader, by tx.outcome.
func (h *harness) countsByOutcome(t *testing.T, ctx context.Context) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for k, n := range h.sums(t, ctx, metrics.MetricDuration, OutcomeKey) {
		out[strings.TrimPrefix(k, string(OutcomeKey)+"=")] = n
	}
	return out
}
