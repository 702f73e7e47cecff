// Package schema holds the names of the telemetry the otelpgxtx packages share: the
// instrumentation scope's version, the attribute keys and span names that both the
// instrumentation (the root package) and the reconciler (package reconcile) record, and
// the W3C traceparent form in which a frame's span travels to its reconciliation. The
// root package re-exports them, documented, in semconv.go: that is their home for users.
package schema

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Version is the version of the instrumentation, for its tracers and meters.
const Version = "0.1.0"

// Keys and names both packages record.
const (
	OperationIDKey       = attribute.Key("tx.operation_id")
	ReconciliationRefKey = attribute.Key("tx.reconciliation.ref")
	// NoReferenceKey says why a frame has no reference (the command prints it).
	NoReferenceKey = attribute.Key("tx.reconciliation.no_reference")
	// RecoveryKey is the field of the log record of a crash recovery (a reconcile.Recovery).
	RecoveryKey        = attribute.Key("tx.reconciliation.recovery")
	ResolvedOutcomeKey = attribute.Key("tx.outcome.resolved")
	ErrorTypeKey       = semconv.ErrorTypeKey
	DBSystemNameKey    = semconv.DBSystemNameKey
	SpanNameReconcile  = "tx.reconcile"
)

// DBSystemPostgreSQL is db.system.name=postgresql, on every span and metric.
var DBSystemPostgreSQL = semconv.DBSystemNamePostgreSQL

// TraceParent returns sc as a W3C traceparent value.
func TraceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	return carrier.Get("traceparent")
}

// SpanContextOf reads a W3C traceparent back into the span context to link
// to; an empty or malformed one gives the zero span context, which links nothing.
func SpanContextOf(tp string) trace.SpanContext {
	if tp == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
	return trace.SpanContextFromContext(ctx)
}

// The keys of the log records that name a frame's span (MessageIndeterminate,
// MessagePendingAtShutdown), which the command reads back: defined once, here.
const (
	TraceIDLogKey = "trace_id"
	SpanIDLogKey  = "span_id"
)
