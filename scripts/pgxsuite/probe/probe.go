// Package probe is what the pgxsuite harness builds into the test binaries of its copy
// of pgx: a TestMain that installs otelpgxtx the way the run's mode says, watches the frame
// spans and the OpenTelemetry error handler while pgx's own tests run, and writes what it
// saw to a file for the harness to judge.
//
// It is not part of the instrumentation API; it lives in this module so that it is built,
// vetted and tested with the library, against the real pgx.
package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx"
)

// The modes of a run: pgx alone, otelpgxtx installed where pgx parses each configuration,
// otelpgxtx installed when each connection is made, over whatever tracer the test set,
// and installed where pgx parses with commit references on: the xid read
// (WithCommitReference) or the commit marker (WithCommitMarker, MarkerTable).
const (
	Baseline   = "baseline"
	Parse      = "parse"
	Connect    = "connect"
	References = "references"
	Marker     = "marker"
)

// MarkerTable is the commit-marker table of the Marker mode; the harness creates it in
// the template database.
var MarkerTable = pgx.Identifier{"public", "otelpgxtx_marker"}

// Modes are the modes in the order the harness runs them.
var Modes = []string{Baseline, Parse, Connect, References, Marker}

// The environment variables through which the harness tells a test binary its mode and
// where to write its report.
const (
	ModeEnv   = "OTELPGXTX_PGXSUITE_MODE"
	ReportEnv = "OTELPGXTX_PGXSUITE_REPORT"
)

// Hooks set the hook variables that the harness adds to its copy of pgx: this module is
// built against the real pgx, which has none, so the copy's TestMain hands in setters.
type Hooks struct {
	// ParseConn sets the function pgx.ParseConfig calls with each configuration it returns.
	ParseConn func(func(*pgx.ConnConfig))
	// ParsePool sets the function pgxpool.ParseConfig calls with each configuration it returns.
	ParsePool func(func(*pgxpool.Config))
	// Connect sets the function pgx calls with the configuration of each connection it
	// makes, before it makes it; the configuration is that connection's own copy.
	Connect func(func(*pgx.ConnConfig))
	// Connected sets the function pgx calls with each connection it has made.
	Connected func(func(*pgx.Conn))
}

// Main is the TestMain of each package of the copy: it runs the tests in the mode of
// ModeEnv and writes the Report to the file named by ReportEnv.
func Main(m *testing.M, h Hooks) {
	mode, path := os.Getenv(ModeEnv), os.Getenv(ReportEnv)
	if path == "" {
		fmt.Fprintf(os.Stderr, "probe: %s is not set; this test binary is run by otelpgxtx's scripts/pgxsuite\n", ReportEnv)
		os.Exit(2)
	}
	p, err := New(mode)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	p.Install(h)
	code := m.Run()
	rep := p.Finish(context.Background())
	if err := rep.Write(path); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// Report is what a test binary saw, for the harness to judge (see its judge.go).
type Report struct {
	Mode string `json:"mode"`
	// FramesStarted and FramesEnded count the frame spans.
	FramesStarted int `json:"frames_started"`
	FramesEnded   int `json:"frames_ended"`
	// WithReference counts the ended frame spans with a tx.reconciliation.ref (the
	// references and marker modes take them).
	WithReference int `json:"with_reference"`
	// NoOutcome are frame spans that ended without tx.outcome.
	NoOutcome []Frame `json:"no_outcome,omitempty"`
	// Unended are frame spans still open once every connection pgx made had closed.
	Unended []Frame `json:"unended,omitempty"`
	// EndedByProbe counts the frames that ended when the probe closed the connections the
	// tests left open; those are no failure.
	EndedByProbe int `json:"ended_by_probe"`
	// Connections counts the connections pgx made; Instrumented those whose tracer was
	// otelpgxtx's (in the parse mode, a test that sets its own tracer after pgx parsed the
	// configuration replaces it); LeftOpen those the tests left open (the probe closed
	// them); Busy those it could not close: a query was still running on them, or they
	// belong to a testing/synctest bubble, whose channels no code outside it may touch.
	Connections  int `json:"connections"`
	Instrumented int `json:"instrumented"`
	LeftOpen     int `json:"left_open"`
	Busy         int `json:"busy"`
	// HandlerErrors are the calls of the OpenTelemetry error handler.
	HandlerErrors []Call `json:"handler_errors,omitempty"`
	// InstrumentErrors are the errors InstrumentPool and InstrumentConnConfig returned.
	InstrumentErrors []Call `json:"instrument_errors,omitempty"`
	// MetricsError is the error of collecting the metrics at the end, if any.
	MetricsError string `json:"metrics_error,omitempty"`
}

// Frame describes one frame span: the test it started in (the Test function on the
// stack that began it, "" when none was) and its attributes.
type Frame struct {
	Test       string            `json:"test"`
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Call is one error, with the test it happened in ("" when no Test function was on the stack).
type Call struct {
	Test  string `json:"test"`
	Error string `json:"error"`
}

// Write writes r as JSON to path.
func (r *Report) Write(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadReport reads the report a test binary wrote to path.
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("probe: report %s: %w", path, err)
	}
	return &r, nil
}

// Probe watches one test binary. Its span processor sees every span of the tracer
// provider it installs; it keeps the open frame spans only.
type Probe struct {
	mode   string
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
	reader *sdkmetric.ManualReader

	mu    sync.Mutex
	open  map[trace.SpanID]Frame
	rep   Report
	conns []tracked
}

// New returns a probe for mode, with its own tracer and meter providers.
func New(mode string) (*Probe, error) {
	switch mode {
	case Baseline, Parse, Connect, References, Marker:
	default:
		return nil, fmt.Errorf("probe: %s=%q: want one of %s", ModeEnv, mode, strings.Join(Modes, ", "))
	}
	p := &Probe{mode: mode, open: map[trace.SpanID]Frame{}, reader: sdkmetric.NewManualReader()}
	p.rep.Mode = mode
	p.tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(p))
	p.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.reader))
	return p, nil
}

