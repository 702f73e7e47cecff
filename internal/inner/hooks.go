package inner

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx/internal/sanitize"
	"github.com/txevidence/otelpgxtx/internal/settings"
)

// Hooks is the inner tracer (otelpgx by default, or the application's), by each
// tracer interface it implements, and what it is handed: its spans are the statements'.
type Hooks struct {
	Cfg       *settings.Config
	Sanitized *sanitize.Sanitizer
	// AsIs: the inner tracer is the application's, and is handed what pgx hands a
	// tracer — SQL, errors, batches and statement names as they are — unless
	// WithSanitizedInnerTracer asks otherwise; its spans get no attribute of ours.
	AsIs bool

	query   pgx.QueryTracer
	batch   pgx.BatchTracer
	copy    pgx.CopyFromTracer
	prepare pgx.PrepareTracer
	Connect pgx.ConnectTracer
	Acquire pgxpool.AcquireTracer
	Release pgxpool.ReleaseTracer
}

// SetInner keeps each tracer interface inner implements, asserted once here rather than
// in every hook.
func (t *Hooks) SetInner(inner pgx.QueryTracer) {
	t.query = inner
	t.batch, _ = inner.(pgx.BatchTracer)
	t.copy, _ = inner.(pgx.CopyFromTracer)
	t.prepare, _ = inner.(pgx.PrepareTracer)
	t.Connect, _ = inner.(pgx.ConnectTracer)
	t.Acquire, _ = inner.(pgxpool.AcquireTracer)
	t.Release, _ = inner.(pgxpool.ReleaseTracer)
}
