package otelpgxtx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx/internal/hooks"
)

// Tracer is a pgx tracer that records one span per transaction frame, with the
// transaction's evidence phases as events and its outcome as tx.outcome and status. Set
// it as pgx.ConnConfig.Tracer, or use [InstrumentPool] or [InstrumentConnConfig], which
// also chain the notice and pool hooks it needs.
//
// It wraps an inner tracer that makes the statement spans (otelpgx by default) and
// parents every span that one starts inside a transaction to the transaction's frame
// span. It implements pgx.QueryTracer, pgx.BatchTracer, pgx.CopyFromTracer,
// pgx.PrepareTracer, pgx.ConnectTracer, pgxpool.AcquireTracer and pgxpool.ReleaseTracer.
type Tracer struct {
	// a is what the hooks do: the Tracer is only its public door.
	a hooks.Adapter
}

var (
	_ pgx.QueryTracer       = (*Tracer)(nil)
	_ pgx.BatchTracer       = (*Tracer)(nil)
	_ pgx.CopyFromTracer    = (*Tracer)(nil)
	_ pgx.PrepareTracer     = (*Tracer)(nil)
	_ pgx.ConnectTracer     = (*Tracer)(nil)
	_ pgxpool.AcquireTracer = (*Tracer)(nil)
	_ pgxpool.ReleaseTracer = (*Tracer)(nil)
)

// Close stops the tracer's automatic reconciliation ([WithAutoReconcile]), and the
// observation of the connection counts of the pool it instruments ([InstrumentPool]).
// An attempt in flight may finish until ctx is done, then it is cancelled. Every outcome
// not settled by then gets a warning log record
// ([MessagePendingAtShutdown], with its operation id and reference, on the [WithLogger]
// logger, else slog's default) for "otelpgxtx reconcile" to settle it after the restart,
// and is handed to the [WithOnReconciled] callback unknown with reason [reconcile.ReasonStopped];
// so is every frame that ends indeterminate after Close (its callback on a goroutine of
// its own, since the frame's may hold a lock of its connection's). Call it after the application
// stopped using the pool, and before closing the db it reconciles with. It returns
// ctx's error if ctx ended first; calling it again does nothing. A nil ctx is an error
// wrapping [ErrInvalidArgument], and closes nothing: call it again with a context.
func (t *Tracer) Close(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if ctx == nil {
		return invalid("Tracer.Close: nil context")
	}
	t.a.Pool.Close()
	if t.a.Auto == nil {
		return nil
	}
	return t.a.Auto.Close(ctx)
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *Tracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return t.a.TraceQueryStart(ctx, conn, data)
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *Tracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	t.a.TraceQueryEnd(ctx, conn, data)
}

// TraceBatchStart implements pgx.BatchTracer.
func (t *Tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	return t.a.TraceBatchStart(ctx, conn, data)
}

// TraceBatchQuery implements pgx.BatchTracer.
func (t *Tracer) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	t.a.TraceBatchQuery(ctx, conn, data)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *Tracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	t.a.TraceBatchEnd(ctx, conn, data)
}

// TraceCopyFromStart implements pgx.CopyFromTracer.
func (t *Tracer) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	return t.a.TraceCopyFromStart(ctx, conn, data)
}

// TraceCopyFromEnd implements pgx.CopyFromTracer.
func (t *Tracer) TraceCopyFromEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromEndData) {
	t.a.TraceCopyFromEnd(ctx, conn, data)
}

// TracePrepareStart implements pgx.PrepareTracer.
func (t *Tracer) TracePrepareStart(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareStartData) context.Context {
	return t.a.TracePrepareStart(ctx, conn, data)
}

// TracePrepareEnd implements pgx.PrepareTracer.
func (t *Tracer) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareEndData) {
	t.a.TracePrepareEnd(ctx, conn, data)
}

// TraceConnectStart implements pgx.ConnectTracer.
func (t *Tracer) TraceConnectStart(ctx context.Context, data pgx.TraceConnectStartData) context.Context {
	return t.a.TraceConnectStart(ctx, data)
}

// TraceConnectEnd implements pgx.ConnectTracer.
func (t *Tracer) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	t.a.TraceConnectEnd(ctx, data)
}

// TraceAcquireStart implements pgxpool.AcquireTracer.
func (t *Tracer) TraceAcquireStart(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireStartData) context.Context {
	return t.a.TraceAcquireStart(ctx, pool, data)
}

// TraceAcquireEnd implements pgxpool.AcquireTracer.
func (t *Tracer) TraceAcquireEnd(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	t.a.TraceAcquireEnd(ctx, pool, data)
}

// TraceRelease implements pgxpool.ReleaseTracer.
func (t *Tracer) TraceRelease(pool *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	t.a.TraceRelease(pool, data)
}
