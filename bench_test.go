package otelpgxtx

// Benchmarks of issues 6 and 13: the cost of the evidence, side by side with bare pgx
// and otelpgx. scripts/bench runs them and compares the variants with benchstat.
//
// The real-server benchmarks (BenchmarkTx at each added network round-trip time,
// BenchmarkTxScale at each concurrency) report, next to tx/s and latency, the CPU time
// per transaction of this process (client-µs/tx) and of the pool's server backends
// (server-µs/tx): figures that a noisy machine disturbs far less than throughput.
//
// Variants (the v= key, so that `benchstat -col /v` puts them side by side):
//
//	a_pgx          bare pgx, no tracing at all
//	b_otelpgx      pgx + otelpgx as ConnConfig.Tracer
//	c_otelpgxtx    pgx + InstrumentPool (our Tracer, wrapping otelpgx), pgx.Tx by hand
//	d_run          c through Run, CaptureReference off
//	e_run_capture  d with CaptureReference on
//	f_run_marker   e with the commit marker (Policy.CommitMarker); real server only
//	g_otelpgxtx_xid     c with WithCaptureReference (the xid read in COMMIT's write); real server only
//	h_otelpgxtx_marker  c with WithCommitMarker; real server only
//	i_otelpgxtx_spans   c with every statement span, as before issue 29: WithInnerSpans
//	                    (InnerSpanTransactionControl, InnerSpanPrepare)
//	j_otelpgxtx_prepare_spans  c with the implicit prepares as spans (WithInnerSpans
//	                    (InnerSpanPrepare)): BenchmarkTxExport's describe_exec workload
//
// b–e run every transaction under an application "request" span, as a traced service
// does: otelpgx (v0.13) starts statement spans only under a recording parent, so
// without one b would record no span at all and c would pay for otelpgx's spans as
// well as its own. Tracing uses the SDK: a batch span processor exporting to a
// discarding exporter, with an always-on sampler ("sampled") and a never-sample one
// ("unsampled"), and an SDK MeterProvider with a manual reader (never collected);
// BenchmarkTxExport also exports through OTLP to a real Jaeger (bench_export_test.go).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

const (
	benchA = "a_pgx"
	benchB = "b_otelpgx"
	benchC = "c_otelpgxtx"
	benchD = "d_run"
	benchE = "e_run_capture"
	benchF = "f_run_marker"
	benchG = "g_otelpgxtx_xid"
	benchH = "h_otelpgxtx_marker"
	benchI = "i_otelpgxtx_spans"
	benchJ = "j_otelpgxtx_prepare_spans"

	benchKeyGroups = 64  // disjoint groups of bench_kv rows: goroutine g writes group g % 64
	benchKeysPerG  = 128 // rows of bench_kv per group
)

var benchVariants = []string{benchA, benchB, benchC, benchD, benchE, benchI}

// benchServerVariants are the variants run against the real server: f and h need the
// marker table, and g and h's references need the server's identity.
var benchServerVariants = append(slices.Clone(benchVariants), benchF, benchG, benchH)

// benchMarker is f_run_marker's commit-marker table.
var benchMarker = pgx.Identifier{"bench_marker"}

// ---- telemetry ------------------------------------------------------------------

// benchDiscard is a span exporter that drops what it is given.
type benchDiscard struct{}

func (benchDiscard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (benchDiscard) Shutdown(context.Context) error                             { return nil }

// benchSpanCount counts ended spans, for spans/op.
type benchSpanCount struct{ n atomic.Int64 }

func (c *benchSpanCount) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *benchSpanCount) OnEnd(sdktrace.ReadOnlySpan)                     { c.n.Add(1) }
func (c *benchSpanCount) Shutdown(context.Context) error                  { return nil }
func (c *benchSpanCount) ForceFlush(context.Context) error                { return nil }

type benchSampling struct {
	name    string
	sampler func() sdktrace.Sampler
	// exporter makes the span exporter behind the batch span processor; nil: discard.
	exporter func(testing.TB) sdktrace.SpanExporter
}

var benchSamplings = []benchSampling{
	{"sampled", sdktrace.AlwaysSample, nil},
	{"unsampled", sdktrace.NeverSample, nil},
}

// benchTelemetry is one variant's SDK providers.
type benchTelemetry struct {
	tp       *sdktrace.TracerProvider
	mp       *sdkmetric.MeterProvider
	spans    *benchSpanCount
	exported *benchExportCount
	app      trace.Tracer // the application's request spans
}

func newBenchTelemetry(tb testing.TB, s benchSampling) *benchTelemetry {
	spans := &benchSpanCount{}
	var exp sdktrace.SpanExporter = benchDiscard{}
	if s.exporter != nil {
		exp = s.exporter(tb)
	}
	exported := &benchExportCount{SpanExporter: exp}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s.sampler()),
		sdktrace.WithBatcher(exported), sdktrace.WithSpanProcessor(spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	return &benchTelemetry{tp: tp, mp: mp, spans: spans, exported: exported, app: tp.Tracer("bench/app")}
}

// benchExportCount counts the spans handed to the exporter it wraps: fewer than ended when
// the batch span processor's queue was full and it dropped some.
type benchExportCount struct {
	sdktrace.SpanExporter
	n atomic.Int64
}

func (e *benchExportCount) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.n.Add(int64(len(spans)))
	return e.SpanExporter.ExportSpans(ctx, spans)
}

// request starts the application's request span around one transaction.
func (t *benchTelemetry) request(ctx context.Context) (context.Context, trace.Span) {
	if t == nil {
		return ctx, noopSpan
	}
	return t.app.Start(ctx, "request")
}