// TracerProvider is the provider the probe watches; Install makes it the global one.
func (p *Probe) TracerProvider() trace.TracerProvider { return p.tp }

// Install makes the probe's providers and error handler the global ones (otelpgxtx uses
// the globals unless told otherwise, as an application's setup would leave it) and sets
// the copy's hooks for the mode. In the baseline it sets nothing: pgx runs as it is.
func (p *Probe) Install(h Hooks) {
	if p.mode == Baseline {
		return
	}
	otel.SetTracerProvider(p.tp)
	otel.SetMeterProvider(p.mp)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(p.handle))
	switch p.mode {
	case Parse, References, Marker:
		var opts []otelpgxtx.Option
		switch p.mode {
		case References:
			opts = append(opts, otelpgxtx.WithCommitReference())
		case Marker:
			opts = append(opts, otelpgxtx.WithCommitMarker(MarkerTable))
		}
		h.ParseConn(func(cfg *pgx.ConnConfig) {
			_, err := otelpgxtx.InstrumentConnConfig(cfg, opts...)
			p.instrumented(err)
		})
		h.ParsePool(func(cfg *pgxpool.Config) {
			_, err := otelpgxtx.InstrumentPool(cfg, opts...)
			p.instrumented(err)
		})
	case Connect:
		h.Connect(func(cfg *pgx.ConnConfig) {
			// A configuration copied from an instrumented connection (conn.Config()) is
			// instrumented already; connecting with it is what an application would do.
			if _, ok := cfg.Tracer.(*otelpgxtx.Tracer); !ok {
				_, err := otelpgxtx.InstrumentConnConfig(cfg)
				p.instrumented(err)
			}
		})
	}
	h.Connected(p.track)
}

// tracked is a connection pgx made, kept so that Finish can tell the frames of closed
// connections from those of connections the tests left open.
type tracked struct {
	pc *pgconn.PgConn
	// bubbled is whether it was made inside a testing/synctest bubble, whose fake clock
	// starts at midnight UTC 2000-01-01 (the only sign of a bubble a function can read).
	bubbled bool
}

// track keeps a connection pgx made.
func (p *Probe) track(c *pgx.Conn) {
	t := tracked{pc: c.PgConn(), bubbled: time.Now().Before(bubbleEpoch)}
	_, instrumented := c.Config().Tracer.(*otelpgxtx.Tracer)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = append(p.conns, t)
	if instrumented {
		p.rep.Instrumented++
	}
}

// bubbleEpoch is a time no synctest bubble's clock reaches in a test and every real clock
// has passed.
var bubbleEpoch = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)

func (p *Probe) instrumented(err error) {
	if err == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rep.InstrumentErrors = append(p.rep.InstrumentErrors, Call{Test: callerTest(3), Error: err.Error()})
}

func (p *Probe) handle(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rep.HandlerErrors = append(p.rep.HandlerErrors, Call{Test: callerTest(3), Error: err.Error()})
}

// isFrame reports whether s is an otelpgxtx frame span (the default name: the probe sets
// no WithSpanName).
func isFrame(s sdktrace.ReadOnlySpan) bool {
	return s.InstrumentationScope().Name == otelpgxtx.ScopeName && s.Name() == otelpgxtx.DefaultSpanName
}

