package poolmetrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/internal/settings"
)

// ConnState is what the pool metrics keep on a connection, in its frame.Conn.
type ConnState struct {
	seen       bool          // its pool is among the observed ones
	acquiredAt time.Duration // when it was last acquired (monoNow); zero once released
}

// epoch is the origin of monoNow.
var epoch = time.Now()

// monoNow reads the monotonic clock alone, as the time since epoch: the pool metrics
// measure durations and never need the wall clock, and time.Now reads both (on a VM's
// kvm-clock some 130 ns where this reads one clock in 60: BenchmarkPoolMetrics). It is
// never 0 (epoch is read before anything can call it), so that 0 can mean none.
func monoNow() time.Duration { return max(time.Since(epoch), 1) }

// Connection-pool metric names, as the OpenTelemetry semantic conventions for database
// client metrics define them (db.client.connection.*): the conventions own these names
// and keys, so they are not exported here. Every one of them, and their
// attributes db.client.connection.pool.name and db.client.connection.state, has
// Development status in the conventions: the names may still change there. Each data
// point also carries the pool's configured database identity, as semantic-conventions
// PR #4097 has it: db.system.name ("postgresql"), db.namespace (the database, when the
// configuration names one), server.address and server.port (its first host). With the
// Prometheus exporter they become db_client_connection_count,
// db_client_connection_timeouts_total, db_client_connection_wait_time_seconds and so on.
const (
	// MetricConnectionCount is the number of connections in each state: idle, and used
	// (acquired). Connections being created are in neither.
	MetricConnectionCount = "db.client.connection.count"
	// MetricConnectionIdleMax is the most idle connections the pool keeps: pgxpool closes
	// an idle connection only for its idle time or lifetime, so this is its MaxConns.
	MetricConnectionIdleMax = "db.client.connection.idle.max"
	// MetricConnectionIdleMin is the fewest idle connections the pool keeps (MinIdleConns).
	MetricConnectionIdleMin = "db.client.connection.idle.min"
	// MetricConnectionMax is the most connections the pool opens (MaxConns).
	MetricConnectionMax = "db.client.connection.max"
	// MetricConnectionPendingRequests is the number of acquires in progress: begun and not
	// yet handed a connection or failed.
	MetricConnectionPendingRequests = "db.client.connection.pending_requests"
	// MetricConnectionTimeouts counts acquires that failed because their context's
	// deadline passed (pgxpool's acquire timeout is the context's).
	MetricConnectionTimeouts = "db.client.connection.timeouts"
	// MetricConnectionCreateTime is the time a new connection of the pool took to
	// connect, in seconds (connections that failed to connect are not recorded).
	MetricConnectionCreateTime = "db.client.connection.create_time"
	// MetricConnectionWaitTime is the time an acquire took to obtain a connection, in
	// seconds (failed acquires are counted by their error, not here).
	MetricConnectionWaitTime = "db.client.connection.wait_time"
	// MetricConnectionUseTime is the time from an acquire to the release of its
	// connection, in seconds, whatever state the connection was released in.
	MetricConnectionUseTime = "db.client.connection.use_time"
)

// Attribute keys of the connection-pool metrics.
const (
	// PoolNameKey is db.client.connection.pool.name: [WithPoolName]'s name, or for a
	// pool without one the first of the conventions' fallbacks that its configuration
	// has: db.namespace (the database), the server target (address:port), db.system.name
	// ("postgresql"); see [WithPoolName].
	PoolNameKey = semconv.DBClientConnectionPoolNameKey
	// ConnectionStateKey is db.client.connection.state: "idle" or "used".
	ConnectionStateKey = semconv.DBClientConnectionStateKey
)

// Metrics records the connection-pool metrics of the pools a tracer instruments. The
// counts come from pgxpool.Stat in an asynchronous callback; the times, the timeouts and
// the pending acquires from the tracer's hooks, which see every acquire, connect and
// release.
type Metrics struct {
	timeouts                      metric.Int64Counter
	createTime, waitTime, useTime metric.Float64Histogram
	addOpts                       []metric.AddOption
	recordOpts                    []metric.RecordOption
	pending                       atomic.Int64

	mu sync.Mutex
	// pools are the pools seen acquiring, held weakly: a pool the application dropped is
	// no longer observed, and never kept alive by its metrics.
	pools []seenPool
	reg   metric.Registration
}

// seenPool is one pool a tracer instruments, and what its configuration says once.
type seenPool struct {
	p       weak.Pointer[pgxpool.Pool]
	minIdle int64
}

