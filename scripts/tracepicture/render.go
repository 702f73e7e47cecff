package main

import (
	"cmp"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/image/font"
	"golang.org/x/image/font/gofont/gobold"
	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/opentype"
	"golang.org/x/image/math/fixed"
)

// The picture's geometry, in pixels. Fixed, so that a picture's size depends only on how
// many spans and frames it shows (the test checks it).
const (
	width     = 1400
	margin    = 16                      // left and right of everything
	nameWidth = 440                     // the "Service & Operation" column
	timelineX = margin + nameWidth + 16 // where the time axis begins
	timelineW = width - margin - 12 - timelineX
	headerH   = 74 // the trace's title and its summary line
	rulerH    = 28 // the column titles and the time labels
	rowH      = 28 // one span
	detailH   = 66 // the attributes and events under a frame's row
	footerH   = 14
	barH      = 12
	indent    = 18 // per level of the span tree
)

// The palette: Jaeger's light look, and an outcome colour for each frame span. The
// indeterminate amber must differ from both the error red and the committed green: it is
// the picture's point that an unknown outcome is neither.
var (
	colorBackground    = color.RGBA{0xff, 0xff, 0xff, 0xff}
	colorHeader        = color.RGBA{0xf6, 0xf6, 0xf6, 0xff}
	colorRuler         = color.RGBA{0xec, 0xec, 0xec, 0xff}
	colorLine          = color.RGBA{0xe3, 0xe3, 0xe3, 0xff}
	colorGrid          = color.RGBA{0xee, 0xee, 0xee, 0xff}
	colorText          = color.RGBA{0x22, 0x22, 0x22, 0xff}
	colorMuted         = color.RGBA{0x77, 0x77, 0x77, 0xff}
	colorDetail        = color.RGBA{0xf9, 0xf9, 0xf9, 0xff}
	colorTick          = color.RGBA{0x1f, 0x1f, 0x1f, 0xff}
	colorService       = color.RGBA{0x4c, 0x8b, 0xd6, 0xff} // spans that are not frames
	colorCommitted     = color.RGBA{0x3a, 0xa0, 0x5a, 0xff}
	colorIndeterminate = color.RGBA{0xf5, 0x9e, 0x0b, 0xff}
	colorError         = color.RGBA{0xd6, 0x3a, 0x3a, 0xff}
)

// outcomeKey is the frame span's tx.outcome: a span that has it is a transaction's frame.
const outcomeKey = attribute.Key("tx.outcome")

// detailKeys are the frame attributes written under a frame's row, in this order: what a
// reader of the trace settles an outcome from.
var detailKeys = []attribute.Key{"tx.outcome", "error.type", "tx.phase", "tx.commit.committed_locally", "tx.reconciliation.xid"}

// row is one line of the picture: a span and its depth in the span tree.
type row struct {
	span  tracetest.SpanStub
	depth int
	// parent reports whether the span has children (it gets the tree's caret).
	parent bool
}

// picture is the layout of one trace: its rows and its time axis.
type picture struct {
	rows       []row
	start, end time.Time
}

// newPicture lays the spans out as Jaeger does: the span tree depth first, siblings (and
// roots, the spans whose parent is not among them) by start time, then name, then span
// id, so that the same spans always make the same picture.
func newPicture(spans tracetest.SpanStubs) *picture {
	p := &picture{}
	present := map[trace.SpanID]bool{}
	for _, s := range spans {
		present[s.SpanContext.SpanID()] = true
	}
	children := map[trace.SpanID][]tracetest.SpanStub{}
	var roots []tracetest.SpanStub
	for _, s := range spans {
		if pid := s.Parent.SpanID(); s.Parent.IsValid() && present[pid] {
			children[pid] = append(children[pid], s)
		} else {
			roots = append(roots, s)
		}
		if p.start.IsZero() || s.StartTime.Before(p.start) {
			p.start = s.StartTime
		}
		if s.EndTime.After(p.end) {
			p.end = s.EndTime
		}
	}
	var walk func(level []tracetest.SpanStub, depth int)
	walk = func(level []tracetest.SpanStub, depth int) {
		slices.SortFunc(level, func(a, b tracetest.SpanStub) int {
			return cmp.Or(a.StartTime.Compare(b.StartTime), cmp.Compare(a.Name, b.Name),
				cmp.Compare(a.SpanContext.SpanID().String(), b.SpanContext.SpanID().String()))
		})
		for _, s := range level {
			kids := children[s.SpanContext.SpanID()]
			p.rows = append(p.rows, row{span: s, depth: depth, parent: len(kids) > 0})
			walk(kids, depth+1)
		}
	}
	walk(roots, 0)
	return p
}

// duration is the trace's length, at least a nanosecond so that the axis never divides
// by zero.
func (p *picture) duration() time.Duration {
	return max(p.end.Sub(p.start), time.Nanosecond)
}

// x is the horizontal pixel of instant t on the time axis.
func (p *picture) x(t time.Time) int {
	return timelineX + int(float64(t.Sub(p.start))/float64(p.duration())*float64(timelineW)+0.5)
}

// height is the picture's height: the header, the ruler, a row per span and a detail
// box per frame.
func (p *picture) height() int {
	h := headerH + rulerH + footerH
	for _, r := range p.rows {
		h += rowHeight(r)
	}
	return h
}

