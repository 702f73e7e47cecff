package otelpgxtx

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"

	"github.com/txevidence/otelpgxtx/internal/framespan"
	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

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
//   - v=implicit_frame: a committed implicit transaction (an autocommit write) as the
//     Tracer makes it: its statement's span as otelpgx makes it (below) with the
//     db.query.summary the Tracer sets, and on it what the frame adds at its end (status
//     Ok and its 3 attributes in one SetAttributes), with its one metric record (the
//     duration, with the context that carries the span); TestBenchFloorFrame checks the
//     model. v=statement_span is that statement's span alone: the difference is what the
//     SDK charges for a committed implicit frame;
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
				m := metrics.New(tel.mp, nil)
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
var benchFloors = map[string]func(context.Context, trace.Tracer, *metrics.Metrics){
	"frame_span": func(ctx context.Context, tr trace.Tracer, m *metrics.Metrics) { benchFrameSpan(ctx, tr, m, nil) },
	"frame_span_run": func(ctx context.Context, tr trace.Tracer, m *metrics.Metrics) {
		benchFrameSpan(ctx, tr, m, benchRunAttrs)
	},
	"bare_span":               benchBareSpan,
	"implicit_frame":          benchImplicitFrame,
	"statement_span":          func(ctx context.Context, tr trace.Tracer, _ *metrics.Metrics) { benchStatementSpan(ctx, tr, true) },
	"statement_spans":         func(ctx context.Context, tr trace.Tracer, _ *metrics.Metrics) { benchStatementSpans(ctx, tr, false) },
	"statement_spans_summary": func(ctx context.Context, tr trace.Tracer, _ *metrics.Metrics) { benchStatementSpans(ctx, tr, true) },
}

// benchRunAttrs are the attributes a Run frame has that a frame of hand-written pgx has not.
var benchRunAttrs = []attribute.KeyValue{PropagationKey.String("required"), AttemptKey.Int(1)}

// benchFrameSpan makes a frame's span and metrics as phase_span.go does, with extra
// attributes at its end.
func benchFrameSpan(ctx context.Context, tr trace.Tracer, m *metrics.Metrics, extra []attribute.KeyValue) {
	id := outcome.NewOperationID()
	start := time.Now()
	sctx, span := tr.Start(ctx, DefaultSpanName, framespan.FrameStartOptions...)
	rec := span.IsRecording()
	if rec {
		span.AddEvent(framespan.PhaseEvents[outcome.PhaseActive])
		benchSinkCtx = trace.ContextWithSpan(ctx, span)
		span.AddEvent(framespan.PhaseEvents[outcome.PhaseCommitting])
		span.AddEvent(framespan.PhaseEvents[outcome.PhaseCommitted])
	}
	now := time.Now()
	mctx := context.Background()
	if span.SpanContext().IsSampled() {
		mctx = sctx
	}
	o := outcome.OutcomeCommitted
	m.Duration.Record(mctx, now.Sub(start).Seconds(), m.RecordOpts[0][o]...)
	m.Commit.Record(mctx, now.Sub(start).Seconds(), m.RecordOpts[0][o]...)
	if !rec {
		span.End()
		return
	}
	span.SetStatus(codes.Ok, "")
	buf := framespan.FrameAttrs.Get().(*[]attribute.KeyValue)
	attrs := append((*buf)[:0], schema.DBSystemPostgreSQL, schema.DBNamespaceKey.String("bench"), schema.ServerAddressKey.String("127.0.0.1"),
		schema.ServerPortKey.Int(5432), OperationIDKey.String(id.String()), FrameDepthKey.Int(0),
		OutcomeKey.String(o.String()), PhaseKey.String(outcome.PhaseCommitted.String()))
	framespan.SetFrameAttrs(span, buf, append(attrs, extra...))
	span.End()
}

// benchImplicitFrame makes a committed implicit frame on its statement's span as
// phase_span.go and metrics.go do, the statement's span as otelpgx does.
func benchImplicitFrame(ctx context.Context, tr trace.Tracer, m *metrics.Metrics) {
	id := outcome.NewOperationID()
	start := time.Now()
	sctx, span := tr.Start(ctx, "UPDATE", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(benchStatementAttrs...))
	rec := span.IsRecording()
	if rec {
		span.SetAttributes(benchSummary...)
	}
	now := time.Now()
	mctx := context.Background()
	if span.SpanContext().IsSampled() {
		mctx = sctx
	}
	o := outcome.OutcomeCommitted
	m.Duration.Record(mctx, now.Sub(start).Seconds(), m.RecordOpts[1][o]...)
	if rec {
		span.SetStatus(codes.Ok, "")
		buf := framespan.FrameAttrs.Get().(*[]attribute.KeyValue)
		attrs := append((*buf)[:0], OutcomeKey.String(o.String()), ImplicitKey.Bool(true), OperationIDKey.String(id.String()))
		framespan.SetFrameAttrs(span, buf, attrs)
		span.SetAttributes(benchRowsAffected)
	}
	span.End()
}

