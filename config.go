package otelpgxtx

import (
	"context"
	"log/slog"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/settings"
)

// DefaultSpanName is the name of a frame span unless [WithSpanName] says otherwise;
// exported, like the frame span's attribute keys, for code that picks frame spans out.
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

// Option configures a [Tracer].
type Option interface {
	apply(*settings.Config)
}

type optionFunc func(*settings.Config)

func (f optionFunc) apply(c *settings.Config) { f(c) }

// newConfig applies opts over the defaults: the global providers and DefaultSpanName.
func newConfig(opts []Option) settings.Config {
	c := settings.Config{
		TracerProvider: otel.GetTracerProvider(),
		MeterProvider:  otel.GetMeterProvider(),
		SpanName:       DefaultSpanName,
		Expected:       defaultExpected,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// WithTracerProvider sets the tracer provider; the global one by default. A nil provider
// keeps the default; a typed nil one (a nil *sdktrace.TracerProvider) is an error, since
// it would panic at the first span. (A reconcile.Reconciler has an option of its own.)
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *settings.Config) {
		switch {
		case pg.IsNilHandle(tp):
			refuse(&c.Err, invalid("WithTracerProvider: nil %T", tp))
		case tp != nil:
			c.TracerProvider = tp
		}
	})
}

// WithMeterProvider sets the meter provider; the global one by default. A nil provider
// keeps the default; a typed nil one is an error.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *settings.Config) {
		switch {
		case pg.IsNilHandle(mp):
			refuse(&c.Err, invalid("WithMeterProvider: nil %T", mp))
		case mp != nil:
			c.MeterProvider = mp
		}
	})
}

// WithSpanName sets the name of frame spans ("transaction" by default). Keep it of low
// cardinality: it names a kind of transaction, never one transaction.
func WithSpanName(name string) Option {
	return optionFunc(func(c *settings.Config) {
		if name == "" {
			refuse(&c.Err, invalid("WithSpanName: empty span name"))
			return
		}
		c.SpanName = name
	})
}

// WithStatusMapping chooses how a committed frame's span status is set. An unknown value
// is an error.
func WithStatusMapping(m StatusMapping) Option {
	return optionFunc(func(c *settings.Config) {
		if m != StatusOkOnCommit && m != StatusStrict {
			refuse(&c.Err, invalid("WithStatusMapping: unknown status mapping %d", m))
			return
		}
		c.Strict = m == StatusStrict
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
// A typed nil tracer (a nil pointer of a tracer type) is an error.
func WithInnerTracer(inner pgx.QueryTracer) Option {
	return optionFunc(func(c *settings.Config) {
		if pg.IsNilHandle(inner) {
			refuse(&c.Err, invalid("WithInnerTracer: nil %T (a plain nil turns statement spans off)", inner))
			return
		}
		c.Inner, c.InnerSet = inner, true
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
	return optionFunc(func(c *settings.Config) { c.SanitizeInner = true })
}

// WithOtelpgxOptions passes options to the default otelpgx inner tracer (for example
// otelpgx.WithTrimSQLInSpanName()). The providers are set for it already, and so is its
// span name function: otelpgx.SQLOperationName, from the tracer's cache of SQL strings. They
// are passed after those, so an otelpgx.WithSpanNameFunc of yours replaces it. A nil
// option is an error (otelpgx would panic on it).
func WithOtelpgxOptions(opts ...otelpgx.Option) Option {
	return optionFunc(func(c *settings.Config) {
		for i, o := range opts {
			if o == nil || pg.IsNilHandle(o) {
				refuse(&c.Err, invalid("WithOtelpgxOptions: option %d is nil", i))
				return
			}
		}
		c.OtelpgxOptions = append(c.OtelpgxOptions, opts...)
	})
}

// ---- What is recorded, and under which name ----------------------------------------
// Names as in otelpgx and otelhttp where the meaning is the same.

// WithSpanAttributes adds attributes to every frame span, and to the statement spans of
// the default otelpgx inner tracer (otelpgx.WithTracerAttributes): service-level facts,
// not per-transaction ones. Metrics do not get them; see [WithMeterAttributes]. A key the
// library writes itself is an error naming it: every tx.* key, and the semantic
// conventions' keys it sets (db.system.name, db.namespace, db.operation.name,
// db.query.summary, db.response.status_code, error.type, server.address, server.port, the
// pool metrics' db.client.connection.*), so that tx.outcome=… is only ever a frame's.
func WithSpanAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *settings.Config) {
		if err := checkAttributes("WithSpanAttributes", attrs); err != nil {
			refuse(&c.Err, err)
			return
		}
		c.SpanAttributes = append(c.SpanAttributes, attrs...)
	})
}

// WithMeterAttributes adds attributes to every measurement of the transaction metrics,
// and of the default otelpgx inner tracer's metrics (otelpgx.WithMeterAttributes). Each
// distinct value is a time series of its own: keep them few and fixed. A key the library
// writes itself is an error, as with [WithSpanAttributes].
func WithMeterAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *settings.Config) {
		if err := checkAttributes("WithMeterAttributes", attrs); err != nil {
			refuse(&c.Err, err)
			return
		}
		c.MeterAttributes = append(c.MeterAttributes, attrs...)
	})
}

