package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txevidence/otelpgxtx/internal/poolmetrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// poolReading is one collection of the connection-pool metrics.
type poolReading struct {
	names  map[string]bool
	points map[string]int64 // sums and gauges: "name" or "name state", the value
	hist   map[string]metricdata.HistogramDataPoint[float64]
	units  map[string]string
	kinds  map[string]string // "updown", "counter", "histogram"
	pools  map[string]bool   // db.client.connection.pool.name values seen
	// identity is each metric's database identity attributes (db.system.name,
	// db.namespace, server.address, server.port) as "key=value", sorted.
	identity map[string][]string
}

// readPool collects reader and keeps the db.client.connection.* metrics.
func readPool(t *testing.T, ctx context.Context, reader *sdkmetric.ManualReader) poolReading {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	r := poolReading{names: map[string]bool{}, points: map[string]int64{}, hist: map[string]metricdata.HistogramDataPoint[float64]{},
		units: map[string]string{}, kinds: map[string]string{}, pools: map[string]bool{}, identity: map[string][]string{}}
	var name string
	pool := func(s attribute.Set) {
		if v, ok := s.Value(poolmetrics.PoolNameKey); ok {
			r.pools[v.AsString()] = true
		}
		var ids []string
		for _, k := range []attribute.Key{schema.DBNamespaceKey, schema.DBSystemNameKey, schema.ServerAddressKey, schema.ServerPortKey} {
			if v, ok := s.Value(k); ok {
				ids = append(ids, string(k)+"="+v.String())
			}
		}
		r.identity[name] = ids
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			if len(m.Name) < 20 || m.Name[:20] != "db.client.connection" {
				continue
			}
			r.names[m.Name], r.units[m.Name] = true, m.Unit
			name = m.Name
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				r.kinds[m.Name] = "updown"
				if d.IsMonotonic {
					r.kinds[m.Name] = "counter"
				}
				for _, dp := range d.DataPoints {
					pool(dp.Attributes)
					key := m.Name
					if v, ok := dp.Attributes.Value(poolmetrics.ConnectionStateKey); ok {
						key += " " + v.AsString()
					}
					r.points[key] += dp.Value
				}
			case metricdata.Histogram[float64]:
				r.kinds[m.Name] = "histogram"
				for _, dp := range d.DataPoints {
					pool(dp.Attributes)
					r.hist[m.Name] = dp
				}
			}
		}
	}
	return r
}

