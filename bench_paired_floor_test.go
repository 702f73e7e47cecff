package otelpgxtx

// The floor variant of BenchmarkPaired (l): otelpgx alone, as b, plus exactly what the
// library's defaults make the OpenTelemetry SDK and the kernel do for an autocommit
// statement, and nothing of the library's own logic. Paired with b on the real server it
// prices that floor as users run it (l − b); paired with c it leaves what the library adds
// above it (c − l). The floor of a read is its statement span's db.query.summary; of a
// committed write, besides, what a committed implicit frame records (issue 66): status Ok
// and tx.outcome, tx.implicit, tx.operation_id on the statement's span, one duration record
// with its exemplar on the frame's series, two clock reads, and the FATAL peek, one
// non-blocking MSG_PEEK before the write on a plain socket (docs/classifier.md,
// session_ended_before_commit: its answer is needed before the write); on a pool, the pool
// metrics' two records per acquire and release (wait and use time, on the pool's set; off
// with WithDisablePoolMetrics), which otelpgx does not record. TestPairedFloorModel checks
// the model against the library's own spans, metrics and peeks.

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/poolmetrics"
	"github.com/txevidence/otelpgxtx/internal/sanitize"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

const pairedL = "l_otelpgx_floor"

// pairedFloor is otelpgx with the floor's SDK calls around its statement spans. One
// side runs one statement at a time, so the frame's start and id live here, not in a
// context (the library's frame is an allocation of its own logic, not of the floor).
type pairedFloor struct {
	*otelpgx.Tracer
	m       *metrics.Metrics
	summary map[string][]attribute.KeyValue // by SQL, made before the run as the sanitizer's cache holds it
	writes  bool                            // the work's statements are autocommit writes: a frame each
	start   time.Time
	id      outcome.OperationID
	peeks   atomic.Int64 // the peeks made, for the model's test
	// The pool metrics' records: the wait and use times on the pool's attribute set, and
	// the pending acquires' count, read only when collected.
	wait, use         metric.Float64Histogram
	poolOpts          []metric.RecordOption
	pending           atomic.Int64
	acquire, acquired time.Time
}

func newPairedFloor(tel *pairedTelemetry, cfg *pgx.ConnConfig, writes bool) *pairedFloor {
	f := &pairedFloor{
		Tracer:  otelpgx.NewTracer(otelpgx.WithTracerProvider(tel.tp), otelpgx.WithMeterProvider(tel.mp)),
		m:       metrics.New(tel.mp, nil),
		summary: map[string][]attribute.KeyValue{},
		writes:  writes,
	}
	for _, sql := range []string{pairedInsertSQL, pairedSelectSQL} {
		f.summary[sql] = []attribute.KeyValue{schema.DBQuerySummaryKey.String(sanitize.QuerySummary(sql))}
	}
	meter := tel.mp.Meter("bench/floor")
	f.wait = metrics.Histogram(meter, "bench.floor.wait_time", "s", "", metrics.DurationBuckets)
	f.use = metrics.Histogram(meter, "bench.floor.use_time", "s", "", metrics.DurationBuckets)
	f.poolOpts = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(poolmetrics.PoolAttributes("", cfg)...))}
	cfg.Tracer = f
	dial := cfg.DialFunc
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext // pgconn's own default
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil || !writes {
			return c, err
		}
		return newPairedPeekConn(c, &f.peeks), nil
	}
	return f
}

func (f *pairedFloor) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if f.writes {
		f.id, f.start = outcome.NewOperationID(), time.Now()
	}
	ctx = f.Tracer.TraceQueryStart(ctx, conn, data)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(f.summary[data.SQL]...)
	}
	return ctx
}

func (f *pairedFloor) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if f.writes && data.Err == nil {
		span := trace.SpanFromContext(ctx)
		mctx := context.Background()
		if span.SpanContext().IsSampled() {
			mctx = ctx // the exemplar's trace, as the frame's record carries it
		}
		o := outcome.OutcomeCommitted
		f.m.Duration.Record(mctx, time.Since(f.start).Seconds(), f.m.RecordOpts[1][o]...)
		if span.IsRecording() {
			span.SetStatus(codes.Ok, "")
			span.SetAttributes(OutcomeKey.String(o.String()), ImplicitKey.Bool(true), OperationIDKey.String(f.id.String()))
		}
	}
	f.Tracer.TraceQueryEnd(ctx, conn, data)
}

func (f *pairedFloor) TraceAcquireStart(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireStartData) context.Context {
	f.pending.Add(1)
	f.acquire = time.Now()
	return f.Tracer.TraceAcquireStart(ctx, pool, data)
}

func (f *pairedFloor) TraceAcquireEnd(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	f.pending.Add(-1)
	if data.Err == nil {
		f.acquired = time.Now()
		f.wait.Record(context.Background(), f.acquired.Sub(f.acquire).Seconds(), f.poolOpts...)
	}
	f.Tracer.TraceAcquireEnd(ctx, pool, data)
}

