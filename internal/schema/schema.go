// Package schema holds the names of the telemetry the otelpgxtx packages share: the
// instrumentation scope's version, and the attribute keys and span names that both the
// instrumentation (the root package) and the reconciler (package reconcile) record. The
// root package re-exports them, documented, in semconv.go: that is their home for users.
package schema

import "go.opentelemetry.io/otel/attribute"

// Version is the version of the instrumentation, for its tracers and meters.
const Version = "0.1.0"

// Keys and names both packages record.
const (
	OperationIDKey       = attribute.Key("tx.operation_id")
	ReconciliationRefKey = attribute.Key("tx.reconciliation.ref")
	ResolvedOutcomeKey   = attribute.Key("tx.outcome.resolved")
	ErrorTypeKey         = attribute.Key("error.type")
	DBSystemNameKey      = attribute.Key("db.system.name")
	SpanNameReconcile    = "tx.reconcile"
)

// DBSystemPostgreSQL is db.system.name=postgresql, on every span and metric.
var DBSystemPostgreSQL = DBSystemNameKey.String("postgresql")
