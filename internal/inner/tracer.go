package inner

import (
	"context"

	"go.opentelemetry.io/otel/trace"
)

// Tracer returns the provider's tracer, wrapped.
func (p ExpectedStatusProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return expectedStatusTracer{p.TracerProvider.Tracer(name, opts...)}
}

// Start starts the span; in an expectedCtx (a type assertion, no lookup) it returns it
// wrapped in expectedSpan.
func (t expectedStatusTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx2, span := t.Tracer.Start(ctx, name, opts...)
	if _, ok := ctx.(expectedCtx); ok {
		span = ExpectedSpan{span}
		ctx2 = trace.ContextWithSpan(ctx2, span)
	}
	return ctx2, span
}
