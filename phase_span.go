package otelpgxtx

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

// The frame span: one span per frame, an output of the frame's evidence. It is started
// with the frame, takes an event for each phase the evidence moves the frame to and each
// statement that is an event of the frame, and ends with the frame's
// ending: its outcome attributes and status.

// frameSpan is the frame's span, and what its statements need of it.
type frameSpan struct {
	span trace.Span
	// parentSpan is the span context the frame span was started under, so that a chained
	// transaction (COMMIT AND CHAIN) gets the same parent.
	parentSpan trace.SpanContext
	// spanCtx is the context the frame span was started in and returned by Start: it
	// carries the frame span, for metric exemplars, at no allocation.
	spanCtx context.Context
	// framedIn and framedOut are innerStartCtx's last caller context and its answer; only
	// the connection's user calls it.
	framedIn, framedOut context.Context
	// connAttrs are the connection's attributes, from its connState.
	connAttrs []attribute.KeyValue
	// unrecorded: a Filter rejected the frame; its span only carries the caller's span
	// context, and nothing is parented to it.
	unrecorded bool
	// recording is the span's IsRecording at start, which holds until it ends: the SDK's
	// IsRecording takes the span's lock, and the hooks ask on every statement.
	recording bool
	// onStatement: the frame's span is its one statement's, which the inner tracer starts
	// and ends (an implicit transaction's, with the default otelpgx tracer: see attach).
	onStatement bool
	// errJudged and errExpected: whether the first failure was an expected one (see
	// judgeErr); an expected failure leaves the span's status Unset. The bools are kept
	// together: a frame of more than 760 bytes (with its malloc header) takes the next
	// size class, 128 bytes more per frame.
	errJudged, errExpected bool
	// unspanned is what such a frame needs to start a span of its own when it ends, if its
	// statement had none that records and it did not commit (see startUnspanned).
	unspanned unspanned
	name      string // the span's name, for the next frame of COMMIT AND CHAIN
	// folding is what the statements that are events of the frame need: made by the
	// first one, so that a frame without one (an implicit transaction's, an unsampled
	// one's) carries none of it.
	folding *frameFolding
}

// frameFolding is what the span keeps of the statements that are its events, not spans
// : standIn takes the span's place for the inner tracer's hooks of
// such a statement; answer is its answer, waiting for the event it makes while answering.
type frameFolding struct {
	standIn    frameStandIn
	answer     statementAnswer
	answering  bool
	eventAttrs [5]attribute.KeyValue // an answering event's attributes are built here
}

// unspanned is what an implicit frame on its statement's span keeps, at no allocation, for
// a span of its own started at its end: its connection (the span's attributes) and its
// statement (the filter's and the span name's argument, as a frame span's BEGIN).
type unspanned struct {
	conn *pgx.Conn
	sql  string
}

// frameStartOptions are the frame span's start options, built once so that Start
// allocates nothing for them. No explicit timestamp: boxing a time.Time allocates, and
// the SDK reads the clock itself. The kind is INTERNAL: the frame groups the statement
// spans, which are the CLIENT calls (see "Span kind" in the package documentation).
var frameStartOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}

// phaseEvents are the event names per phase, built once so a transition allocates no name.
var phaseEvents = func() (names [outcome.PhaseUnknown + 1]string) {
	for p := range names {
		names[p] = eventPhasePrefix + outcome.Phase(p).String()
	}
	return names
}()

