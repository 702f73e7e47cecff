package main

import (
	"math"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// TestTailSampling runs the shipped tail-sampling.yaml in the real Jaeger v2 and sends
// it a few thousand transactions of every outcome, all sampled by the application. Jaeger
// must then hold every trace that has a frame whose tx.outcome is not committed or a span
// with status Error, complete, and about the configured share of the committed-only ones.
//
// The bound on that share: the probabilistic policy keeps a trace when a hash of its
// trace id falls below the configured rate, and the SDK's trace ids are random, so each
// of the N committed-only traces is kept independently with probability p and the kept
// count is Binomial(N, p). The test accepts N·p ± 5·sqrt(N·p·(1−p)): a correct pipeline
// fails it with probability below 1e-6 (N·p is about 250, where the normal approximation
// holds), while keeping 5% or 15% instead of 10% fails it.
func TestTailSampling(t *testing.T) {
	const (
		n       = 3000
		percent = 10
		service = "otelpgxtx-tail-sampling"
	)
	bin := jaegerBinary(t)
	conf, err := filepath.Abs("tail-sampling.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, health, queryGRPC := newJaegerProc(t)
	j.start(t, bin, t.TempDir(), health, "file:"+conf,
		"OTLP_GRPC_ENDPOINT="+j.otlpGRPC, "OTLP_HTTP_ENDPOINT="+j.otlpHTTP,
		"QUERY_HTTP_ENDPOINT="+j.query, "QUERY_GRPC_ENDPOINT="+queryGRPC, "HEALTH_ENDPOINT="+health,
		// decision_wait stays at the file's 10 s: the SDK exports every second
		// (telemetry.go) and the transactions are short, so a trace is whole long before.
		"TAIL_SAMPLING_COMMITTED_PERCENT=10")

	ctx := pgtest.Context(t, 8*time.Minute)
	var out, errOut syncBuffer
	cfg := config{
		databaseURL:     srv.ConnString(),
		otlpEndpoint:    "http://" + j.otlpHTTP,
		otlpProtocol:    protoHTTP,
		otlpWait:        10 * time.Second,
		serviceName:     service,
		tree:            treeNever,
		scenarioTimeout: time.Minute,
	}
	from := time.Now().Add(-time.Minute)
	a, err := newApp(ctx, cfg, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep := a.runLoad(ctx, n, 4)
	checkLoad(t, rep, n)
	if err := a.flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The sentinel, sent after every other span was exported, is kept (status Error)
	// and decided last: once it is in Jaeger, every trace before it has been decided.
	_, sentinel := a.tracer.Start(ctx, "load.sentinel")
	sentinel.SetStatus(codes.Error, "sentinel")
	sentinel.End()
	if err := a.close(ctx); err != nil { // flushes
		t.Fatal(err)
	}
	t.Logf("%d transactions in %v", n, time.Since(start).Round(time.Millisecond))

	// What the application produced, from the spans its SDK ended.
	produced := map[string]int{} // spans per trace
	mustKeep := map[string]bool{}
	for _, s := range a.tel.collector.take() {
		id := s.SpanContext().TraceID().String()
		produced[id]++
		if v, ok := spanAttr(s, otelpgxtx.OutcomeKey); ok && v.AsString() != "committed" || s.Status().Code == codes.Error {
			mustKeep[id] = true
		}
	}
	sentinelID := sentinel.SpanContext().TraceID().String()
	var committedOnly []string
	for k := range numLoadKinds {
		keep := k != loadCommitted && k != loadParticipating
		for _, id := range rep.traces[k] {
			if mustKeep[id.String()] != keep {
				t.Errorf("a %s trace %s: must-keep %v, want %v", k, id, mustKeep[id.String()], keep)
			}
			if !keep {
				committedOnly = append(committedOnly, id.String())
			}
		}
	}
	if len(produced) != n+1 {
		t.Fatalf("the SDK ended spans of %d traces, want %d", len(produced), n+1)
	}

	// Wait until the sentinel and every must-keep trace are in, complete.
	var got map[string]int
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got = j.spansByTrace(t, ctx, service, from, 10*n)
		missing := 0
		for id := range mustKeep {
			if got[id] != produced[id] {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes, %d of the %d traces that must be kept are missing or incomplete in Jaeger", missing, len(mustKeep))
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	if !mustKeep[sentinelID] {
		t.Fatal("the sentinel trace is not one to keep")
	}

	// Searched by tag as an operator would: exactly the application's count of each.
	for _, k := range []loadKind{loadIndeterminate, loadRolledBack, loadPostCommitFailure} {
		traces, _ := j.searchByTag(t, ctx, service, string(otelpgxtx.OutcomeKey), k.String(), from)
		if len(traces) != rep.count(k) {
			t.Errorf("Jaeger finds %d traces with tx.outcome=%s, the application produced %d", len(traces), k, rep.count(k))
		}
	}

	kept := 0
	for _, id := range committedOnly {
		switch got[id] {
		case 0:
		case produced[id]:
			kept++
		default:
			t.Errorf("committed trace %s is in Jaeger with %d of its %d spans", id, got[id], produced[id])
		}
	}
	for id := range got {
		if produced[id] == 0 {
			t.Errorf("Jaeger holds trace %s, which the application never produced", id)
		}
	}
	nc := float64(len(committedOnly))
	p := percent / 100.0
	mean, bound := nc*p, 5*math.Sqrt(nc*p*(1-p))
	t.Logf("kept: all %d traces with a non-committed frame or an error (of which %d indeterminate); "+
		"%d of %d committed-only traces (%.2f%%; expected %.0f ± %.0f at %d%%)",
		len(mustKeep)-1, rep.count(loadIndeterminate), kept, len(committedOnly), 100*float64(kept)/nc, mean, bound, percent)
	if math.Abs(float64(kept)-mean) > bound {
		t.Errorf("Jaeger kept %d of %d committed-only traces; at %d%% want %.0f ± %.0f", kept, len(committedOnly), percent, mean, bound)
	}
}