// rowHeight is a row's height: a frame's row has its detail box below.
func rowHeight(r row) int {
	if isFrame(r.span) {
		return rowH + detailH
	}
	return rowH
}

// rowTop is the top pixel of row i.
func (p *picture) rowTop(i int) int {
	y := headerH + rulerH
	for _, r := range p.rows[:i] {
		y += rowHeight(r)
	}
	return y
}

// barRect is where row i's bar is drawn: at least 2 pixels wide, as Jaeger draws a span
// too short to see.
func (p *picture) barRect(i int) image.Rectangle {
	s := p.rows[i].span
	x0, x1 := p.x(s.StartTime), p.x(s.EndTime)
	x1 = max(x1, x0+2)
	y := p.rowTop(i) + (rowH-barH)/2
	return image.Rect(x0, y, x1, y+barH)
}

// isFrame reports whether s is a transaction's frame span (it has tx.outcome).
func isFrame(s tracetest.SpanStub) bool {
	_, ok := attr(s, outcomeKey)
	return ok
}

// attr returns the value of s's attribute key as text, and whether s has it.
func attr(s tracetest.SpanStub, key attribute.Key) (string, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.Emit(), true
		}
	}
	return "", false
}

// barColor is the colour of s's bar: a frame's by its outcome, any other span's by its
// status (Jaeger colours by service; this trace has one).
func barColor(s tracetest.SpanStub) color.RGBA {
	o, frame := attr(s, outcomeKey)
	switch {
	case frame && strings.HasPrefix(o, "committed"):
		return colorCommitted
	case frame && o == "indeterminate":
		return colorIndeterminate
	case frame && o == "rolled_back", s.Status.Code == codes.Error:
		return colorError
	}
	return colorService
}

// spanService returns the service.name of s's resource, as Jaeger labels each row.
func spanService(s tracetest.SpanStub) string {
	if s.Resource != nil {
		if v, ok := s.Resource.Set().Value("service.name"); ok {
			return v.Emit()
		}
	}
	return "unknown_service"
}

// faces are the fonts the picture is written in: the Go fonts, built into x/image, so
// that the picture is the same on every machine.
type faces struct {
	regular, bold, small, title font.Face
}

// loadFaces parses the Go fonts at the picture's sizes.
func loadFaces() (*faces, error) {
	regular, err := opentype.Parse(goregular.TTF)
	if err != nil {
		return nil, err
	}
	bold, err := opentype.Parse(gobold.TTF)
	if err != nil {
		return nil, err
	}
	face := func(f *opentype.Font, size float64) (font.Face, error) {
		return opentype.NewFace(f, &opentype.FaceOptions{Size: size, DPI: 72, Hinting: font.HintingFull})
	}
	var fs faces
	for _, x := range []struct {
		dst  *font.Face
		f    *opentype.Font
		size float64
	}{{&fs.regular, regular, 13}, {&fs.bold, bold, 13}, {&fs.small, regular, 12}, {&fs.title, bold, 20}} {
		if *x.dst, err = face(x.f, x.size); err != nil {
			return nil, err
		}
	}
	return &fs, nil
}

// canvas is the image being drawn, with the fonts to write on it.
type canvas struct {
	img *image.RGBA
	f   *faces
}

// fill paints rectangle r in colour c.
func (c *canvas) fill(r image.Rectangle, col color.Color) {
	draw.Draw(c.img, r, image.NewUniform(col), image.Point{}, draw.Src)
}

// text writes s with its baseline at (x, y) and returns the x where it ends.
func (c *canvas) text(face font.Face, col color.Color, x, y int, s string) int {
	d := font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: face, Dot: fixed.P(x, y)}
	d.DrawString(s)
	return d.Dot.X.Ceil()
}

// textWidth is how many pixels s takes in face.
func textWidth(face font.Face, s string) int {
	return font.MeasureString(face, s).Ceil()
}

// fit shortens s with an ellipsis until it takes at most w pixels.
func fit(face font.Face, s string, w int) string {
	if textWidth(face, s) <= w {
		return s
	}
	r := []rune(s)
	for len(r) > 0 && textWidth(face, string(r)+"…") > w {
		r = r[:len(r)-1]
	}
	if len(r) == 0 {
		return ""
	}
	return string(r) + "…"
}

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

// shortRef shortens a reconciliation reference for the picture: each long number of
// it (the system identifier, the LSNs) keeps its first and last four digits.
func shortRef(ref string) string {
	prefix, rest, ok := strings.Cut(ref, ":")
	if !ok {
		prefix, rest = "", ref
	} else {
		prefix += ":"
	}
	parts := strings.Split(rest, "/")
	for i, part := range parts {
		if len(part) > 10 {
			parts[i] = part[:4] + "…" + part[len(part)-4:]
		}
	}
	return prefix + strings.Join(parts, "/")
}

// formatDuration writes d as Jaeger does: in the largest unit under which it is at least
// one, with at most two decimals.
func formatDuration(d time.Duration) string {
	trim := func(v float64, unit string) string {
		s := strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
		return s + unit
	}
	switch {
	case d == 0:
		return "0µs"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return trim(float64(d)/float64(time.Microsecond), "µs")
	case d < time.Second:
		return trim(float64(d)/float64(time.Millisecond), "ms")
	}
	return trim(d.Seconds(), "s")
}
