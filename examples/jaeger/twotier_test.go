package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// The service names of the two-service demo in these tests.
const (
	frontService = "otelpgxtx-front"
	dbService    = "otelpgxtx-orders"
	probeService = "otelpgxtx-probe"
	floodService = "otelpgxtx-flood"
)

// twoTier is the pipeline of "Several collectors: two tiers" in this example's README:
// first-tier collectors (collector-tier1.yaml) that route every span by its trace id to
// one of the samplers (collector-sampler.yaml), which send what they keep to a Jaeger that
// stores it all.
type twoTier struct {
	jaeger   *jaegerProc
	samplers []*collectorProc
	tier1    []*collectorProc
}

// numTraces is the samplers' num_traces in these tests: several times the undecided traces
// a sampler holds at the tests' paced load (loadRate / 2 samplers x 11 s), and small enough
// for flood to push a decided trace out of memory.
const (
	numTraces = 5000
	loadRate  = 300 // requests a second
)

func startTwoTier(t *testing.T, samplers, percent int) *twoTier {
	t.Helper()
	bin := collectorBinary(t)
	p := &twoTier{jaeger: startJaeger(t)}
	var addrs []string
	for i := range samplers {
		s := startCollector(t, bin, fmt.Sprintf("sampler-%d", i+1), "collector-sampler.yaml",
			"BACKEND_OTLP_GRPC="+p.jaeger.otlpGRPC, fmt.Sprintf("TAIL_SAMPLING_COMMITTED_PERCENT=%d", percent),
			fmt.Sprintf("TAIL_SAMPLING_NUM_TRACES=%d", numTraces))
		p.samplers = append(p.samplers, s)
		addrs = append(addrs, s.otlpGRPC)
	}
	for i := range 2 {
		p.tier1 = append(p.tier1, startCollector(t, bin, fmt.Sprintf("tier1-%d", i+1), "collector-tier1.yaml",
			"SAMPLERS=["+strings.Join(addrs, ", ")+"]"))
	}
	return p
}

// drain waits until everything sent to the first tier has been decided and what was kept
// is in Jaeger. Probe traces (status Error, so kept) go to each first-tier collector
// after everything else: the spans of a trace queue behind those sent before them on the
// way to their sampler, and a sampler decides traces in the order they arrived, so once
// Jaeger holds every probe — with enough of them that each sampler gets some from each
// first-tier collector — every trace before them has been decided. Then the samplers'
// export queues must be empty.
func (p *twoTier) drain(t *testing.T, ctx context.Context) {
	t.Helper()
	const perCollector = 32 // a sampler misses all of them with probability 2^-31
	from := time.Now().Add(-time.Minute)
	for _, c := range p.tier1 {
		sendTraces(t, ctx, c, probeService, perCollector, codes.Error)
	}
	waitFor(t, ctx, 2*time.Minute, "every probe trace in Jaeger", func() bool {
		return len(p.jaeger.spansByTrace(t, ctx, probeService, from, 1000)) == perCollector*len(p.tier1)
	})
	waitFor(t, ctx, time.Minute, "the samplers' export queues empty", func() bool {
		for _, s := range p.samplers {
			if s.metric(t, ctx, "otelcol_exporter_queue_size") != 0 {
				return false
			}
		}
		return true
	})
}

// flood waits until no sampler holds an undecided trace, then sends perCollector traces
// of one span each (status Unset: a sampler keeps the configured share) to each
// first-tier collector, and waits until the samplers have them. More than num_traces per
// sampler push every decided trace out of the samplers' memory: only the decision caches
// remember them.
func (p *twoTier) flood(t *testing.T, ctx context.Context, perCollector int) {
	t.Helper()
	sum := func(name string) float64 {
		var v float64
		for _, s := range p.samplers {
			v += s.metric(t, ctx, name)
		}
		return v
	}
	// Every trace a sampler took in has been decided, or dropped undecided.
	waitFor(t, ctx, time.Minute, "every held trace decided", func() bool {
		for _, s := range p.samplers {
			m := s.metrics(t, ctx)
			if m["otelcol_processor_tail_sampling_new_trace_id_received"] != m["otelcol_processor_tail_sampling_global_count_traces_sampled"]+
				m["otelcol_processor_tail_sampling_sampling_trace_dropped_too_early"] {
				return false
			}
		}
		return true
	})
	before := sum("otelcol_processor_tail_sampling_new_trace_id_received")
	for _, c := range p.tier1 {
		sendTraces(t, ctx, c, floodService, perCollector, codes.Unset)
	}
	waitFor(t, ctx, time.Minute, "the samplers receiving the flood", func() bool {
		return sum("otelcol_processor_tail_sampling_new_trace_id_received") >= before+float64(perCollector*len(p.tier1))
	})
}

