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
	// InnerSpanPrepare: the "prepare" span of each statement pgx prepares, implicitly the
	// first time a statement runs in its default query mode.
	InnerSpanPrepare
	numInnerSpans
)

var innerSpanNames = [...]string{InnerSpanConnect: "connect", InnerSpanAcquire: "acquire",
	InnerSpanBatchQuery: "batch query", InnerSpanPrepare: "prepare"}

// String names the kind.
func (k InnerSpan) String() string {
	if k >= InnerSpanConnect && k < numInnerSpans {
		return innerSpanNames[k]
	}
	return fmt.Sprintf("InnerSpan(%d)", uint8(k))
}

// WithoutInnerSpans turns off the default otelpgx inner tracer's spans of the given kinds.
// Only the spans go: every pgx tracer interface is still forwarded to otelpgx, whose
// metrics (db.client.operation.duration and its error count) still count each operation,
// and the frame's own hooks still run — a connection acquired or prepared without a span is
// tracked as before. An unknown kind is an error, and so is this option with a tracer of
// your own ([WithInnerTracer], or a tracer the config already had), which decides its own
// spans.
func WithoutInnerSpans(kinds ...InnerSpan) Option {
	return optionFunc(func(c *config) {
		for _, k := range kinds {
			if k < InnerSpanConnect || k >= numInnerSpans {
				c.err = fmt.Errorf("otelpgxtx: WithoutInnerSpans: unknown kind %d", uint8(k))
				return
			}
			c.omitSpans |= 1 << k
		}
	})
}

// checkOmitSpans refuses WithoutInnerSpans with a tracer of the user's own.
func (c *config) checkOmitSpans() error {
	if c.omitSpans != 0 && c.innerSet {
		return fmt.Errorf("otelpgxtx: WithoutInnerSpans applies to the default otelpgx inner tracer; a tracer of your own decides its own spans")
	}
	return nil
}

// omits reports whether the inner tracer's spans of kind k are turned off.
func (t *Tracer) omits(k InnerSpan) bool { return t.cfg.omitSpans&(1<<k) != 0 }

// innerStart runs start, an inner Start hook of kind k. For an omitted kind it is given a
// span that does not record, so otelpgx starts none (and still notes the start time for
// its metrics), and the caller's span is put back into what it returns, so that the work
// the hook precedes (a connect inside an acquire) is parented as without it.
func (t *Tracer) innerStart(k InnerSpan, ctx context.Context, start func(context.Context) context.Context) context.Context {
	if !t.omits(k) {
		return start(ctx)
	}
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
