package main

import (
	"cmp"
	"image"
	"slices"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
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
