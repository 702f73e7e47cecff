package inner

import (
	"context"

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
