package otelpgxtx

import (
	"context"
	"reflect"
	"strings"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
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
	// auto reconciles indeterminate frames in the background (WithAutoReconcile), or is nil.
	auto *autoReconciler
	// sanitized holds, per SQL string, what the inner tracer is given of it.
	sanitized sanitizer

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
	if cfg.err == nil && cfg.auto != nil {
		var err error
		if t.auto, err = newAutoReconciler(t, cfg.auto); err != nil {
			return t, err
		}
	}
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

// innerSQL returns what the inner tracer is given of sql: its sanitized text unless
// [WithRawQueryText] was passed. s carries its db.query.summary.
func (t *Tracer) innerSQL(sql string) (string, *sanitized) {
	s := t.sanitized.get(sql)
	if t.cfg.rawQueryText {
		return sql, s
	}
	return s.text, s
}

// innerErr returns what the inner tracer is given of err: see [recordedError].
func (t *Tracer) innerErr(err error) error { return recordedError(err, t.cfg.errorMessages) }

// recordedError returns what may be recorded of err: all of it only if full (the
// [WithErrorMessages] option), for a server message can quote the statement's values.
func recordedError(err error, full bool) error {
	if full {
		return err
	}
	return redactError(err)
}

// startedSpan returns the span an inner Start hook put into after, or nil if it started
// none that records.
func startedSpan(before, after context.Context) trace.Span {
	span := trace.SpanFromContext(after)
	if !span.IsRecording() || sameSpan(span, trace.SpanFromContext(before)) {
		return nil
	}
	return span
}

// batchSummary returns db.query.summary of a batch as the semantic conventions define
// it: "BATCH " and its statements' summary when they share one, else "BATCH".
func (t *Tracer) batchSummary(b *pgx.Batch) attribute.KeyValue {
	common := ""
	for i, q := range b.QueuedQueries {
		sum := ""
		if s := t.sanitized.get(q.SQL); len(s.summary) > 0 {
			sum = s.summary[0].Value.AsString()
		}
		if i > 0 && sum != common {
			common = ""
			break
		}
		common = sum
	}
	if common == "" {
		return dbQuerySummaryKey.String("BATCH")
	}
	return dbQuerySummaryKey.String("BATCH " + common)
}

// innerBatch returns the batch an inner tracer is given: the default otelpgx tracer
// reads only its length, but a user's tracer may read its SQL, which it then gets
// sanitized, in a copy (the queued queries are the caller's).
func (t *Tracer) innerBatch(b *pgx.Batch) *pgx.Batch {
	if b == nil || !t.cfg.innerSet || t.cfg.rawQueryText {
		return b
	}
	c := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, len(b.QueuedQueries))}
	for i, q := range b.QueuedQueries {
		c.QueuedQueries[i] = &pgx.QueuedQuery{SQL: t.sanitized.get(q.SQL).text, Arguments: q.Arguments}
	}
	return c
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
	if sameContext(ctx, f.framedIn) {
		return f.framedOut // a transaction's statements mostly share the caller's context
	}
	f.framedIn, f.framedOut = ctx, trace.ContextWithSpan(ctx, f.span)
	return f.framedOut
}

// sameContext reports whether a and b are one context. Only pointers are compared: ==
// on two values of a non-comparable context type panics.
func sameContext(a, b context.Context) bool {
	return a != nil && reflect.TypeOf(a).Kind() == reflect.Pointer && a == b
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
// inner tracers end "the span in ctx", and that must never be the frame's (see
// "Composition with the inner tracer" in the package documentation).
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
		t.abandon(st, f, ReasonEndedUnobserved)
		f = nil
	}
	if f == nil && set.has(stmtBegin) && pg.TxStatus() == 'I' {
		f = t.startFrame(ctx, conn, st, outcome.PhaseNotStarted, beginSQL, nil)
		if f.span.IsRecording() { // they are only ever attributes
			_, rest := classifyOne(beginSQL)
			f.isolation, f.accessMode = beginOptions(rest)
		}
	}
	if f != nil && set.commits() && !pg.IsBusy() {
		// A busy connection (a result the application has not read) refuses the
		// statement before sending a byte: COMMIT never leaves, so the phase stays.
		if f.currentPhase() == outcome.PhaseNotStarted {
			f.transition(outcome.PhaseActive) // BEGIN and COMMIT in one string
		}
		f.transition(outcome.PhaseCommitting)
		st.armCommit(f)
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
		st.commitFacts(f, &facts)
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

// Reasons of a frame whose transaction ended where no statement showed it, written as
// error.type beside the [classifier] reasons: the frame is rolled_back (unknown if COMMIT
// had been sent). They are the tracer's, not the classifier's, because only the tracer
// sees pool releases, closed connections and idle sessions.
const (
	// ReasonEndedUnobserved: the connection was found outside a transaction at its next
	// statement, acquire or release: the transaction was ended by a path that bypasses
	// pgx's tracer (a statement sent through *pgconn.PgConn directly).
	ReasonEndedUnobserved = "ended_unobserved"
	// ReasonReleasedInTransaction: the connection went back to the pool in the middle of
	// the transaction; the pool destroys it, which rolls the transaction back.
	ReasonReleasedInTransaction = "released_in_transaction"
	// ReasonConnectionClosed: the connection closed with the transaction open (a
	// *pgx.Conn closed mid-transaction, a connection database/sql discards).
	ReasonConnectionClosed = "connection_closed"
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
	return t.start(ctx, conn, classifyStatements(data.SQL), data.SQL, func(ctx context.Context) context.Context {
		return t.innerQueryStart(ctx, conn, data)
	})
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *Tracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	t.end(ctx, conn, data.CommandTag, data.Err, func(ctx context.Context) {
		t.innerQueryEnd(ctx, conn, data)
	})
}

// innerQueryStart hands a statement's start to the inner tracer, sanitized.
func (t *Tracer) innerQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if t.query == nil {
		return ctx
	}
	var s *sanitized
	data.SQL, s = t.innerSQL(data.SQL)
	inner := t.query.TraceQueryStart(ctx, conn, data)
	if span := startedSpan(ctx, inner); span != nil && s.summary != nil {
		span.SetAttributes(s.summary...)
	}
	return inner
}

