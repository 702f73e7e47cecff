package otelpgxtx

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
)

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
	inner          pgx.QueryTracer
	innerSet       bool
	sanitizeInner  bool // WithSanitizedInnerTracer
	otelpgxOptions []otelpgx.Option
	logger         *slog.Logger
	auto           *autoConfig // WithAutoReconcile
	// reference is what plain pgx commits carry (WithCaptureReference, WithCommitMarker);
	// marker is the quoted marker table.
	reference referenceMode
	marker    string
	// Set by the options grouped below WithOtelpgxOptions.
	spanAttributes  []attribute.KeyValue
	meterAttributes []attribute.KeyValue
	spanNameFunc    SpanNameCtxFunc
	filter          Filter
	noConnDetails   bool
	// What may leave the process; both off by default.
	rawQueryText  bool
	errorMessages bool
	err           error

	// expected decides which failures leave span status Unset (WithExpectedErrors).
	expected []ExpectedErrorFunc
	// omitSpans has bit k set for each InnerSpan kind turned off (WithoutInnerSpans),
	// keepSpans for each made a span where by default it is an event (WithInnerSpans);
	// spansChosen: either option was given.
	omitSpans, keepSpans uint8
	spansChosen          bool
	// The connection-pool metrics of InstrumentPool: WithPoolName, WithDisablePoolMetrics.
	poolName      string
	noPoolMetrics bool
}

// Option configures a [Tracer].
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// newConfig applies opts over the defaults: the global providers and DefaultSpanName.
func newConfig(opts []Option) config {
	c := config{
		tracerProvider: otel.GetTracerProvider(),
		meterProvider:  otel.GetMeterProvider(),
		spanName:       DefaultSpanName,
		expected:       defaultExpected,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// WithTracerProvider sets the tracer provider; the global one by default. A nil provider
// keeps the default. (A reconcile.Reconciler has an option of its own.)
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
// tracer built with the same providers). Besides pgx.QueryTracer it may implement any of
// pgx's other tracer interfaces and pgxpool's acquire and release tracers; each one it
// implements is forwarded, with the frame span as the parent of what it starts. nil turns
// statement spans off. It is the application's tracer, so it is handed exactly what pgx
// hands a tracer — SQL text, arguments, errors, batches and statement names — as it
// would be without this package, and its spans get no attribute of this package's;
// [WithSanitizedInnerTracer] hands it what the default otelpgx tracer gets instead.
// A tracer the connection config already has when it is instrumented is passed here.
func WithInnerTracer(inner pgx.QueryTracer) Option {
	return optionFunc(func(c *config) {
		c.inner, c.innerSet = inner, true
	})
}

// WithSanitizedInnerTracer hands an inner tracer of the application's ([WithInnerTracer],
// or the tracer the connection config had) what the default otelpgx tracer is handed:
// query text with every literal replaced by "?" (unless [WithRawQueryText]), errors
// redacted (unless [WithErrorMessages]), a copy of each batch with sanitized SQL, pgx's
// statement cache names replaced by "stmtcache", and db.query.summary on the spans it
// starts. Use it when that tracer sends what it is given out of the process. Without an
// inner tracer of the application's it changes nothing.
func WithSanitizedInnerTracer() Option {
	return optionFunc(func(c *config) { c.sanitizeInner = true })
}

// WithOtelpgxOptions passes options to the default otelpgx inner tracer (for example
// otelpgx.WithTrimSQLInSpanName()). The providers are set for it already, and so is its
// span name function: otelpgx.SQLOperationName, from the tracer's cache of SQL strings. They
// are passed after those, so an otelpgx.WithSpanNameFunc of yours replaces it.
func WithOtelpgxOptions(opts ...otelpgx.Option) Option {
	return optionFunc(func(c *config) {
		c.otelpgxOptions = append(c.otelpgxOptions, opts...)
	})
}

// ---- What is recorded, and under which name ----------------------------------------
// Names as in otelpgx and otelhttp where the meaning is the same.

// WithSpanAttributes adds attributes to every frame span, and to the statement spans of
// the default otelpgx inner tracer (otelpgx.WithTracerAttributes): service-level facts,
// not per-transaction ones. Metrics do not get them; see [WithMeterAttributes].
func WithSpanAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) {
		c.spanAttributes = append(c.spanAttributes, attrs...)
	})
}

// WithMeterAttributes adds attributes to every measurement of the transaction metrics,
// and of the default otelpgx inner tracer's metrics (otelpgx.WithMeterAttributes). Each
// distinct value is a time series of its own: keep them few and fixed.
func WithMeterAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) {
		c.meterAttributes = append(c.meterAttributes, attrs...)
	})
}

// SpanNameCtxFunc names a frame span from the context of the call that began the
// transaction and the text of its BEGIN statement as the statement spans record it:
// literals replaced by "?" unless [WithRawQueryText] is set, since a name leaves the
// process. The statement is "" for a transaction the tracer found already open; the next
// transaction of COMMIT AND CHAIN keeps the name (and the [Filter]'s decision) of the one
// it follows. An empty name keeps the [WithSpanName] one. It runs once per frame, on the
// caller's goroutine, and must be of low cardinality: it names a kind of transaction,
// never one transaction.
type SpanNameCtxFunc func(ctx context.Context, begin string) string

