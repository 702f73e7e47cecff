package otelpgxtx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/evidence"
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
	core
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

// TraceQueryStart implements pgx.QueryTracer.
func (t *Tracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s := t.sanitized.get(data.SQL) // one lookup for the statement's kinds and its text
	sql, set := t.core.statementOf(conn, data.SQL, s.set)
	return t.core.startQuery(ctx, conn, set, sql, foldControl, s.op, func(ctx context.Context, _ bool) context.Context {
		return t.core.innerQueryStart(ctx, conn, data, s)
	})
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *Tracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	t.core.endQuery(ctx, conn, data.CommandTag, data.Err, func(ctx context.Context, _ bool) {
		t.core.innerQueryEnd(ctx, conn, data)
	})
}

// TraceBatchStart implements pgx.BatchTracer. A batch is handed to the driver whole, so
// a COMMIT anywhere in it marks committing before anything is sent.
func (t *Tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	set, beginSQL := t.core.classifyBatch(conn, data.Batch)
	return t.core.startQuery(ctx, conn, set, beginSQL, foldNone, "", func(ctx context.Context, _ bool) context.Context {
		return t.core.innerBatchStart(ctx, conn, data)
	})
}

// TraceBatchQuery implements pgx.BatchTracer. The transaction status is not valid in
// the middle of a batch, so results are only collected here and judged at its end.
func (t *Tracer) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if st := t.connStateOf(conn); st != nil {
		st.mu.Lock()
		if q := st.top(ctx); q != nil {
			if data.Err != nil && q.batch.err == nil {
				q.batch.err = data.Err
			}
			if data.CommandTag.String() == "ROLLBACK" && t.sanitized.get(data.SQL).set.Decides() {
				q.batch.rollbackTag = true
			}
		}
		st.mu.Unlock()
	}
	t.core.innerBatchQuery(ctx, conn, data)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *Tracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	t.core.endQuery(ctx, conn, pgconn.CommandTag{}, data.Err, func(ctx context.Context, _ bool) {
		t.core.innerBatchEnd(ctx, conn, data)
	})
}

// TraceCopyFromStart implements pgx.CopyFromTracer. CopyFrom writes: its frame takes a
// commit reference at COMMIT, never the xid read after it (its data follows its query).
func (t *Tracer) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	return t.core.startQuery(ctx, conn, evidence.CopyFromSet, copyFromSQL, foldNone, "", func(ctx context.Context, _ bool) context.Context {
		return t.core.innerCopyFromStart(ctx, conn, data)
	})
}

// copyFromSQL stands for the statement CopyFrom sends (pgx writes it itself): what the
// references read of it is that it is a COPY, after which nothing may be added.
const copyFromSQL = "copy"

// TraceCopyFromEnd implements pgx.CopyFromTracer.
func (t *Tracer) TraceCopyFromEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromEndData) {
	t.core.endQuery(ctx, conn, data.CommandTag, data.Err, func(ctx context.Context, _ bool) {
		t.core.innerCopyFromEnd(ctx, conn, data)
	})
}

// TracePrepareStart implements pgx.PrepareTracer. Preparing a statement runs nothing: it
// neither begins nor commits.
func (t *Tracer) TracePrepareStart(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareStartData) context.Context {
	t.core.prepareStarted(conn, data.Name, data.SQL)
	data.Name = t.core.innerStmtName(data.Name)
	return t.core.startQuery(ctx, conn, evidence.OtherSet, "", foldPrepare, data.Name, func(ctx context.Context, folded bool) context.Context {
		return t.core.innerPrepareStart(ctx, conn, data, folded)
	})
}

// TracePrepareEnd implements pgx.PrepareTracer.
func (t *Tracer) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareEndData) {
	t.core.prepareEnded(conn, data.Err)
	t.core.endQuery(ctx, conn, pgconn.CommandTag{}, data.Err, func(ctx context.Context, folded bool) {
		t.core.innerPrepareEnd(ctx, conn, data, folded)
	})
}

// TraceConnectStart implements pgx.ConnectTracer.
func (t *Tracer) TraceConnectStart(ctx context.Context, data pgx.TraceConnectStartData) context.Context {
	ctx = t.pool.connectStart(ctx)
	if t.connect != nil {
		return t.core.innerStart(InnerSpanConnect, ctx, func(ctx context.Context) context.Context {
			return t.connect.TraceConnectStart(ctx, data)
		})
	}
	return ctx
}

// TraceConnectEnd implements pgx.ConnectTracer.
func (t *Tracer) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	t.pool.connectEnd(ctx, data.Err)
	notReached(ctx, data.Err)
	if t.connect != nil {
		ctx = t.core.innerEnd(InnerSpanConnect, ctx, data.Err)
		data.Err = t.core.innerErr(data.Err)
		t.connect.TraceConnectEnd(ctx, data)
	}
}

// notReached tells the Verdict of ctx, if any, that its transaction never reached the
// server when err, a failed Acquire's or Connect's, is not nil.
func notReached(ctx context.Context, err error) {
	if err != nil {
		if v := verdictFrom(ctx); v != nil {
			v.notStarted(err)
		}
	}
}