func (t *benchTelemetry) shutdown() {
	if t == nil {
		return
	}
	_ = t.tp.Shutdown(context.Background())
	_ = t.mp.Shutdown(context.Background())
}

func (t *benchTelemetry) spanCount() int64 {
	if t == nil {
		return 0
	}
	return t.spans.n.Load()
}

// flushed exports every span ended so far and returns how many spans were exported in all.
func (t *benchTelemetry) flushed() int64 {
	if t == nil {
		return 0
	}
	_ = t.tp.ForceFlush(context.Background())
	return t.exported.n.Load()
}

// benchVariantOptions are the options of the variants that add some to c's.
var benchVariantOptions = map[string][]Option{
	benchG: {WithCaptureReference()},
	benchH: {WithCommitMarker(benchMarker)},
	benchI: {WithInnerSpans(InnerSpanTransactionControl, InnerSpanPrepare)},
	benchJ: {WithInnerSpans(InnerSpanPrepare)},
}

// benchInstrument configures cfg (and pool, when the variant runs on a pool) for
// variant v. It returns the telemetry, nil for a_pgx.
func benchInstrument(tb testing.TB, cfg *pgx.ConnConfig, pool *pgxpool.Config, v string, s benchSampling) *benchTelemetry {
	if v == benchA {
		return nil
	}
	tel := newBenchTelemetry(tb, s)
	opts := append([]Option{WithTracerProvider(tel.tp), WithMeterProvider(tel.mp)}, benchVariantOptions[v]...)
	switch {
	case v == benchB:
		cfg.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tel.tp), otelpgx.WithMeterProvider(tel.mp))
	case pool != nil:
		if _, err := InstrumentPool(pool, opts...); err != nil {
			tb.Fatal(err)
		}
	default:
		// A single connection: the Tracer alone is the per-transaction hook path
		// (InstrumentConnConfig adds only per-connection and notice hooks).
		t, err := newTracer(opts)
		if err != nil {
			tb.Fatal(err)
		}
		cfg.Tracer = t
	}
	return tel
}

// ---- workloads --------------------------------------------------------------------

type benchWorkload struct {
	name string
	opts pgx.TxOptions
	work func(ctx context.Context, tx pgx.Tx, key int64) error
	mode pgx.QueryExecMode // the pool's DefaultQueryExecMode; 0 keeps the connection string's (pgx's default)
}

var benchWorkloads = []benchWorkload{
	{"write", pgx.TxOptions{}, benchWrite, 0},
	{"readonly", pgx.TxOptions{AccessMode: pgx.ReadOnly}, benchRead, 0},
}

// benchWrite: BEGIN, insert, update, select, COMMIT.
func benchWrite(ctx context.Context, tx pgx.Tx, key int64) error {
	if _, err := tx.Exec(ctx, "insert into bench_log (k, v) values ($1, $2)", key, key); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "update bench_kv set v = v + 1 where k = $1", key); err != nil {
		return err
	}
	var v int64
	return tx.QueryRow(ctx, "select v from bench_kv where k = $1", key).Scan(&v)
}

// benchRead: BEGIN READ ONLY, three selects, COMMIT.
func benchRead(ctx context.Context, tx pgx.Tx, key int64) error {
	var v, n int64
	if err := tx.QueryRow(ctx, "select v from bench_kv where k = $1", key).Scan(&v); err != nil {
		return err
	}
	if err := tx.QueryRow(ctx, "select count(*) from bench_kv where k between $1 and $2", key, key+15).Scan(&n); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, "select k, v from bench_kv where k >= $1 order by k limit 5", key)
	if err != nil {
		return err
	}
	for rows.Next() {
		if err := rows.Scan(&n, &v); err != nil {
			rows.Close()
			return err
		}
	}
	return rows.Err()
}

// benchKey spreads goroutines over disjoint rows, so that up to benchKeyGroups
// parallel writers never wait for each other's row locks.
func benchKey(g, i int) int64 {
	return int64(g%benchKeyGroups)*benchKeysPerG + int64(i%benchKeysPerG) + 1
}