// sendTraces sends n traces of one span each from service to the collector c.
func sendTraces(t *testing.T, ctx context.Context, c *collectorProc, service string, n int, status codes.Code) {
	t.Helper()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL("http://"+c.otlpHTTP+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBlocking()),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
	for range n {
		_, span := tp.Tracer(service).Start(ctx, service)
		span.SetStatus(status, "")
		span.End()
	}
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// paced makes one wait its turn, so that calls start at most rate a second.
func paced(t *testing.T, one loadFunc, rate int) loadFunc {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	t.Cleanup(tick.Stop)
	return func(ctx context.Context, i int, k loadKind) (trace.TraceID, error) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return trace.TraceID{}, ctx.Err()
		}
		return one(ctx, i, k)
	}
}

// twoServices is the two-service demo: the database service runs in the test process, so
// that the test sees every span its SDK ended and can take its database down; the front
// service is the demo program in a process of its own.
type twoServices struct {
	db       *app
	dbServer *pgtest.Server
	outage   *outageControl
	front    *toolProc
	frontURL string
}

// startServices starts both services, each sending to a first-tier collector of its own.
func startServices(t *testing.T, ctx context.Context, p *twoTier) *twoServices {
	t.Helper()
	// A server of this test's own: it is stopped and started again.
	dbServer, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dbServer.Close() })
	var out, errOut syncBuffer
	a, err := newApp(ctx, config{
		databaseURL:     dbServer.ConnString(),
		otlpEndpoint:    "http://" + p.tier1[1].otlpHTTP,
		otlpProtocol:    protoHTTP,
		otlpWait:        10 * time.Second,
		serviceName:     dbService,
		tree:            treeNever,
		scenarioTimeout: time.Minute,
	}, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.close(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("closing the database service: %v", err)
		}
	})
	s := &twoServices{db: a, dbServer: dbServer, outage: &outageControl{Server: dbServer, down: make(chan struct{})}}
	a.ctl = s.outage
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- serveHTTP(sctx, l, a.ordersHandler()) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("database service: %v", err)
		}
	})
	s.front, s.frontURL = startFront(t, "http://"+l.Addr().String(), "http://"+p.tier1[0].otlpHTTP)
	return s
}

// startFront runs the demo's front service in a process of its own (the test binary as
// the demo program), calling backend and sending its spans to otlp.
func startFront(t *testing.T, backend, otlp string) (*toolProc, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr := freePorts(t, 1)[0]
	cmd := exec.Command(exe, "-front", addr, "-backend", backend,
		"-otlp-endpoint", otlp, "-otlp-wait", "10s", "-service-name", frontService)
	cmd.Env = append(os.Environ(), demoProcessEnv+"=1")
	proc := runTool(t, "front", t.TempDir(), cmd, &http.Client{Timeout: 10 * time.Second}, "http://"+addr+healthPath)
	return proc, "http://" + addr
}

// outageControl is the database service's backend control, with one change: once armed,
// the next Terminate stops the whole server (a crash while COMMIT waits), instead of one
// backend.
type outageControl struct {
	*pgtest.Server
	armed atomic.Bool
	down  chan struct{} // closed once the server is stopped
}

func (c *outageControl) Terminate(ctx context.Context, pid uint32) error {
	if c.armed.CompareAndSwap(true, false) {
		defer close(c.down)
		return c.StopImmediate()
	}
	return c.Server.Terminate(ctx, pid)
}

