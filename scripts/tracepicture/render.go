package main

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// writePNG renders the spans and encodes the picture as PNG.
func writePNG(w io.Writer, spans tracetest.SpanStubs) error {
	img, err := render(spans)
	if err != nil {
		return err
	}
	// Best compression: the picture is flat colour, and it is kept in the repository.
	return (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(w, img)
}

// render draws the trace of the spans in the look of Jaeger's trace timeline.
func render(spans tracetest.SpanStubs) (*image.RGBA, error) {
	if len(spans) == 0 {
		return nil, fmt.Errorf("no spans to draw")
	}
	f, err := loadFaces()
	if err != nil {
		return nil, err
	}
	p := newPicture(spans)
	c := &canvas{img: image.NewRGBA(image.Rect(0, 0, width, p.height())), f: f}
	c.fill(c.img.Bounds(), colorBackground)
	c.header(p)
	c.ruler(p)
	for i := range p.rows {
		c.row(p, i)
	}
	return c.img, nil
}

// header writes the trace's title (its root span), its id, and its summary line as
// Jaeger's trace page does, with the legend of the bar colours on the right.
func (c *canvas) header(p *picture) {
	c.fill(image.Rect(0, 0, width, headerH), colorHeader)
	c.fill(image.Rect(0, headerH-1, width, headerH), colorLine)
	root := p.rows[0].span
	x := c.text(c.f.title, colorText, margin, 30, spanService(root)+": "+root.Name)
	c.text(c.f.regular, colorMuted, x+10, 30, root.SpanContext.TraceID().String()[:7])

	depth, services := 0, map[string]bool{}
	for _, r := range p.rows {
		depth = max(depth, r.depth+1)
		services[spanService(r.span)] = true
	}
	x = margin
	for _, kv := range [][2]string{
		{"Trace Start", p.start.UTC().Format("2006-01-02 15:04:05.000 UTC")},
		{"Duration", formatDuration(p.duration())},
		{"Services", fmt.Sprint(len(services))},
		{"Depth", fmt.Sprint(depth)},
		{"Total Spans", fmt.Sprint(len(p.rows))},
	} {
		x = c.text(c.f.bold, colorText, x, 56, kv[0]+" ")
		x = c.text(c.f.regular, colorMuted, x, 56, kv[1]) + 22
	}

	// The legend, right-aligned on the title's line.
	legend := []struct {
		col   color.RGBA
		label string
	}{
		{colorCommitted, "committed"},
		{colorIndeterminate, "indeterminate (commit outcome unknown)"},
		{colorError, "rolled back / error"},
		{colorService, "other span"},
	}
	total := 0
	for _, l := range legend {
		total += 14 + textWidth(c.f.small, l.label) + 18
	}
	total += 8 + textWidth(c.f.small, "span event")
	x = width - margin - total
	for _, l := range legend {
		c.fill(image.Rect(x, 20, x+10, 30), l.col)
		x = c.text(c.f.small, colorText, x+14, 30, l.label) + 18
	}
	c.fill(image.Rect(x, 18, x+2, 32), colorTick)
	c.text(c.f.small, colorText, x+8, 30, "span event")
}

// ruler writes the column titles and the time axis's labels at a quarter of the trace
// each, as Jaeger's ruler does; the grid lines are drawn with the rows.
func (c *canvas) ruler(p *picture) {
	top := headerH
	c.fill(image.Rect(0, top, width, top+rulerH), colorRuler)
	c.fill(image.Rect(0, top+rulerH-1, width, top+rulerH), colorLine)
	c.text(c.f.bold, colorText, margin, top+18, "Service & Operation")
	for q := range 5 {
		x := timelineX + timelineW*q/4
		label := formatDuration(p.duration() * time.Duration(q) / 4)
		lx := x + 4
		if q == 4 {
			lx = x - 4 - textWidth(c.f.small, label) // the last label stays inside
		}
		c.fill(image.Rect(x, top+6, x+1, top+rulerH), colorMuted)
		c.text(c.f.small, colorText, lx, top+18, label)
	}
}

// row draws row i: the tree guides, the service and span name on the left, the bar with
// its event ticks and duration on the right, and a frame's detail box below.
func (c *canvas) row(p *picture, i int) {
	r := p.rows[i]
	s := r.span
	top := p.rowTop(i)
	bottom := top + rowHeight(r)
	col := barColor(s)

	// The grid of the time axis, under everything of the row.
	for q := range 5 {
		x := timelineX + timelineW*q/4
		c.fill(image.Rect(x, top, x+1, bottom), colorGrid)
	}

	// Tree guides: a line for each ancestor level, as Jaeger indents its rows.
	for d := range r.depth {
		gx := margin + d*indent + 4
		c.fill(image.Rect(gx, top, gx+1, top+rowH), colorLine)
	}
	x := margin + r.depth*indent
	if r.parent {
		// The expanded caret, a small downward triangle.
		for k := range 4 {
			c.fill(image.Rect(x+1+k, top+11+k, x+8-k, top+12+k), colorMuted)
		}
	}
	x += 12
	// The service's colour stripe, then the service and the span name.
	c.fill(image.Rect(x, top+5, x+3, top+rowH-5), colorService)
	x += 8
	nameRight := timelineX - 16
	x = c.text(c.f.bold, colorText, x, top+18, fit(c.f.bold, spanService(s), nameRight-x))
	name := s.Name
	if q, ok := attr(s, "db.query.summary"); ok && q != s.Name {
		name = q // "INSERT orders" says more than "INSERT"
	}
	x = c.text(c.f.regular, colorMuted, x+6, top+18, fit(c.f.regular, name, nameRight-x-6))
	if o, ok := attr(s, outcomeKey); ok && x+16+textWidth(c.f.small, o) < nameRight {
		// The outcome as a badge in its colour, readable without the bar.
		w := textWidth(c.f.small, o) + 12
		c.fill(image.Rect(x+8, top+6, x+8+w, top+rowH-6), col)
		c.text(c.f.small, colorText, x+14, top+18, o)
	}

	// The bar, the ticks of the span's events on it, and its duration beside it.
	bar := p.barRect(i)
	c.fill(bar, col)
	for _, e := range s.Events {
		ex := min(max(p.x(e.Time), bar.Min.X), bar.Max.X-2)
		c.fill(image.Rect(ex, bar.Min.Y-3, ex+2, bar.Max.Y+3), colorTick)
	}
	label := formatDuration(s.EndTime.Sub(s.StartTime))
	if q, ok := attr(s, "db.query.text"); ok {
		label += "   " + q
	}
	// Right of the bar where there is room, else left of it, else inside it (a span as
	// long as the trace), so that the label never spills into the names.
	lw := timelineX + timelineW - bar.Max.X - 8
	short := formatDuration(s.EndTime.Sub(s.StartTime))
	switch sw := textWidth(c.f.small, short); {
	case textWidth(c.f.small, label) <= lw || lw > 120:
		c.text(c.f.small, colorMuted, bar.Max.X+6, top+18, fit(c.f.small, label, lw))
	case bar.Min.X-timelineX >= sw+8:
		c.text(c.f.small, colorMuted, bar.Min.X-6-sw, top+18, short)
	case bar.Dx() >= sw+12:
		c.text(c.f.small, colorBackground, bar.Max.X-6-sw, top+18, short)
	}
	// The divider between the names and the timeline (not across a frame's detail box).
	c.fill(image.Rect(timelineX-9, top, timelineX-8, top+rowH), colorLine)

	if isFrame(s) {
		c.detail(p, s, col, top+rowH, margin+r.depth*indent+12)
	}
	c.fill(image.Rect(0, bottom-1, width, bottom), colorGrid)
}

// detail draws a frame's detail box from x to the right edge, as Jaeger shows an expanded
// span: its outcome attributes, its reconciliation reference (shortened) and its events,
// each at its time from the trace's start.
func (c *canvas) detail(p *picture, s tracetest.SpanStub, col color.RGBA, top, x int) {
	box := image.Rect(x, top, width-margin, top+detailH-6)
	c.fill(box, colorLine)
	c.fill(box.Inset(1), colorDetail)
	c.fill(image.Rect(box.Min.X, box.Min.Y, box.Min.X+4, box.Max.Y), col)
	x += 14
	right := box.Max.X - 10

	line := func(y int, pairs [][2]string) {
		lx := x
		for _, kv := range pairs {
			if lx >= right {
				return
			}
			lx = c.text(c.f.small, colorMuted, lx, y, kv[0]+" = ")
			lx = c.text(c.f.small, colorText, lx, y, fit(c.f.small, kv[1], right-lx)) + 20
		}
	}
	var attrs [][2]string
	for _, k := range detailKeys {
		if v, ok := attr(s, k); ok {
			attrs = append(attrs, [2]string{string(k), v})
		}
	}
	line(top+17, attrs)
	if ref, ok := attr(s, "tx.reconciliation.ref"); ok {
		line(top+35, [][2]string{{"tx.reconciliation.ref", shortRef(ref)}})
	}
	lx := c.text(c.f.small, colorMuted, x, top+53, "events  ")
	for j, e := range s.Events {
		if j > 0 {
			lx = c.text(c.f.small, colorMuted, lx, top+53, "  ·  ")
		}
		lx = c.text(c.f.small, colorText, lx, top+53, e.Name)
		lx = c.text(c.f.small, colorMuted, lx, top+53, " "+formatDuration(e.Time.Sub(p.start)))
	}
}