// start starts the span of t's frame, for a transaction that conn is beginning with the
// statement begin ("" when none was seen), or that COMMIT AND CHAIN began after chained,
// whose filter decision and span name it keeps. It is a child of the span in ctx.
// connAttrs are the connection's attributes, made on its first recorded frame.
func (f *frameSpan) start(t *core, ctx context.Context, conn *pgx.Conn, connAttrs *[]attribute.KeyValue, begin string, chained *frameSpan, onStatement bool) {
	f.parentSpan = trace.SpanContextFromContext(ctx)
	if onStatement {
		// No span of its own: until attach finds the statement's, one that only carries
		// the caller's span context, under which the inner tracer starts the statement's.
		f.spanCtx, f.span = ctx, noopSpan // ending reads parentSpan while unattached (spanContext)
		f.unrecorded, f.onStatement = true, true
		f.unspanned = unspanned{conn: conn, sql: begin}
		return
	}
	name, filtered := "", false
	switch {
	case chained != nil:
		name, filtered = chained.name, chained.unrecorded
	default:
		name, filtered = t.frameSpanName(ctx, begin)
	}
	if filtered {
		// Not recorded: a span that only carries the caller's span context, so that the
		// inner tracer parents its statement spans as if there were no frame.
		f.spanCtx, f.span = ctx, trace.SpanFromContext(trace.ContextWithSpanContext(context.Background(), f.parentSpan))
		f.unrecorded = true
	} else {
		f.name = name
		f.spanCtx, f.span = t.tracer.Start(ctx, f.name, frameStartOptions...)
	}
	f.recording = f.span.IsRecording()
	if f.recording {
		f.connAttrs = t.connAttrs(conn, connAttrs)
	}
}

// frameSpanName returns the name of the span of a frame begun in ctx with the statement
// begin, and whether a Filter rejects it.
func (t *core) frameSpanName(ctx context.Context, begin string) (name string, filtered bool) {
	if t.cfg.filter != nil || t.cfg.spanNameFunc != nil {
		// A span name leaves the process: both get the text the statement spans get.
		begin = t.sanitized.innerSQL(begin, t.sanitized.get(begin))
	}
	if t.cfg.filter != nil && !t.cfg.filter(ctx, begin) {
		return "", true
	}
	name = t.cfg.spanName
	if t.cfg.spanNameFunc != nil {
		if n := t.cfg.spanNameFunc(ctx, begin); n != "" {
			name = n
		}
	}
	return name, false
}

// connAttrs returns the attributes of conn that every recorded frame span carries, made
// on the first and kept in slot, the connection's: conn.Config() copies the whole
// configuration, once per connection.
func (t *core) connAttrs(conn *pgx.Conn, slot *[]attribute.KeyValue) []attribute.KeyValue {
	if *slot == nil {
		attrs := []attribute.KeyValue{schema.DBSystemPostgreSQL}
		if !t.cfg.noConnDetails {
			cfg := conn.Config()
			attrs = append(attrs,
				dbNamespaceKey.String(cfg.Database),
				serverAddressKey.String(cfg.Host),
				serverPortKey.Int(int(cfg.Port)))
		}
		*slot = attrs
	}
	return *slot
}

// spanContext is the context of the frame's span: while a frame on its statement's span
// has found none (attach), the caller's, as a filtered frame's span carries it.
func (f *frameSpan) spanContext() trace.SpanContext {
	if f.onStatement && f.unrecorded {
		return f.parentSpan
	}
	return f.span.SpanContext()
}

// attach makes the span the inner tracer started for the frame's one statement (from
// before to after) the frame's span, and records on it the phases the frame moved to
// as the statement was handed over. An implicit transaction is one statement, whose span
// already says what it did: a span of the frame's own would only double it. Where the
// inner tracer started none that records (otelpgx starts none without a recording
// parent), a committed frame has no span, as the statement has none, and one that did not
// commit gets its own as it ends (startUnspanned); its metrics, log record and Verdict are
// as any frame's.
func (f *frameSpan) attach(before, after context.Context) {
	span := startedSpan(before, after)
	if span == nil {
		return
	}
	f.span, f.spanCtx, f.unrecorded, f.recording = span, after, false, true
	f.phaseEvent(outcome.PhaseActive)
	f.phaseEvent(outcome.PhaseCommitting)
}

