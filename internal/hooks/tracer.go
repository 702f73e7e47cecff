package hooks

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/framespan"
	"github.com/txevidence/otelpgxtx/internal/inner"
	"github.com/txevidence/otelpgxtx/internal/poolmetrics"
	"github.com/txevidence/otelpgxtx/internal/verdict"
)

// Adapter is the pgx hooks' side of the tracer: what each hook does, turned into the
// frames' events (query.go) beside the inner tracer's hooks and the pool metrics.
type Adapter struct {
	frame.Core
	Inner inner.Hooks
	// Pool records the connection-pool metrics (InstrumentPool), or is nil.
	Pool *poolmetrics.Metrics
	// named: a connection has a statement prepared by name (see frame.NamedStatements), which
	// the hooks look up; until then a query's SQL is taken as it is, with no lookup.
	named atomic.Bool
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *Adapter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s := t.Sanitized.Get(data.SQL) // one lookup for the statement's kinds and its text
	sql, set := t.statementOf(conn, data.SQL, s.Set)
	return t.startQuery(ctx, conn, set, sql, framespan.FoldControl, s.Op, func(ctx context.Context, _ bool) context.Context {
		return t.Inner.QueryStart(ctx, conn, data, s)
	})
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *Adapter) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	t.endQuery(ctx, conn, data.CommandTag, data.Err, func(ctx context.Context, _ bool) {
		t.Inner.QueryEnd(ctx, conn, data)
	})
}

// TraceBatchStart implements pgx.BatchTracer. A batch is handed to the driver whole, so
// a COMMIT anywhere in it marks committing before anything is sent.
func (t *Adapter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	set, beginSQL := t.classifyBatch(conn, data.Batch)
	return t.startQuery(ctx, conn, set, beginSQL, framespan.FoldNone, "", func(ctx context.Context, _ bool) context.Context {
		return t.Inner.BatchStart(ctx, conn, data)
	})
}

// TraceBatchQuery implements pgx.BatchTracer. The transaction status is not valid in
// the middle of a batch, so results are only collected here and judged at its end.
func (t *Adapter) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if st := t.State(frame.PgConn(conn)); st != nil {
		st.Mu.Lock()
		if q := st.Top(ctx); q != nil {
			if data.Err != nil && q.Batch.Err == nil {
				q.Batch.Err = data.Err
			}
			if data.CommandTag.String() == "ROLLBACK" && t.Sanitized.Get(data.SQL).Set.Decides() {
				q.Batch.RollbackTag = true
			}
		}
		st.Mu.Unlock()
	}
	t.Inner.BatchQuery(ctx, conn, data)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *Adapter) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	t.endQuery(ctx, conn, pgconn.CommandTag{}, data.Err, func(ctx context.Context, _ bool) {
		t.Inner.BatchEnd(ctx, conn, data)
	})
}

// TraceCopyFromStart implements pgx.CopyFromTracer. CopyFrom writes: its frame takes a
// commit reference at COMMIT, never the xid read after it (its data follows its query).
func (t *Adapter) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	return t.startQuery(ctx, conn, evidence.CopyFromSet, copyFromSQL, framespan.FoldNone, "", func(ctx context.Context, _ bool) context.Context {
		return t.Inner.CopyFromStart(ctx, conn, data)
	})
}

// copyFromSQL stands for the statement CopyFrom sends (pgx writes it itself): what the
// references read of it is that it is a COPY, after which nothing may be added.
const copyFromSQL = "copy"

// TraceCopyFromEnd implements pgx.CopyFromTracer.
func (t *Adapter) TraceCopyFromEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromEndData) {
	t.endQuery(ctx, conn, data.CommandTag, data.Err, func(ctx context.Context, _ bool) {
		t.Inner.CopyFromEnd(ctx, conn, data)
	})
}

// TracePrepareStart implements pgx.PrepareTracer. Preparing a statement runs nothing: it
// neither begins nor commits.
func (t *Adapter) TracePrepareStart(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareStartData) context.Context {
	t.prepareStarted(conn, data.Name, data.SQL)
	data.Name = t.Inner.StmtName(data.Name)
	return t.startQuery(ctx, conn, evidence.OtherSet, "", framespan.FoldPrepare, data.Name, func(ctx context.Context, folded bool) context.Context {
		return t.Inner.PrepareStart(ctx, conn, data, folded)
	})
}

// TracePrepareEnd implements pgx.PrepareTracer.
func (t *Adapter) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareEndData) {
	t.prepareEnded(conn, data.Err)
	t.endQuery(ctx, conn, pgconn.CommandTag{}, data.Err, func(ctx context.Context, folded bool) {
		t.Inner.PrepareEnd(ctx, conn, data, folded)
	})
}

// TraceConnectStart implements pgx.ConnectTracer.
func (t *Adapter) TraceConnectStart(ctx context.Context, data pgx.TraceConnectStartData) context.Context {
	ctx = t.Pool.ConnectStart(ctx)
	if t.Inner.Connect != nil {
		return t.Inner.Start(inner.KindConnect, ctx, func(ctx context.Context) context.Context {
			return t.Inner.Connect.TraceConnectStart(ctx, data)
		})
	}
	return ctx
}

// TraceConnectEnd implements pgx.ConnectTracer.
func (t *Adapter) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	t.Pool.ConnectEnd(ctx, data.Err)
	notReached(ctx, data.Err)
	if t.Inner.Connect != nil {
		ctx = t.Inner.End(inner.KindConnect, ctx, data.Err)
		data.Err = t.Inner.Err(data.Err)
		t.Inner.Connect.TraceConnectEnd(ctx, data)
	}
}