// flush stops the front service (which exports what it has) and flushes the database
// service's spans, then returns the spans the database service ended and the number of
// spans each first-tier collector accepted.
func (s *twoServices) flush(t *testing.T, ctx context.Context, p *twoTier) ([]sdktrace.ReadOnlySpan, []float64) {
	t.Helper()
	if err := s.front.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("front service: %v", err)
	}
	if err := s.db.flush(ctx); err != nil {
		t.Fatal(err)
	}
	var accepted []float64
	for _, c := range p.tier1 {
		accepted = append(accepted, c.metric(t, ctx, "otelcol_receiver_accepted_spans"))
	}
	return s.db.tel.collector.take(), accepted
}

// tracedRun is one trace the services produced and what Jaeger holds of it.
type tracedRun struct {
	label             string // the load kind, or what else made it
	mustKeep          bool
	wantFront, wantDB int // spans each service ended
	gotFront, gotDB   int // spans of each service in Jaeger
	started           time.Time
	structureProblem  string
}

func (r *tracedRun) complete() bool { return r.gotFront == r.wantFront && r.gotDB == r.wantDB }
func (r *tracedRun) missing() bool  { return r.gotFront == 0 && r.gotDB == 0 }

// extraTrace is a trace made outside the load, and how many spans the front made in it.
type extraTrace struct {
	label      string
	frontSpans int
}

// collate matches what the services produced with what Jaeger holds: the request traces
// of rep (2 front spans each, the database service's from its SDK), and the extra ones.
func collate(t *testing.T, ctx context.Context, p *twoTier, from time.Time, rep *loadReport,
	dbSpans []sdktrace.ReadOnlySpan, extra map[string]extraTrace) (map[string]*tracedRun, *jTrace) {
	t.Helper()
	runs := map[string]*tracedRun{}
	for k := range numLoadKinds {
		for _, id := range rep.traces[k] {
			runs[id.String()] = &tracedRun{label: k.String(), wantFront: 2, started: rep.started[id]}
		}
	}
	for id, x := range extra {
		runs[id] = &tracedRun{label: x.label, wantFront: x.frontSpans}
	}
	for _, s := range dbSpans {
		id := s.SpanContext().TraceID().String()
		r := runs[id]
		if r == nil {
			r = &tracedRun{label: "other"}
			runs[id] = r
		}
		r.wantDB++
		if v, ok := spanAttr(s, otelpgxtx.OutcomeKey); ok && v.AsString() != "committed" || s.Status().Code == codes.Error {
			r.mustKeep = true
		}
	}

	// Every span of the services' traces in Jaeger, once each.
	got := &jTrace{byID: map[string]*jSpan{}}
	for _, service := range []string{frontService, dbService} {
		for _, s := range p.jaeger.findSpans(t, ctx, service, from, 20000).spans {
			if got.byID[s.spanID] == nil {
				got.spans = append(got.spans, s)
				got.byID[s.spanID] = s
			}
		}
	}
	for _, s := range got.spans {
		r := runs[s.traceID]
		if r == nil {
			t.Errorf("Jaeger holds a span of trace %s, which the services never produced: %s (%s)", s.traceID, s.name, s.service)
			continue
		}
		switch s.service {
		case frontService:
			r.gotFront++
		case dbService:
			r.gotDB++
		default:
			t.Errorf("span %s of trace %s from service %q", s.name, s.traceID, s.service)
		}
	}
	// A request's trace is one tree across the two processes: the front's server span is
	// its root, and the database service's server span is a child of the front's client
	// span.
	byTrace := map[string][]*jSpan{}
	for _, s := range got.spans {
		byTrace[s.traceID] = append(byTrace[s.traceID], s)
	}
	for id, spans := range byTrace {
		r := runs[id]
		if r == nil || r.wantFront == 0 || !r.complete() {
			continue
		}
		var roots []string
		for _, s := range spans {
			if got.byID[s.parent] == nil {
				roots = append(roots, s.service+" "+s.name)
			}
			if s.service == dbService && s.kind == 2 && (got.byID[s.parent] == nil || got.byID[s.parent].service != frontService || got.byID[s.parent].kind != 3) {
				r.structureProblem = "the database service's server span is not a child of the front's client span"
			}
		}
		if len(roots) != 1 || roots[0] != frontService+" POST "+ordersPath {
			r.structureProblem = fmt.Sprintf("roots %q, want the front's server span alone", roots)
		}
	}
	return runs, got
}

