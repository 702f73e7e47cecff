package otelpgxtx

import (
	"context"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
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
	cfg     config
	tracer  trace.Tracer
	metrics *metrics

	query   pgx.QueryTracer
	batch   pgx.BatchTracer
	copy    pgx.CopyFromTracer
	prepare pgx.PrepareTracer
	connect pgx.ConnectTracer
	acquire pgxpool.AcquireTracer
	release pgxpool.ReleaseTracer
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

// NewTracer returns a tracer. An invalid option value is reported to otel.Handle and
// ignored; [InstrumentPool] and [InstrumentConnConfig] return it as an error instead.
func NewTracer(opts ...Option) *Tracer {
	t, err := newTracer(opts)
	if err != nil {
		otel.Handle(err)
	}
	return t
}

func newTracer(opts []Option) (*Tracer, error) {
	cfg := newConfig(opts)
	t := &Tracer{
		cfg:     cfg,
		tracer:  cfg.tracerProvider.Tracer(ScopeName, trace.WithInstrumentationVersion(Version())),
		metrics: newMetrics(cfg.meterProvider, cfg.meterAttributes),
	}
	inner := cfg.inner
	if !cfg.innerSet {
		oo := []otelpgx.Option{
			otelpgx.WithTracerProvider(cfg.tracerProvider),
			otelpgx.WithMeterProvider(cfg.meterProvider),
			otelpgx.WithTracerAttributes(cfg.spanAttributes...),
			otelpgx.WithMeterAttributes(cfg.meterAttributes...),
		}
		if cfg.noConnDetails {
			oo = append(oo, otelpgx.WithDisableConnectionDetailsInAttributes())
		}
		inner = otelpgx.NewTracer(append(oo, cfg.otelpgxOptions...)...)
	}
	t.setInner(inner)
	return t, cfg.err
}

func (t *Tracer) setInner(inner pgx.QueryTracer) {
	t.query = inner
	t.batch, _ = inner.(pgx.BatchTracer)
	t.copy, _ = inner.(pgx.CopyFromTracer)
	t.prepare, _ = inner.(pgx.PrepareTracer)
	t.connect, _ = inner.(pgx.ConnectTracer)
	t.acquire, _ = inner.(pgxpool.AcquireTracer)
	t.release, _ = inner.(pgxpool.ReleaseTracer)
}

// withFrame makes f's span the parent of what the inner tracer starts. It allocates only
// when someone records and ctx does not already carry the frame's span (inside Run or
// Begin it does): an unsampled frame under an unsampled caller costs nothing.
func withFrame(ctx context.Context, f *frame) context.Context {
	if f == nil || f.unrecorded {
		return ctx
	}
	in := trace.SpanFromContext(ctx)
	if !f.span.IsRecording() && !in.IsRecording() || sameSpan(in, f.span) {
		return ctx
	}
	return trace.ContextWithSpan(ctx, f.span)
}

// sameSpan reports whether a and b are one span. Spans are told apart by their ids,
// never with ==: a span's dynamic type need not be comparable (the SDK's non-recording
// span is not, and == on two of them panics). Only a recording span is compared: its ids
// are its own, where a no-op span may carry its parent's.
func sameSpan(a, b trace.Span) bool {
	if !a.IsRecording() || !b.IsRecording() {
		return false
	}
	sa, sb := a.SpanContext(), b.SpanContext()
	return sa.SpanID() == sb.SpanID() && sa.TraceID() == sb.TraceID()
}

var noopSpan = noop.Span{}

// unframe hides f's span from an inner End hook that did not start a span of its own:
// inner tracers end "the span in ctx", and that must never be the frame's (DESIGN.md §7).
// A span that does not record has nothing an End hook could change.
func unframe(ctx context.Context, f *frame) context.Context {
	if f != nil && sameSpan(trace.SpanFromContext(ctx), f.span) {
		return trace.ContextWithSpan(ctx, noopSpan)
	}
	return ctx
}

// enter records the start of a statement (or batch, copy, prepare) on conn and returns
// the context for the inner tracer. A call made while another is in flight on the same
// connection — pgx's implicit prepare inside a query — is part of that one: it neither
// moves the phase nor re-parents what the inner tracer starts to the frame.
func (t *Tracer) enter(ctx context.Context, conn *pgx.Conn, st *connState, set stmtSet, sql string) (context.Context, queryState) {
	if len(st.queries) > 0 {
		return ctx, queryState{set: set, frame: st.queries[len(st.queries)-1].frame, nested: true}
	}
	f := t.beginStatement(ctx, conn, st, set, sql)
	q := queryState{set: set, frame: f, callerCtx: ctx}
	if set.savepoint() {
		q.savepoint = savepointName(sql)
	}
	return withFrame(ctx, f), q
}

// leave records the end of what enter started.
func (t *Tracer) leave(conn *pgx.Conn, st *connState, q *queryState, tag pgconn.CommandTag, err error) {
	if !q.nested {
		t.endStatement(conn, st, q, tag, err)
	}
}

// beginStatement runs before a statement (or batch) reaches the driver: it starts a
// frame for a BEGIN, and marks committing before a COMMIT is handed over.
func (t *Tracer) beginStatement(ctx context.Context, conn *pgx.Conn, st *connState, set stmtSet, beginSQL string) *frame {
	pg := conn.PgConn()
	f := st.frame
	if f != nil && pg.TxStatus() == 'I' {
		// The transaction ended where we could not see it; its frame must not ride
		// into this unrelated work.
		t.abandon(st, f, reasonEndedUnobserved)
		f = nil
	}
	if f == nil && set.has(stmtBegin) && pg.TxStatus() == 'I' {
		f = t.startFrame(ctx, conn, st, outcome.PhaseNotStarted, beginSQL, nil)
		if f.span.IsRecording() { // they are only ever attributes
			_, rest := classifyOne(beginSQL)
			f.isolation, f.accessMode = beginOptions(rest)
		}
	}
	if f != nil && set.commits() {
		if f.currentPhase() == outcome.PhaseNotStarted {
			f.transition(outcome.PhaseActive) // BEGIN and COMMIT in one string
		}
		f.transition(outcome.PhaseCommitting)
	}
	return f
}

// endStatement runs after a statement (or batch) completed, when the connection's
// transaction status is known again. It is where evidence becomes a verdict.
func (t *Tracer) endStatement(conn *pgx.Conn, st *connState, q *queryState, tag pgconn.CommandTag, err error) {
	pg := conn.PgConn()
	closed := pg.IsClosed()
	status := pg.TxStatus()
	inTx := !closed && (status == 'T' || status == 'E')
	f := q.frame
	if f == nil || !f.open() {
		if inTx && st.frame == nil {
			// A transaction we did not see begin (BEGIN inside a string we could not
			// read): track it from here rather than not at all.
			t.startFrame(q.callerCtx, conn, st, outcome.PhaseActive, "", nil)
		}
		return
	}
	facts := classifier.Facts{ConnClosed: closed, CommittedLocally: f.committedLocally,
		RollbackTag: q.batch.rollbackTag || tag.String() == "ROLLBACK"}
	if q.batch.err != nil && err == nil {
		err = q.batch.err
	}
	switch f.currentPhase() {
	case outcome.PhaseNotStarted:
		if !inTx {
			f.finish(st, classifier.Classify(outcome.PhaseNotStarted, err, facts))
			break
		}
		f.transition(outcome.PhaseActive)
		t.activeStatement(st, f, q, err, facts, inTx)
	case outcome.PhaseCommitting:
		f.finish(st, classifier.Classify(outcome.PhaseCommitting, err, facts))
	case outcome.PhaseActive:
		t.activeStatement(st, f, q, err, facts, inTx)
	}
	if q.set.chains() && inTx && st.frame == nil && err == nil {
		// AND CHAIN began the next transaction at once, with the same characteristics.
		next := t.startFrame(f.startCtx(), conn, st, outcome.PhaseActive, "", f)
		next.isolation, next.accessMode = f.isolation, f.accessMode
	}
}

func (t *Tracer) activeStatement(st *connState, f *frame, q *queryState, err error, facts classifier.Facts, inTx bool) {
	if err != nil && !f.hasErr {
		f.firstErr, f.hasErr = classifier.Classify(outcome.PhaseActive, err, facts), true
	}
	switch {
	case q.set.rollsBack() || !inTx:
		v := classifier.Classify(outcome.PhaseActive, err, facts)
		if f.hasErr {
			// The rollback is the consequence; the first failure is the cause.
			v = f.firstErr
		}
		f.finish(st, v)
	case err == nil && q.set.savepoint() && f.span.IsRecording():
		name := EventSavepointCreated
		switch {
		case q.set.has(stmtRelease):
			name = EventSavepointReleased
		case q.set.has(stmtRollbackTo):
			name = EventSavepointRolledBack
		}
		f.span.AddEvent(name, trace.WithAttributes(SavepointNameKey.String(q.savepoint)))
	}
}

// abandon ends a frame whose transaction ended where no statement showed it: the
// connection was released mid-transaction, closed, or found idle. Evidence of commit it
// cannot have; if COMMIT was sent, the outcome is unknown.
func (t *Tracer) abandon(st *connState, f *frame, reason string) {
	if !f.open() {
		return
	}
	if f.currentPhase() == outcome.PhaseCommitting {
		v, _ := classifier.NewVerdict(classifier.EvidenceUnknown, false, "", reason)
		f.finish(st, v)
		return
	}
	v, _ := classifier.NewVerdict(classifier.EvidenceRolledBack, false, "", reason)
	f.hasErr = true
	f.finish(st, v)
}

// Reasons for frames that ended without a statement showing it.
const (
	reasonEndedUnobserved = "ended_unobserved"
	reasonReleasedInTx    = "released_in_transaction"
	reasonConnClosed      = "connection_closed"
)

// savepointName returns the name after SAVEPOINT, RELEASE [SAVEPOINT] or ROLLBACK [WORK|
// TRANSACTION] TO [SAVEPOINT], as a substring of sql (no allocation).
func savepointName(sql string) string {
	kind, rest := classifyOne(sql)
	if kind == stmtRelease || kind == stmtRollbackTo {
		if w, r := nextWord(rest); eq(w, "savepoint") {
			rest = r
		}
	}
	rest = skipSpace(rest)
	i := 0
	for i < len(rest) && rest[i] != ';' && rest[i] != ' ' && rest[i] != '\n' && rest[i] != '\t' {
		i++
	}
	return rest[:i]
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *Tracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	st := connStateOf(conn)
	if st == nil {
		return ctx
	}
	ctx, q := t.enter(ctx, conn, st, classifyStatements(data.SQL), data.SQL)
	if t.query != nil {
		ctx = t.query.TraceQueryStart(ctx, conn, data)
	}
	q.ctx = ctx
	st.push(q)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *Tracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	st := connStateOf(conn)
	if st == nil {
		return
	}
	q := st.pop(ctx)
	if t.query != nil {
		t.query.TraceQueryEnd(unframe(ctx, q.frame), conn, data)
	}
	t.leave(conn, st, &q, data.CommandTag, data.Err)
}

// TraceBatchStart implements pgx.BatchTracer. A batch is handed to the driver whole, so
// a COMMIT anywhere in it marks committing before anything is sent.
func (t *Tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	st := connStateOf(conn)
	if st == nil {
		return ctx
	}
	var set stmtSet
	beginSQL := ""
	if data.Batch != nil {
		for i, qq := range data.Batch.QueuedQueries {
			s := classifyStatements(qq.SQL)
			if i == 0 || beginSQL == "" && s.has(stmtBegin) {
				beginSQL = qq.SQL
			}
			set |= s
		}
	}
	ctx, q := t.enter(ctx, conn, st, set.transactional(), beginSQL)
	if t.batch != nil {
		ctx = t.batch.TraceBatchStart(ctx, conn, data)
	}
	q.ctx = ctx
	st.push(q)
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer. The transaction status is not valid in
// the middle of a batch, so results are only collected here and judged at its end.
func (t *Tracer) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if st := connStateOf(conn); st != nil {
		if q := st.top(ctx); q != nil {
			if data.Err != nil && q.batch.err == nil {
				q.batch.err = data.Err
			}
			if data.CommandTag.String() == "ROLLBACK" && classifyStatements(data.SQL).commits() {
				q.batch.rollbackTag = true
			}
		}
	}
	if t.batch != nil {
		t.batch.TraceBatchQuery(ctx, conn, data)
	}
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *Tracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	st := connStateOf(conn)
	if st == nil {
		return
	}
	q := st.pop(ctx)
	if t.batch != nil {
		t.batch.TraceBatchEnd(unframe(ctx, q.frame), conn, data)
	}
	t.leave(conn, st, &q, pgconn.CommandTag{}, data.Err)
}

// TraceCopyFromStart implements pgx.CopyFromTracer.
func (t *Tracer) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	st := connStateOf(conn)
	if st == nil {
		return ctx
	}
	ctx, q := t.enter(ctx, conn, st, 1<<stmtOther, "")
	if t.copy != nil {
		ctx = t.copy.TraceCopyFromStart(ctx, conn, data)
	}
	q.ctx = ctx
	st.push(q)
	return ctx
}

