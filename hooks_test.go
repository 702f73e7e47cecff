package otelpgxtx

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

func TestBeginBadInput(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	for name, db := range map[string]DB{
		"nil":            nil,
		"typed nil pool": (*pgxpool.Pool)(nil),
		"typed nil conn": (*pgx.Conn)(nil),
	} {
		rctx, tx, err := Begin(ctx, db, pgx.TxOptions{})
		if !errors.Is(err, ErrInvalidArgument) || tx != nil || rctx != ctx {
			t.Errorf("%s: tx %v, err %v; want an error wrapping ErrInvalidArgument", name, tx, err)
		}
	}
}

// innerCounter is an inner tracer that counts the calls of each hook.
// A Start with an already cancelled context is counted too: no statement of the
// application's starts that way, so it is the library's.
type innerCounter struct{ starts, ends, batchQueries, doneCtxStarts int }

func (c *innerCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.starts++
	if ctx.Err() != nil {
		c.doneCtxStarts++
	}
	return ctx
}
func (c *innerCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) { c.ends++ }
func (c *innerCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.starts++
	return ctx
}
func (c *innerCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.batchQueries++
}
func (c *innerCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) { c.ends++ }
func (c *innerCounter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	c.starts++
	return ctx
}
func (c *innerCounter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {
	c.ends++
}
func (c *innerCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.starts++
	return ctx
}
func (c *innerCounter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {
	c.ends++
}

// callAllHooks calls every statement hook of tr once, Start then End, on conn.
func callAllHooks(ctx context.Context, tr *Tracer, conn *pgx.Conn) {
	tr.TraceQueryEnd(tr.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: "select 1"}), conn, pgx.TraceQueryEndData{})
	bctx := tr.TraceBatchStart(ctx, conn, pgx.TraceBatchStartData{Batch: &pgx.Batch{}})
	tr.TraceBatchQuery(bctx, conn, pgx.TraceBatchQueryData{SQL: "select 1"})
	tr.TraceBatchEnd(bctx, conn, pgx.TraceBatchEndData{})
	tr.TraceCopyFromEnd(tr.TraceCopyFromStart(ctx, conn, pgx.TraceCopyFromStartData{}), conn, pgx.TraceCopyFromEndData{})
	tr.TracePrepareEnd(tr.TracePrepareStart(ctx, conn, pgx.TracePrepareStartData{}), conn, pgx.TracePrepareEndData{})
}

// TestHooksWithoutStateCallInner: with no connection state (no connection), every hook
// still calls the inner tracer, so that statement spans never vanish.
func TestHooksWithoutStateCallInner(t *testing.T) {
	inner := &innerCounter{}
	tr := mustTracer(t, WithInnerTracer(inner))
	callAllHooks(context.Background(), tr, nil)
	if inner.starts != 4 || inner.ends != 4 || inner.batchQueries != 1 {
		t.Fatalf("inner tracer saw %d starts, %d ends, %d batch queries; want 4, 4, 1", inner.starts, inner.ends, inner.batchQueries)
	}
}

// TestEndWithoutStart calls the End hooks on a real connection inside a transaction
// without their Start: nothing to end, no frame begun from a nil context, no panic,
// and the inner tracer still sees each End.
func TestEndWithoutStart(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	mustExec(t, ctx, conn, "begin")
	inner := &innerCounter{}
	tr := mustTracer(t, WithInnerTracer(inner))
	tr.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{})
	tr.TraceBatchEnd(ctx, conn, pgx.TraceBatchEndData{})
	tr.TraceCopyFromEnd(ctx, conn, pgx.TraceCopyFromEndData{})
	tr.TracePrepareEnd(ctx, conn, pgx.TracePrepareEndData{})
	if inner.ends != 4 {
		t.Fatalf("inner tracer saw %d ends, want 4", inner.ends)
	}
	if st := frame.State(conn.PgConn()); st.Frame() != nil || len(st.Queries) != 0 {
		t.Fatalf("state after unmatched ends: frame %v, %d queries", st.Frame(), len(st.Queries))
	}
}

// TestReleaseIdleWithFrame releases a connection whose transaction was ended through
// pgconn, where the tracer could not see it: the connection is idle, so the frame is
// not released_in_transaction: committed, as the server's COMMIT tag that pgconn read says.
func TestReleaseIdleWithFrame(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	pc := acquireInTransaction(t, ctx, h)
	if _, err := pc.Conn().PgConn().Exec(ctx, "commit").ReadAll(); err != nil {
		t.Fatal(err)
	}
	pc.Release()
	f := onlyFrame(t, h)
	wantAttr(t, f, "tx.outcome", "committed")
	h.wantNoFrames(t, ctx)
}

// uncomparableCtx is a context passed by value whose type == cannot compare: a
// comparison of two of them panics at run time.
type uncomparableCtx struct {
	context.Context
	tags []string
}

// TestUncomparableContext runs statements, in and out of a transaction, under a context
// of a type that == cannot compare: the hooks must match a query's End to its Start
// without comparing such contexts, which would panic.
func TestUncomparableContext(t *testing.T) {
	for _, inner := range []struct {
		name string
		opts []Option
	}{{"otelpgx", nil}, {"no inner tracer", []Option{WithInnerTracer(nil)}}} {
		t.Run(inner.name, func(t *testing.T) { testUncomparableContext(t, inner.opts...) })
	}
}

func testUncomparableContext(t *testing.T, opts ...Option) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1, opts...)
	uctx := uncomparableCtx{Context: ctx, tags: []string{"a"}}
	if _, err := h.pool.Exec(uctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	batch := &pgx.Batch{}
	batch.Queue("select 1")
	batch.Queue("select 2")
	if err := h.pool.SendBatch(uctx, batch).Close(); err != nil {
		t.Fatal(err)
	}
	tx, err := h.pool.Begin(uctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(uctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(uctx); err != nil {
		t.Fatal(err)
	}
	res := Run(uctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		var n int
		return n, tx.QueryRow(ctx, "select 1").Scan(&n)
	})
	if res.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("Run under an uncomparable context: %s", res.Outcome())
	}
	frames := h.frames()
	if len(frames) != 2 {
		t.Fatalf("%d frames, want 2", len(frames))
	}
	for _, f := range frames {
		wantAttr(t, f, "tx.outcome", "committed")
	}
	h.wantNoFrames(t, ctx)
}
