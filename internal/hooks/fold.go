package hooks

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/framespan"
	"github.com/txevidence/otelpgxtx/internal/inner"
)

// fold decides whether q, a query that enter has just recorded, is an event in place of a
// span (of kind k; op names it), marks it so, and returns the context its inner Start
// hook gets.
func (t *Adapter) fold(ctx context.Context, q *frame.QueryState, k framespan.FoldKind, op string) context.Context {
	switch {
	case k == framespan.FoldControl && t.foldsControl(q):
		q.Folded, q.Start, q.Op = true, time.Now(), op
		return q.Frame.Folds().StandInCtx(ctx)
	case k == framespan.FoldPrepare && t.foldsPrepare(ctx, q):
		q.Folded, q.Start, q.Op = true, time.Now(), op
	}
	return ctx
}

// foldsControl reports whether q is a transaction-control statement to record as an event
// of its frame: the frame's span records (else the statement would have no span either),
// and the option is on.
func (t *Adapter) foldsControl(q *frame.QueryState) bool {
	return !q.Nested && q.Frame != nil && q.Frame.Recording && q.Set.Control() &&
		t.Inner.Folds(inner.KindTransactionControl)
}

// An implicit prepare as an event of its statement's span (InnerSpanPrepare, folded by
// default). pgx prepares a statement inside the query that runs it — the first time in its
// default query mode, every time in QueryExecModeDescribeExec — and otelpgx makes that a
// span named like the statement, under the statement's span: INSERT under INSERT. The
// prepare is a step of the statement, so it is an eventPrepare event of the statement's
// span, with its duration, its statement name and its SQLSTATE; otelpgx still gets both
// hooks, under a span that does not record, and counts the prepare in its metrics as
// before. An explicit prepare (Conn.Prepare) has no statement around it and stays a span.

// foldsPrepare reports whether q, a prepare, is an implicit one whose statement's span
// records (in ctx, the statement's context), to be recorded as an event of that span.
func (t *Adapter) foldsPrepare(ctx context.Context, q *frame.QueryState) bool {
	return q.Nested && t.Inner.Folds(inner.KindPrepare) && trace.SpanFromContext(ctx).IsRecording()
}