// OnStart records a frame span as open, with the test that began it.
func (p *Probe) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	if !isFrame(s) {
		return
	}
	f := Frame{Test: callerTest(2)}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rep.FramesStarted++
	p.open[s.SpanContext().SpanID()] = f
}

// OnEnd records a frame span as ended and checks that it says its outcome.
func (p *Probe) OnEnd(s sdktrace.ReadOnlySpan) {
	if !isFrame(s) {
		return
	}
	id := s.SpanContext().SpanID()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rep.FramesEnded++
	f := p.open[id]
	delete(p.open, id)
	for _, kv := range s.Attributes() {
		if kv.Key == otelpgxtx.ReconciliationRefKey {
			p.rep.WithReference++
		}
	}
	for _, kv := range s.Attributes() {
		if kv.Key == otelpgxtx.OutcomeKey && kv.Value.AsString() != "" {
			return
		}
	}
	f.Attributes = attributes(s)
	p.rep.NoOutcome = append(p.rep.NoOutcome, f)
}

// Shutdown is part of sdktrace.SpanProcessor; the probe holds nothing to release.
func (p *Probe) Shutdown(context.Context) error { return nil }

// ForceFlush is part of sdktrace.SpanProcessor; the probe exports nothing.
func (p *Probe) ForceFlush(context.Context) error { return nil }

// closeWait bounds how long Finish waits for a connection's close to complete: pgconn's
// asynchronous close may wait up to 15 s for its cancel request.
const closeWait = 30 * time.Second

// Finish closes the connections the tests left open (their frames end then, and are
// counted apart), waits until every connection's close has completed, collects the
// metrics once, and returns the report. The frames still open after that belong to
// connections that closed without ending them.
func (p *Probe) Finish(ctx context.Context) *Report {
	p.mu.Lock()
	conns := p.conns
	p.rep.Connections = len(conns)
	openBefore := len(p.open)
	p.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, closeWait)
	defer cancel()
	busy := 0
	var waiting []*pgconn.PgConn
	for _, t := range conns {
		pc := t.pc
		switch {
		case t.bubbled:
			// Its close, if the test closed it, ran in the bubble: nothing to wait for.
			if !pc.IsClosed() {
				busy++
			}
			continue
		case !pc.IsClosed() && pc.IsBusy():
			busy++
			continue
		case !pc.IsClosed():
			p.mu.Lock()
			p.rep.LeftOpen++
			p.mu.Unlock()
			_ = pc.Close(ctx)
		}
		waiting = append(waiting, pc)
	}
	for _, pc := range waiting {
		select {
		case <-pc.CleanupDone():
		case <-ctx.Done():
		}
	}
	var rm metricdata.ResourceMetrics
	merr := p.reader.Collect(ctx, &rm)

	p.mu.Lock()
	defer p.mu.Unlock()
	p.rep.Busy = busy
	p.rep.EndedByProbe = openBefore - len(p.open)
	if merr != nil {
		p.rep.MetricsError = merr.Error()
	}
	for _, f := range p.open {
		p.rep.Unended = append(p.rep.Unended, f)
	}
	rep := p.rep
	return &rep
}

// attributes renders a span's attributes for a report.
func attributes(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

// callerTest returns the name of the Test function on the calling goroutine's stack, ""
// when there is none (a goroutine a test started, a pool's background work), skipping
// skip frames.
func callerTest(skip int) string {
	pcs := make([]uintptr, 256)
	n := runtime.Callers(skip, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	for {
		fr, more := frames.Next()
		if name := TestOf(fr.Function); name != "" {
			return name
		}
		if !more {
			return ""
		}
	}
}

// TestOf returns the Test function that fn, a function name as runtime.Frame spells it
// ("github.com/jackc/pgx/v5_test.TestConnect.func1"), is or is inside of; "" if none.
func TestOf(fn string) string {
	if i := strings.LastIndexByte(fn, '/'); i >= 0 {
		fn = fn[i+1:]
	}
	_, name, ok := strings.Cut(fn, ".")
	if !ok {
		return ""
	}
	name, _, _ = strings.Cut(name, ".")
	rest, ok := strings.CutPrefix(name, "Test")
	if !ok || name == "TestMain" {
		return ""
	}
	// go test's own rule: Test followed by nothing or by a character that is not a
	// lower-case letter.
	if rest != "" && rest[0] >= 'a' && rest[0] <= 'z' {
		return ""
	}
	return name
}

var _ sdktrace.SpanProcessor = (*Probe)(nil)
