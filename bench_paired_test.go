package otelpgxtx

// BenchmarkPaired measures the library as its users would compare it: otelpgx alone (b)
// beside otelpgxtx (c) on the same workload, paired in time, for an autocommit write, an
// autocommit read and an explicit transaction (BEGIN, INSERT, COMMIT), on a pool and on a
// single connection, sampled and unsampled, on the real server and over the in-process
// fake server (no I/O). `scripts/bench paired` runs it and prints the targets: on
// the real server, sampled, an autocommit write at most 4 µs of client CPU above otelpgx,
// a read at most 2 µs, an explicit transaction no more than otelpgx.
//
// It uses only the exported API (InstrumentPool, InstrumentConnConfig, the options), the
// test server (srv) and the fake (fakePGConfig), so that it measures the library from the
// outside whatever its insides become.

import (
	"context"
	"fmt"
	"runtime"
	rtmetrics "runtime/metrics"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// pairedVariants: otelpgx alone as the connection's tracer (b), the library with its
// defaults (c), and bare pgx (a, only as a null baseline where asked).
const (
	pairedA = "a_pgx"
	pairedB = "b_otelpgx"
	pairedC = "c_otelpgxtx"
)

// pairedPairs are the pairs measured, head against base: the library against otelpgx,
// and the library against itself, the measure's own noise in that run (real server only:
// without I/O it is a fraction of a µs); for autocommit statements, the floor against
// otelpgx (what the contract charges) and the library against the floor (what it adds
// above it: bench_paired_floor_test.go).
var pairedPairs = [][2]string{{pairedB, pairedC}, {pairedC, pairedC}, {pairedB, pairedL}, {pairedL, pairedC}}

// pairedBlock is how many statements (or transactions) one side runs per sample: some
// 3–10 ms of work on the real server.
const pairedBlock = 64

// pairedWork is one unit of the workload: an autocommit write, an autocommit read, or an
// explicit transaction, sent through a pool or on a single connection.
type pairedWork struct {
	name string
	pool func(ctx context.Context, p *pgxpool.Pool, key int64) error
	conn func(ctx context.Context, c *pgx.Conn, key int64) error
}

var pairedWorks = []pairedWork{
	{"insert",
		func(ctx context.Context, p *pgxpool.Pool, key int64) error { return pairedInsert(ctx, p.Exec, key) },
		func(ctx context.Context, c *pgx.Conn, key int64) error { return pairedInsert(ctx, c.Exec, key) }},
	{"select",
		func(ctx context.Context, p *pgxpool.Pool, key int64) error {
			return pairedSelect(p.QueryRow(ctx, pairedSelectSQL, key))
		},
		func(ctx context.Context, c *pgx.Conn, key int64) error {
			return pairedSelect(c.QueryRow(ctx, pairedSelectSQL, key))
		}},
	{"tx",
		func(ctx context.Context, p *pgxpool.Pool, key int64) error {
			return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error { return pairedInsert(ctx, tx.Exec, key) })
		},
		func(ctx context.Context, c *pgx.Conn, key int64) error {
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error { return pairedInsert(ctx, tx.Exec, key) })
		}},
}

const (
	pairedInsertSQL = "insert into paired_log (k, v) values ($1, $2)"
	pairedSelectSQL = "select v from paired_kv where k = $1"
	pairedKeys      = 1024 // rows of paired_kv
)

func pairedInsert[T any](ctx context.Context, exec func(context.Context, string, ...any) (T, error), key int64) error {
	_, err := exec(ctx, pairedInsertSQL, key, key)
	return err
}

func pairedSelect(row pgx.Row) error {
	var v int64
	return row.Scan(&v)
}

// pairedIO is where the statements go: the real test server, or the in-process fake.
type pairedIO struct {
	name   string
	config func(b *testing.B) *pgx.ConnConfig
}

var pairedIOs = []pairedIO{
	{"server", func(b *testing.B) *pgx.ConnConfig {
		cfg, err := pgx.ParseConfig(srv.ConnString())
		if err != nil {
			b.Fatal(err)
		}
		return cfg
	}},
	{"fake", func(*testing.B) *pgx.ConnConfig { return fakePGConfig() }},
}

// pairedSampling: every trace sampled, or none.
var pairedSamplings = []struct {
	name    string
	sampler func() sdktrace.Sampler
}{{"sampled", sdktrace.AlwaysSample}, {"unsampled", sdktrace.NeverSample}}