// startUnspanned gives f, an implicit frame whose statement had no span that records
// (otelpgx starts none without a recording parent: a background job's write), a span of
// its own as it ends without a commit confirmed, so that a lost or failed autocommit write
// is in the traces wherever it ran; a committed one stays without, at no cost. The span is
// the one WithImplicitFrameSpans would have started, as the Filter and the sampler decide,
// started back at the frame's start, with the phase events at the times the evidence
// recorded them. slot holds the connection's attributes (connState.attrs).
func (t *core) startUnspanned(f *frame, slot *[]attribute.KeyValue) {
	s := &f.frameSpan
	name, filtered := t.frameSpanName(s.spanCtx, s.unspanned.sql)
	if filtered {
		return
	}
	s.spanCtx, s.span = t.tracer.Start(s.spanCtx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithTimestamp(f.startedAt))
	s.onStatement, s.unrecorded = false, false // its span is its own now: end ends it
	s.recording = s.span.IsRecording()
	if !s.recording {
		return
	}
	s.connAttrs = t.connAttrs(s.unspanned.conn, slot)
	if at := f.ev.CommittingAt(); !at.IsZero() { // its statement was handed over
		s.span.AddEvent(phaseEvents[outcome.PhaseActive], trace.WithTimestamp(at))
		s.span.AddEvent(phaseEvents[outcome.PhaseCommitting], trace.WithTimestamp(at))
	}
	s.span.AddEvent(phaseEvents[f.ev.Phase()], trace.WithTimestamp(f.ev.ConcludedAt()))
}

// phaseEvent records that f moved to phase to. A folded statement's answer, waiting, goes
// with the event it caused (f.event): BEGIN's with active, COMMIT's and ROLLBACK's with
// the ending phase.
func (f *frameSpan) phaseEvent(to outcome.Phase) {
	if f.recording {
		f.event(phaseEvents[to])
	}
}

// spanEvent adds the event name, naming the operation id, to the span: a nested frame's
// suspension and resumption of its frame.
func (f *frameSpan) spanEvent(name string, id outcome.OperationID) {
	if f.span.IsRecording() {
		f.span.AddEvent(name, trace.WithAttributes(schema.OperationIDKey.String(id.String())))
	}
}

// withSpan makes f's span the parent of what runs inside the frame; an unrecorded frame
// leaves ctx's own span there, as if there were no frame.
func (f *frameSpan) withSpan(ctx context.Context) context.Context {
	if f.unrecorded {
		return ctx
	}
	return trace.ContextWithSpan(ctx, f.span)
}

// end writes the outcome attributes and status of e, its frame's ending, and ends the
// span. It is called once, by the frame's end; cfg is the tracer's, postCommitErr the
// follow-up failure of a committed_with_post_commit_failure frame.
func (f *frameSpan) end(e *ending, cfg *config, postCommitErr error) {
	if !f.recording {
		f.span.End()
		return
	}
	buf := frameAttrs.Get().(*[]attribute.KeyValue)
	setFrameAttrs(f.span, buf, f.setOutcomeStatus(e, cfg, f.outcomeAttrs(e, cfg, (*buf)[:0])))
	if postCommitErr != nil {
		f.span.AddEvent(eventPostCommitFailed)
	}
	if !f.onStatement { // the inner tracer ends the statement's span
		f.span.End()
	}
}

// frameAttrs holds the slices endSpan builds a frame's attributes in: SetAttributes
// copies what it is given (the SDK appends each value to the span's own), so one slice
// serves frame after frame, where a new one would cost each frame some 1 KB of heap.
var frameAttrs = sync.Pool{New: func() any {
	s := make([]attribute.KeyValue, 0, 20)
	return &s
}}

// setFrameAttrs writes attrs, built in buf from frameAttrs, to span in one SetAttributes
// call, and gives buf back to the pool.
func setFrameAttrs(span trace.Span, buf *[]attribute.KeyValue, attrs []attribute.KeyValue) {
	span.SetAttributes(attrs...)
	clear(attrs) // what the span was given must not stay reachable from the pool
	*buf = attrs[:0]
	frameAttrs.Put(buf)
}

