package frame

import (
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/auto"
	"github.com/txevidence/otelpgxtx/internal/framespan"
	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/sanitize"
	"github.com/txevidence/otelpgxtx/internal/settings"
)

// Core is what every frame needs of its tracer: the configuration, the OpenTelemetry
// tracer of the frame spans, the outputs (metrics, automatic reconciliation), the
// sanitizer, and the crash recoveries logged. The hooks' adapter holds it; the frames
// end through it (Apply).
type Core struct {
	Cfg     settings.Config
	Tracer  trace.Tracer
	Metrics *metrics.Metrics
	// Auto reconciles indeterminate frames in the background (WithAutoReconcile), or is nil.
	Auto *auto.Reconciler
	// Sanitized holds, per SQL string, what the inner tracer is given of it.
	Sanitized sanitize.Sanitizer
	// Spans starts the frame spans.
	Spans framespan.Starter
	// recoveries are the ends of crash recoveries it logged (MessageCrashRecovered).
	recoveries SeenRecoveries
}
