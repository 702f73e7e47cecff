package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx"
)

// collector keeps every ended span in memory: the terminal trees and the demo's own
// checks read them. It is a span processor, so it sees exactly what an exporter sees.
type collector struct {
	mu    sync.Mutex
	spans []sdktrace.ReadOnlySpan
}

var _ sdktrace.SpanProcessor = (*collector)(nil)

func (c *collector) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (c *collector) OnEnd(s sdktrace.ReadOnlySpan) {
	c.mu.Lock()
	c.spans = append(c.spans, s)
	c.mu.Unlock()
}

func (c *collector) Shutdown(context.Context) error   { return nil }
func (c *collector) ForceFlush(context.Context) error { return nil }

// take returns the spans collected so far and forgets them.
func (c *collector) take() []sdktrace.ReadOnlySpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.spans
	c.spans = nil
	return s
}

// renderTrace prints one trace as a tree: every span with its offset from the trace's
// start and its duration; frame spans with their outcome, status, tx.* attributes and
// phase events (offsets from the frame span's start); statement spans with their SQL.
func renderTrace(w io.Writer, title string, spans []sdktrace.ReadOnlySpan) {
	if len(spans) == 0 {
		fmt.Fprintf(w, "%s: no spans\n", title)
		return
	}
	ids := map[trace.SpanID]bool{}
	t0 := spans[0].StartTime()
	for _, s := range spans {
		ids[s.SpanContext().SpanID()] = true
		if s.StartTime().Before(t0) {
			t0 = s.StartTime()
		}
	}
	kids := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if p := s.Parent(); p.IsValid() && ids[p.SpanID()] {
			kids[p.SpanID()] = append(kids[p.SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) }
	slices.SortStableFunc(roots, byStart)
	for k := range kids {
		slices.SortStableFunc(kids[k], byStart)
	}
	names := map[trace.SpanID]string{}
	for _, s := range spans {
		names[s.SpanContext().SpanID()] = s.Name()
	}
	fmt.Fprintf(w, "── %s  (trace %s)\n", title, spans[0].SpanContext().TraceID())
	var walk func(s sdktrace.ReadOnlySpan, head, body string)
	walk = func(s sdktrace.ReadOnlySpan, head, body string) {
		fmt.Fprintf(w, "%s%s\n", head, spanLine(s, t0))
		children := kids[s.SpanContext().SpanID()]
		bar := body + "│   "
		if len(children) == 0 {
			bar = body + "    "
		}
		for _, d := range spanDetails(s, names) {
			fmt.Fprintf(w, "%s  %s\n", bar, d)
		}
		for i, c := range children {
			if i == len(children)-1 {
				walk(c, body+"└── ", body+"    ")
			} else {
				walk(c, body+"├── ", body+"│   ")
			}
		}
	}
	for _, r := range roots {
		walk(r, "", "")
	}
}

// spanLine is a span's headline: name, kind, offset from the trace start, duration and
// what matters most about it.
func spanLine(s sdktrace.ReadOnlySpan, t0 time.Time) string {
	var b strings.Builder
	b.WriteString(s.Name())
	if k := s.SpanKind(); k != trace.SpanKindInternal && k != trace.SpanKindUnspecified {
		fmt.Fprintf(&b, " [%s]", k)
	}
	fmt.Fprintf(&b, "  +%s  %s", ms(s.StartTime().Sub(t0)), ms(s.EndTime().Sub(s.StartTime())))
	switch {
	case isFrame(s):
		if v, ok := spanAttr(s, "db.query.text"); ok { // an implicit transaction's: the statement's span
			fmt.Fprintf(&b, "  %s", oneLine(v.AsString(), 60))
		}
		v, _ := spanAttr(s, otelpgxtx.OutcomeKey)
		fmt.Fprintf(&b, "  tx.outcome=%s  status=%s", v.String(), status(s))
	case s.Name() == otelpgxtx.SpanNameReconcile:
		v, _ := spanAttr(s, otelpgxtx.ResolvedOutcomeKey)
		fmt.Fprintf(&b, "  tx.outcome.resolved=%s  status=%s", v.String(), status(s))
	default:
		if v, ok := spanAttr(s, "db.query.text"); ok {
			if _, prepare := spanAttr(s, "pgx.prepare_stmt.name"); prepare {
				// pgx prepares a statement on its first use on a connection.
				b.WriteString("  (prepare)")
			}
			fmt.Fprintf(&b, "  %s", oneLine(v.AsString(), 90))
		}
		if s.Status().Code != codes.Unset {
			fmt.Fprintf(&b, "  status=%s", status(s))
		}
	}
	return b.String()
}

// frameDetail is the order in which a frame span's attributes are shown.
var frameDetail = []attribute.Key{
	otelpgxtx.PhaseKey, otelpgxtx.ImplicitKey, otelpgxtx.FrameDepthKey, otelpgxtx.PropagationKey, otelpgxtx.IsolationKey,
	otelpgxtx.AttemptKey, otelpgxtx.RetryableKey, "error.type", "db.response.status_code",
	otelpgxtx.CommittedLocallyKey, otelpgxtx.ReconciliationXIDKey, otelpgxtx.ReconciliationRefKey,
	otelpgxtx.OperationIDKey,
}

// spanDetails are the lines under a span's headline: attributes worth reading, links,
// and events with their offsets from the span's start.
func spanDetails(s sdktrace.ReadOnlySpan, names map[trace.SpanID]string) []string {
	var lines []string
	var attrs []string
	switch {
	case isFrame(s):
		for _, k := range frameDetail {
			if v, ok := spanAttr(s, k); ok {
				attrs = append(attrs, fmt.Sprintf("%s=%s", k, v.String()))
			}
		}
	case strings.HasPrefix(s.Name(), "demo."):
		if v, ok := spanAttr(s, "demo.results"); ok {
			attrs = append(attrs, "demo.results="+strings.Join(v.AsStringSlice(), " "))
		}
	case s.Name() == otelpgxtx.SpanNameReconcile:
		for _, k := range []attribute.Key{"error.type", otelpgxtx.ReconciliationRefKey, otelpgxtx.OperationIDKey} {
			if v, ok := spanAttr(s, k); ok {
				attrs = append(attrs, fmt.Sprintf("%s=%s", k, v.String()))
			}
		}
	}
	lines = append(lines, wrap(attrs, 100)...)
	for _, l := range s.Links() {
		name := names[l.SpanContext.SpanID()]
		if name == "" {
			name = "span"
		}
		lines = append(lines, fmt.Sprintf("link → %s %s (trace %s)", name, l.SpanContext.SpanID(), l.SpanContext.TraceID()))
	}
	events := slices.Clone(s.Events())
	slices.SortStableFunc(events, func(a, b sdktrace.Event) int { return a.Time.Compare(b.Time) })
	for _, e := range events {
		line := fmt.Sprintf("@ +%-9s %s", ms(e.Time.Sub(s.StartTime())), e.Name)
		for _, kv := range e.Attributes {
			v := kv.Value.String()
			if kv.Key == otelpgxtx.OperationIDKey && len(v) > 8 {
				v = v[:8] + "…"
			}
			line += fmt.Sprintf(" %s=%s", kv.Key, oneLine(v, 80))
		}
		lines = append(lines, line)
	}
	return lines
}

func status(s sdktrace.ReadOnlySpan) string {
	st := s.Status()
	switch st.Code {
	case codes.Ok:
		return "Ok"
	case codes.Error:
		return fmt.Sprintf("Error(%q)", st.Description)
	}
	return "Unset"
}

// ms formats a duration in milliseconds with a tenth.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000)
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

// wrap joins items with two spaces into lines of at most width characters.
func wrap(items []string, width int) []string {
	var lines []string
	cur := ""
	for _, it := range items {
		if cur != "" && len(cur)+2+len(it) > width {
			lines = append(lines, cur)
			cur = ""
		}
		if cur != "" {
			cur += "  "
		}
		cur += it
	}
	if cur != "" {
		lines = append(lines, cur)
	}
	return lines
}