// tally is the kept/expected table of the closing note: per label, traces and each
// service's spans.
func tally(runs map[string]*tracedRun) string {
	type row struct{ traces, complete, partial, front, wantFront, db, wantDB int }
	rows := map[string]*row{}
	for _, r := range runs {
		w := rows[r.label]
		if w == nil {
			w = &row{}
			rows[r.label] = w
		}
		w.traces++
		switch {
		case r.complete():
			w.complete++
		case !r.missing():
			w.partial++
		}
		w.front += r.gotFront
		w.wantFront += r.wantFront
		w.db += r.gotDB
		w.wantDB += r.wantDB
	}
	labels := make([]string, 0, len(rows))
	for l := range rows {
		labels = append(labels, l)
	}
	slices.Sort(labels)
	var b strings.Builder
	fmt.Fprintf(&b, "%-36s %7s %7s %8s %14s %14s\n", "kind", "traces", "kept", "partial", "front spans", "orders spans")
	for _, l := range labels {
		w := rows[l]
		fmt.Fprintf(&b, "%-36s %7d %7d %8d %14s %14s\n", l, w.traces, w.complete, w.partial,
			fmt.Sprintf("%d/%d", w.front, w.wantFront), fmt.Sprintf("%d/%d", w.db, w.wantDB))
	}
	return b.String()
}

// checkLoad requires every transaction of rep to have ended as built.
func checkLoad(t *testing.T, rep *loadReport, n int) {
	t.Helper()
	for _, err := range rep.errs {
		t.Error(err)
	}
	var want [numLoadKinds]int
	for i := range n {
		want[loadKindOf(i)]++
	}
	for k := range numLoadKinds {
		if rep.count(k) != want[k] || want[k] == 0 {
			t.Errorf("%d transactions built for %s, want %d (> 0)", rep.count(k), k, want[k])
		}
	}
}

