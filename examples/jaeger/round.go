package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx"
)

// scenarioReport is one scenario's run: its trace, what Run returned, and whether that
// was what the scenario is for.
type scenarioReport struct {
	sc      *scenario
	traceID trace.TraceID
	results []string
	err     error
	spans   []sdktrace.ReadOnlySpan // of its trace, in end order
}

type roundReport struct {
	n           int
	scenarios   []scenarioReport
	err         error // the round could not run
	interrupted bool
}

func (r roundReport) ok() bool {
	if r.interrupted {
		return true
	}
	if r.err != nil {
		return false
	}
	for _, s := range r.scenarios {
		if s.err != nil {
			return false
		}
	}
	return true
}

// round runs every scenario once, each under a root span of its own, and checks its
// results and its frame spans.
func (a *app) round(ctx context.Context, n int) roundReport {
	rep := roundReport{n: n}
	a.tel.collector.take() // only this round's spans from here on
	if err := a.resetTables(ctx); err != nil {
		rep.err = err
		rep.interrupted = ctx.Err() != nil
		return rep
	}
	for _, sc := range scenarios {
		sctx, cancel := context.WithTimeout(ctx, a.cfg.scenarioTimeout)
		sctx, span := a.tracer.Start(sctx, "demo."+sc.name, trace.WithAttributes(
			attribute.String("demo.scenario", sc.name),
			attribute.String("demo.title", sc.title),
			attribute.Int("demo.round", n),
		))
		run := &scenarioRun{}
		err := sc.run(sctx, a, run)
		// demo.results are the Result variants the application code got back: the
		// demo's own record, not the library's (a participant has no span to carry it).
		span.SetAttributes(attribute.StringSlice("demo.results", run.results))
		if err != nil {
			span.SetStatus(codes.Error, "demo: unexpected outcome")
		}
		span.End()
		cancel()
		rep.scenarios = append(rep.scenarios, scenarioReport{sc: sc, traceID: span.SpanContext().TraceID(), results: run.results, err: err})
		if ctx.Err() != nil {
			rep.interrupted = true
			return rep
		}
	}
	byTrace := map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	for _, s := range a.tel.collector.take() {
		byTrace[s.SpanContext().TraceID()] = append(byTrace[s.SpanContext().TraceID()], s)
	}
	for i := range rep.scenarios {
		sr := &rep.scenarios[i]
		sr.spans = byTrace[sr.traceID]
		if sr.err == nil {
			sr.err = checkFrames(sr.sc, sr.spans)
		}
	}
	return rep
}

// isFrame reports whether s is a transaction frame span: the library's, or an implicit
// transaction's, whose frame is its statement's span (tx.implicit).
func isFrame(s sdktrace.ReadOnlySpan) bool {
	if implicit, _ := spanAttr(s, otelpgxtx.ImplicitKey); implicit.AsBool() {
		return true
	}
	if s.InstrumentationScope().Name != otelpgxtx.ScopeName {
		return false
	}
	_, ok := spanAttr(s, otelpgxtx.FrameDepthKey)
	return ok
}

func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// checkFrames compares the tx.outcome of the trace's frame spans with the scenario's.
func checkFrames(sc *scenario, spans []sdktrace.ReadOnlySpan) error {
	var got []string
	for _, s := range spans {
		if isFrame(s) {
			v, _ := spanAttr(s, otelpgxtx.OutcomeKey)
			got = append(got, v.AsString())
		}
	}
	want := slices.Clone(sc.frames)
	slices.Sort(got)
	slices.Sort(want)
	if sc.name == "serialization_retry" && len(got) > len(want) {
		// More than one conflict is possible in principle; every extra frame must be a
		// retried rollback.
		want = append(want, slices.Repeat([]string{"rolled_back"}, len(got)-len(want))...)
		slices.Sort(want)
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("frame spans carry tx.outcome %s, want %s", strings.Join(got, ","), strings.Join(want, ","))
	}
	return nil
}
