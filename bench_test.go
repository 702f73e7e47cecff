package otelpgxtx

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/framespan"
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
	benchK = "k_otelpgxtx_unframed"

	benchKeyGroups = 64  // disjoint groups of bench_kv rows: goroutine g writes group g % 64
	benchKeysPerG  = 128 // rows of bench_kv per group
)

var benchVariants = []string{benchA, benchB, benchC, benchD, benchE, benchI}

// benchServerVariants are the variants run against the real server: f and h need the
// marker table, and g and h's references need the server's identity.
var benchServerVariants = append(slices.Clone(benchVariants), benchF, benchG, benchH)

// benchMarker is f_run_marker's commit-marker table.
var benchMarker = pgx.Identifier{"public", "bench_marker"}

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
		return ctx, framespan.NoopSpan
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
	benchG: {WithCommitReference()},
	benchH: {WithCommitMarker(benchMarker)},
	benchI: {WithInnerSpans(InnerSpanTransactionControl, InnerSpanPrepare)},
	benchJ: {WithInnerSpans(InnerSpanPrepare)},
	// k: c with no implicit transaction made a frame: what the tracer costs an
	// autocommit write besides its frame.
	benchK: {WithImplicitFilter(func(context.Context, string) bool { return false })},
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
		// A single connection, as InstrumentConnConfig makes it: the net.Conn wrapper is on
		// the per-transaction path too (it carries the commit references).
		if _, err := InstrumentConnConfig(cfg, opts...); err != nil {
			tb.Fatal(err)
		}
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
		// A procedure that commits inside: its two writes are two transactions.
		"create or replace procedure bench_call(a bigint, b bigint) language plpgsql as $$ begin " +
			"insert into bench_log (k, v) values (a, b); commit; insert into bench_log (k, v) values (a, b); end $$",
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

// ---- CPU time ---------------------------------------------------------------------

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
