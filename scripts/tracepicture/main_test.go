package main

import (
	"bytes"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The synthetic trace's clock: every instant is an offset from t0, in milliseconds.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// ms is the instant n milliseconds after t0.
func ms(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Millisecond))) }

// stub makes a span of the synthetic trace: span id id, under parent (0: a root).
func stub(id, parent byte, name string, start, end float64, attrs []attribute.KeyValue, events ...sdktrace.Event) tracetest.SpanStub {
	tid := trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	s := tracetest.SpanStub{
		Name:        name,
		SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{7: id}}),
		StartTime:   ms(start),
		EndTime:     ms(end),
		Attributes:  attrs,
		Events:      events,
		Resource:    resource.NewSchemaless(attribute.String("service.name", serviceName)),
	}
	if parent != 0 {
		s.Parent = trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{7: parent}})
	}
	return s
}

// event is a span event at n milliseconds.
func event(name string, n float64) sdktrace.Event { return sdktrace.Event{Name: name, Time: ms(n)} }

// syntheticSpans is the trace the program records, with round times: a root of 40 ms, a
// committed frame from 1 to 5 ms and an indeterminate one from 10 to 30 ms, each with an
// INSERT under it. In the order an exporter sees them: by end.
func syntheticSpans() tracetest.SpanStubs {
	return tracetest.SpanStubs{
		stub(3, 2, "INSERT", 2, 3, []attribute.KeyValue{attribute.String("db.query.text", "insert into orders (item) values ($1)")}),
		stub(2, 1, "transaction", 1, 5, []attribute.KeyValue{
			attribute.String("tx.outcome", "committed"),
			attribute.String("tx.phase", "committed"),
			attribute.String("tx.reconciliation.ref", "pg:7715015004061303347/1/725/1796291910229173/1796291909216233"),
		}, event("tx.phase.active", 1.5), event("tx.phase.committing", 4), event("tx.phase.committed", 5)),
		stub(5, 4, "INSERT", 11, 12, nil),
		stub(4, 1, "transaction", 10, 30, []attribute.KeyValue{
			attribute.String("tx.outcome", "indeterminate"),
			attribute.String("tx.phase", "unknown"),
			attribute.String("error.type", "connection_lost"),
			attribute.Bool("tx.commit.committed_locally", true),
			attribute.String("tx.reconciliation.ref", "pg:7715015004061303347/1/726/1796291910229173/1796291909216233"),
		}, event("tx.phase.active", 10.5), event("tx.phase.committing", 13), event("tx.phase.unknown", 29.5)),
		stub(1, 0, "POST /orders", 0, 40, nil),
	}
}

