package inner

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// ExpectedSpan is a span that ended with an expected error: it takes every call but the
// Error status.
type ExpectedSpan struct{ trace.Span }

// expectedCtx marks the context of a batch query that failed with an expected error:
// otelpgx starts and ends that span inside one hook, from its own tracer, so the mark
// travels to the tracer the default otelpgx is given (expectedStatusTracer), which wraps
// the span it starts.
type expectedCtx struct{ context.Context }

// ExpectedStatusProvider is the tracer provider of the default otelpgx inner tracer: its
// tracers wrap the spans started in an expectedCtx. Any other start is the SDK's, as it is.
type ExpectedStatusProvider struct{ trace.TracerProvider }

type expectedStatusTracer struct{ trace.Tracer }

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

// SetStatus drops codes.Error, which an expected error must not set.
func (s ExpectedSpan) SetStatus(code codes.Code, description string) {
	if code != codes.Error {
		s.Span.SetStatus(code, description)
	}
}
