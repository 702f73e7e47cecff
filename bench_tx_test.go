package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

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
	d.policy.CommitReference = v == benchE || v == benchF
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
// pgtest.Proxy: commit references (e) must take exactly as many as d. Its ns/op
// includes the proxy and is not comparable with BenchmarkTx.
func BenchmarkTxRoundTrips(b *testing.B) {
	admin := benchSchema(b)
	proxy := pgtest.ProxyFor(b, srv)
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
