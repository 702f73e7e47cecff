package otelpgxtx

import (
	"context"
	"log/slog"

	"github.com/txevidence/otelpgxtx/internal/schema"
)

// logIndeterminate writes one record per indeterminate frame, ended e, so that an
// unknown commit survives trace sampling: the operation id and reference are what
// reconciliation needs.
func (t *core) logIndeterminate(e *ending) {
	attrs := []slog.Attr{
		slog.String(string(schema.OperationIDKey), e.id.String()),
		slog.String(string(phaseKey), e.phase.String()),
		slog.String(string(schema.ErrorTypeKey), e.verdict.Reason()),
	}
	if sc := e.span; sc.HasTraceID() {
		attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	if e.ref != nil {
		attrs = append(attrs, slog.String(string(schema.ReconciliationRefKey), e.ref.String()))
	}
	if e.noRef != "" {
		attrs = append(attrs, slog.String(string(schema.NoReferenceKey), e.noRef))
	}
	if e.committedLocally {
		attrs = append(attrs, slog.Bool(string(committedLocallyKey), true))
	}
	if e.implicit {
		attrs = append(attrs, slog.Bool(string(implicitKey), true))
	}
	t.cfg.logger().LogAttrs(context.Background(), slog.LevelWarn, messageIndeterminate, attrs...)
}

// MessageIndeterminate is the message of the log record written for each indeterminate
// frame ([WithLogger]); a log query selects these records by it, and those of
// [MessagePendingAtShutdown], for the operator's command (cmd/otelpgxtx). It says what
// is true when it is written — nothing may be replayed before the commit is settled —
// and stays true when [Retry] with [WithReconciler] settles it aborted and runs the
// attempt again. That settling is recorded in the trace (the otelpgxtx.retry span's
// tx.retry.settled event, then the next attempt's frames), not in a log record.
const MessageIndeterminate = messageIndeterminate