// benchStatementAttrs are the attributes otelpgx v0.13 starts a statement span with over
// fakePG, in its order (TestBenchFloorModel checks them): its own db.system.name, the
// connection's five (db.system.name again among them: the SDK keeps both until it
// deduplicates at export), the query text and the operation name.
var benchStatementAttrs = []attribute.KeyValue{
	schema.DBSystemPostgreSQL,
	schema.DBSystemPostgreSQL, attribute.String("server.address", "127.0.0.1"), attribute.Int("server.port", 5432),
	attribute.String("user.name", "bench"), attribute.String("db.namespace", "bench"),
	attribute.String("db.query.text", "update t set v = v + 1 where id = $1"), attribute.String("db.operation.name", "UPDATE"),
}

// benchSummary is a statement's db.query.summary as the Tracer's sanitizer caches it.
var benchSummary = []attribute.KeyValue{schema.DBQuerySummaryKey.String("update t")}

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
func benchBareSpan(ctx context.Context, tr trace.Tracer, _ *metrics.Metrics) {
	_, span := tr.Start(ctx, DefaultSpanName, framespan.FrameStartOptions...)
	span.End()
}

// TestBenchFloorModel checks BenchmarkHookFloor's model of a statement span against the
// real thing: over fakePG, the statement span otelpgx makes under the Tracer gets the SDK
// calls that benchStatementSpan makes, with the same start attributes in the same order
// (db.system.name twice: otelpgx's own tracer attribute and the connection's), and ends
// the same (benchSpanShape).
func TestBenchFloorModel(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := &callLogProvider{tp: sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))}
	// The model is of a statement inside a transaction: this one, sent alone, is no
	// implicit transaction's frame (whose span the statement's is).
	conn, _, _ := fakeTraced(t, WithTracerProvider(tp), WithImplicitFilter(func(context.Context, string) bool { return false }))
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

// TestBenchFloorImplicit checks implicit_frame's model against a real committed
// implicit transaction: over fakePG, the statement span of an autocommit write under the
// Tracer's defaults, the frame's span, gets the SDK calls that benchImplicitFrame makes,
// and ends the same.
func TestBenchFloorImplicit(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := &callLogProvider{tp: sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))}
	conn, _, _ := fakeTraced(t, WithTracerProvider(tp))
	const sql = "update t set v = v + 1 where id = $1"
	if _, err := conn.Exec(context.Background(), sql, 1); err != nil { // prepared once, untraced, as in the benchmarks
		t.Fatal(err)
	}
	ctx, req := tp.tp.Tracer("request").Start(context.Background(), "request")
	if _, err := conn.Exec(ctx, sql, 1); err != nil {
		t.Fatal(err)
	}
	benchImplicitFrame(ctx, tp.Tracer("model"), metrics.New(sdkmetric.NewMeterProvider(), nil))
	req.End()
	spans := exp.GetSpans()
	if len(spans) != 3 || len(tp.logs) != 2 {
		t.Fatalf("%d spans, %d call logs: want the statement's, the model's and the request's", len(spans), len(tp.logs))
	}
	if v, ok := attr(spans[0], OutcomeKey); !ok || v.AsString() != "committed" {
		t.Fatalf("the statement's span is no committed frame: %v", spans[0].Attributes)
	}
	if real, model := *tp.logs[0], *tp.logs[1]; !slices.Equal(real, model) {
		t.Errorf("the model calls\n\t%v\nbut the implicit frame calls\n\t%v", model, real)
	}
	if real, model := benchSpanShape(spans[0]), benchSpanShape(spans[1]); real != model {
		t.Errorf("the model ends as\n\t%s\nbut the implicit frame ends as\n\t%s", model, real)
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
	run.policy.CommitReference = false
	for _, f := range []*benchFake{plain, run} {
		if err := f.tx(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	m := metrics.New(sdkmetric.NewMeterProvider(), nil)
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
