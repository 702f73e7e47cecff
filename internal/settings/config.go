package settings

import (
	"context"
	"log/slog"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/auto"
	"github.com/txevidence/otelpgxtx/internal/reference"
)

// Config is the result of the options; unexported, as in opentelemetry-go-contrib.
type Config struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	SpanName       string
	Strict         bool // WithStatusMapping(StatusStrict)
	Inner          pgx.QueryTracer
	InnerSet       bool
	SanitizeInner  bool // WithSanitizedInnerTracer
	OtelpgxOptions []otelpgx.Option
	Log            *slog.Logger
	Auto           *auto.Config // WithAutoReconcile
	// Reference is what plain pgx commits carry (WithCommitReference, WithCommitMarker);
	// marker is the quoted marker table.
	Reference reference.Mode
	Marker    string
	// Set by the options grouped below WithOtelpgxOptions.
	SpanAttributes  []attribute.KeyValue
	MeterAttributes []attribute.KeyValue
	SpanNameFunc    func(ctx context.Context, begin string) string
	Filter          func(ctx context.Context, begin string) bool
	ImplicitFilter  func(ctx context.Context, sql string) bool // WithImplicitFilter; nil: every implicit transaction
	ImplicitSpans   bool                                       // WithImplicitFrameSpans: an implicit frame's span is its own
	NoConnDetails   bool
	// What may leave the process; both off by default.
	RawQueryText  bool
	ErrorMessages bool
	// Err is the first option refused (see refuse).
	Err error

	// Expected decides which failures leave span status Unset (WithExpectedErrors).
	Expected []func(ctx context.Context, err error) bool
	// OmitSpans has bit k set for each InnerSpan kind turned off (WithoutInnerSpans),
	// keepSpans for each made a span where by default it is an event (WithInnerSpans);
	// spansChosen: either option was given.
	OmitSpans, KeepSpans uint8
	SpansChosen          bool
	// The connection-pool metrics of InstrumentPool: WithPoolName, WithDisablePoolMetrics.
	PoolName      string
	NoPoolMetrics bool
}

// ExpectedErr reports whether err, a failure of a call made in ctx, is expected.
func (c *Config) ExpectedErr(ctx context.Context, err error) bool {
	if err == nil {
		return false
	}
	for _, fn := range c.Expected {
		if fn(ctx, err) {
			return true
		}
	}
	return false
}

// Logger is where the library's records go: WithLogger's logger, else slog's default at
// the time of the record (an application may set it after instrumenting).
func (c *Config) Logger() *slog.Logger {
	if l := c.Log; l != nil {
		return l
	}
	return slog.Default()
}

// The options of the commit references of plain pgx and database/sql frames:
// WithCommitReference and WithCommitMarker.

// References is what the commits of plain pgx frames carry (a Policy decides for Run's).
func (c *Config) References() reference.Refs {
	return reference.Refs{Mode: c.Reference, Marker: c.Marker}
}