// WithSpanNameCtxFunc names frame spans with fn instead of [WithSpanName]'s fixed name.
// A nil fn keeps the fixed name.
func WithSpanNameCtxFunc(fn SpanNameCtxFunc) Option {
	return optionFunc(func(c *config) { c.spanNameFunc = fn })
}

// Filter decides, per transaction, whether its frame span is recorded; it gets what a
// [SpanNameCtxFunc] gets. A frame it rejects is still tracked — its outcome is still
// classified, counted in the metrics and logged by [WithLogger], and [Run] still returns
// its Result — but it has no span: its statement spans (and a tx.post_commit span) are
// made as without this package, children of the span in the caller's context, and a
// Result's TraceParent names that span.
type Filter func(ctx context.Context, begin string) bool

// WithFilter records a frame span only for the transactions for which every filter
// returns true. Filters run once per frame, on the caller's goroutine.
func WithFilter(f ...Filter) Option {
	return optionFunc(func(c *config) {
		for _, fn := range f {
			if fn == nil {
				continue
			}
			if prev := c.filter; prev != nil {
				c.filter = func(ctx context.Context, begin string) bool { return prev(ctx, begin) && fn(ctx, begin) }
			} else {
				c.filter = fn
			}
		}
	})
}

// WithDisableConnectionDetailsInAttributes leaves server.address, server.port and
// db.namespace out of frame spans, and out of the default otelpgx inner tracer's spans
// (otelpgx.WithDisableConnectionDetailsInAttributes): for a deployment whose host names
// or database names must not leave the process.
func WithDisableConnectionDetailsInAttributes() Option {
	return optionFunc(func(c *config) { c.noConnDetails = true })
}

// ---- end of the group -------------------------------------------------------------

// WithLogger sets a logger that receives one record per indeterminate outcome, with
// its operation id, trace id and reconciliation reference, so that an unknown commit is
// never lost to trace sampling. No logging by default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
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
// errors as they are. By default only the SQLSTATE, its class and the error's type are
// recorded. (A reconcile.Reconciler has an option of its own.)
//
// Warning: the full text may carry user data out of the process, as WithRawQueryText does.
func WithErrorMessages() Option {
	return optionFunc(func(c *config) { c.errorMessages = true })
}

// referenceMode is what the library adds to a plain pgx COMMIT for reconciliation.
type referenceMode uint8

const (
	referenceNone   referenceMode = iota // nothing: the default, no byte of the library's
	referenceXID                         // the xid read (WithCaptureReference)
	referenceMarker                      // the commit marker (WithCommitMarker)
)

// WithCaptureReference gives plain pgx and database/sql transactions — pool.Begin …
// Commit, pgx.BeginFunc, BeginTx, stdlib, a raw begin … commit — the reconciliation
// reference [Run] gives its own: the xid read (a fast-path call of
// pg_current_xact_id_if_assigned) is sent in the same write as the application's COMMIT,
// so it costs no round trip, and its reply is taken out of the stream: pgconn reads
// exactly the reply to its COMMIT. An indeterminate frame then carries
// tx.reconciliation.ref, for its log record, automatic reconciliation and the operator's
// command.
//
// What it needs is checked once per connection, outside any transaction, ahead of the
// first BEGIN in the same write (the cluster identity, and the privilege to call the
// function): a check that fails turns it off for that connection, with one log record.
// Only PostgreSQL servers get it. A COMMIT is left exactly as it is when the transaction is
// read-only or wrote nothing the library saw (only SELECT, SHOW, SET, … statements), or
// when it is not a lone simple-protocol Query (a batch, a pipeline, COMMIT AND CHAIN, BEGIN
// and COMMIT in one string, a COMMIT inside a function). See the README, "Commit
// references for plain pgx", for what it sends and costs.
func WithCaptureReference() Option {
	return optionFunc(func(c *config) {
		if c.reference == referenceNone {
			c.reference = referenceXID
		}
	})
}

// WithCommitMarker is [WithCaptureReference] with a commit marker: instead of the xid read,
// the frame's operation id is inserted into table (create it with reconcile.MarkerTableDDL) by a
// Query sent ahead of the application's COMMIT in the same write, so that the reference
// names a row
// that exists exactly when the transaction committed, even after a crash restart or a
// failover, and exists before any reply comes. The table and the role's INSERT privilege
// on it are checked with the cluster identity; without them the connection's commits
// carry the xid read alone.
func WithCommitMarker(table pgx.Identifier) Option {
	return optionFunc(func(c *config) {
		name, err := outcome.QuoteMarkerTable(table...)
		if err != nil {
			c.err = fmt.Errorf("otelpgxtx: WithCommitMarker: %w", err)
			return
		}
		c.reference, c.marker = referenceMarker, name
	})
}
