package otelpgxtx

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

// TestImplicitUnspannedFrames: an autocommit write with no span in its context — a
// background job's —, where otelpgx starts no span, through the pgx pool and
// database/sql: committed, it has no span, as before; rolled back by a unique violation,
// or made indeterminate by a cut after the server read it, or committed with a failure of
// the client after it, it has one span, the frame's own, a root span started at the
// frame's start (before its phase events), with tx.implicit, tx.outcome and the status of
// its outcome, which the log record of an unknown commit names.
func TestImplicitUnspannedFrames(t *testing.T) {
	ways := []implicitWay{implicitWays[0], implicitWays[5]}
	if ways[0].name != "pgx cache statement" || ways[1].name != "database/sql" {
		t.Fatalf("ways %q, %q", ways[0].name, ways[1].name)
	}
	cases := []struct {
		name  string
		arm   func(t *testing.T, w *implicitSetup, id int)
		want  outcome.Outcome
		code  codes.Code
		phase string // the last phase event
	}{
		{name: "committed", want: outcome.OutcomeCommitted},
		{name: "unique violation", arm: implicitFaults[1].arm, want: outcome.OutcomeRolledBack, code: codes.Error, phase: "tx.phase.rolled_back"},
		{name: "cut after the server read it", arm: implicitFaults[5].arm, want: outcome.OutcomeIndeterminate, code: codes.Unset, phase: "tx.phase.unknown"},
	}
	if implicitFaults[1].name != "unique violation" || implicitFaults[5].name != "proxy cut after the server read it" {
		t.Fatalf("faults %q, %q", implicitFaults[1].name, implicitFaults[5].name)
	}
	for _, way := range ways {
		for _, c := range cases {
			t.Run(way.name+"/"+c.name, func(t *testing.T) {
				w := newImplicit(t, "xid")
				const id = 1
				if c.arm != nil {
					c.arm(t, w, id)
				}
				pid := w.pid(t)
				w.h.exp.Reset()
				if trace.SpanFromContext(w.ctx).SpanContext().IsValid() {
					t.Fatal("a span in the test's context")
				}
				werr := way.write(w.ctx, w, id)
				returned := time.Now()
				if c.want == outcome.OutcomeIndeterminate {
					mustOK(t, srv.WaitBackendGone(w.ctx, pid))
				}
				if (werr == nil) != (c.want == outcome.OutcomeCommitted) {
					t.Fatalf("write: %v", werr)
				}
				spans := w.h.exp.GetSpans()
				if c.want == outcome.OutcomeCommitted {
					if len(spans) != 0 {
						t.Fatalf("a committed write outside any trace has spans: %v", names(spans))
					}
					return
				}
				if len(spans) != 1 {
					t.Fatalf("%d spans, want the frame's: %v", len(spans), names(spans))
				}
				f := spans[0]
				wantUnspannedFrame(t, f, c.want, c.code, returned)
				wantEvents(t, f, "tx.phase.active", "tx.phase.committing", c.phase)
				if c.want == outcome.OutcomeIndeterminate {
					// The xid read rode in the write whose reply was lost.
					wantAttr(t, f, string(NoReferenceKey), "xid_lost")
					if !strings.Contains(w.logs.String(), `"span_id":"`+f.SpanContext.SpanID().String()+`"`) {
						t.Fatalf("the log record does not name the frame's span %s: %s", f.SpanContext.SpanID(), w.logs)
					}
				}
			})
		}
	}
	t.Run("pgx pool/committed, then the client failed", func(t *testing.T) {
		w := newImplicit(t, "off")
		w.h.exp.Reset()
		var wrong []string // an int does not scan into a slice of strings
		err := w.h.pool.QueryRow(w.ctx, "insert into "+w.table+" (id, k) values (1, 1) returning id "+implicitText).Scan(&wrong)
		returned := time.Now()
		if err == nil {
			t.Fatal("the scan succeeded")
		}
		spans := w.h.exp.GetSpans()
		if len(spans) != 1 {
			t.Fatalf("%d spans, want the frame's: %v", len(spans), names(spans))
		}
		wantUnspannedFrame(t, spans[0], outcome.OutcomeCommittedWithPostCommitFailure, codes.Ok, returned)
		wantEvents(t, spans[0], "tx.phase.active", "tx.phase.committing", "tx.phase.committed", schema.EventPostCommitFailed)
	})
}

