package otelpgxtx

import (
	"fmt"

	"github.com/txevidence/otelpgxtx/internal/inner"
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