// outcomeAttrs appends to attrs the attributes a recording frame span ends with, whatever
// its status, so that they are written in one SetAttributes call.
func (f *frameSpan) outcomeAttrs(e *ending, cfg *config, attrs []attribute.KeyValue) []attribute.KeyValue {
	v := e.verdict
	attrs = append(attrs, f.connAttrs...)
	attrs = append(attrs, schema.OperationIDKey.String(e.id.String()), frameDepthKey.Int(e.depth))
	attrs = append(attrs, cfg.spanAttributes...)
	attrs = append(attrs, outcomeKey.String(e.outcome.String()), phaseKey.String(e.phase.String()))
	if e.implicit {
		attrs = append(attrs, implicitKey.Bool(true))
	}
	if e.isolation != "" {
		attrs = append(attrs, isolationKey.String(e.isolation))
	}
	if e.accessMode != "" {
		attrs = append(attrs, accessModeKey.String(e.accessMode))
	}
	if e.propagation != "" {
		attrs = append(attrs, propagationKey.String(e.propagation))
	}
	if e.attemptNo > 0 {
		attrs = append(attrs, attemptKey.Int(e.attemptNo))
	}
	if e.ref != nil {
		attrs = append(attrs, schema.ReconciliationRefKey.String(e.ref.String()))
		if !e.ref.NoWrites() {
			attrs = append(attrs, reconciliationXIDKey.String(strconv.FormatUint(e.ref.XID, 10)))
		}
	}
	if e.noRef != "" && e.outcome == outcome.OutcomeIndeterminate {
		attrs = append(attrs, schema.NoReferenceKey.String(e.noRef))
	}
	if e.committedLocally {
		attrs = append(attrs, committedLocallyKey.Bool(true))
	}
	if e.outcome == outcome.OutcomeParticipating {
		attrs = append(attrs, preparedKey.Bool(true))
	}
	if v.SQLState() != "" {
		attrs = append(attrs, dbResponseStatusKey.String(v.SQLState()))
	}
	return attrs
}

// setOutcomeStatus sets the span status of outcome o and returns attrs with the
// attributes that go with that status (tx.retryable, error.type).
func (f *frameSpan) setOutcomeStatus(e *ending, cfg *config, attrs []attribute.KeyValue) []attribute.KeyValue {
	v := e.verdict
	switch e.outcome {
	case outcome.OutcomeCommitted, outcome.OutcomeCommittedWithPostCommitFailure:
		if !cfg.strict {
			f.span.SetStatus(codes.Ok, "")
		}
	case outcome.OutcomeRolledBack:
		attrs = append(attrs, retryableKey.Bool(v.Retryable()))
		// A deliberate rollback with nothing gone wrong is not an error.
		if e.deliberate {
			attrs = append(attrs, rollbackKey.String(rollbackDeliberate))
		} else {
			attrs = append(attrs, rollbackKey.String(rollbackFailure), schema.ErrorTypeKey.String(v.Reason()))
			if !f.errExpected {
				f.span.SetStatus(codes.Error, statusDescriptionRolledBack)
			}
		}
	case outcome.OutcomeIndeterminate:
		// Neither Ok nor Error: nothing was determined. tx.outcome says which.
		attrs = append(attrs, schema.ErrorTypeKey.String(v.Reason()))
	}
	return attrs
}

// judgeErr records whether the first failure the frame saw, of a call made in ctx, was expected:
// the failure that decides its span's status.
func (s *frameSpan) judgeErr(cfg *config, ctx context.Context, err error) {
	if err != nil && !s.errJudged {
		s.errJudged, s.errExpected = true, cfg.expectedErr(ctx, err)
	}
}