// pairedTelemetry is one side's SDK: spans through a batch span processor to a
// discarding exporter, metrics to a manual reader never collected, and the application's
// tracer for the request span each unit of work runs under.
type pairedTelemetry struct {
	tp  *sdktrace.TracerProvider
	mp  *sdkmetric.MeterProvider
	app trace.Tracer
}

type pairedDiscard struct{}

func (pairedDiscard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (pairedDiscard) Shutdown(context.Context) error                             { return nil }

func newPairedTelemetry(sampler sdktrace.Sampler) *pairedTelemetry {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(pairedDiscard{}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	return &pairedTelemetry{tp: tp, mp: mp, app: tp.Tracer("bench/app")}
}

// newPairedTelemetryOf is variant v's telemetry: none for bare pgx.
func newPairedTelemetryOf(v string, sampler sdktrace.Sampler) *pairedTelemetry {
	if v == pairedA {
		return nil
	}
	return newPairedTelemetry(sampler)
}

func (t *pairedTelemetry) shutdown() {
	_ = t.tp.Shutdown(context.Background())
	_ = t.mp.Shutdown(context.Background())
}

// pairedSide is one variant's pool or connection, warm, and how it runs one unit.
type pairedSide struct {
	tel   *pairedTelemetry
	run   func(ctx context.Context, key int64) error
	close func()
	key   int64
}

// unit runs one unit of work under the application's request span (none for bare pgx).
func (s *pairedSide) unit() error {
	ctx := context.Background()
	s.key = s.key%pairedKeys + 1
	if s.tel == nil {
		return s.run(ctx, s.key)
	}
	ctx, span := s.tel.app.Start(ctx, "request")
	defer span.End()
	return s.run(ctx, s.key)
}

// quiet exports the spans ended so far, outside the measured blocks.
func (s *pairedSide) quiet() {
	if s.tel != nil {
		_ = s.tel.tp.ForceFlush(context.Background())
	}
}

// newPairedSide builds variant v on a pool of one connection (onPool) or on a single
// connection, over cfg, and warms it (statements prepared, references read).
// Its telemetry is tel (nil for bare pgx), which it shuts down when closed.
func newPairedSide(b testing.TB, cfg *pgx.ConnConfig, v string, tel *pairedTelemetry, w pairedWork, onPool bool) *pairedSide {
	ctx := context.Background()
	s := &pairedSide{tel: tel}
	opts := func() []Option { return []Option{WithTracerProvider(s.tel.tp), WithMeterProvider(s.tel.mp)} }
	switch v {
	case pairedB:
		cfg.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(s.tel.tp), otelpgx.WithMeterProvider(s.tel.mp))
	case pairedL:
		newPairedFloor(s.tel, cfg, w.name == "insert")
	}
	var closers []func()
	if onPool {
		pcfg, err := pgxpool.ParseConfig("")
		if err != nil {
			b.Fatal(err)
		}
		pcfg.ConnConfig, pcfg.MaxConns = cfg, 1
		if v == pairedC {
			if _, err := InstrumentPool(pcfg, opts()...); err != nil {
				b.Fatal(err)
			}
		}
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			b.Fatal(err)
		}
		closers = append(closers, pool.Close)
		s.run = func(ctx context.Context, key int64) error { return w.pool(ctx, pool, key) }
	} else {
		if v == pairedC {
			if _, err := InstrumentConnConfig(cfg, opts()...); err != nil {
				b.Fatal(err)
			}
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		closers = append(closers, func() { _ = conn.Close(context.Background()) })
		s.run = func(ctx context.Context, key int64) error { return w.conn(ctx, conn, key) }
	}
	s.close = func() {
		for _, c := range closers {
			c()
		}
		if s.tel != nil {
			s.tel.shutdown()
		}
	}
	for range 16 {
		if err := s.unit(); err != nil {
			s.close()
			b.Fatal(err)
		}
	}
	return s
}

// pairedSchema creates the benchmark's tables once per run.
func pairedSchema(b testing.TB) {
	ctx := context.Background()
	conn, err := srv.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		"create table if not exists paired_kv (k bigint primary key, v bigint not null)",
		fmt.Sprintf("insert into paired_kv select g, g from generate_series(1, %d) g on conflict do nothing", pairedKeys),
		"create table if not exists paired_log (k bigint not null, v bigint not null)",
		"truncate paired_log",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPaired is BenchmarkPaired/<io>/<conn>/<work>/<sampling>/v=<head>-<base>: each
// iteration runs a block of pairedBlock units on each side, in alternating order, after
// both sides' spans were exported and the heap collected (outside the blocks), and makes
// one sample of each side's cost per unit and of their difference. Reported, as medians
// over the samples: Δcpu-ns/op (head − base, this process's CPU: pgx, the tracers, the SDK,
// the runtime) and Δns/op (wall), and each side's own cpu-ns/op, allocs/op and B/op
// (base-… and head-…), from which scripts/bench shows b beside c with benchstat.
func BenchmarkPaired(b *testing.B) {
	pairedSchema(b)
	for _, io := range pairedIOs {
		for _, onPool := range []bool{true, false} {
			where := map[bool]string{true: "pool", false: "conn"}[onPool]
			for _, w := range pairedWorks {
				for _, s := range pairedSamplings {
					for _, p := range pairedPairs {
						if io.name != "server" && p[0] == p[1] || w.name == "tx" && (p[0] == pairedL || p[1] == pairedL) {
							continue
						}
						b.Run(io.name+"/"+where+"/"+w.name+"/"+s.name+"/v="+p[1]+"-"+p[0], func(b *testing.B) {
							base := newPairedSide(b, io.config(b), p[0], newPairedTelemetryOf(p[0], s.sampler()), w, onPool)
							defer base.close()
							head := newPairedSide(b, io.config(b), p[1], newPairedTelemetryOf(p[1], s.sampler()), w, onPool)
							defer head.close()
							pairedRun(b, base, head)
						})
					}
				}
			}
		}
	}
}

// pairedCost is one block's cost per unit.
type pairedCost struct{ wall, cpu, allocs, bytes float64 }

// pairedRun is one pair's measurement (see BenchmarkPaired).
func pairedRun(b *testing.B, base, head *pairedSide) {
	// Allocations as testing's allocs/op counts them: tiny objects included.
	samples := []rtmetrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/tiny/allocs:objects"}, {Name: "/gc/heap/allocs:bytes"}}
	heap := func() (objects, bytes uint64) {
		rtmetrics.Read(samples)
		return samples[0].Value.Uint64() + samples[1].Value.Uint64(), samples[2].Value.Uint64()
	}
	block := func(s *pairedSide) pairedCost {
		for range 2 { // its caches warm again after the other side's block
			if err := s.unit(); err != nil {
				b.Fatal(err)
			}
		}
		o, by := heap()
		c, t := benchProcessCPU(b), time.Now()
		for range pairedBlock {
			if err := s.unit(); err != nil {
				b.Fatal(err)
			}
		}
		wall, cpu := time.Since(t), benchProcessCPU(b)-c
		o2, by2 := heap()
		n := float64(pairedBlock)
		return pairedCost{float64(wall) / n, float64(cpu) / n, float64(o2-o) / n, float64(by2-by) / n}
	}
	var bases, heads []pairedCost
	for i := 0; b.Loop(); i++ {
		base.quiet()
		head.quiet()
		runtime.GC()
		var bc, hc pairedCost
		if i%2 == 0 {
			bc, hc = block(base), block(head)
		} else {
			hc, bc = block(head), block(base)
		}
		bases, heads = append(bases, bc), append(heads, hc)
	}
	med := func(costs []pairedCost, f func(pairedCost) float64) float64 {
		xs := make([]float64, len(costs))
		for i, c := range costs {
			xs[i] = f(c)
		}
		return benchMedian(xs)
	}
	diff := func(f func(pairedCost) float64) float64 {
		xs := make([]float64, len(bases))
		for i := range bases {
			xs[i] = f(heads[i]) - f(bases[i])
		}
		return benchMedian(xs)
	}
	wall := func(c pairedCost) float64 { return c.wall }
	cpu := func(c pairedCost) float64 { return c.cpu }
	allocs := func(c pairedCost) float64 { return c.allocs }
	bytes := func(c pairedCost) float64 { return c.bytes }
	b.ReportMetric(diff(cpu), "Δcpu-ns/op")
	b.ReportMetric(diff(wall), "Δns/op")
	b.ReportMetric(med(bases, cpu), "base-cpu-ns/op")
	b.ReportMetric(med(heads, cpu), "head-cpu-ns/op")
	b.ReportMetric(med(bases, allocs), "base-allocs/op")
	b.ReportMetric(med(heads, allocs), "head-allocs/op")
	b.ReportMetric(med(bases, bytes), "base-B/op")
	b.ReportMetric(med(heads, bytes), "head-B/op")
}