// New creates the instruments on the tracer's meter, for the pool cfg
// configures, and registers the callback that observes its counts.
func New(c settings.Config, cfg *pgxpool.Config) *Metrics {
	meter := c.MeterProvider.Meter(schema.ScopeName, metric.WithInstrumentationVersion(schema.Version))
	// Clipped: attribute.NewSet sorts the slice it is given in place, so the idle and used
	// sets appended to base must never share its array.
	base := slices.Clip(append(PoolAttributes(c.PoolName, cfg.ConnConfig), c.MeterAttributes...))
	set := attribute.NewSet(base...)
	pm := &Metrics{
		timeouts: metrics.Counter(meter, MetricConnectionTimeouts, "{timeout}",
			"The number of connection timeouts that have occurred trying to obtain a connection from the pool."),
		createTime: metrics.Histogram(meter, MetricConnectionCreateTime, "s", "The time it took to create a new connection.", metrics.DurationBuckets),
		waitTime:   metrics.Histogram(meter, MetricConnectionWaitTime, "s", "The time it took to obtain an open connection from the pool.", metrics.DurationBuckets),
		useTime: metrics.Histogram(meter, MetricConnectionUseTime, "s",
			"The time between borrowing a connection and returning it to the pool.", metrics.DurationBuckets),
		addOpts:    []metric.AddOption{metric.WithAttributeSet(set)},
		recordOpts: []metric.RecordOption{metric.WithAttributeSet(set)},
	}
	// Born at 0, as the transaction counters are: the first timeout is an increase.
	pm.timeouts.Add(context.Background(), 0, pm.addOpts...)
	pm.register(meter, set, base)
	return pm
}

// PoolAttributes are the attributes of every data point of a pool's metrics: its name
// (name, or the conventions' fallback) and its configured database identity.
func PoolAttributes(name string, cc *pgx.ConnConfig) []attribute.KeyValue {
	var target string
	if cc.Host != "" {
		target = net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
		if strings.HasPrefix(cc.Host, "/") {
			target = cc.Host // a Unix socket's directory: no port to join
		}
	}
	for _, fallback := range []string{cc.Database, target, schema.DBSystemPostgreSQL.Value.AsString()} {
		if name == "" {
			name = fallback
		}
	}
	attrs := []attribute.KeyValue{PoolNameKey.String(name), schema.DBSystemPostgreSQL}
	if cc.Database != "" {
		attrs = append(attrs, schema.DBNamespaceKey.String(cc.Database))
	}
	if cc.Host != "" {
		attrs = append(attrs, schema.ServerAddressKey.String(cc.Host), schema.ServerPortKey.Int(int(cc.Port)))
	}
	return attrs
}

// register creates the asynchronous instruments and the callback that observes the
// pools' counts at each collection.
func (pm *Metrics) register(meter metric.Meter, set attribute.Set, base []attribute.KeyValue) {
	upDown := func(name, unit, description string) metric.Int64ObservableUpDownCounter {
		i, err := meter.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(description))
		if err != nil {
			otel.Handle(err)
		}
		return i
	}
	count := upDown(MetricConnectionCount, "{connection}",
		"The number of connections that are currently in state described by the state attribute.")
	idleMax := upDown(MetricConnectionIdleMax, "{connection}", "The maximum number of idle open connections allowed.")
	idleMin := upDown(MetricConnectionIdleMin, "{connection}", "The minimum number of idle open connections allowed.")
	maxConns := upDown(MetricConnectionMax, "{connection}", "The maximum number of open connections allowed.")
	pending := upDown(MetricConnectionPendingRequests, "{request}", "The number of current pending requests for an open connection.")
	opt := metric.WithAttributeSet(set)
	idle := metric.WithAttributeSet(attribute.NewSet(append(base, ConnectionStateKey.String("idle"))...))
	used := metric.WithAttributeSet(attribute.NewSet(append(base, ConnectionStateKey.String("used"))...))
	var err error
	pm.reg, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		var n poolCounts
		if !pm.count(&n) {
			return nil // no pool has acquired yet: nothing to report
		}
		o.ObserveInt64(count, n.idle, idle)
		o.ObserveInt64(count, n.used, used)
		o.ObserveInt64(idleMax, n.max, opt)
		o.ObserveInt64(idleMin, n.minIdle, opt)
		o.ObserveInt64(maxConns, n.max, opt)
		o.ObserveInt64(pending, pm.pending.Load(), opt)
		return nil
	}, count, idleMax, idleMin, maxConns, pending)
	if err != nil {
		otel.Handle(fmt.Errorf("otelpgxtx: registering the pool metrics: %w", err))
	}
}

// poolCounts are the counts of a tracer's pools, summed.
type poolCounts struct{ idle, used, max, minIdle int64 }

