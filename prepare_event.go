package otelpgxtx

import (
	"context"

	"github.com/exaring/otelpgx"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

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
func (t *core) foldsPrepare(ctx context.Context, q *queryState) bool {
	return q.nested && t.folds(InnerSpanPrepare) && trace.SpanFromContext(ctx).IsRecording()
}

// prepareEvent adds the event of q, a folded prepare that ended with err, to the
// statement's span in ctx (the context its Start hook returned: see innerPrepareStart).
func prepareEvent(ctx context.Context, q *queryState, err error) {
	a := answerOf("", q.start, err)
	attrs := make([]attribute.KeyValue, 0, 3)
	attrs = append(attrs, statementDurationKey.Float64(a.took.Seconds()))
	if q.op != "" {
		attrs = append(attrs, otelpgx.PrepareStmtNameKey.String(q.op))
	}
	if a.sqlState != "" {
		attrs = append(attrs, dbResponseStatusKey.String(a.sqlState))
	}
	trace.SpanFromContext(ctx).AddEvent(eventPrepare, trace.WithAttributes(attrs...))
}
