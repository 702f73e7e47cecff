package otelpgxtx

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// innerSpanKinds runs, under a request span, an acquire that connects, a statement pgx
// prepares implicitly, and a transaction holding a batch of three queries, and counts the
// spans of each kind, and the operations otelpgx's duration metric counted by
// pgx.operation.type.
func innerSpanKinds(t *testing.T, opts ...Option) (spans, ops map[string]int64, frame string) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1, opts...)
	ctx, root := h.tp.Tracer("test").Start(ctx, "request")
	if _, err := h.pool.Exec(ctx, "select $1::int", 1); err != nil {
		t.Fatal(err)
	}
	tx := mustBegin(t, ctx, h.pool)
	b := &pgx.Batch{}
	for i := range 3 {
		b.Queue(fmt.Sprintf("select %d", i))
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	root.End()

	all := h.exp.GetSpans()
	byID := map[string]tracetest.SpanStub{}
	for _, s := range all {
		byID[s.SpanContext.SpanID().String()] = s
	}
	// The request span ended last: no inner End hook ended it in place of a span it
	// did not start.
	for _, s := range all {
		if s.Name == "request" && s.EndTime.Before(all[len(all)-2].EndTime) {
			t.Errorf("the request span ended at %v, before %q (%v)", s.EndTime, all[len(all)-2].Name, all[len(all)-2].EndTime)
		}
	}
	spans = map[string]int64{}
	for _, s := range all {
		_, prepare := attr(s, otelpgx.PrepareStmtNameKey)
		text, _ := attr(s, "db.query.text")
		switch {
		case evidence.Classify(text.AsString()).Control():
			spans["transaction control"]++
		case s.Name == "connect":
			spans["connect"]++
		case s.Name == "pool.acquire":
			spans["acquire"]++
		case prepare:
			spans["prepare"]++
		case byID[s.Parent.SpanID().String()].Name == "batch start":
			spans["batch query"]++
		case s.Name == "batch start":
			spans["batch"]++
		case s.InstrumentationScope.Name == "github.com/exaring/otelpgx":
			spans["query"]++
		}
	}
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	ops = map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "db.client.operation.duration" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				v, _ := dp.Attributes.Value(otelpgx.PGXOperationTypeKey)
				ops[v.AsString()] += int64(dp.Count)
			}
		}
	}
	return spans, ops, attrString(t, onlyFrame(t, h), OutcomeKey)
}

// allInnerSpans makes every kind of inner span a span.
var allInnerSpans = WithInnerSpans(InnerSpanConnect, InnerSpanAcquire, InnerSpanBatchQuery, InnerSpanPrepare, InnerSpanTransactionControl)

// TestWithoutInnerSpans: each kind turned off loses exactly its spans — the batch's own
// span and the query spans stay, and the frame is the same — while otelpgx, still given
// every hook, counts every operation in its metrics as before. By default, the implicit
// prepare and the transaction-control statements are no spans: they are events (see
// TestControlEventsAnswers, TestSpanImplicitPrepareStaysUnderItsStatement).
func TestWithoutInnerSpans(t *testing.T) {
	baseSpans, baseOps, baseFrame := innerSpanKinds(t, allInnerSpans)
	for _, k := range []string{"connect", "acquire", "prepare", "batch query", "batch", "query", "transaction control"} {
		if baseSpans[k] == 0 {
			t.Fatalf("with every kind on there is no %s span: %v", k, baseSpans)
		}
	}
	for _, k := range []InnerSpan{InnerSpanConnect, InnerSpanAcquire, InnerSpanBatchQuery, InnerSpanPrepare, InnerSpanTransactionControl} {
		t.Run(k.String(), func(t *testing.T) {
			spans, ops, frame := innerSpanKinds(t, allInnerSpans, WithoutInnerSpans(k))
			want := maps.Clone(baseSpans)
			delete(want, k.String())
			if !maps.Equal(spans, want) {
				t.Errorf("spans %v, want %v (all but %s)", spans, want, k)
			}
			if !maps.Equal(ops, baseOps) || frame != baseFrame {
				t.Errorf("otelpgx counted %v and the frame is %s, want %v and %s as without the option", ops, frame, baseOps, baseFrame)
			}
		})
	}
	t.Run("default", func(t *testing.T) {
		spans, ops, frame := innerSpanKinds(t)
		want := maps.Clone(baseSpans)
		delete(want, "prepare")
		delete(want, "transaction control")
		if !maps.Equal(spans, want) {
			t.Errorf("spans %v, want %v (all but the implicit prepare and transaction control)", spans, want)
		}
		if !maps.Equal(ops, baseOps) || frame != baseFrame {
			t.Errorf("otelpgx counted %v and the frame is %s, want %v and %s as with every span", ops, frame, baseOps, baseFrame)
		}
	})
}

// TestWithoutInnerSpansBadInput: an unknown kind, and the option with a tracer of the
// user's own, are errors.
func TestWithoutInnerSpansBadInput(t *testing.T) {
	for name, opts := range map[string][]Option{
		"unknown kind":                  {WithoutInnerSpans(InnerSpanPrepare, InnerSpan(9))},
		"zero kind":                     {WithoutInnerSpans(0)},
		"user's tracer":                 {WithInnerTracer(&endSpanRecorder{}), WithoutInnerSpans(InnerSpanConnect)},
		"user's tracer, WithInnerSpans": {WithInnerTracer(&endSpanRecorder{}), WithInnerSpans(InnerSpanTransactionControl)},
		"unknown kind, WithInnerSpans":  {WithInnerSpans(InnerSpan(7))},
		"config's tracer":               nil, // below: the config already has a tracer
	} {
		cfg, err := pgxpool.ParseConfig(srv.ConnString())
		if err != nil {
			t.Fatal(err)
		}
		if opts == nil {
			cfg.ConnConfig.Tracer = &endSpanRecorder{}
			opts = []Option{WithoutInnerSpans(InnerSpanAcquire)}
		}
		if _, err := InstrumentPool(cfg, opts...); err == nil || !strings.Contains(err.Error(), "InnerSpans") {
			t.Errorf("%s: InstrumentPool = %v, want an error naming the option", name, err)
		}
	}
	if got := InnerSpan(9).String(); got != "InnerSpan(9)" {
		t.Errorf("InnerSpan(9).String() = %q", got)
	}
}
