package otelpgxtx

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/exaring/otelpgx"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope name of the tracer and meter.
const ScopeName = "github.com/txevidence/otelpgxtx"

// Version is the version of this instrumentation.
func Version() string { return "0.1.0" }

// DefaultSpanName is the name of a frame span unless [WithSpanName] says otherwise.
const DefaultSpanName = "transaction"

// StatusMapping says which span status a committed frame gets.
type StatusMapping uint8

const (
	// StatusOkOnCommit (the default) sets Ok on a frame whose commit was confirmed: here
	// Ok has the documented meaning "commit confirmed".
	StatusOkOnCommit StatusMapping = iota
	// StatusStrict never sets Ok, as the OpenTelemetry specification asks of
	// instrumentation that is not configured otherwise; tx.outcome still says committed.
	StatusStrict
)

// config is the result of the options; unexported, as in opentelemetry-go-contrib.
type config struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	spanName       string
	status         StatusMapping
	inner          any
	innerSet       bool
	otelpgxOptions []otelpgx.Option
	attributes     []attribute.KeyValue
	logger         *slog.Logger
	// For the Reconciler.
	reconcileWait     time.Duration
	reconcileInterval time.Duration
	// What may leave the process; both off by default.
	rawQueryText  bool
	errorMessages bool
	err           error
}

// Option configures a [Tracer].
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

func newConfig(opts []Option) config {
	c := config{
		tracerProvider:    otel.GetTracerProvider(),
		meterProvider:     otel.GetMeterProvider(),
		spanName:          DefaultSpanName,
		reconcileWait:     5 * time.Second,
		reconcileInterval: 50 * time.Millisecond,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// WithTracerProvider sets the tracer provider; the global one by default. A nil provider
// keeps the default.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) {
		if tp != nil {
			c.tracerProvider = tp
		}
	})
}

// WithMeterProvider sets the meter provider; the global one by default. A nil provider
// keeps the default.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.meterProvider = mp
		}
	})
}

// WithSpanName sets the name of frame spans ("transaction" by default). Keep it of low
// cardinality: it names a kind of transaction, never one transaction.
func WithSpanName(name string) Option {
	return optionFunc(func(c *config) {
		if name == "" {
			c.err = fmt.Errorf("otelpgxtx: WithSpanName: empty span name")
			return
		}
		c.spanName = name
	})
}

// WithStatusMapping chooses how a committed frame's span status is set. An unknown value
// is an error.
func WithStatusMapping(m StatusMapping) Option {
	return optionFunc(func(c *config) {
		if m != StatusOkOnCommit && m != StatusStrict {
			c.err = fmt.Errorf("otelpgxtx: WithStatusMapping: unknown status mapping %d", m)
			return
		}
		c.status = m
	})
}

// WithInnerTracer replaces the tracer that makes statement spans (by default an otelpgx
// tracer built with the same providers). It may implement any of pgx's tracer interfaces
// and pgxpool's acquire and release tracers; each one it implements is forwarded, with
// the frame span as the parent of what it starts. nil turns statement spans off. It is
// given sanitized SQL and redacted errors, as otelpgx is (see [WithRawQueryText] and
// [WithErrorMessages]); statement arguments reach it unchanged.
func WithInnerTracer(inner any) Option {
	return optionFunc(func(c *config) {
		c.inner, c.innerSet = inner, true
	})
}

// WithOtelpgxOptions passes options to the default otelpgx inner tracer (for example
// otelpgx.WithTrimSQLInSpanName()). The providers are set for it already.
func WithOtelpgxOptions(opts ...otelpgx.Option) Option {
	return optionFunc(func(c *config) {
		c.otelpgxOptions = append(c.otelpgxOptions, opts...)
	})
}

// WithAttributes adds attributes to every frame span (service-level facts, not
// per-transaction ones).
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) {
		c.attributes = append(c.attributes, attrs...)
	})
}

// WithLogger sets a logger that receives one record per indeterminate outcome, with
// its operation id, trace id and reconciliation reference, so that an unknown commit is
// never lost to trace sampling. No logging by default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// WithReconcileWait bounds how long a [Reconciler] polls a transaction that is still in
// progress (a backend can sit in a synchronous-replication wait), and how often; 5 s and
// 50 ms by default. A zero wait asks once.
func WithReconcileWait(wait, interval time.Duration) Option {
	return optionFunc(func(c *config) {
		if wait < 0 || interval <= 0 {
			c.err = fmt.Errorf("otelpgxtx: WithReconcileWait: wait must be >= 0 and interval > 0, got %v, %v", wait, interval)
			return
		}
		c.reconcileWait, c.reconcileInterval = wait, interval
	})
}

// WithRawQueryText records query text as the application wrote it (db.query.text of
// the statement spans, and their names if otelpgx.WithFullSQLInSpanName is set), instead
// of the default text with every literal replaced by "?" and comments removed.
//
// Warning: raw text carries every literal of every statement — passwords of CREATE ROLE
// and ALTER ROLE, card numbers, e-mail addresses — to wherever the traces go: collectors,
// vendors and dashboards with wider access than the database. Statement parameters
// ($1 …) are not recorded either way unless otelpgx.WithIncludeQueryParameters is passed.
func WithRawQueryText() Option {
	return optionFunc(func(c *config) { c.rawQueryText = true })
}

// WithErrorMessages records errors with their full text: the server's message, which
// can quote the statement's values (invalid input syntax for type integer: "…"), in
// the statement spans' status descriptions and exception events, and post-commit hook
// and reconciliation errors as they are. By default only the SQLSTATE, its class and
// the error's type are recorded.
//
// Warning: the full text may carry user data out of the process, as WithRawQueryText does.
func WithErrorMessages() Option {
	return optionFunc(func(c *config) { c.errorMessages = true })
}