// innerQueryEnd hands a statement's end to the inner tracer, its error redacted.
func (t *Tracer) innerQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if t.query != nil {
		data.Err = t.innerErr(data.Err)
		t.query.TraceQueryEnd(ctx, conn, data)
	}
}

// start is the body of every Start hook: it records the start of a statement of kinds
// set, lets the inner tracer start its span (inner), and pushes what its End needs. With
// no state on the connection, or while Run closes pgx's Tx object, only inner runs — for
// the latter not even that (see closePgxTx).
func (t *Tracer) start(ctx context.Context, conn *pgx.Conn, set stmtSet, sql string, inner func(context.Context) context.Context) context.Context {
	st := connStateOf(conn)
	if st == nil {
		return inner(ctx) // no frame to parent to, but the statement span stays
	}
	if st.silent {
		return ctx
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	ctx, q := t.enter(ctx, conn, st, set, sql)
	ctx = inner(ctx)
	q.ctx = ctx
	st.push(q)
	return ctx
}

// end is the body of every End hook: it pops what start pushed, lets the inner tracer
// end its span (inner), and judges the statement. An End without its Start has nothing
// to judge.
func (t *Tracer) end(ctx context.Context, conn *pgx.Conn, tag pgconn.CommandTag, err error, inner func(context.Context)) {
	st := connStateOf(conn)
	var q queryState
	started := false
	if st != nil {
		if st.silent {
			return
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		q, started = st.pop(ctx)
	}
	inner(unframe(ctx, q.frame))
	if started {
		t.leave(conn, st, &q, tag, err)
	}
}

// TraceBatchStart implements pgx.BatchTracer. A batch is handed to the driver whole, so
// a COMMIT anywhere in it marks committing before anything is sent.
func (t *Tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
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
	return t.start(ctx, conn, set.transactional(), beginSQL, func(ctx context.Context) context.Context {
		if t.batch != nil {
			inner := data
			inner.Batch = t.innerBatch(data.Batch)
			innerCtx := t.batch.TraceBatchStart(ctx, conn, inner)
			if span := startedSpan(ctx, innerCtx); span != nil && data.Batch != nil {
				span.SetAttributes(t.batchSummary(data.Batch))
			}
			ctx = innerCtx
		}
		return ctx
	})
}

// TraceBatchQuery implements pgx.BatchTracer. The transaction status is not valid in
// the middle of a batch, so results are only collected here and judged at its end.
func (t *Tracer) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if st := connStateOf(conn); st != nil {
		st.mu.Lock()
		if q := st.top(ctx); q != nil {
			if data.Err != nil && q.batch.err == nil {
				q.batch.err = data.Err
			}
			if data.CommandTag.String() == "ROLLBACK" && classifyStatements(data.SQL).commits() {
				q.batch.rollbackTag = true
			}
		}
		st.mu.Unlock()
	}
	if t.batch != nil {
		data.SQL, _ = t.innerSQL(data.SQL)
		data.Err = t.innerErr(data.Err)
		t.batch.TraceBatchQuery(ctx, conn, data)
	}
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *Tracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	t.end(ctx, conn, pgconn.CommandTag{}, data.Err, func(ctx context.Context) {
		if t.batch != nil {
			data.Err = t.innerErr(data.Err)
			t.batch.TraceBatchEnd(ctx, conn, data)
		}
	})
}

// TraceCopyFromStart implements pgx.CopyFromTracer.
func (t *Tracer) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	return t.start(ctx, conn, 1<<stmtOther, "", func(ctx context.Context) context.Context {
		if t.copy != nil {
			inner := t.copy.TraceCopyFromStart(ctx, conn, data)
			if span := startedSpan(ctx, inner); span != nil {
				span.SetAttributes(dbQuerySummaryKey.String("COPY " + data.TableName.Sanitize()))
			}
			ctx = inner
		}
		return ctx
	})
}

