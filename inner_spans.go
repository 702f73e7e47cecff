package otelpgxtx

import (
	"fmt"

	"github.com/txevidence/otelpgxtx/internal/inner"
	"github.com/txevidence/otelpgxtx/internal/settings"
)

// InnerSpan names a kind of span the default otelpgx inner tracer makes, for
// [WithoutInnerSpans].
type InnerSpan uint8

const (
	// InnerSpanConnect: the "connect" span of each new connection.
	InnerSpanConnect = InnerSpan(inner.KindConnect)
	// InnerSpanAcquire: the "pool.acquire" span of each acquire from a pool.
	InnerSpanAcquire = InnerSpan(inner.KindAcquire)
	// InnerSpanBatchQuery: the span of each query of a batch (otelpgx #54: thousands of
	// them under one batch); the batch's own span stays.
	InnerSpanBatchQuery = InnerSpan(inner.KindBatchQuery)
	// InnerSpanPrepare: the "prepare" span of each statement pgx prepares: implicitly, inside
	// a query (the first time a statement runs in pgx's default query mode, every time in
	// QueryExecModeDescribeExec), or explicitly (Conn.Prepare). By default an implicit
	// prepare is no span but a pgx.prepare event of its statement's span (see
	// [WithInnerSpans]); an explicit one, which has no statement span, stays a span.
	InnerSpanPrepare = InnerSpan(inner.KindPrepare)
	// InnerSpanTransactionControl: the statement spans of BEGIN (START TRANSACTION),
	// COMMIT (END), ROLLBACK (ABORT), their AND CHAIN forms, SAVEPOINT, RELEASE and ROLLBACK
	// TO, each sent alone as a query inside a recorded frame. By default they are no spans
	// but events of the frame (see [WithInnerSpans]).
	InnerSpanTransactionControl = InnerSpan(inner.KindTransactionControl)
	numInnerSpans               = InnerSpanTransactionControl + 1
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

// WithoutInnerSpans turns off the default otelpgx inner tracer's spans of the given kinds.
// Only the spans go: every pgx tracer interface is still forwarded to otelpgx, whose
// metrics (db.client.operation.duration and its error count) still count each operation,
// and the frame's own hooks still run — a connection acquired or prepared without a span is
// tracked as before. The kinds whose spans are events by default stay events:
// InnerSpanTransactionControl (of the frame) and the implicit prepares of InnerSpanPrepare
// (of their statement), whose explicit prepares lose their spans. An unknown kind is an
// error, and so is this option with a tracer of your own ([WithInnerTracer], or a tracer
// the config already had), which decides its own spans.
func WithoutInnerSpans(kinds ...InnerSpan) Option {
	return innerSpansOption("WithoutInnerSpans", kinds, func(c *settings.Config, bit uint8) {
		c.OmitSpans |= bit
		c.KeepSpans &^= bit
	})
}

// WithInnerSpans makes the default otelpgx inner tracer's spans of the given kinds as
// otelpgx makes them, where by default they are events: InnerSpanTransactionControl, a
// statement span of its own for each BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE and
// ROLLBACK TO in place of the frame's events; InnerSpanPrepare, a span for each implicit
// prepare under its statement's span (named like it, by otelpgx; its
// otelpgx.WithQuerySpanNamePrefix, through [WithOtelpgxOptions], names them "prepare
// INSERT"). For the other kinds, spans by default, it undoes an earlier
// [WithoutInnerSpans]. An unknown kind is an error, and so is this option with a tracer of
// your own.
//
// The events hold what those spans said that the frame does not already (the package
// doc, "Statements as events"), for less: a transaction of BEGIN, one statement and COMMIT is then two
// spans, the frame and the statement, where otelpgx alone makes three.
func WithInnerSpans(kinds ...InnerSpan) Option {
	return innerSpansOption("WithInnerSpans", kinds, func(c *settings.Config, bit uint8) {
		c.KeepSpans |= bit
		c.OmitSpans &^= bit
	})
}

// innerSpansOption is the option named name that applies set to the bit of each kind.
func innerSpansOption(name string, kinds []InnerSpan, set func(c *settings.Config, bit uint8)) Option {
	return optionFunc(func(c *settings.Config) {
		for _, k := range kinds {
			if k < InnerSpanConnect || k >= numInnerSpans {
				refuse(&c.Err, invalid("%s: unknown kind %d", name, uint8(k)))
				return
			}
			set(c, 1<<k)
			c.SpansChosen = true
		}
	})
}

// checkOmitSpans refuses WithoutInnerSpans and WithInnerSpans with a tracer of the user's
// own.
func checkOmitSpans(c *settings.Config) error {
	if c.SpansChosen && c.InnerSet {
		return invalid("WithoutInnerSpans and WithInnerSpans apply to the default otelpgx inner tracer; a tracer of your own decides its own spans")
	}
	return nil
}
