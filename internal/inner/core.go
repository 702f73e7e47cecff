package inner

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

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
