package main

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// outcomeKey is the frame span's tx.outcome: a span that has it is a transaction's frame.
const outcomeKey = attribute.Key("tx.outcome")

// detailKeys are the frame attributes written under a frame's row, in this order: what a
// reader of the trace settles an outcome from.
var detailKeys = []attribute.Key{"tx.outcome", "error.type", "tx.phase", "tx.commit.committed_locally", "tx.reconciliation.xid"}

// isFrame reports whether s is a transaction's frame span (it has tx.outcome).
func isFrame(s tracetest.SpanStub) bool {
	_, ok := attr(s, outcomeKey)
	return ok
}

// attr returns the value of s's attribute key as text, and whether s has it.
func attr(s tracetest.SpanStub, key attribute.Key) (string, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.String(), true
		}
	}
	return "", false
}

// spanService returns the service.name of s's resource, as Jaeger labels each row.
func spanService(s tracetest.SpanStub) string {
	if s.Resource != nil {
		if v, ok := s.Resource.Set().Value("service.name"); ok {
			return v.String()
		}
	}
	return "unknown_service"
}