// notReached tells the Verdict of ctx, if any, that its transaction never reached the
// server when err, a failed Acquire's or Connect's, is not nil.
func notReached(ctx context.Context, err error) {
	if err != nil {
		if v := verdict.From(ctx); v != nil {
			v.NotStarted(err)
		}
	}
}

// TraceAcquireStart implements pgxpool.AcquireTracer.
func (t *Adapter) TraceAcquireStart(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireStartData) context.Context {
	ctx = t.Pool.AcquireStart(ctx)
	if t.Inner.Acquire != nil {
		return t.Inner.Start(inner.KindAcquire, ctx, func(ctx context.Context) context.Context {
			return t.Inner.Acquire.TraceAcquireStart(ctx, pool, data)
		})
	}
	return ctx
}

// TraceAcquireEnd implements pgxpool.AcquireTracer. An idle connection handed out with
// a frame still on it would classify unrelated work against an old transaction's
// evidence; the frame is concluded here as a last line of defence.
func (t *Adapter) TraceAcquireEnd(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	var ps *poolmetrics.ConnState
	if data.Conn != nil {
		if st := t.State(data.Conn.PgConn()); st != nil {
			st.Mu.Lock()
			if st.Frame() != nil && data.Conn.PgConn().TxStatus() == 'I' {
				t.Abandon(st, evidence.ReasonEndedUnobserved)
			}
			st.Mu.Unlock()
			ps = &st.Pool
		}
	}
	t.Pool.AcquireEnd(ctx, pool, ps, data.Err)
	notReached(ctx, data.Err)
	if t.Inner.Acquire != nil {
		ctx = t.Inner.End(inner.KindAcquire, ctx, data.Err)
		data.Err = t.Inner.Err(data.Err)
		t.Inner.Acquire.TraceAcquireEnd(ctx, pool, data)
	}
}

// TraceRelease implements pgxpool.ReleaseTracer. A connection released in the middle of
// a transaction is destroyed by the pool, which rolls the transaction back; one released
// idle or closed with a frame on it had its transaction end where no query showed it.
func (t *Adapter) TraceRelease(pool *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	if data.Conn != nil {
		if st := t.State(data.Conn.PgConn()); st != nil {
			t.Pool.Release(&st.Pool)
			st.Mu.Lock()
			if st.Frame() != nil {
				pg, reason := data.Conn.PgConn(), evidence.ReasonReleasedInTransaction
				if pg.IsClosed() {
					reason = evidence.ReasonConnectionClosed
				}
				t.Abandon(st, goneReason(st, pg, reason))
			}
			st.Mu.Unlock()
		}
	}
	if t.Inner.Release != nil {
		t.Inner.Release.TraceRelease(pool, data)
	}
}

// OnNotice sees every notice before the user's handler: the "already committed
// locally" warning is evidence for the frame in committing.
func (t *Adapter) OnNotice(pg *pgconn.PgConn, n *pgconn.Notice) {
	if !classifier.CommittedLocallyNotice(n) {
		return
	}
	// The warnings' texts and 57P01's meaning are PostgreSQL's own.
	if st := t.State(pg); st != nil && st.Server() == classifier.ServerPostgreSQL {
		st.Mu.Lock()
		st.Ev.Notice()
		st.Mu.Unlock()
	}
}

// ConnClosing concludes the frame of a connection about to be closed: its transaction
// rolls back with the session, unless the server's last ReadyForQuery said the session
// was idle (it ended where no query showed it).
func (t *Adapter) ConnClosing(conn *pgx.Conn) {
	if st := t.State(frame.PgConn(conn)); st != nil {
		st.Mu.Lock()
		t.Abandon(st, goneReason(st, conn.PgConn(), evidence.ReasonConnectionClosed))
		st.Mu.Unlock()
	}
}

// goneReason is why the frame of pg, which is closed or released with the frame open,
// ended: where no query showed it if the server's last ReadyForQuery said the session is
// idle (and then as the replies pgconn read say, see frame.Conn.SeenEnd), or if a
// statement went past the hooks with its reply not read (frame.Conn.WentPastHooks: a
// COMMIT on the PgConn whose reply a fault lost leaves the status in the transaction, and
// the session's end proves no rollback); else reason, the session having ended in the
// transaction.
func goneReason(st *frame.Conn, pg *pgconn.PgConn, reason string) string {
	if pg.TxStatus() == 'I' || st.WentPastHooks(pg) {
		return evidence.ReasonEndedUnobserved
	}
	return reason
}

// NetConnClosed concludes the frame of a connection whose net.Conn was closed, unless a
// query is in flight on it: then the connection's user is inside
// pgconn, will see the connection closed, and concludes the frame with what its query
// observed. It may run on any goroutine; st.mu orders it with the user's hooks. With no
// query in flight pgconn writes its transaction status no more, and the server's last
// ReadyForQuery idle means the transaction ended where no query showed it.
func (t *Adapter) NetConnClosed(st *frame.Conn) {
	st.Mu.Lock()
	defer st.Mu.Unlock()
	if f := st.Frame(); f != nil && len(st.Queries) == 0 {
		t.Abandon(st, goneReason(st, f.Conn, evidence.ReasonConnectionClosed))
	}
}
