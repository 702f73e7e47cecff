package otelpgxtx

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/trace"
)

// InnerSpan names a kind of span the default otelpgx inner tracer makes, for
// [WithoutInnerSpans].
type InnerSpan uint8

const (
	// InnerSpanConnect: the "connect" span of each new connection.
	InnerSpanConnect InnerSpan = iota + 1
	// InnerSpanAcquire: the "pool.acquire" span of each acquire from a pool.
	InnerSpanAcquire
	// InnerSpanBatchQuery: the span of each query of a batch (otelpgx #54: thousands of
	// them under one batch); the batch's own span stays.
	InnerSpanBatchQuery
	// InnerSpanPrepare: the "prepare" span of each statement pgx prepares: implicitly, inside
	// a query (the first time a statement runs in pgx's default query mode, every time in
	// QueryExecModeDescribeExec), or explicitly (Conn.Prepare). By default an implicit
	// prepare is no span but a pgx.prepare event of its statement's span (see
	// [WithInnerSpans]); an explicit one, which has no statement span, stays a span.
	InnerSpanPrepare
	// InnerSpanTransactionControl: the statement spans of BEGIN (START TRANSACTION),
	// COMMIT (END), ROLLBACK (ABORT), their AND CHAIN forms, SAVEPOINT, RELEASE and ROLLBACK
	// TO, each sent alone as a query inside a recorded frame. By default they are no spans
	// but events of the frame (see [WithInnerSpans]).
	InnerSpanTransactionControl
	numInnerSpans
)

var innerSpanNames = [...]string{InnerSpanConnect: "connect", InnerSpanAcquire: "acquire",
	InnerSpanBatchQuery: "batch query", InnerSpanPrepare: "prepare",
	InnerSpanTransactionControl: "transaction control"}

// String names the kind.
func (k InnerSpan) String() string {
	if k >= InnerSpanConnect && k < numInnerSpans {
		return innerSpanNames[k]
	}
	return fmt.Sprintf("InnerSpan(%d)", uint8(k))
}

// omits reports whether the inner tracer's spans of kind k are turned off.
func (t *Tracer) omits(k InnerSpan) bool { return t.cfg.omitSpans&(1<<k) != 0 }

// folds reports whether the spans of kind k — InnerSpanTransactionControl, or the implicit
// prepares of InnerSpanPrepare — are events in place of spans: by default, with the
// default otelpgx inner tracer. A tracer of the application's gets every statement as pgx
// gives it and decides its own spans.
func (t *Tracer) folds(k InnerSpan) bool {
	return !t.cfg.innerSet && t.cfg.keepSpans&(1<<k) == 0
}

// innerStart runs start, an inner Start hook of kind k. For an omitted kind it is given a
// span that does not record, so otelpgx starts none (and still notes the start time for
// its metrics), and the caller's span is put back into what it returns, so that the work
// the hook precedes (a connect inside an acquire) is parented as without it.
func (t *Tracer) innerStart(k InnerSpan, ctx context.Context, start func(context.Context) context.Context) context.Context {
	if !t.omits(k) {
		return start(ctx)
	}
	return quietStart(ctx, start)
}

// quietStart runs start, an inner Start hook, with a span that does not record in place of
// ctx's, and puts ctx's span back into what it returns.
func quietStart(ctx context.Context, start func(context.Context) context.Context) context.Context {
	return trace.ContextWithSpan(start(withoutSpan(ctx)), trace.SpanFromContext(ctx))
}

// innerEnd returns the context for an inner End hook of kind k of a call that failed
// with err (nil: it did not): one without a span for an omitted kind — otelpgx ends "the
// span in the context", which must not be the caller's —, else one whose span cannot take
// the Error status of an expected error (innerEndStatus).
func (t *Tracer) innerEnd(k InnerSpan, ctx context.Context, err error) context.Context {
	if t.omits(k) {
		return withoutSpan(ctx)
	}
	return t.innerEndStatus(ctx, err)
}

// withoutSpan returns ctx with a span that does not record in place of its own.
func withoutSpan(ctx context.Context) context.Context { return trace.ContextWithSpan(ctx, noopSpan) }