// waitPool polls the pool metrics until cond holds of a reading.
func waitPool(t *testing.T, ctx context.Context, reader *sdkmetric.ManualReader, what string, cond func(poolReading) bool) poolReading {
	t.Helper()
	for {
		r := readPool(t, ctx, reader)
		if cond(r) {
			return r
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not before the test's deadline; last reading %v", what, r.points)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestPoolMetrics drives a real pool of two through exhaustion, an acquire that waits
// and one that times out, and a connection destroyed mid-transaction (its backend
// terminated), and reads each metric of the semantic conventions after each step: the
// counts as pgxpool.Stat has them, pending acquires, timeouts, and the create, wait and
// use times, with the conventions' names, units, instrument kinds and attributes.
func TestPoolMetrics(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2, WithPoolName("orders"))
	stat := func() string {
		s := h.pool.Stat()
		return fmt.Sprintf("idle %d used %d", s.IdleConns(), s.AcquiredConns())
	}
	counts := func(r poolReading) string {
		return fmt.Sprintf("idle %d used %d", r.points[poolmetrics.MetricConnectionCount+" idle"], r.points[poolmetrics.MetricConnectionCount+" used"])
	}

	// Before the pool's first acquire there is nothing to count, but the timeouts
	// series is there at 0.
	r := readPool(t, ctx, h.reader)
	if _, ok := r.points[poolmetrics.MetricConnectionCount+" used"]; ok || r.points[poolmetrics.MetricConnectionTimeouts] != 0 || !r.names[poolmetrics.MetricConnectionTimeouts] {
		t.Fatalf("before any acquire: %v", r.points)
	}

	// Exhausted: both connections used.
	c1, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Release()
	c2, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Release()
	r = readPool(t, ctx, h.reader)
	if counts(r) != "idle 0 used 2" || counts(r) != stat() {
		t.Errorf("exhausted: %s, pgxpool.Stat %s, want idle 0 used 2", counts(r), stat())
	}
	for name, want := range map[string]int64{poolmetrics.MetricConnectionMax: 2, poolmetrics.MetricConnectionIdleMax: 2, poolmetrics.MetricConnectionIdleMin: 0,
		poolmetrics.MetricConnectionPendingRequests: 0, poolmetrics.MetricConnectionTimeouts: 0} {
		if got := r.points[name]; got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if n := r.hist[poolmetrics.MetricConnectionCreateTime].Count; n != 2 || int64(n) != h.pool.Stat().NewConnsCount() {
		t.Errorf("%s count %d, want the pool's 2 new connections", poolmetrics.MetricConnectionCreateTime, n)
	}

	// An acquire waits: pending, until a connection comes back; its wait is recorded.
	waited := make(chan error, 1)
	var waiter *pgxpool.Conn
	go func() {
		var err error
		waiter, err = h.pool.Acquire(ctx)
		waited <- err
	}()
	waitPool(t, ctx, h.reader, "one pending acquire", func(r poolReading) bool { return r.points[poolmetrics.MetricConnectionPendingRequests] == 1 })
	before := r.hist[poolmetrics.MetricConnectionWaitTime]
	// c1's holder works 50 ms more (on the server), then gives it back.
	if _, err := c1.Exec(ctx, "select pg_sleep(0.05)"); err != nil {
		t.Fatal(err)
	}
	c1.Release()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	r = readPool(t, ctx, h.reader)
	w := r.hist[poolmetrics.MetricConnectionWaitTime]
	if longest, _ := w.Max.Value(); w.Count != before.Count+1 || longest < 0.05 {
		t.Errorf("%s: %d acquires, the longest %.3fs; want one more (%d) that waited over 0.05s", poolmetrics.MetricConnectionWaitTime, w.Count, longest, before.Count+1)
	}
	if r.points[poolmetrics.MetricConnectionPendingRequests] != 0 || counts(r) != "idle 0 used 2" {
		t.Errorf("after the wait: pending %d, %s", r.points[poolmetrics.MetricConnectionPendingRequests], counts(r))
	}
	if u := r.hist[poolmetrics.MetricConnectionUseTime]; u.Count != 1 {
		t.Errorf("%s count %d, want c1's one use", poolmetrics.MetricConnectionUseTime, u.Count)
	}

	// An acquire whose deadline passes while the pool is exhausted: a timeout.
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = h.pool.Acquire(tctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire from an exhausted pool: %v, want its deadline", err)
	}
	// And one the caller cancels is no timeout.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := h.pool.Acquire(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled acquire: %v", err)
	}
	r = readPool(t, ctx, h.reader)
	if r.points[poolmetrics.MetricConnectionTimeouts] != 1 || r.points[poolmetrics.MetricConnectionPendingRequests] != 0 {
		t.Errorf("timeouts %d, pending %d; want 1 and 0", r.points[poolmetrics.MetricConnectionTimeouts], r.points[poolmetrics.MetricConnectionPendingRequests])
	}

	// A connection destroyed mid-transaction: its backend terminated, the statement
	// fails, and the pool destroys it on release. Its use is recorded; it is counted
	// no more.
	tx, err := c2.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Terminate(ctx, c2.Conn().PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "select 1"); err == nil {
		t.Fatal("a statement on a terminated backend succeeded")
	}
	c2.Release()
	waiter.Release()
	r = waitPool(t, ctx, h.reader, "the destroyed connection gone", func(r poolReading) bool {
		return r.points[poolmetrics.MetricConnectionCount+" used"] == 0 && r.points[poolmetrics.MetricConnectionCount+" idle"] == 1
	})
	if counts(r) != stat() {
		t.Errorf("after the destroyed connection: %s, pgxpool.Stat %s", counts(r), stat())
	}
	if u := r.hist[poolmetrics.MetricConnectionUseTime]; u.Count != 3 {
		t.Errorf("%s count %d, want 3 uses (c1, the destroyed c2, the waiter's)", poolmetrics.MetricConnectionUseTime, u.Count)
	}
	if fs := h.frames(); len(fs) != 1 || attrString(t, fs[0], schema.ErrorTypeKey) == "" {
		t.Errorf("the destroyed connection's frame: %v", names(fs))
	}

	// The conventions' names, units, instrument kinds, and the pool's name.
	want := map[string][2]string{
		poolmetrics.MetricConnectionCount: {"{connection}", "updown"}, poolmetrics.MetricConnectionIdleMax: {"{connection}", "updown"},
		poolmetrics.MetricConnectionIdleMin: {"{connection}", "updown"}, poolmetrics.MetricConnectionMax: {"{connection}", "updown"},
		poolmetrics.MetricConnectionPendingRequests: {"{request}", "updown"}, poolmetrics.MetricConnectionTimeouts: {"{timeout}", "counter"},
		poolmetrics.MetricConnectionCreateTime: {"s", "histogram"}, poolmetrics.MetricConnectionWaitTime: {"s", "histogram"}, poolmetrics.MetricConnectionUseTime: {"s", "histogram"},
	}
	for name, uk := range want {
		if r.units[name] != uk[0] || r.kinds[name] != uk[1] {
			t.Errorf("%s: unit %q, kind %q; want %q, %q", name, r.units[name], r.kinds[name], uk[0], uk[1])
		}
	}
	if len(r.names) != len(want) || len(r.pools) != 1 || !r.pools["orders"] {
		t.Errorf("metrics %v of pools %v, want the %d of the conventions, of pool orders", r.names, r.pools, len(want))
	}

	// Tracer.Close stops the counts' observation.
	if err := h.tracer.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if r := readPool(t, ctx, h.reader); r.names[poolmetrics.MetricConnectionCount] {
		t.Errorf("after Close: %v", r.points)
	}
}

// TestPoolAttributes: every data point's attributes as semantic-conventions PR #4097 has
// them, and the unnamed pool's name by its fallback order: the database, the server target,
// db.system.name.
func TestPoolAttributes(t *testing.T) {
	for _, c := range []struct {
		name, conn, want string
		attrs            []attribute.KeyValue
	}{
		{"orders", "postgres://u@db.example.com:6432/app", "orders", []attribute.KeyValue{
			attribute.String("db.namespace", "app"), attribute.String("server.address", "db.example.com"), attribute.Int("server.port", 6432)}},
		{"", "postgres://u@db.example.com:6432/app", "app", []attribute.KeyValue{
			attribute.String("db.namespace", "app"), attribute.String("server.address", "db.example.com"), attribute.Int("server.port", 6432)}},
		{"", "postgres://u@[::1]:5433/", "[::1]:5433", []attribute.KeyValue{
			attribute.String("server.address", "::1"), attribute.Int("server.port", 5433)}},
		{"", "host=/run/postgresql port=5432 user=u", "/run/postgresql", []attribute.KeyValue{
			attribute.String("server.address", "/run/postgresql"), attribute.Int("server.port", 5432)}},
	} {
		cc, err := pgx.ParseConfig(c.conn)
		if err != nil {
			t.Fatal(err)
		}
		if c.conn != "postgres://u@db.example.com:6432/app" {
			cc.Database = "" // a connection string without one gets PGDATABASE or the user's name
		}
		got := attribute.NewSet(poolmetrics.PoolAttributes(c.name, cc)...)
		want := attribute.NewSet(append(c.attrs, poolmetrics.PoolNameKey.String(c.want), attribute.String("db.system.name", "postgresql"))...)
		if !got.Equals(&want) {
			t.Errorf("%q named %q: %v, want %v", c.conn, c.name, got.Encoded(attribute.DefaultEncoder()), want.Encoded(attribute.DefaultEncoder()))
		}
	}
	// Nothing configured but the system: the name is db.system.name's.
	got := attribute.NewSet(poolmetrics.PoolAttributes("", &pgx.ConnConfig{})...)
	want := attribute.NewSet(poolmetrics.PoolNameKey.String("postgresql"), attribute.String("db.system.name", "postgresql"))
	if !got.Equals(&want) {
		t.Errorf("empty config: %v", got.Encoded(attribute.DefaultEncoder()))
	}
}

// TestPoolMetricsOptions: the default pool name is the database (db.namespace), and every
// data point carries the pool's database identity;
// WithDisablePoolMetrics records none; an empty name is an error; a pool the application
// closed and dropped is no longer observed (nor kept alive).
func TestPoolMetricsOptions(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	if _, err := h.pool.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	cc := h.pool.Config().ConnConfig
	r := readPool(t, ctx, h.reader)
	if !r.pools[cc.Database] || len(r.pools) != 1 {
		t.Errorf("pool names %v, want the database %q", r.pools, cc.Database)
	}
	want := fmt.Sprint([]string{"db.namespace=" + cc.Database, "db.system.name=postgresql",
		"server.address=" + cc.Host, fmt.Sprintf("server.port=%d", cc.Port)})
	for name, ids := range r.identity {
		if fmt.Sprint(ids) != want {
			t.Errorf("%s: identity %v, want %v", name, ids, want)
		}
	}
	if len(r.identity) != len(r.names) {
		t.Errorf("identity on %d of the %d metrics", len(r.identity), len(r.names))
	}
	off := newHarness(t, "", 1, WithDisablePoolMetrics())
	if _, err := off.pool.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	if r := readPool(t, ctx, off.reader); len(r.names) != 0 {
		t.Errorf("WithDisablePoolMetrics: %v", r.names)
	}
	cfg, err := pgxpool.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InstrumentPool(cfg, WithPoolName("")); err == nil {
		t.Error("WithPoolName(\"\") accepted")
	}

	// A pool of its own, closed and dropped: its counts go.
	pgtest.LeakCheck(t)
	reader := sdkmetric.NewManualReader()
	cfg, err = pgxpool.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	tracer, err := InstrumentPool(cfg, WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	func() {
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
	}()
	if r := readPool(t, ctx, reader); r.points[poolmetrics.MetricConnectionCount+" idle"] != 0 || !slices.Contains(keys(r.points), poolmetrics.MetricConnectionCount+" idle") {
		t.Fatalf("a closed pool still referenced: %v, want its counts at 0", r.points)
	}
	waitPool(t, ctx, reader, "the dropped pool no longer observed", func(r poolReading) bool {
		runtime.GC()
		return !r.names[poolmetrics.MetricConnectionCount]
	})
	_ = tracer
}

// keys returns m's keys.
func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