// statementAnswer is what the event of a statement without a span of its own carries
// beyond the event's own attributes.
type statementAnswer struct {
	op       string        // db.operation.name, as the statement's span would have been named
	took     time.Duration // from its Start hook to its End hook
	sqlState string        // the server's SQLSTATE when it failed with one
}

// attrs appends the answer's attributes to attrs.
func (a *statementAnswer) attrs(attrs []attribute.KeyValue) []attribute.KeyValue {
	attrs = append(attrs, dbOperationNameKey.String(a.op), statementDurationKey.Float64(a.took.Seconds()))
	if a.sqlState != "" {
		attrs = append(attrs, dbResponseStatusKey.String(a.sqlState))
	}
	return attrs
}

// frameStandIn takes the frame span's place in the context of a statement that is an
// event of the frame: it does not record, so the inner tracer starts no span and ends
// none, and it carries the frame's span context, so that the exemplars of otelpgx's
// metrics for the statement name the frame span that holds its event.
type frameStandIn struct {
	noop.Span
	sc trace.SpanContext
	// in and out are standInCtx's last context and its answer.
	in, out context.Context
}

// SpanContext returns the frame span's context.
func (s *frameStandIn) SpanContext() trace.SpanContext { return s.sc }

// event adds the event name with attrs to the frame's span, and the answer of the
// statement that caused it, if one is waiting for its event (see answered).
func (f *frameSpan) event(name string, attrs ...attribute.KeyValue) {
	if p := f.folding; p != nil && p.answering {
		p.answering = false
		// Built in the folding's own array: the SDK copies an event's attributes.
		attrs = p.answer.attrs(append(p.eventAttrs[:0], attrs...))
	}
	if len(attrs) == 0 {
		f.span.AddEvent(name)
		return
	}
	f.span.AddEvent(name, trace.WithAttributes(attrs...))
}

// Transaction-control statements as events of their frame (InnerSpanTransactionControl,
// folded by default). The frame span already says what the spans of BEGIN, COMMIT,
// ROLLBACK and the savepoint statements say — tx.phase.active is BEGIN's answer,
// tx.phase.committing to tx.phase.committed is COMMIT's round trip, the frame's status and
// error.type are COMMIT's failure, tx.savepoint.* are the savepoint statements — so each
// such statement is not a span of its own but the event its answer already makes, with
// what only its span had: its operation name, its duration and its SQLSTATE. The inner
// tracer still gets both hooks of the statement, under a span that does not record, so
// that otelpgx starts no span and records its metrics exactly as before.

// answerOf returns the answer of a statement named op that started at start and ended
// now with err.
func answerOf(op string, start time.Time, err error) statementAnswer {
	a := statementAnswer{op: op, took: time.Since(start)}
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) {
		a.sqlState = pgErr.Code
	}
	return a
}

// foldKind is which kind of event a query may be in place of its span.
type foldKind uint8

const (
	foldNone    foldKind = iota
	foldControl          // a transaction-control statement: an event of its frame
	foldPrepare          // an implicit prepare: an event of its statement's span
)

// fold decides whether q, a query that enter has just recorded, is an event in place of a
// span (of kind k; op names it), marks it so, and returns the context its inner Start
// hook gets.
func (t *core) fold(ctx context.Context, q *queryState, k foldKind, op string) context.Context {
	switch {
	case k == foldControl && t.foldsControl(q):
		q.folded, q.start, q.op = true, time.Now(), op
		return q.frame.folds().standInCtx(ctx)
	case k == foldPrepare && t.foldsPrepare(ctx, q):
		q.folded, q.start, q.op = true, time.Now(), op
	}
	return ctx
}

// foldsControl reports whether q is a transaction-control statement to record as an event
// of its frame: the frame's span records (else the statement would have no span either),
// and the option is on.
func (t *core) foldsControl(q *queryState) bool {
	return !q.nested && q.frame != nil && q.frame.recording && q.set.Control() &&
		t.folds(InnerSpanTransactionControl)
}