// TraceCopyFromEnd implements pgx.CopyFromTracer.
func (t *Tracer) TraceCopyFromEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromEndData) {
	st := connStateOf(conn)
	if st == nil {
		return
	}
	q := st.pop(ctx)
	if t.copy != nil {
		t.copy.TraceCopyFromEnd(unframe(ctx, q.frame), conn, data)
	}
	t.leave(conn, st, &q, data.CommandTag, data.Err)
}

// TracePrepareStart implements pgx.PrepareTracer.
func (t *Tracer) TracePrepareStart(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareStartData) context.Context {
	st := connStateOf(conn)
	if st == nil {
		return ctx
	}
	// Preparing a statement runs nothing: it neither begins nor commits.
	ctx, q := t.enter(ctx, conn, st, 1<<stmtOther, "")
	if t.prepare != nil {
		ctx = t.prepare.TracePrepareStart(ctx, conn, data)
	}
	q.ctx = ctx
	st.push(q)
	return ctx
}

// TracePrepareEnd implements pgx.PrepareTracer.
func (t *Tracer) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareEndData) {
	st := connStateOf(conn)
	if st == nil {
		return
	}
	q := st.pop(ctx)
	if t.prepare != nil {
		t.prepare.TracePrepareEnd(unframe(ctx, q.frame), conn, data)
	}
	t.leave(conn, st, &q, pgconn.CommandTag{}, data.Err)
}