// wantUnspannedFrame asserts that s is the span an implicit frame made outside any trace
// started at its end: a root "transaction" span of the library's, of kind INTERNAL, with
// tx.implicit, outcome want and status code, started no later than its first event (the
// frame's start precedes the statement's handing over) and before the write returned,
// ending after its last.
func wantUnspannedFrame(t *testing.T, s tracetest.SpanStub, want outcome.Outcome, code codes.Code, returned time.Time) {
	t.Helper()
	if s.Name != DefaultSpanName || s.Parent.IsValid() || s.SpanKind != trace.SpanKindInternal || s.InstrumentationScope.Name != ScopeName {
		t.Fatalf("span %q, parent %v, kind %v, scope %q: want a root frame span", s.Name, s.Parent.SpanID(), s.SpanKind, s.InstrumentationScope.Name)
	}
	wantAttr(t, s, string(OutcomeKey), want.String())
	if v, _ := attr(s, ImplicitKey); !v.AsBool() {
		t.Fatal("no tx.implicit")
	}
	if _, ok := attr(s, schema.DBSystemNameKey); !ok {
		t.Fatal("no db.system.name")
	}
	if s.Status.Code != code {
		t.Fatalf("status %v %q, want %v", s.Status.Code, s.Status.Description, code)
	}
	if len(s.Events) == 0 {
		t.Fatal("no events")
	}
	times := make([]time.Time, len(s.Events))
	for i, e := range s.Events {
		times[i] = e.Time
	}
	first, last := slices.MinFunc(times, time.Time.Compare), slices.MaxFunc(times, time.Time.Compare)
	if s.StartTime.After(first) || !s.StartTime.Before(returned) || s.EndTime.Before(last) || s.EndTime.Before(s.StartTime) {
		t.Fatalf("start %v, events %v to %v, end %v, the write returned at %v: want start ≤ events ≤ end, start before the return",
			s.StartTime, first, last, s.EndTime, returned)
	}
}

// TestImplicitUnspannedFramesDecided: the span of an implicit frame that did not commit,
// outside any trace, is as the application's configuration decides, as any frame span: the
// SDK's default sampler (parent-based) records it as a root span and leaves it out under an
// unsampled parent; a sampler that samples nothing is asked and leaves it out; a Filter
// that rejects the frame, asked with the sanitized statement, leaves it out. The frame is
// counted whatever its span.
func TestImplicitUnspannedFramesDecided(t *testing.T) {
	unsampledParent := func(ctx context.Context) context.Context {
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})
		return trace.ContextWithSpanContext(ctx, sc)
	}
	provider := func(s sdktrace.Sampler) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s), sdktrace.WithSyncer(exp))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return tp, exp
	}
	byDefault, byDefaultExp := provider(sdktrace.ParentBased(sdktrace.AlwaysSample()))
	drop := &askedSampler{}
	never, neverExp := provider(drop)
	var filtered []string
	for _, c := range []struct {
		name  string
		ctx   func(context.Context) context.Context
		opts  []Option
		exp   *tracetest.InMemoryExporter // where its span would go (else the harness's)
		spans int
		asked func() bool // the configuration was asked about the frame
	}{
		{"the default sampler, no parent", nil, []Option{WithTracerProvider(byDefault)}, byDefaultExp, 1, func() bool { return true }},
		{"the default sampler, an unsampled parent", unsampledParent, []Option{WithTracerProvider(byDefault)}, byDefaultExp, 0, func() bool { return true }},
		{"a sampler that samples nothing", nil, []Option{WithTracerProvider(never)}, neverExp, 0, func() bool { return drop.asked.Load() == 1 }},
		{"a filter that rejects it", nil, []Option{WithFilter(func(_ context.Context, sql string) bool {
			filtered = append(filtered, sql)
			return !strings.Contains(sql, "insert")
		})}, nil, 0, func() bool { return len(filtered) == 1 && strings.Contains(filtered[0], "values ($1, $1)") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newImplicit(t, "off", c.opts...)
			implicitFaults[1].arm(t, w, 1) // a unique violation
			exp := c.exp
			if exp == nil {
				exp = w.h.exp
			}
			exp.Reset()
			ctx := w.ctx
			if c.ctx != nil {
				ctx = c.ctx(ctx)
			}
			if _, err := w.h.pool.Exec(ctx, w.insert(), 1); err == nil {
				t.Fatal("the write did not fail")
			}
			if spans := exp.GetSpans(); len(spans) != c.spans {
				t.Fatalf("spans %v, want %d", names(spans), c.spans)
			}
			if c.spans == 1 {
				wantUnspannedFrame(t, exp.GetSpans()[0], outcome.OutcomeRolledBack, codes.Error, time.Now())
			}
			if !c.asked() {
				t.Fatalf("the configuration was not asked: sampler %d, filter %q", drop.asked.Load(), filtered)
			}
			counts := w.h.sums(t, w.ctx, metrics.MetricDuration, OutcomeKey, ImplicitKey)
			if n := counts["tx.outcome=rolled_back,tx.implicit=true"]; n != 1 {
				t.Fatalf("counted %v, want one implicit rolled_back", nonZero(counts))
			}
		})
	}
}

// askedSampler samples nothing and counts the spans it was asked about.
type askedSampler struct{ asked atomic.Int64 }

func (s *askedSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	s.asked.Add(1)
	return sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
}

func (s *askedSampler) Description() string { return "askedSampler" }
