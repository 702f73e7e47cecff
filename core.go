package otelpgxtx

import (
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
)

// core is the tracer's parts, which the hooks of [Tracer] (tracer.go) drive and every
// layer below them uses: its configuration, the OpenTelemetry tracer of its transaction spans,
// its outputs (metrics, automatic reconciliation, the pool metrics), the sanitizer of what
// the inner tracer is given, and the inner tracer, by interface.
type core struct {
	cfg     config
	tracer  trace.Tracer
	metrics *metrics
	// auto reconciles indeterminate frames in the background (WithAutoReconcile), or is nil.
	auto *autoReconciler
	// pool records the connection-pool metrics (InstrumentPool), or is nil.
	pool *poolMetrics
	// sanitized holds, per SQL string, what the inner tracer is given of it.
	sanitized sanitizer
	// recoveries are the ends of crash recoveries it logged (MessageCrashRecovered).
	recoveries seenRecoveries
	// innerAsIs: the inner tracer is the application's, and is handed what pgx hands a
	// tracer — SQL, errors, batches and statement names as they are — unless
	// WithSanitizedInnerTracer asks otherwise; its spans get no attribute of ours.
	innerAsIs bool
	// named: a connection has a statement prepared by name (see prepared_names.go), which
	// the hooks look up; until then a query's SQL is taken as it is, with no lookup.
	named atomic.Bool

	query   pgx.QueryTracer
	batch   pgx.BatchTracer
	copy    pgx.CopyFromTracer
	prepare pgx.PrepareTracer
	connect pgx.ConnectTracer
	acquire pgxpool.AcquireTracer
	release pgxpool.ReleaseTracer
}

// setInner keeps each tracer interface inner implements, asserted once here rather than
// in every hook.
func (t *core) setInner(inner pgx.QueryTracer) {
	t.query = inner
	t.batch, _ = inner.(pgx.BatchTracer)
	t.copy, _ = inner.(pgx.CopyFromTracer)
	t.prepare, _ = inner.(pgx.PrepareTracer)
	t.connect, _ = inner.(pgx.ConnectTracer)
	t.acquire, _ = inner.(pgxpool.AcquireTracer)
	t.release, _ = inner.(pgxpool.ReleaseTracer)
}