func (f *pairedFloor) TraceRelease(*pgxpool.Pool, pgxpool.TraceReleaseData) {
	f.use.Record(context.Background(), time.Since(f.acquired).Seconds(), f.poolOpts...)
}

// pairedPeekConn peeks, without consuming or waiting, before each write, as the library
// does before a write that commits on a plain socket; elsewhere (the fake's pipe) there
// is nothing to peek at, as for the library.
type pairedPeekConn struct {
	net.Conn
	rc    syscall.RawConn
	buf   [5]byte
	peek  func(fd uintptr)
	peeks *atomic.Int64
}

func newPairedPeekConn(c net.Conn, peeks *atomic.Int64) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	p := &pairedPeekConn{Conn: c, rc: rc, peeks: peeks}
	p.peek = func(fd uintptr) {
		_, _, _ = syscall.Recvfrom(int(fd), p.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}
	return p
}

func (p *pairedPeekConn) Write(b []byte) (int, error) {
	_ = p.rc.Control(p.peek)
	p.peeks.Add(1)
	return p.Conn.Write(b)
}

// TestPairedFloorModel checks the floor against the library on the real server, sampled,
// on one connection and on a pool: an autocommit INSERT's and SELECT's statement span ends
// with the same attribute keys, status and events under the floor (l) as under the library
// (c); each records as many points on otelpgxtx.transaction.duration (1 for the write, 0
// for the read) and, on a pool, as many on the wait and use times (1 each); and the floor
// peeks once before the write and never before the read, as the library does (internal/
// wire's TestMarkCommitPlainSocket; strace's count in docs/performance.md).
func TestPairedFloorModel(t *testing.T) {
	pairedSchema(t)
	for _, onPool := range []bool{false, true} {
		for _, w := range pairedWorks {
			if w.name == "tx" {
				continue
			}
			t.Run(map[bool]string{true: "pool", false: "conn"}[onPool]+"/"+w.name, func(t *testing.T) {
				shapes := map[string]string{}
				for _, v := range []string{pairedC, pairedL} {
					shapes[v] = pairedFloorShape(t, v, w, onPool)
				}
				if shapes[pairedC] != shapes[pairedL] {
					t.Errorf("the floor's statement span and records are\n\t%s\nthe library's\n\t%s", shapes[pairedL], shapes[pairedC])
				}
				t.Logf("%s", shapes[pairedC])
			})
		}
	}
}

// pairedFloorShape runs one unit of w on variant v, warm, and says what it left: its
// statement span's attribute keys, status and events, and its points on the frame's and
// the pool's histograms.
func pairedFloorShape(t *testing.T, v string, w pairedWork, onPool bool) string {
	exp := tracetest.NewInMemoryExporter()
	reader := sdkmetric.NewManualReader()
	tel := &pairedTelemetry{tp: sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)),
		mp: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}
	tel.app = tel.tp.Tracer("bench/app")
	cfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	s := newPairedSide(t, cfg, v, tel, w, onPool)
	defer s.close()
	floor, _ := cfg.Tracer.(*pairedFloor)
	hists := map[string][3]string{ // the frame's, the wait's and the use's histogram
		pairedC: {metrics.MetricDuration, poolmetrics.MetricConnectionWaitTime, poolmetrics.MetricConnectionUseTime},
		pairedL: {metrics.MetricDuration, "bench.floor.wait_time", "bench.floor.use_time"},
	}[v]
	before, peeks := pairedPoints(t, reader, hists), int64(0)
	if floor != nil {
		peeks = floor.peeks.Load()
	}
	exp.Reset()
	if err := s.unit(); err != nil {
		t.Fatal(err)
	}
	after := pairedPoints(t, reader, hists)
	var stmt *tracetest.SpanStub
	spans := exp.GetSpans()
	for i, sp := range spans {
		if sp.Name == "INSERT" || sp.Name == "SELECT" {
			stmt = &spans[i]
		}
	}
	if stmt == nil {
		t.Fatalf("%s: no statement span among %v", v, names(spans))
	}
	keys := make([]string, 0, len(stmt.Attributes))
	for _, a := range stmt.Attributes {
		keys = append(keys, string(a.Key))
	}
	slices.Sort(keys)
	wantFrames := map[bool]int64{true: 1, false: 0}[w.name == "insert"]
	if floor != nil {
		if got := floor.peeks.Load() - peeks; got != wantFrames {
			t.Errorf("the floor peeked %d times for one %s, want %d", got, w.name, wantFrames)
		}
	}
	return fmt.Sprintf("%s status=%v events=%d frames=%d waits=%d uses=%d", strings.Join(keys, ","), stmt.Status.Code,
		len(stmt.Events), after[0]-before[0], after[1]-before[1], after[2]-before[2])
}

// pairedPoints counts the points recorded so far on each histogram named.
func pairedPoints(t *testing.T, reader *sdkmetric.ManualReader, names [3]string) (n [3]int64) {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if i := slices.Index(names[:], m.Name); ok && i >= 0 {
				for _, dp := range h.DataPoints {
					n[i] += int64(dp.Count)
				}
			}
		}
	}
	return n
}