// benchSchema creates the tables (idempotent) and returns an admin connection.
func benchSchema(b *testing.B) *pgx.Conn {
	ctx := context.Background()
	conn, err := srv.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, sql := range []string{
		"create table if not exists bench_kv (k bigint primary key, v bigint not null)",
		fmt.Sprintf("insert into bench_kv select g, 0 from generate_series(1, %d) g on conflict do nothing",
			benchKeyGroups*benchKeysPerG),
		"create table if not exists bench_log (k bigint not null, v bigint not null)",
		benchMarkerDDL(b),
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	return conn
}

func benchMarkerDDL(b *testing.B) string {
	ddl, err := reconcile.MarkerTableDDL(benchMarker)
	if err != nil {
		b.Fatal(err)
	}
	return ddl
}

// ---- real-server environment -----------------------------------------------------

// benchDB is one variant's pool on the test server.
type benchDB struct {
	v      string
	w      benchWorkload
	tel    *benchTelemetry
	pool   *pgxpool.Pool
	policy Policy
	pids   []uint32 // the server backends of the pool's connections
}

// newBenchDB opens a pool of conns connections for variant v, every one of them open
// and warm before it returns.
func newBenchDB(b *testing.B, connString, v string, s benchSampling, w benchWorkload, conns int) *benchDB {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(conns)
	if w.mode != 0 { // pgx's zero QueryExecMode is invalid, not its default
		cfg.ConnConfig.DefaultQueryExecMode = w.mode
	}
	d := &benchDB{v: v, w: w, policy: DefaultPolicy()}
	d.policy.AccessMode = w.opts.AccessMode
	d.policy.CaptureReference = v == benchE || v == benchF
	if v == benchF {
		d.policy.CommitMarker = benchMarker
	}
	d.tel = benchInstrument(b, cfg.ConnConfig, cfg, v, s)
	if d.pool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
	// Warm up: every statement cached on every connection, the cluster identity read.
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for g := range conns {
		wg.Go(func() {
			for i := range 16 {
				if err := d.tx(context.Background(), benchKey(g, i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		d.close()
		b.Fatal(err)
	}
	// Hold every connection at once: the pool then has all of them open, and their
	// backends are the ones whose CPU time the benchmark reads.
	held := make([]*pgxpool.Conn, 0, conns)
	for range conns {
		c, err := d.pool.Acquire(context.Background())
		if err != nil {
			d.close()
			b.Fatal(err)
		}
		held = append(held, c)
		d.pids = append(d.pids, c.Conn().PgConn().PID())
	}
	for _, c := range held {
		c.Release()
	}
	return d
}

func (d *benchDB) close() {
	d.pool.Close()
	d.tel.shutdown()
}

// tx runs one transaction of the workload the variant's way.
func (d *benchDB) tx(ctx context.Context, key int64) error {
	ctx, span := d.tel.request(ctx)
	defer span.End()
	if d.v == benchD || d.v == benchE || d.v == benchF {
		res := Run(ctx, d.pool, d.policy, func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			return struct{}{}, d.w.work(ctx, tx, key)
		})
		if res.Outcome() != outcome.OutcomeCommitted {
			return fmt.Errorf("Run: %s: %+v", res.Outcome(), res)
		}
		return nil
	}
	tx, err := d.pool.BeginTx(ctx, d.w.opts)
	if err != nil {
		return err
	}
	if err := d.w.work(ctx, tx, key); err != nil {
		return errors.Join(err, tx.Rollback(ctx))
	}
	return tx.Commit(ctx)
}

// benchReset empties the insert-only table before a timed run, so that every run
// writes into a small table.
func benchReset(b *testing.B, admin *pgx.Conn) {
	if _, err := admin.Exec(context.Background(), "truncate bench_log, bench_marker"); err != nil {
		b.Fatal(err)
	}
}

// benchReport reports throughput, latency percentiles and spans per transaction.
func benchReport(b *testing.B, lat []time.Duration, spans int64) {
	if len(lat) == 0 {
		return
	}
	b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "tx/s")
	slices.Sort(lat)
	b.ReportMetric(float64(benchPercentile(lat, 0.50))/1e3, "p50-us")
	b.ReportMetric(float64(benchPercentile(lat, 0.99))/1e3, "p99-us")
	b.ReportMetric(float64(spans)/float64(len(lat)), "spans/op")
}

// benchPercentile returns the p-quantile of sorted (nearest rank).
func benchPercentile(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// benchCPU is the CPU time used so far by this process (the client: pgx, the
// instrumentation, the SDK, the runtime) and by the pool's server backends.
type benchCPU struct{ client, server time.Duration }

func (d *benchDB) cpu(b *testing.B) benchCPU {
	c := benchCPU{client: benchProcessCPU(b)}
	for _, pid := range d.pids {
		t, err := pgtest.BackendCPU(pid)
		if err != nil {
			b.Fatalf("CPU time of server backend %d (run as root or as the server's OS user): %v", pid, err)
		}
		c.server += t
	}
	return c
}

// benchProcessCPU is the CPU time (user and system) this process has used so far.
func benchProcessCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchLoopCPU runs body in a b.Loop and reports the process's CPU time per iteration,
// cpu-ns/op: unlike ns/op it does not grow while a loaded machine runs other work.
func benchLoopCPU(b *testing.B, body func()) {
	cpu := benchProcessCPU(b)
	for b.Loop() {
		body()
	}
	b.ReportMetric(float64(benchProcessCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
}

// benchReportCPU reports the CPU time per transaction between start and now: the
// client's, client-µs/tx, and the server backends', server-µs/tx.
func benchReportCPU(b *testing.B, d *benchDB, start benchCPU, n int) {
	if n == 0 {
		return
	}
	end := d.cpu(b)
	b.ReportMetric(float64(end.client-start.client)/1e3/float64(n), "client-µs/tx")
	b.ReportMetric(float64(end.server-start.server)/1e3/float64(n), "server-µs/tx")
}

// benchList reads a comma-separated list from the environment variable name, or def.
func benchList[T any](b *testing.B, name, def string, parse func(string) (T, error)) []T {
	s := os.Getenv(name)
	if s == "" {
		s = def
	}
	var out []T
	for f := range strings.SplitSeq(s, ",") {
		v, err := parse(strings.TrimSpace(f))
		if err != nil {
			b.Fatalf("%s=%q: %v", name, s, err)
		}
		out = append(out, v)
	}
	return out
}

// benchRTTs are the added network round-trip times BenchmarkTx runs at
// ($OTELPGXTX_BENCH_RTT): 0 connects directly, anything else through a
// pgtest.ProxyProcess delaying each direction by half of it.
func benchRTTs(b *testing.B) []time.Duration {
	return benchList(b, "OTELPGXTX_BENCH_RTT", "0,200us,1ms", time.ParseDuration)
}

// benchGoroutineCounts are BenchmarkTxScale's concurrencies ($OTELPGXTX_BENCH_GOROUTINES).
func benchGoroutineCounts(b *testing.B) []int {
	return benchList(b, "OTELPGXTX_BENCH_GOROUTINES", "1,2,4,8,16,64", func(s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err == nil && n < 1 {
			err = errors.New("goroutines must be at least 1")
		}
		return n, err
	})
}

// benchMs names a duration in milliseconds, "rtt=0.2ms".
func benchMs(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64) + "ms"
}

// benchEach runs fn as BenchmarkX/<workload>/<sampling>/v=<variant> for each of
// workloads, samplings and variants, with one pool of conns connections to connString per
// variant, created and warmed before the sub-benchmark and closed after it.
func benchEach(b *testing.B, admin *pgx.Conn, connString string, conns int, workloads []benchWorkload,
	samplings []benchSampling, variants []string, fn func(b *testing.B, d *benchDB, admin *pgx.Conn)) {
	for _, w := range workloads {
		for _, s := range samplings {
			for _, v := range variants {
				var d *benchDB
				b.Run(w.name+"/"+s.name+"/v="+v, func(b *testing.B) {
					if d == nil { // created on the first call, reused by the following ones
						d = newBenchDB(b, connString, v, s, w, conns)
					}
					fn(b, d, admin)
				})
				if d != nil {
					d.close()
				}
			}
		}
	}
}

// benchLoop runs b.N transactions over goroutines goroutines and reports throughput,
// latency, spans and CPU time per transaction.
func benchLoop(b *testing.B, d *benchDB, admin *pgx.Conn, goroutines int) {
	benchReset(b, admin)
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	exported := d.tel.flushed() // none of the warm-up's left to export in the timed loop
	spans := d.tel.spanCount()
	b.ReportAllocs()
	cpu := d.cpu(b)
	b.ResetTimer()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			ctx := context.Background()
			for {
				i := int(next.Add(1) - 1)
				if i >= b.N {
					return
				}
				t0 := time.Now()
				if err := d.tx(ctx, benchKey(g, i)); err != nil {
					b.Error(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	benchReportCPU(b, d, cpu, b.N)
	benchReport(b, lat, d.tel.spanCount()-spans)
	if d.tel != nil && len(lat) > 0 {
		// Fewer than spans/op: the batch span processor's queue was full and it dropped some.
		b.ReportMetric(float64(d.tel.flushed()-exported)/float64(len(lat)), "exported/op")
	}
}

// BenchmarkTx runs one transaction at a time against the real server, at each added
// round-trip time (BenchmarkTx/rtt=<ms>/<workload>/<sampling>/v=<variant>).
func BenchmarkTx(b *testing.B) {
	admin := benchSchema(b)
	target := fmt.Sprintf("%s:%d", srv.Host(), srv.Port())
	for _, rtt := range benchRTTs(b) {
		connString := srv.ConnString()
		var proxy *pgtest.ProxyProcess
		if rtt > 0 {
			var err error
			if proxy, err = pgtest.StartProxyProcess(target, rtt/2, rtt-rtt/2); err != nil {
				b.Fatal(err)
			}
			connString = proxy.ConnString(connString)
		}
		b.Run("rtt="+benchMs(rtt), func(b *testing.B) {
			benchEach(b, admin, connString, 1, benchWorkloads, benchSamplings, benchServerVariants, func(b *testing.B, d *benchDB, admin *pgx.Conn) {
				benchLoop(b, d, admin, 1)
			})
		})
		if proxy != nil {
			if err := proxy.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkTxScale runs writes from g goroutines over a pool of g connections, for
// each g of benchGoroutineCounts (BenchmarkTxScale/g=<n>/write/<sampling>/v=<variant>):
// how throughput and the client's CPU time per transaction grow with concurrency.
func BenchmarkTxScale(b *testing.B) {
	admin := benchSchema(b)
	for _, g := range benchGoroutineCounts(b) {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			benchEach(b, admin, srv.ConnString(), g, benchWorkloads[:1], benchSamplings, benchServerVariants, func(b *testing.B, d *benchDB, admin *pgx.Conn) {
				benchLoop(b, d, admin, g)
			})
		})
	}
}

// BenchmarkTxRoundTrips counts client-to-server round trips per transaction at a
// pgtest.Proxy: reference capture (e) must take exactly as many as d. Its ns/op
// includes the proxy and is not comparable with BenchmarkTx.
func BenchmarkTxRoundTrips(b *testing.B) {
	admin := benchSchema(b)
	proxy := newProxy(b)
	for _, w := range benchWorkloads {
		for _, v := range benchServerVariants {
			d := newBenchDB(b, proxy.ConnString(srv.ConnString()), v, benchSamplings[0], w, 1)
			b.Run(w.name+"/v="+v, func(b *testing.B) {
				benchReset(b, admin)
				ctx := context.Background()
				proxy.ResetRoundTrips()
				b.ResetTimer()
				for i := range b.N {
					if err := d.tx(ctx, benchKey(0, i)); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(proxy.RoundTrips())/float64(b.N), "roundtrips/op")
			})
			d.close()
		}
	}
}

// ---- micro-benchmarks over the in-process fake server ------------------------------

// benchFake is one variant's connection to a fakePG.
type benchFake struct {
	v      string
	tel    *benchTelemetry
	conn   *pgx.Conn
	policy Policy
}

func newBenchFake(tb testing.TB, v string, s benchSampling) *benchFake {
	cfg := fakePGConfig()
	f := &benchFake{v: v, policy: DefaultPolicy()}
	f.policy.CaptureReference = v == benchE
	f.tel = benchInstrument(tb, cfg, nil, v, s)
	var err error
	if f.conn, err = pgx.ConnectConfig(context.Background(), cfg); err != nil {
		tb.Fatal(err)
	}
	for range 8 { // warm: statements prepared and cached, cluster identity read
		if err := f.tx(context.Background()); err != nil {
			tb.Fatal(err)
		}
	}
	return f
}

func (f *benchFake) close() {
	_ = f.conn.Close(context.Background())
	f.tel.shutdown()
}

// tx is BEGIN, insert, update, select, COMMIT on the fake, the variant's way.
func (f *benchFake) tx(ctx context.Context) error {
	ctx, span := f.tel.request(ctx)
	defer span.End()
	if f.v == benchD || f.v == benchE {
		res := Run(ctx, f.conn, f.policy, func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			return struct{}{}, benchWrite(ctx, tx, 7)
		})
		if res.Outcome() != outcome.OutcomeCommitted {
			return fmt.Errorf("Run: %s: %+v", res.Outcome(), res)
		}
		return nil
	}
	tx, err := f.conn.Begin(ctx)
	if err != nil {
		return err
	}
	if err := benchWrite(ctx, tx, 7); err != nil {
		return errors.Join(err, tx.Rollback(ctx))
	}
	return tx.Commit(ctx)
}

// BenchmarkHookTx is the per-transaction hook path without I/O: BEGIN, 3 statements,
// COMMIT over fakePG. c_otelpgxtx − b_otelpgx is the Tracer's own added cost per
// transaction; d and e add Run and reference capture on top of c.
func BenchmarkHookTx(b *testing.B) {
	for _, s := range benchSamplings {
		for _, v := range benchVariants {
			b.Run(s.name+"/v="+v, func(b *testing.B) {
				f := newBenchFake(b, v, s) // b.Loop: this function runs once
				defer f.close()
				ctx := context.Background()
				spans := f.tel.spanCount()
				b.ReportAllocs()
				benchLoopCPU(b, func() {
					if err := f.tx(ctx); err != nil {
						b.Fatal(err)
					}
				})
				b.ReportMetric(float64(f.tel.spanCount()-spans)/float64(b.N), "spans/op")
			})
		}
	}
}

// benchPairs are the differences issue 13's targets are about, head against base: the
// Tracer (c−b), Run (d−c) and reference capture (e−d); a null pair, c against itself,
// whose difference is the measure's own noise in that run; what the frame's events in
// place of statement spans save (c−i, issue 29) and the Tracer with every span (i−b, which
// the floors model); and the SDK floors of
// BenchmarkHookFloor measured the same way: the frame span (against nothing), what a
// Run frame's two attributes add to it, and what db.query.summary adds to the
// statement spans.
var benchPairs = [][2]string{
	{benchB, benchC}, {benchC, benchD}, {benchD, benchE}, {benchC, benchC}, {benchI, benchC}, {benchB, benchI},
	{benchNone, "frame_span"}, {"frame_span", "frame_span_run"}, {"statement_spans", "statement_spans_summary"},
}

// benchNone is a pair side that does nothing: against it, a floor's own cost.
const benchNone = "none"

// benchPairBlock is how many transactions one side of a BenchmarkHookPair sample runs,
// some 1 ms of work; a floor's block runs benchPairFloorBlock calls, each a few µs.
const (
	benchPairBlock      = 32
	benchPairFloorBlock = 64
)

// benchPairSide is one side of a BenchmarkHookPair pair: one transaction (or one
// floor's telemetry) per call, and what settles its background work between samples.
type benchPairSide struct {
	block int // calls per block
	run   func() error
	quiet func() // flushes the side's spans to its exporter
	close func()
}

// newBenchPairSide builds the side named v: a variant of BenchmarkHookTx over the fake,
// a floor of BenchmarkHookFloor, or benchNone.
func newBenchPairSide(b *testing.B, v string, s benchSampling) benchPairSide {
	if v == benchNone {
		return benchPairSide{block: benchPairFloorBlock, run: func() error { return nil }, quiet: func() {}, close: func() {}}
	}
	if floor, ok := benchFloors[v]; ok {
		tel := newBenchTelemetry(b, s)
		m := newMetrics(tel.mp, nil)
		tr := tel.tp.Tracer(ScopeName)
		ctx, req := tel.request(context.Background())
		return benchPairSide{
			block: benchPairFloorBlock,
			run:   func() error { floor(ctx, tr, m); return nil },
			quiet: func() { _ = tel.tp.ForceFlush(context.Background()) },
			close: func() { req.End(); tel.shutdown() },
		}
	}
	f := newBenchFake(b, v, s)
	return benchPairSide{
		block: benchPairBlock,
		run:   func() error { return f.tx(context.Background()) },
		quiet: func() { _ = f.tel.tp.ForceFlush(context.Background()) },
		close: f.close,
	}
}

// BenchmarkHookPair measures what one side adds to another (a variant of BenchmarkHookTx
// to another, or a floor of BenchmarkHookFloor to another) with the two paired in time:
// each iteration runs a block of benchPairBlock transactions of each (benchPairFloorBlock
// calls of a floor), in alternating order, and makes one sample of the difference per
// transaction; the median sample is reported (Δns/tx wall, Δcpu-ns/tx process CPU).
//
// Before each pair of blocks, outside them, both sides' spans are flushed and the heap is
// collected, and right before its block each side runs two transactions to warm its
// caches again, so that neither side's block follows its own warm-up closer. The blocks
// then measure the code the transaction runs, with neither the SDK's export goroutine
// nor the garbage collector in them: on 2 cores those land on the blocks unevenly and
// moved sampled differences by ±2 µs between runs, where now the null pair stays within
// ±0.2 µs. What they leave out grows with allocs/op, B/op and spans/op, which
// BenchmarkHookTx reports.
func BenchmarkHookPair(b *testing.B) {
	for _, s := range benchSamplings {
		for _, p := range benchPairs {
			b.Run(s.name+"/v="+p[1]+"-"+p[0], func(b *testing.B) {
				base, head := newBenchPairSide(b, p[0], s), newBenchPairSide(b, p[1], s)
				defer base.close()
				defer head.close()
				run := func(side benchPairSide, n int) {
					for range n {
						if err := side.run(); err != nil {
							b.Fatal(err)
						}
					}
				}
				n := max(base.block, head.block)
				block := func(side benchPairSide) (wall, cpu time.Duration) {
					run(side, 2) // its caches warm again after the other side's block
					c, t := benchProcessCPU(b), time.Now()
					run(side, n)
					return time.Since(t), benchProcessCPU(b) - c
				}
				var walls, cpus []float64
				for i := 0; b.Loop(); i++ {
					base.quiet()
					head.quiet()
					runtime.GC()
					var bw, bc, hw, hc time.Duration
					if i%2 == 0 {
						bw, bc = block(base)
						hw, hc = block(head)
					} else {
						hw, hc = block(head)
						bw, bc = block(base)
					}
					walls = append(walls, float64(hw-bw)/float64(n))
					cpus = append(cpus, float64(hc-bc)/float64(n))
				}
				b.ReportMetric(benchMedian(walls), "Δns/tx")
				b.ReportMetric(benchMedian(cpus), "Δcpu-ns/tx")
			})
		}
	}
}

// benchMedian returns the median of xs, which it sorts.
func benchMedian(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

// BenchmarkHookQuery is one statement inside an open transaction over fakePG: the
// Tracer's per-query cost is c_otelpgxtx − b_otelpgx.
func BenchmarkHookQuery(b *testing.B) {
	for _, s := range benchSamplings {
		for _, v := range []string{benchA, benchB, benchC} {
			b.Run(s.name+"/v="+v, func(b *testing.B) {
				f := newBenchFake(b, v, s) // b.Loop: this function runs once
				defer f.close()
				ctx, span := f.tel.request(context.Background())
				defer span.End()
				tx, err := f.conn.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				benchLoopCPU(b, func() {
					if _, err := tx.Exec(ctx, "update bench_kv set v = v + 1 where k = $1", 7); err != nil {
						b.Fatal(err)
					}
				})
				b.StopTimer()
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// fakeTraced connects to a fakePG with a Tracer (opts added) recording into exp through
// tp, synchronously; the connection is closed when t ends.
func fakeTraced(t *testing.T, opts ...Option) (*pgx.Conn, *tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	cfg := fakePGConfig()
	cfg.Tracer = NewTracer(append([]Option{WithTracerProvider(tp)}, opts...)...)
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn, exp, tp
}

// TestBenchFloorModel checks BenchmarkHookFloor's model of a statement span against the
// real thing: over fakePG, the statement span otelpgx makes under the Tracer gets the SDK
// calls that benchStatementSpan makes, with the same start attributes in the same order
// (db.system.name twice: otelpgx's own tracer attribute and the connection's), and ends
// the same (benchSpanShape).
func TestBenchFloorModel(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := &callLogProvider{tp: sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))}
	conn, _, _ := fakeTraced(t, WithTracerProvider(tp))
	const sql = "update t set v = v + 1 where id = $1"
	if _, err := conn.Exec(context.Background(), sql, 1); err != nil { // prepared once, untraced, as in the benchmarks
		t.Fatal(err)
	}
	ctx, req := tp.tp.Tracer("request").Start(context.Background(), "request") // otelpgx records under a recording parent
	if _, err := conn.Exec(ctx, sql, 1); err != nil {
		t.Fatal(err)
	}
	benchStatementSpan(ctx, tp.Tracer("model"), true)
	req.End()
	spans := exp.GetSpans()
	if len(spans) != 3 || len(tp.logs) != 2 {
		t.Fatalf("%d spans, %d call logs: want the statement's, the model's and the request's", len(spans), len(tp.logs))
	}
	if real, model := *tp.logs[0], *tp.logs[1]; !slices.Equal(real, model) {
		t.Errorf("the model calls\n\t%v\nbut the statement span calls\n\t%v", model, real)
	}
	if real, model := benchSpanShape(spans[0]), benchSpanShape(spans[1]); real != model {
		t.Errorf("the model ends as\n\t%s\nbut the statement span ends as\n\t%s", model, real)
	}
}

// benchSpanShape is what an ended span is as the floors model it: its name, kind, status,
// attribute keys and event names.
func benchSpanShape(s tracetest.SpanStub) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %v", s.Name, s.SpanKind, s.Status.Code)
	for _, a := range s.Attributes {
		b.WriteString(" " + string(a.Key))
	}
	for _, e := range s.Events {
		b.WriteString(" event:" + e.Name)
	}
	return b.String()
}

// TestBenchFloorFrame checks frame_span's and frame_span_run's model against the real
// frames: over fakePG, the frame of a hand-written transaction and a Run frame make the
// SDK calls, in order, that benchFrameSpan makes, without and with benchRunAttrs, and end
// with the same kind, attributes, events and status.
func TestBenchFloorFrame(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := &callLogProvider{tp: sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))}
	conn, _, _ := fakeTraced(t, WithInnerTracer(nil), WithTracerProvider(tp))
	plain := &benchFake{v: benchC, conn: conn}
	run := &benchFake{v: benchD, conn: conn, policy: DefaultPolicy()}
	run.policy.CaptureReference = false
	for _, f := range []*benchFake{plain, run} {
		if err := f.tx(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	m := newMetrics(sdkmetric.NewMeterProvider(), nil)
	benchFrameSpan(context.Background(), tp.Tracer(ScopeName), m, nil)
	benchFrameSpan(context.Background(), tp.Tracer(ScopeName), m, benchRunAttrs)
	spans := exp.GetSpans()
	if len(spans) != 4 || len(tp.logs) != 4 {
		t.Fatalf("%d spans, %d call logs: want 2 frames and 2 models", len(spans), len(tp.logs))
	}
	for i, name := range []string{"frame_span", "frame_span_run"} {
		if real, model := benchSpanShape(spans[i]), benchSpanShape(spans[i+2]); real != model {
			t.Errorf("%s ends as\n\t%s\nbut the frame ends as\n\t%s", name, model, real)
		}
		if real, model := *tp.logs[i], *tp.logs[i+2]; !slices.Equal(real, model) {
			t.Errorf("%s calls\n\t%v\nbut the frame calls\n\t%v", name, model, real)
		}
	}
}

// callLogProvider is a TracerProvider that logs, per span, the calls that change it, and
// the kind and attribute keys it starts with: what the SDK charges for.
type callLogProvider struct {
	embedded.TracerProvider
	tp   trace.TracerProvider
	logs []*[]string
}

// Tracer implements trace.TracerProvider.
func (p *callLogProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return callLogTracer{tr: p.tp.Tracer(name, opts...), p: p}
}

// callLogTracer starts spans that log into a new entry of its provider's logs.
type callLogTracer struct {
	embedded.Tracer
	tr trace.Tracer
	p  *callLogProvider
}

func (t callLogTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	var keys []attribute.Key
	for _, a := range cfg.Attributes() {
		keys = append(keys, a.Key)
	}
	log := &[]string{fmt.Sprintf("Start(%v, attributes %v)", cfg.SpanKind(), keys)}
	t.p.logs = append(t.p.logs, log)
	ctx, span := t.tr.Start(ctx, name, opts...)
	s := callLogSpan{Span: span, log: log}
	return trace.ContextWithSpan(ctx, s), s
}

// callLogSpan is a span that logs its changing calls, then makes them.
type callLogSpan struct {
	trace.Span
	log *[]string
}

func (s callLogSpan) add(call string, args ...any) {
	*s.log = append(*s.log, fmt.Sprintf(call, args...))
}

func (s callLogSpan) SetAttributes(kv ...attribute.KeyValue) {
	s.add("SetAttributes(%d)", len(kv))
	s.Span.SetAttributes(kv...)
}

func (s callLogSpan) AddEvent(name string, opts ...trace.EventOption) {
	s.add("AddEvent(%s, %d options)", name, len(opts))
	s.Span.AddEvent(name, opts...)
}

func (s callLogSpan) SetStatus(code codes.Code, desc string) {
	s.add("SetStatus(%v)", code)
	s.Span.SetStatus(code, desc)
}

func (s callLogSpan) End(opts ...trace.SpanEndOption) {
	s.add("End(%d options)", len(opts))
	s.Span.End(opts...)
}

// TestBenchFakeServer checks that the fake is a faithful enough stand-in: over it, the
// Tracer sees a committed frame with every phase, and Run with capture returns a
// Committed result after reading the cluster identity and the xid.
func TestBenchFakeServer(t *testing.T) {
	conn, exp, _ := fakeTraced(t, WithInnerTracer(nil))
	f := &benchFake{v: benchC, conn: conn}
	if err := f.tx(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.v, f.policy = benchE, DefaultPolicy()
	if err := f.tx(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2 frames", len(spans))
	}
	for i, s := range spans {
		wantAttr(t, s, "tx.outcome", "committed")
		wantEvents(t, s, "tx.phase.active", "tx.phase.committing", "tx.phase.committed")
		if _, ok := attr(s, ReconciliationXIDKey); ok != (i == 1) {
			t.Errorf("frame %d: reconciliation xid present %v", i, ok)
		}
	}
}

// ---- the SDK's floor ---------------------------------------------------------------

var (
	benchSinkCtx        context.Context
	benchFloorStatement = 5 // BEGIN, 3 statements, COMMIT: one statement span each
)

// BenchmarkHookFloor is what the OpenTelemetry SDK alone charges for one frame of a
// committed BEGIN + 3 statements + COMMIT, without the Tracer's own logic:
//
//   - v=frame_span: the span as phase_span.go makes it today (Start with its kind, 2
//     phase events, the context that parents the statements to it, once per frame as
//     innerStartCtx keeps it, the third event, the 3 metric recordings with the
//     context Start returned, then status and the 8 attributes in one SetAttributes
//     from a pooled slice, End); TestBenchFloorFrame checks the model;
//   - v=frame_span_run: the same with the two attributes a Run frame adds
//     (tx.propagation, tx.attempt): ten attributes, past the eight up to which the SDK
//     deduplicates them with a map on the stack, so that it costs 3 allocations more;
//   - v=bare_span: a span with nothing on it, Start and End: the least one more span
//     per transaction can cost;
//   - v=statement_spans: the 5 statement spans otelpgx makes of that transaction (Start
//     with its kind and its 8 attributes, pgx.rows_affected at the end, End), and
//     v=statement_spans_summary the same with the db.query.summary the Tracer sets on each
//     after Start: their difference is what the SDK charges for that attribute, which the
//     frame span does not include.
//
// BenchmarkHookTx's c−b minus frame_span and minus statement_spans_summary −
// statement_spans is the Tracer's logic; d−c minus frame_span_run − frame_span is Run's.
func BenchmarkHookFloor(b *testing.B) {
	for _, s := range benchSamplings {
		for _, v := range slices.Sorted(maps.Keys(benchFloors)) {
			b.Run(s.name+"/v="+v, func(b *testing.B) {
				tel := newBenchTelemetry(b, s)
				defer tel.shutdown()
				m := newMetrics(tel.mp, nil)
				tr := tel.tp.Tracer(ScopeName)
				ctx, req := tel.request(context.Background())
				defer req.End()
				frame := benchFloors[v]
				b.ReportAllocs()
				benchLoopCPU(b, func() { frame(ctx, tr, m) })
			})
		}
	}
}

// benchFloors are BenchmarkHookFloor's variants by name.
var benchFloors = map[string]func(context.Context, trace.Tracer, *metrics){
	"frame_span":              func(ctx context.Context, tr trace.Tracer, m *metrics) { benchFrameSpan(ctx, tr, m, nil) },
	"frame_span_run":          func(ctx context.Context, tr trace.Tracer, m *metrics) { benchFrameSpan(ctx, tr, m, benchRunAttrs) },
	"bare_span":               benchBareSpan,
	"statement_spans":         func(ctx context.Context, tr trace.Tracer, _ *metrics) { benchStatementSpans(ctx, tr, false) },
	"statement_spans_summary": func(ctx context.Context, tr trace.Tracer, _ *metrics) { benchStatementSpans(ctx, tr, true) },
}

// benchRunAttrs are the attributes a Run frame has that a frame of hand-written pgx has not.
var benchRunAttrs = []attribute.KeyValue{PropagationKey.String("required"), AttemptKey.Int(1)}

// benchFrameSpan makes a frame's span and metrics as phase_span.go does, with extra
// attributes at its end.
func benchFrameSpan(ctx context.Context, tr trace.Tracer, m *metrics, extra []attribute.KeyValue) {
	id := outcome.NewOperationID()
	start := time.Now()
	sctx, span := tr.Start(ctx, DefaultSpanName, frameStartOptions...)
	rec := span.IsRecording()
	if rec {
		span.AddEvent(phaseEvents[outcome.PhaseActive])
		benchSinkCtx = trace.ContextWithSpan(ctx, span)
		span.AddEvent(phaseEvents[outcome.PhaseCommitting])
		span.AddEvent(phaseEvents[outcome.PhaseCommitted])
	}
	now := time.Now()
	mctx := context.Background()
	if span.SpanContext().IsSampled() {
		mctx = sctx
	}
	o := outcome.OutcomeCommitted
	m.transactions.Add(mctx, 1, m.addOpts[o]...)
	m.duration.Record(mctx, now.Sub(start).Seconds(), m.recordOpts[o]...)
	m.commit.Record(mctx, now.Sub(start).Seconds(), m.recordOpts[o]...)
	if !rec {
		span.End()
		return
	}
	span.SetStatus(codes.Ok, "")
	buf := frameAttrs.Get().(*[]attribute.KeyValue)
	attrs := append((*buf)[:0], dbSystemPostgreSQL, dbNamespaceKey.String("bench"), serverAddressKey.String("127.0.0.1"),
		serverPortKey.Int(5432), OperationIDKey.String(id.String()), FrameDepthKey.Int(0),
		OutcomeKey.String(o.String()), PhaseKey.String(outcome.PhaseCommitted.String()))
	setFrameAttrs(span, buf, append(attrs, extra...))
	span.End()
}

// benchStatementAttrs are the attributes otelpgx v0.13 starts a statement span with over
// fakePG, in its order (TestBenchFloorModel checks them): its own db.system.name, the
// connection's five (db.system.name again among them: the SDK keeps both until it
// deduplicates at export), the query text and the operation name.
var benchStatementAttrs = []attribute.KeyValue{
	dbSystemPostgreSQL,
	dbSystemPostgreSQL, attribute.String("server.address", "127.0.0.1"), attribute.Int("server.port", 5432),
	attribute.String("user.name", "bench"), attribute.String("db.namespace", "bench"),
	attribute.String("db.query.text", "update t set v = v + 1 where id = $1"), attribute.String("db.operation.name", "UPDATE"),
}

// benchSummary is a statement's db.query.summary as the Tracer's sanitizer caches it.
var benchSummary = []attribute.KeyValue{dbQuerySummaryKey.String("update t")}

// benchRowsAffected is what otelpgx sets on a statement span at its end.
var benchRowsAffected = otelpgx.RowsAffectedKey.Int64(1)

// benchStatementSpans makes a transaction's statement spans as otelpgx does, with the
// Tracer's db.query.summary on each if summary.
func benchStatementSpans(ctx context.Context, tr trace.Tracer, summary bool) {
	for range benchFloorStatement {
		benchStatementSpan(ctx, tr, summary)
	}
}

// benchStatementSpan makes one statement span as otelpgx does, with the Tracer's
// db.query.summary if summary.
func benchStatementSpan(ctx context.Context, tr trace.Tracer, summary bool) {
	_, span := tr.Start(ctx, "UPDATE", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(benchStatementAttrs...))
	if summary && span.IsRecording() {
		span.SetAttributes(benchSummary...)
	}
	if span.IsRecording() {
		span.SetAttributes(benchRowsAffected)
	}
	span.End()
}

// benchBareSpan starts and ends a span with nothing on it.
func benchBareSpan(ctx context.Context, tr trace.Tracer, _ *metrics) {
	_, span := tr.Start(ctx, DefaultSpanName, frameStartOptions...)
	span.End()
}