// folds returns what the statements that are events of f need, made at the first.
func (f *frameSpan) folds() *frameFolding {
	if f.folding == nil {
		f.folding = &frameFolding{standIn: frameStandIn{sc: f.span.SpanContext()}}
	}
	return f.folding
}

// standInCtx returns ctx with the frame's stand-in as its span. The context it makes is
// kept for the context it was made from, which a transaction's BEGIN and COMMIT mostly
// share (see innerStartCtx), and looked up first.
func (p *frameFolding) standInCtx(ctx context.Context) context.Context {
	if !sameContext(ctx, p.standIn.in) {
		p.standIn.in, p.standIn.out = ctx, trace.ContextWithSpan(ctx, &p.standIn)
	}
	return p.standIn.out
}

// answered records a, the answer of a statement folded into the frame: the next event of
// the frame that answers a statement carries it (see frame.event).
func (p *frameFolding) answered(a statementAnswer) {
	p.answer, p.answering = a, true
}

// unanswered gives a statement that caused no event of its own — a BEGIN inside the
// transaction, which the server only warns about; a savepoint statement that failed —
// the event eventStatement, so that every statement folded into the frame is one event.
func (f *frameSpan) unanswered(savepoint string) {
	if f.folding == nil || !f.folding.answering {
		return
	}
	if savepoint != "" {
		f.event(eventStatement, savepointNameKey.String(savepoint))
		return
	}
	f.event(eventStatement)
}

// savepointEvents are the events of what a savepoint statement did.
var savepointEvents = [...]string{evidence.SavepointCreated: eventSavepointCreated,
	evidence.SavepointReleased: eventSavepointReleased, evidence.SavepointRolledBack: eventSavepointRolledBack}

// savepointEvent records on f's span what a savepoint statement naming the savepoint name
// did (move, as the evidence moved its stack): its event, with the depth of the savepoint
// it made or named, where the frame saw that savepoint made.
func (f *frame) savepointEvent(move evidence.SavepointMove, depth int, name string) {
	if depth == 0 { // a savepoint made before the frame was found
		f.event(savepointEvents[move], savepointNameKey.String(name))
		return
	}
	f.event(savepointEvents[move], savepointNameKey.String(name), savepointDepthKey.Int(depth))
}

// An implicit prepare as an event of its statement's span (InnerSpanPrepare, folded by
// default). pgx prepares a statement inside the query that runs it — the first time in its
// default query mode, every time in QueryExecModeDescribeExec — and otelpgx makes that a
// span named like the statement, under the statement's span: INSERT under INSERT. The
// prepare is a step of the statement, so it is an eventPrepare event of the statement's
// span, with its duration, its statement name and its SQLSTATE; otelpgx still gets both
// hooks, under a span that does not record, and counts the prepare in its metrics as
// before. An explicit prepare (Conn.Prepare) has no statement around it and stays a span.

// foldsPrepare reports whether q, a prepare, is an implicit one whose statement's span
// records (in ctx, the statement's context), to be recorded as an event of that span.
func (t *core) foldsPrepare(ctx context.Context, q *queryState) bool {
	return q.nested && t.folds(InnerSpanPrepare) && trace.SpanFromContext(ctx).IsRecording()
}

// prepareEvent adds the event of q, a folded prepare that ended with err, to the
// statement's span in ctx (the context its Start hook returned: see innerPrepareStart).
func prepareEvent(ctx context.Context, q *queryState, err error) {
	a := answerOf("", q.start, err)
	attrs := make([]attribute.KeyValue, 0, 3)
	attrs = append(attrs, statementDurationKey.Float64(a.took.Seconds()))
	if q.op != "" {
		attrs = append(attrs, otelpgx.PrepareStmtNameKey.String(q.op))
	}
	if a.sqlState != "" {
		attrs = append(attrs, dbResponseStatusKey.String(a.sqlState))
	}
	trace.SpanFromContext(ctx).AddEvent(eventPrepare, trace.WithAttributes(attrs...))
}