// encode renders spans to PNG bytes.
func encode(t *testing.T, spans tracetest.SpanStubs) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := writePNG(&b, spans); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestRender renders the synthetic trace to a file and checks the picture by its pixels:
// its size, and the colour of each frame's bar and of an event's tick where the layout
// puts them, computed here from the geometry rather than asked of the renderer.
func TestRender(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.png")
	if err := os.WriteFile(path, encode(t, syntheticSpans()), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	// Five rows, two of them frames with their detail boxes.
	wantH := headerH + rulerH + 5*rowH + 2*detailH + footerH
	if got := img.Bounds().Size(); got != (image.Point{width, wantH}) {
		t.Fatalf("size %v, want %dx%d", got, width, wantH)
	}

	// The rows, top down: root, committed frame, its INSERT, indeterminate frame, its INSERT.
	rowMid := func(i int) int {
		y := headerH + rulerH + i*rowH + rowH/2
		if i > 1 {
			y += detailH // below the committed frame's detail box
		}
		return y
	}
	// x of a time on the 40 ms axis, to the nearest pixel (a tick is 2 pixels wide from there).
	at := func(n float64) int { return timelineX + int(math.Round(n/40*float64(timelineW))) }
	for _, c := range []struct {
		what string
		x, y int
		want color.RGBA
	}{
		{"the indeterminate frame's bar (at 20 ms)", at(20), rowMid(3), colorIndeterminate},
		{"the committed frame's bar (at 3 ms)", at(3), rowMid(1), colorCommitted},
		{"the root's bar (at 35 ms)", at(35), rowMid(0), colorService},
		{"the tick of tx.phase.committing (at 13 ms)", at(13), rowMid(3), colorTick},
		{"the names column beside the indeterminate bar", timelineX - 30, rowMid(3) - barH/2 - 2, colorBackground},
	} {
		got := color.RGBAModel.Convert(img.At(c.x, c.y)).(color.RGBA)
		if got != c.want {
			t.Errorf("%s: pixel (%d, %d) is %v, want %v", c.what, c.x, c.y, got, c.want)
		}
	}
	if colorIndeterminate == colorError || colorIndeterminate == colorCommitted || colorIndeterminate == colorService {
		t.Error("the indeterminate colour must differ from the error, committed and other spans' colours")
	}
}

// TestRenderDeterministic: the same spans, in any order, make the same bytes.
func TestRenderDeterministic(t *testing.T) {
	spans := syntheticSpans()
	want := encode(t, spans)
	r := rand.New(rand.NewPCG(1, 2))
	for range 5 {
		r.Shuffle(len(spans), func(i, j int) { spans[i], spans[j] = spans[j], spans[i] })
		if !bytes.Equal(encode(t, spans), want) {
			t.Fatal("a reordering of the spans changed the picture")
		}
	}
}

// TestShortRef: the long numbers of a reference keep their ends; the short ones stay.
func TestShortRef(t *testing.T) {
	got := shortRef("pg:7715015004061303347/1/726/1796291910229173/1796291909216233")
	if want := "pg:7715…3347/1/726/1796…9173/1796…6233"; got != want {
		t.Errorf("shortRef = %q, want %q", got, want)
	}
	got = shortRef("pg:7715015004061303347/1/726/1796291910229173/1796291909216233;flushed=0/1508EA0")
	if want := "pg:7715…3347/1/726/1796…9173/1796…6233;flushed=0/1508EA0"; got != want {
		t.Errorf("shortRef = %q, want %q", got, want)
	}
}

// TestFormatDuration: Jaeger's way of writing a duration.
func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                        "0µs",
		500:                      "500ns",
		217520:                   "217.52µs",
		12200 * time.Microsecond: "12.2ms",
		3 * time.Second:          "3s",
	} {
		if got := formatDuration(d); got != want {
			t.Errorf("formatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestRun runs the whole program against a throw-away PostgreSQL (a few seconds): the
// trace it captured must hold a committed and an indeterminate frame under the root, each
// with a statement span under it, and the picture and the JSON must be written.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	out, spansFile := filepath.Join(dir, "trace.png"), filepath.Join(dir, "spans.json")
	if err := run(out, spansFile); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("not a PNG: %v", err)
	}

	b, err := os.ReadFile(spansFile)
	if err != nil {
		t.Fatal(err)
	}
	// The JSON's shape is tracetest.SpanStub's; only what the check needs is read back.
	var spans []struct {
		Name        string
		SpanContext struct{ SpanID string }
		Parent      struct{ SpanID string }
		Attributes  []struct {
			Key   string
			Value struct{ Value any }
		}
	}
	if err := json.Unmarshal(b, &spans); err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]string{} // frame span id → tx.outcome
	var rootID string
	for _, s := range spans {
		if s.Name == "POST /orders" {
			rootID = s.SpanContext.SpanID
		}
		for _, a := range s.Attributes {
			if a.Key == "tx.outcome" {
				outcomes[s.SpanContext.SpanID], _ = a.Value.Value.(string)
			}
		}
	}
	got := map[string]int{} // tx.outcome → statement spans under the frame
	for _, s := range spans {
		if o, ok := outcomes[s.Parent.SpanID]; ok {
			got[o]++
		}
	}
	for _, s := range spans {
		if _, frame := outcomes[s.SpanContext.SpanID]; frame && s.Parent.SpanID != rootID {
			t.Errorf("frame %s is not under the root span", s.SpanContext.SpanID)
		}
	}
	if len(outcomes) != 2 || got["committed"] < 1 || got["indeterminate"] < 1 {
		t.Errorf("frames %v with statement spans %v; want a committed and an indeterminate frame, each with a statement span", outcomes, got)
	}
}