// TraceConnectStart implements pgx.ConnectTracer.
func (t *Tracer) TraceConnectStart(ctx context.Context, data pgx.TraceConnectStartData) context.Context {
	if t.connect != nil {
		return t.connect.TraceConnectStart(ctx, data)
	}
	return ctx
}

// TraceConnectEnd implements pgx.ConnectTracer.
func (t *Tracer) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	if t.connect != nil {
		t.connect.TraceConnectEnd(ctx, data)
	}
}

// TraceAcquireStart implements pgxpool.AcquireTracer.
func (t *Tracer) TraceAcquireStart(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireStartData) context.Context {
	if t.acquire != nil {
		return t.acquire.TraceAcquireStart(ctx, pool, data)
	}
	return ctx
}

// TraceAcquireEnd implements pgxpool.AcquireTracer. An idle connection handed out with
// a frame still on it would classify unrelated work against an old transaction's
// evidence; the frame is ended here as a last line of defence.
func (t *Tracer) TraceAcquireEnd(ctx context.Context, pool *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	if data.Conn != nil {
		if st := connStateOf(data.Conn); st != nil && st.frame != nil && data.Conn.PgConn().TxStatus() == 'I' {
			t.abandon(st, st.frame, reasonEndedUnobserved)
		}
	}
	if t.acquire != nil {
		t.acquire.TraceAcquireEnd(ctx, pool, data)
	}
}

// TraceRelease implements pgxpool.ReleaseTracer. A connection released in the middle of
// a transaction is destroyed by the pool, which rolls the transaction back.
func (t *Tracer) TraceRelease(pool *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	if data.Conn != nil {
		if st := connStateOf(data.Conn); st != nil && st.frame != nil {
			t.abandon(st, st.frame, reasonReleasedInTx)
		}
	}
	if t.release != nil {
		t.release.TraceRelease(pool, data)
	}
}

// onNotice sees every notice before the user's handler: the "already committed
// locally" warning is evidence for the frame in committing.
func (t *Tracer) onNotice(pg *pgconn.PgConn, n *pgconn.Notice) {
	if !classifier.CommittedLocallyNotice(n) {
		return
	}
	if st := stateOf(pg); st != nil && st.frame != nil && st.frame.currentPhase() == outcome.PhaseCommitting {
		st.frame.committedLocally = true
	}
}

// connClosing ends the frame of a connection about to be closed.
func (t *Tracer) connClosing(conn *pgx.Conn) {
	if st := connStateOf(conn); st != nil && st.frame != nil {
		t.abandon(st, st.frame, reasonConnClosed)
	}
}
