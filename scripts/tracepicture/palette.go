package main

import (
	"image/color"
	"strings"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
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