// SpanNameCtxFunc names a frame span from the context of the call that began the
// transaction and the text of its BEGIN statement as the statement spans record it:
// literals replaced by "?" unless [WithRawQueryText] is set, since a name leaves the
// process. The statement is "" for a transaction the tracer found already open; the next
// transaction of COMMIT AND CHAIN keeps the name (and the [Filter]'s decision) of the one
// it follows; for an implicit transaction's frame span it is the write itself, and a frame
// on its statement's span asks neither (see [WithImplicitFrameSpans]). An empty name keeps
// the [WithSpanName] one. It runs once per frame, on the
// caller's goroutine, and must be of low cardinality: it names a kind of transaction,
// never one transaction.
type SpanNameCtxFunc func(ctx context.Context, begin string) string

// WithSpanNameCtxFunc names frame spans with fn instead of [WithSpanName]'s fixed name.
// A nil fn keeps the fixed name.
func WithSpanNameCtxFunc(fn SpanNameCtxFunc) Option {
	return optionFunc(func(c *settings.Config) { c.SpanNameFunc = fn })
}

// Filter decides, per transaction, whether its frame span is recorded; it gets what a
// [SpanNameCtxFunc] gets. A frame it rejects is still tracked — its outcome is still
// classified, counted in the metrics and logged by [WithLogger], and [Run] still returns
// its Result — but it has no span: its statement spans (and a tx.post_commit span) are
// made as without this package, children of the span in the caller's context, and a
// Result's TraceParent names that span.
type Filter func(ctx context.Context, begin string) bool

// WithFilter records a frame span only for the transactions for which every filter
// returns true. Filters run once per frame, on the caller's goroutine. A nil filter is an
// error.
func WithFilter(f ...Filter) Option {
	return optionFunc(func(c *settings.Config) {
		if err := checkFuncs("WithFilter", f); err != nil {
			refuse(&c.Err, err)
			return
		}
		c.Filter = allOf(Filter(c.Filter), f)
	})
}

// checkFuncs refuses a nil function among fns, the arguments of option name: a nil
// function is a variable never set, not a wish for no filter.
func checkFuncs[F any](name string, fns []F) error {
	for i, fn := range fns {
		if pg.IsNilHandle(fn) {
			return invalid("%s: function %d is nil", name, i)
		}
	}
	return nil
}

// allOf returns a filter that passes what prev (nil: none) and every filter of fs that is
// not nil pass.
func allOf[F ~func(context.Context, string) bool](prev F, fs []F) F {
	for _, fn := range fs {
		if fn == nil {
			continue
		}
		if p := prev; p != nil {
			prev = func(ctx context.Context, s string) bool { return p(ctx, s) && fn(ctx, s) }
		} else {
			prev = fn
		}
	}
	return prev
}

// ImplicitFilter decides, per implicit transaction, whether it is a frame: a statement
// that may write (INSERT, UPDATE, DELETE, MERGE, DDL, COPY, CALL, SELECT … FOR UPDATE …),
// sent while the session is outside a transaction block — pool.Exec, a sqlc query on
// the pool, database/sql's ExecContext, a batch or CopyFrom without BEGIN —, which
// PostgreSQL runs in a transaction of its own and commits as soon as it has run. sql is
// the statement's text as the application wrote it (a batch's first): the filter runs in
// the process and records nothing. It must be fast and safe for concurrent use.
type ImplicitFilter func(ctx context.Context, sql string) bool

// WithImplicitFilter makes frames only of the implicit transactions for which every
// filter returns true. By default every one is a frame: its outcome is classified,
// recorded on its statement's span, counted (tx.implicit=true), logged when
// indeterminate, and told to a [Verdict]. One the filters reject is left as it was
// without this package: its statement span alone, no outcome, no count, no Verdict. To
// leave them all out:
//
//	otelpgxtx.WithImplicitFilter(func(context.Context, string) bool { return false })
//
// A nil filter is an error.
func WithImplicitFilter(f ...ImplicitFilter) Option {
	return optionFunc(func(c *settings.Config) {
		if err := checkFuncs("WithImplicitFilter", f); err != nil {
			refuse(&c.Err, err)
			return
		}
		c.ImplicitFilter = allOf(ImplicitFilter(c.ImplicitFilter), f)
	})
}