// TestTwoTierTailSampling runs the two-tier pipeline as shipped — two first-tier
// collectors (collector-tier1.yaml) routing by trace id to two samplers
// (collector-sampler.yaml), Jaeger behind them — and sends it a few thousand requests of
// every outcome through the two-service demo: the front service, a process of its own,
// sends its spans to one first-tier collector, the database service to the other, so
// every trace reaches its sampler in parts from two collectors. Then:
//
//   - every trace with a frame whose tx.outcome is not committed, or a span with status
//     Error, is in Jaeger complete, with the spans of both services in one tree;
//   - the committed-only ones are kept at the configured rate, within the binomial bound
//     of TestTailSampling;
//   - an indeterminate commit whose database crashed while COMMIT waited is in Jaeger
//     before the database is back, so its trace was decided; the tx.reconcile span of the
//     automatic reconciliation that succeeds once the database is back comes after that
//     decision and is in the kept trace, let through by the samplers' decision cache;
//   - the tx.reconcile span of a frame begun on a context without a span (a background
//     job's) is in the frame's trace.
func TestTwoTierTailSampling(t *testing.T) {
	const (
		n        = 3000
		percent  = 10
		detached = 3
	)
	ctx := pgtest.Context(t, 10*time.Minute)
	p := startTwoTier(t, 2, percent)
	from := time.Now().Add(-time.Minute)
	s := startServices(t, ctx, p)
	a := s.db

	start := time.Now()
	load := httpLoad(s.frontURL, time.Minute)
	rep := runLoadWith(ctx, 0, n, 4, paced(t, load, loadRate))
	checkLoad(t, rep, n)
	t.Logf("%d requests through the front service in %v", n, time.Since(start).Round(time.Millisecond))

	// Frames begun on a context without a span, as a background job's would be.
	extra := map[string]extraTrace{}
	frames := map[string]string{} // trace id -> frame span id
	for i := range detached {
		id := loadRowID(n + 100 + i)
		res, _, werr := a.commitIndeterminately(ctx, a.insert(id, id, "background job"))
		ind, ok := res.(outcome.Indeterminate[int])
		if !ok {
			t.Fatalf("a background job's commit: %v, want indeterminate (%v)", res, werr)
		}
		rec, err := a.reconciled.wait(ctx, ind.OperationID())
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.Split(rec.TraceParent, "-")
		if len(parts) != 4 {
			t.Fatalf("the reconciliation names no frame: traceparent %q", rec.TraceParent)
		}
		extra[parts[1]] = extraTrace{label: "indeterminate, no span"}
		frames[parts[1]] = parts[2]
	}

	// The database crashes while an indeterminate commit's COMMIT waits: its automatic
	// reconciliation cannot ask until the database is back. The samplers decide its trace
	// meanwhile (Jaeger holds it only after a decision); the database comes back only then.
	s.outage.armed.Store(true)
	outageID, err := load(ctx, n+200, loadIndeterminate)
	if err != nil {
		t.Fatalf("the commit the outage cut: %v", err)
	}
	<-s.outage.down
	extra[outageID.String()] = extraTrace{label: "indeterminate, outage", frontSpans: 2}
	waitFor(t, ctx, time.Minute, "the outage's trace in Jaeger", func() bool {
		code, _, err := p.jaeger.get(ctx, "/api/v3/traces/"+outageID.String(), nil)
		return err == nil && code == http.StatusOK
	})
	decided := time.Now()
	// A failed attempt after the decision, sent on: the next attempt comes a whole
	// backoff later (it doubles), time for other traffic — more traces than a sampler
	// holds, so that the decision is no longer in its memory, only in its decision cache
	// — and for the database to come back.
	waitFor(t, ctx, time.Minute, "a failed reconciliation attempt after the decision", func() bool {
		a.tel.collector.mu.Lock()
		defer a.tel.collector.mu.Unlock()
		for _, sp := range a.tel.collector.spans {
			if sp.SpanContext().TraceID() == outageID && sp.Name() == otelpgxtx.SpanNameReconcile &&
				sp.Status().Code == codes.Error && sp.EndTime().After(decided) {
				return true
			}
		}
		return false
	})
	if err := a.flush(ctx); err != nil {
		t.Fatal(err)
	}
	const flood = 3 * numTraces // per first-tier collector
	p.flood(t, ctx, flood)
	if err := s.dbServer.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	indeterminate := rep.count(loadIndeterminate) + detached + 1
	waitFor(t, ctx, 3*time.Minute, "every indeterminate commit reconciled", func() bool {
		return a.reconciled.count() == indeterminate
	})

	dbSpans, accepted := s.flush(t, ctx, p)
	var frontSpans, late int
	for _, sp := range dbSpans {
		if sp.SpanContext().TraceID() == outageID && sp.Name() == otelpgxtx.SpanNameReconcile && sp.Status().Code != codes.Error {
			if !sp.EndTime().After(decided) {
				t.Errorf("the outage's successful reconciliation ended at %v, before its trace was decided (%v)", sp.EndTime(), decided)
			}
			late++
		}
	}
	if late != 1 {
		t.Errorf("%d successful tx.reconcile spans in the outage's trace, want 1", late)
	}
	for k := range numLoadKinds {
		frontSpans += 2 * rep.count(k)
	}
	frontSpans += 2 // the outage's request
	// Each service's spans went through its own first-tier collector (and a share of the
	// flood through each).
	if accepted[0] != float64(frontSpans+flood) || accepted[1] != float64(len(dbSpans)+flood) {
		t.Errorf("first-tier collectors accepted %v spans, want %d (front) and %d (orders), each with %d of the flood",
			accepted, frontSpans, len(dbSpans), flood)
	}
	p.drain(t, ctx)

	runs, got := collate(t, ctx, p, from, rep, dbSpans, extra)
	t.Logf("kept per kind and service:\n%s", tally(runs))
	var committedOnly, kept, mustKeep int
	for id, r := range runs {
		switch {
		case r.mustKeep:
			mustKeep++
			if !r.complete() {
				t.Errorf("%s trace %s: front %d of %d spans, orders %d of %d in Jaeger", r.label, id, r.gotFront, r.wantFront, r.gotDB, r.wantDB)
			}
			if r.structureProblem != "" {
				t.Errorf("%s trace %s: %s", r.label, id, r.structureProblem)
			}
		case r.label == loadCommitted.String() || r.label == loadParticipating.String():
			committedOnly++
			if r.complete() {
				kept++
			} else if !r.missing() {
				t.Errorf("committed trace %s is in Jaeger in part: front %d of %d, orders %d of %d", id, r.gotFront, r.wantFront, r.gotDB, r.wantDB)
			}
		default:
			t.Errorf("%s trace %s (%d spans) is neither one to keep nor a committed request's", r.label, id, r.wantDB)
		}
		if k := r.label; (k == loadCommitted.String() || k == loadParticipating.String()) == r.mustKeep {
			t.Errorf("a %s trace %s: must-keep %v", k, id, r.mustKeep)
		}
	}
	// The frames begun without a span: their tx.reconcile spans are in their traces.
	for id, frame := range frames {
		found := false
		for _, sp := range got.spans {
			if sp.traceID == id && sp.name == otelpgxtx.SpanNameReconcile && slices.Contains(sp.links, frame) {
				found = true
			}
		}
		if !found {
			t.Errorf("frame %s (trace %s) was begun without a span: Jaeger holds no tx.reconcile span linked to it in its trace", frame, id)
		}
	}
	// The late span was let through by a sampler's cached decision.
	var cacheHits float64
	for _, sp := range p.samplers {
		cacheHits += sp.metric(t, ctx, "otelcol_processor_tail_sampling_early_releases_from_cache_decision", "sampled=true")
		if sp.metric(t, ctx, "otelcol_receiver_accepted_spans") == 0 {
			t.Errorf("%s received no span: the first tier does not spread traces", sp.name)
		}
	}
	if cacheHits == 0 {
		t.Error("no span was released by a sampler's decision cache, yet the outage's reconciliation came after its trace's decision")
	}

	// Searched by tag as an operator would: exactly the traces of each outcome.
	for _, k := range []loadKind{loadIndeterminate, loadRolledBack, loadPostCommitFailure} {
		want := rep.count(k)
		if k == loadIndeterminate {
			want = indeterminate
		}
		traces, _ := p.jaeger.searchByTag(t, ctx, dbService, string(otelpgxtx.OutcomeKey), k.String(), from)
		if len(traces) != want {
			t.Errorf("Jaeger finds %d traces with tx.outcome=%s, the services produced %d", len(traces), k, want)
		}
	}
	nc := float64(committedOnly)
	pr := percent / 100.0
	mean, bound := nc*pr, 5*math.Sqrt(nc*pr*(1-pr))
	t.Logf("kept: all %d traces with a non-committed frame or an error; %d of %d committed-only traces (%.2f%%; expected %.0f ± %.0f at %d%%); "+
		"%.0f spans released by decision caches", mustKeep, kept, committedOnly, 100*float64(kept)/nc, mean, bound, percent, cacheHits)
	if math.Abs(float64(kept)-mean) > bound {
		t.Errorf("Jaeger kept %d of %d committed-only traces; at %d%% want %.0f ± %.0f", kept, committedOnly, percent, mean, bound)
	}
}

