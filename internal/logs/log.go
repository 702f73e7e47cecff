package logs

import (
	"context"
	"log/slog"

	"github.com/txevidence/otelpgxtx/internal/record"
	"github.com/txevidence/otelpgxtx/internal/schema"
)

// Indeterminate writes one record per indeterminate frame, ended e, so that an
// unknown commit survives trace sampling: the operation id and reference are what
// reconciliation needs.
func Indeterminate(l *slog.Logger, e *record.Ending) {
	attrs := []slog.Attr{
		slog.String(string(schema.OperationIDKey), e.ID.String()),
		slog.String(string(schema.PhaseKey), e.Phase.String()),
		slog.String(string(schema.ErrorTypeKey), e.Verdict.Reason()),
	}
	if sc := e.Span; sc.HasTraceID() {
		attrs = append(attrs, slog.String(schema.TraceIDLogKey, sc.TraceID().String()), slog.String(schema.SpanIDLogKey, sc.SpanID().String()))
	}
	if e.Ref != nil {
		attrs = append(attrs, slog.String(string(schema.ReconciliationRefKey), e.Ref.String()))
	}
	if e.NoRef != "" {
		attrs = append(attrs, slog.String(string(schema.NoReferenceKey), e.NoRef))
	}
	if e.CommittedLocally {
		attrs = append(attrs, slog.Bool(string(schema.CommittedLocallyKey), true))
	}
	if e.Implicit {
		attrs = append(attrs, slog.Bool(string(schema.ImplicitKey), true))
	}
	l.LogAttrs(context.Background(), slog.LevelWarn, schema.MessageIndeterminate, attrs...)
}