// TraceAcquireStart implements pgxpool.AcquireTracer.
func (t *Tracer) TraceAcquireStart(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireStartData) context.Context {
	ctx = t.pool.acquireStart(ctx)
	if t.acquire != nil {
		return t.core.innerStart(InnerSpanAcquire, ctx, func(ctx context.Context) context.Context {
			return t.acquire.TraceAcquireStart(ctx, pool, data)
		})
	}
	return ctx
}

// TraceAcquireEnd implements pgxpool.AcquireTracer. An idle connection handed out with
// a frame still on it would classify unrelated work against an old transaction's
// evidence; the frame is concluded here as a last line of defence.
func (t *Tracer) TraceAcquireEnd(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	if data.Conn != nil {
		if st := t.connStateOf(data.Conn); st != nil {
			st.mu.Lock()
			if st.frame() != nil && data.Conn.PgConn().TxStatus() == 'I' {
				t.core.abandon(st, evidence.ReasonEndedUnobserved)
			}
			st.mu.Unlock()
		}
	}
	t.pool.acquireEnd(ctx, pool, poolState(data.Conn), data.Err)
	notReached(ctx, data.Err)
	if t.acquire != nil {
		ctx = t.core.innerEnd(InnerSpanAcquire, ctx, data.Err)
		data.Err = t.core.innerErr(data.Err)
		t.acquire.TraceAcquireEnd(ctx, pool, data)
	}
}

// TraceRelease implements pgxpool.ReleaseTracer. A connection released in the middle of
// a transaction is destroyed by the pool, which rolls the transaction back; one released
// idle or closed with a frame on it had its transaction end where no query showed it.
func (t *Tracer) TraceRelease(pool *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	t.pool.release(poolState(data.Conn))
	if data.Conn != nil {
		if st := t.connStateOf(data.Conn); st != nil {
			st.mu.Lock()
			if st.frame() != nil {
				pg, reason := data.Conn.PgConn(), evidence.ReasonReleasedInTransaction
				if pg.IsClosed() {
					reason = evidence.ReasonConnectionClosed
				}
				t.core.abandon(st, goneReason(pg, reason))
			}
			st.mu.Unlock()
		}
	}
	if t.release != nil {
		t.release.TraceRelease(pool, data)
	}
}

// onNotice sees every notice before the user's handler: the "already committed
// locally" warning is evidence for the frame in committing.
func (t *core) onNotice(pg *pgconn.PgConn, n *pgconn.Notice) {
	if !classifier.CommittedLocallyNotice(n) {
		return
	}
	// The warnings' texts and 57P01's meaning are PostgreSQL's own.
	if st := t.stateOf(pg); st != nil && st.server() == classifier.ServerPostgreSQL {
		st.mu.Lock()
		st.ev.Notice()
		st.mu.Unlock()
	}
}

// connClosing concludes the frame of a connection about to be closed: its transaction
// rolls back with the session, unless the server's last ReadyForQuery said the session
// was idle (it ended where no query showed it).
func (t *core) connClosing(conn *pgx.Conn) {
	if st := t.connStateOf(conn); st != nil {
		st.mu.Lock()
		t.abandon(st, goneReason(conn.PgConn(), evidence.ReasonConnectionClosed))
		st.mu.Unlock()
	}
}

// goneReason is why the frame of pg, which is closed or released with the frame open,
// ended: where no query showed it if the server's last ReadyForQuery said the session is
// idle (and then as the replies pgconn read say, see connState.seenEnd), else reason, the
// session having ended in the transaction.
func goneReason(pg *pgconn.PgConn, reason string) string {
	if pg.TxStatus() == 'I' {
		return evidence.ReasonEndedUnobserved
	}
	return reason
}

// netConnClosed concludes the frame of a connection whose net.Conn was closed, unless a
// query is in flight on it: then the connection's user is inside
// pgconn, will see the connection closed, and concludes the frame with what its query
// observed. It may run on any goroutine; st.mu orders it with the user's hooks. With no
// query in flight pgconn writes its transaction status no more, and the server's last
// ReadyForQuery idle means the transaction ended where no query showed it.
func (t *core) netConnClosed(st *connState) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if f := st.frame(); f != nil && len(st.queries) == 0 {
		t.abandon(st, goneReason(f.conn, evidence.ReasonConnectionClosed))
	}
}

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
	t.pool.close()
	if t.auto == nil {
		return nil
	}
	return t.auto.close(ctx)
}

// expectedStatusProvider is the tracer provider of the default otelpgx inner tracer: its
// tracers wrap the spans started in an expectedCtx. Any other start is the SDK's, as it is.
type expectedStatusProvider struct{ trace.TracerProvider }

// Tracer returns the provider's tracer, wrapped.
func (p expectedStatusProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return expectedStatusTracer{p.TracerProvider.Tracer(name, opts...)}
}

type expectedStatusTracer struct{ trace.Tracer }

// Start starts the span; in an expectedCtx (a type assertion, no lookup) it returns it
// wrapped in expectedSpan.
func (t expectedStatusTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx2, span := t.Tracer.Start(ctx, name, opts...)
	if _, ok := ctx.(expectedCtx); ok {
		span = expectedSpan{span}
		ctx2 = trace.ContextWithSpan(ctx2, span)
	}
	return ctx2, span
}