func splitHostPort(t *testing.T, addr string) (string, string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}

// TestTwoTierSamplerRestart runs TestTwoTierTailSampling's load and stops one of the two
// samplers a quarter of the way through (SIGTERM, as a rolling restart does;
// OTELPGXTX_SAMPLER_STOP=kill for SIGKILL) and starts it again at three quarters (5 s
// later at the paced rate), on the same address. It measures what that costs — the undecided traces the sampler held when it
// stopped, and which traces that must be kept are missing or incomplete in Jaeger, by
// when their request began — and requires every one begun after the restart to be
// there, complete, within a minute of drain (the first tier's retries can deliver some
// after drain's probes).
func TestTwoTierSamplerRestart(t *testing.T) {
	const n = 3000
	sig, sigName := os.Signal(syscall.SIGTERM), "SIGTERM"
	if os.Getenv("OTELPGXTX_SAMPLER_STOP") == "kill" {
		sig, sigName = syscall.SIGKILL, "SIGKILL"
	}
	ctx := pgtest.Context(t, 10*time.Minute)
	p := startTwoTier(t, 2, 10)
	from := time.Now().Add(-time.Minute)
	s := startServices(t, ctx, p)

	load := paced(t, httpLoad(s.frontURL, time.Minute), loadRate)
	var done atomic.Int64
	lctx, cancel := context.WithCancel(ctx)
	var rep *loadReport
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		rep = runLoadWith(lctx, 0, n, 4, func(ctx context.Context, i int, k loadKind) (trace.TraceID, error) {
			defer done.Add(1)
			return load(ctx, i, k)
		})
	}()
	t.Cleanup(func() { cancel(); <-loaded })

	victim := p.samplers[1]
	waitFor(t, ctx, 5*time.Minute, "a quarter of the load", func() bool { return done.Load() >= n/4 })
	held := victim.metric(t, ctx, "otelcol_processor_tail_sampling_sampling_traces_on_memory")
	stopAt := time.Now()
	stopErr := victim.proc.stop(sig, 30*time.Second)
	stopped := time.Since(stopAt)
	waitFor(t, ctx, 5*time.Minute, "three quarters of the load", func() bool { return done.Load() >= 3*n/4 })
	victim.start(t)
	restartedAt := time.Now()
	<-loaded
	checkLoad(t, rep, n)
	t.Logf("%s stopped %v into the load with %s (exit: %v, after %v), holding %.0f undecided traces; started again %v later",
		victim.name, stopAt.Sub(rep.first()).Round(time.Millisecond), sigName, stopErr, stopped.Round(time.Millisecond), held,
		restartedAt.Sub(stopAt).Round(time.Millisecond))

	dbSpans, _ := s.flush(t, ctx, p)
	p.drain(t, ctx)
	// drain's probes say that everything sent before them has been decided only while
	// spans reach a sampler in the order they were sent. A batch that failed to reach the
	// restarted sampler (refused while it was down, or while the first tier's connection
	// to it was still backing off) is sent again from the first tier's retry loop, up to
	// 5 s later, and can arrive after the probes. So the traces begun after the restart
	// are waited for until each is complete in Jaeger; the deadline is the failure.
	afterRestart := func(runs map[string]*tracedRun) (incomplete int) {
		for _, r := range runs {
			if r.mustKeep && !r.started.Before(restartedAt) && !r.complete() {
				incomplete++
			}
		}
		return incomplete
	}
	runs, _ := collate(t, ctx, p, from, rep, dbSpans, nil)
	waited, late := time.Now(), afterRestart(runs)
	for n := afterRestart(runs); n > 0 && time.Since(waited) < time.Minute; n = afterRestart(runs) {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(time.Second):
		}
		runs, _ = collate(t, ctx, p, from, rep, dbSpans, nil)
	}
	t.Logf("%d traces to keep begun after the restart were incomplete in Jaeger after drain; waited %v for them",
		late, time.Since(waited).Round(time.Millisecond))

	type count struct{ mustKeep, complete, partial, missing, committed, kept, keptPartial int }
	var when [3]count
	names := [3]string{"begun before the stop", "begun while it was down", "begun after the restart"}
	for id, r := range runs {
		w := &when[0]
		switch {
		case !r.started.Before(restartedAt):
			w = &when[2]
		case !r.started.Before(stopAt):
			w = &when[1]
		}
		switch {
		case r.mustKeep:
			w.mustKeep++
			switch {
			case r.complete():
				w.complete++
			case r.missing():
				w.missing++
			default:
				w.partial++
			}
			if w == &when[2] && !r.complete() {
				t.Errorf("%s trace %s, begun after the restart: front %d of %d spans, orders %d of %d in Jaeger",
					r.label, id, r.gotFront, r.wantFront, r.gotDB, r.wantDB)
			}
		default:
			w.committed++
			switch {
			case r.complete():
				w.kept++
			case !r.missing():
				w.keptPartial++
			}
		}
	}
	if when[2].mustKeep == 0 {
		// Else the requirement above held of nothing: the load ended before the restart.
		t.Errorf("no trace to keep began after %s restarted: the run says nothing of what it keeps", victim.name)
	}
	var b strings.Builder
	for i, w := range when {
		fmt.Fprintf(&b, "  %-24s must keep %4d: complete %4d, partial %3d, missing %3d; committed-only %4d: kept %3d, in part %d\n",
			names[i], w.mustKeep, w.complete, w.partial, w.missing, w.committed, w.kept, w.keptPartial)
	}
	t.Logf("what Jaeger holds, by when the request began:\n%s", b.String())
}