// WithImplicitFrameSpans gives every implicit transaction's frame a span of its own (named
// as [WithSpanName] says, the statement's span its child), as an explicit transaction's
// frame has, in place of the statement's span: one span more per autocommit write, and a
// frame span even where the statement has none — otelpgx starts none without a recording
// parent span, so an autocommit write made outside any trace is then a trace of its own
// (as the sampler decides). Without it, such a write has a span only when it did not
// commit. A tracer of the application's ([WithInnerTracer]) implies it: its spans are not
// the library's to write.
func WithImplicitFrameSpans() Option {
	return optionFunc(func(c *settings.Config) { c.ImplicitSpans = true })
}

// WithDisableConnectionDetailsInAttributes leaves server.address, server.port and
// db.namespace out of frame spans, and out of the default otelpgx inner tracer's spans
// (otelpgx.WithDisableConnectionDetailsInAttributes): for a deployment whose host names
// or database names must not leave the process.
func WithDisableConnectionDetailsInAttributes() Option {
	return optionFunc(func(c *settings.Config) { c.NoConnDetails = true })
}

// ---- end of the group -------------------------------------------------------------

// WithLogger sets the logger of the library's records: one per indeterminate outcome, with
// its operation id, trace id and reconciliation reference, so that an unknown commit is
// never lost to trace sampling; one per outcome still unsettled when the tracer closes
// (WithAutoReconcile); one when a connection's commit references are off, with why.
// Without it they go to slog.Default(), as the OpenTelemetry options default to the
// globals. None holds user data.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *settings.Config) { c.Log = l })
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
	return optionFunc(func(c *settings.Config) { c.RawQueryText = true })
}

// WithErrorMessages records errors with their full text: the server's message, which
// can quote the statement's values (invalid input syntax for type integer: "…"), in
// the statement spans' status descriptions and exception events, and post-commit hook
// errors as they are. By default only the SQLSTATE, its class and the error's type are
// recorded. (A reconcile.Reconciler has an option of its own.)
//
// Warning: the full text may carry user data out of the process, as WithRawQueryText does.
func WithErrorMessages() Option {
	return optionFunc(func(c *settings.Config) { c.ErrorMessages = true })
}

// ---- Which failures are errors ---------------------------------------------------

// WithExpectedErrors sets the functions that decide which failures are expected (see
// [ExpectedErrorFunc]); a failure is expected when one of them says so. It replaces the
// default, [CallerCanceled]: keep it in the list to keep it, and call WithExpectedErrors()
// with none to make every failure an Error, as otelpgx does. A nil function is an error.
//
// It applies to the frame spans, and to the statement, connect and acquire spans of the
// default otelpgx inner tracer; a tracer of your own ([WithInnerTracer]) sets its spans'
// status itself.
func WithExpectedErrors(fns ...ExpectedErrorFunc) Option {
	return optionFunc(func(c *settings.Config) {
		for i, fn := range fns {
			if fn == nil {
				refuse(&c.Err, invalid("WithExpectedErrors: function %d is nil", i))
				return
			}
		}
		c.Expected = make([]func(context.Context, error) bool, len(fns))
		for i, fn := range fns {
			c.Expected[i] = fn
		}
	})
}

// (Which statements are spans: WithInnerSpans and WithoutInnerSpans, inner_spans.go.)

// ---- The connection-pool metrics of InstrumentPool -------------------------------

// WithPoolName names the pool [InstrumentPool] instruments, as
// db.client.connection.pool.name. Without it the name is the first that the pool's
// configuration has of the semantic conventions' fallbacks (PR #4097): db.namespace (the
// database), the server target (address:port of its first host, or a Unix socket's
// directory), db.system.name ("postgresql"). Two instrumented pools of one process on the
// same database report to the same series unless each has a name of its own; the series
// also carry db.system.name, db.namespace, server.address and server.port, by which pools
// of different servers stay apart. An empty name is an error.
func WithPoolName(name string) Option {
	return optionFunc(func(c *settings.Config) {
		if name == "" {
			refuse(&c.Err, invalid("WithPoolName: empty pool name"))
			return
		}
		c.PoolName = name
	})
}

// WithDisablePoolMetrics turns off the connection-pool metrics [InstrumentPool] records
// (db.client.connection.*); the transaction metrics stay.
func WithDisablePoolMetrics() Option {
	return optionFunc(func(c *settings.Config) { c.NoPoolMetrics = true })
}

// refuse keeps err, a refused option value, in *first unless an earlier one was refused
// there: the first is the one reported (config.err, autoConfig.err).
func refuse(first *error, err error) {
	if *first == nil {
		*first = err
	}
}