// TraceCopyFromEnd implements pgx.CopyFromTracer.
func (t *Tracer) TraceCopyFromEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromEndData) {
	t.end(ctx, conn, data.CommandTag, data.Err, func(ctx context.Context) {
		if t.copy != nil {
			data.Err = t.innerErr(data.Err)
			t.copy.TraceCopyFromEnd(ctx, conn, data)
		}
	})
}

// TracePrepareStart implements pgx.PrepareTracer. Preparing a statement runs nothing: it
// neither begins nor commits.
func (t *Tracer) TracePrepareStart(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareStartData) context.Context {
	return t.start(ctx, conn, 1<<stmtOther, "", func(ctx context.Context) context.Context {
		if t.prepare != nil {
			var s *sanitized
			data.SQL, s = t.innerSQL(data.SQL)
			if !t.cfg.rawQueryText && strings.HasPrefix(data.Name, "stmtcache_") {
				data.Name = "stmtcache" // pgx names it by a digest of the raw SQL, literals and all
			}
			inner := t.prepare.TracePrepareStart(ctx, conn, data)
			if span := startedSpan(ctx, inner); span != nil && s.summary != nil {
				span.SetAttributes(s.summary...)
			}
			ctx = inner
		}
		return ctx
	})
}

// TracePrepareEnd implements pgx.PrepareTracer.
func (t *Tracer) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareEndData) {
	t.end(ctx, conn, pgconn.CommandTag{}, data.Err, func(ctx context.Context) {
		if t.prepare != nil {
			data.Err = t.innerErr(data.Err)
			t.prepare.TracePrepareEnd(ctx, conn, data)
		}
	})
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
		data.Err = t.innerErr(data.Err)
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
		if st := connStateOf(data.Conn); st != nil {
			st.mu.Lock()
			if st.frame != nil && data.Conn.PgConn().TxStatus() == 'I' {
				t.abandon(st, st.frame, ReasonEndedUnobserved)
			}
			st.mu.Unlock()
		}
	}
	if t.acquire != nil {
		data.Err = t.innerErr(data.Err)
		t.acquire.TraceAcquireEnd(ctx, pool, data)
	}
}

// TraceRelease implements pgxpool.ReleaseTracer. A connection released in the middle of
// a transaction is destroyed by the pool, which rolls the transaction back; one released
// idle or closed with a frame on it had its transaction end where no statement showed it.
func (t *Tracer) TraceRelease(pool *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	if data.Conn != nil {
		if st := connStateOf(data.Conn); st != nil {
			st.mu.Lock()
			if st.frame != nil {
				reason := ReasonReleasedInTransaction
				if pg := data.Conn.PgConn(); pg.IsClosed() {
					reason = ReasonConnectionClosed
				} else if pg.TxStatus() == 'I' {
					reason = ReasonEndedUnobserved
				}
				t.abandon(st, st.frame, reason)
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
func (t *Tracer) onNotice(pg *pgconn.PgConn, n *pgconn.Notice) {
	if !classifier.CommittedLocallyNotice(n) {
		return
	}
	if st := stateOf(pg); st != nil {
		st.mu.Lock()
		if st.frame != nil && st.frame.currentPhase() == outcome.PhaseCommitting {
			st.frame.committedLocally = true
		}
		st.mu.Unlock()
	}
}

// connClosing ends the frame of a connection about to be closed.
func (t *Tracer) connClosing(conn *pgx.Conn) {
	if st := connStateOf(conn); st != nil {
		st.mu.Lock()
		if st.frame != nil {
			t.abandon(st, st.frame, ReasonConnectionClosed)
		}
		st.mu.Unlock()
	}
}

// netConnClosed ends the frame of a connection whose net.Conn was closed, unless a
// statement (or Run's COMMIT) is in flight on it: then the connection's user is inside
// pgconn, will see the connection closed, and ends the frame with what its statement
// observed. It may run on any goroutine; st.mu orders it with the user's hooks.
func (t *Tracer) netConnClosed(st *connState) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.frame != nil && len(st.queries) == 0 && !st.committing {
		t.abandon(st, st.frame, ReasonConnectionClosed)
	}
}