// count sums the counts of the pools still alive into n, dropping the others, and
// reports whether any pool was there.
func (pm *Metrics) count(n *poolCounts) bool {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	live := pm.pools[:0]
	for _, sp := range pm.pools {
		p := sp.p.Value()
		if p == nil {
			continue
		}
		live = append(live, sp)
		s := p.Stat()
		n.idle += int64(s.IdleConns())
		n.used += int64(s.AcquiredConns())
		n.max += int64(s.MaxConns())
		n.minIdle += sp.minIdle
	}
	clear(pm.pools[len(live):])
	pm.pools = live
	return len(live) > 0
}

// seen adds pool to the observed pools, once.
func (pm *Metrics) seen(pool *pgxpool.Pool) {
	w := weak.Make(pool)
	pm.mu.Lock()
	defer pm.mu.Unlock()
	for _, sp := range pm.pools {
		if sp.p == w {
			return
		}
	}
	pm.pools = append(pm.pools, seenPool{p: w, minIdle: int64(pool.Config().MinIdleConns)})
}

// Close stops observing the pools; again, it does nothing.
func (pm *Metrics) Close() {
	if pm == nil {
		return
	}
	pm.mu.Lock()
	reg := pm.reg
	pm.reg = nil
	pm.mu.Unlock()
	if reg == nil {
		return
	}
	if err := reg.Unregister(); err != nil {
		otel.Handle(err)
	}
}

// startedCtx carries the time an acquire or a connect started (monoNow) from its Start
// hook to its End hook, in one allocation of 32 bytes (context.WithValue and a boxed
// time.Time would take two).
type startedCtx struct {
	context.Context
	kind  startedKey
	start time.Duration
}

// startedKey tells an acquire's start from a connect's: a connect runs inside an acquire.
type startedKey uint8

const (
	startedAcquire startedKey = iota + 1
	startedConnect
)

// Value returns c for its own kind's key.
func (c *startedCtx) Value(key any) any {
	if k, ok := key.(startedKey); ok && k == c.kind {
		return c
	}
	return c.Context.Value(key)
}

// since returns the time from the start of kind in ctx to now (monoNow), and whether
// there was one.
func since(ctx context.Context, kind startedKey, now time.Duration) (time.Duration, bool) {
	c, ok := ctx.Value(kind).(*startedCtx)
	if !ok {
		return 0, false
	}
	return now - c.start, true
}

// AcquireStart counts an acquire as pending and notes its start.
func (pm *Metrics) AcquireStart(ctx context.Context) context.Context {
	if pm == nil {
		return ctx
	}
	pm.pending.Add(1)
	return &startedCtx{Context: ctx, kind: startedAcquire, start: monoNow()}
}

// AcquireEnd records an acquire of pool that ended with conn (nil when it failed with
// err): its wait, or its timeout; and the start of the connection's use.
func (pm *Metrics) AcquireEnd(ctx context.Context, pool *pgxpool.Pool, st *ConnState, err error) {
	if pm == nil {
		return
	}
	pm.pending.Add(-1)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			pm.timeouts.Add(context.Background(), 1, pm.addOpts...)
		}
		return
	}
	now := monoNow() // the wait's end is the use's start: one clock read for both
	if d, ok := since(ctx, startedAcquire, now); ok {
		pm.waitTime.Record(context.Background(), d.Seconds(), pm.recordOpts...)
	}
	if st != nil {
		if !st.seen && pool != nil {
			st.seen = true // a connection belongs to one pool: one lookup per connection
			pm.seen(pool)
		}
		st.acquiredAt = now
	}
}

// Release records the use of a connection the pool gets back, in whatever state.
func (pm *Metrics) Release(st *ConnState) {
	if pm == nil || st == nil || st.acquiredAt == 0 {
		return // not acquired through the tracer's hooks (pgxpool's AcquireAllIdle)
	}
	pm.useTime.Record(context.Background(), (monoNow() - st.acquiredAt).Seconds(), pm.recordOpts...)
	st.acquiredAt = 0
}

// ConnectStart notes the start of a connect.
func (pm *Metrics) ConnectStart(ctx context.Context) context.Context {
	if pm == nil {
		return ctx
	}
	return &startedCtx{Context: ctx, kind: startedConnect, start: monoNow()}
}

// ConnectEnd records the time a successful connect took.
func (pm *Metrics) ConnectEnd(ctx context.Context, err error) {
	if pm == nil || err != nil {
		return
	}
	if d, ok := since(ctx, startedConnect, monoNow()); ok {
		pm.createTime.Record(context.Background(), d.Seconds(), pm.recordOpts...)
	}
}
