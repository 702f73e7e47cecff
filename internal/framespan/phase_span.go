package framespan

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/record"
	"github.com/txevidence/otelpgxtx/internal/sanitize"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/internal/settings"
	"github.com/txevidence/otelpgxtx/outcome"
)

// The frame span: one span per frame, an output of the frame's evidence. It is started
// with the frame, takes an event for each phase the evidence moves the frame to and each
// statement that is an event of the frame, and ends with the frame's
// ending: its outcome attributes and status.

// Span is the frame's span, and what its statements need of it.
type Span struct {
	OTel trace.Span
	// ParentSpan is the span context the frame span was started under, so that a chained
	// transaction (COMMIT AND CHAIN) gets the same parent.
	ParentSpan trace.SpanContext
	// SpanCtx is the context the frame span was started in and returned by Start: it
	// carries the frame span, for metric exemplars, at no allocation.
	SpanCtx context.Context
	// FramedIn and FramedOut are inner.StartCtx's last caller context and its answer; only
	// the connection's user calls it.
	FramedIn, FramedOut context.Context
	// connAttrs holds the connection's attributes, its frame.Conn's slot (made once, never
	// changed), nil until the span records: a pointer, not the slice, keeps the frame small.
	connAttrs *[]attribute.KeyValue
	// Unrecorded: a Filter rejected the frame; its span only carries the caller's span
	// context, and nothing is parented to it.
	Unrecorded bool
	// Recording is the span's IsRecording at start, which holds until it ends: the SDK's
	// IsRecording takes the span's lock, and the hooks ask on every statement.
	Recording bool
	// OnStatement: the frame's span is its one statement's, which the inner tracer starts
	// and ends (an implicit transaction's, with the default otelpgx tracer: see attach).
	OnStatement bool
	// errJudged and errExpected: whether the first failure was an expected one (see
	// JudgeErr); an expected failure leaves the span's status Unset. The bools are kept
	// together: a frame of more than 512 bytes takes the next size class with Go's
	// 8-byte header, 64 bytes more per frame (TestFrameSize).
	errJudged, errExpected bool
	// unspanned is what such a frame needs to start a span of its own when it ends, if its
	// statement had none that records and it did not commit (see Starter.StartUnspanned).
	unspanned unspanned
	name      string // the span's name, for the next frame of COMMIT AND CHAIN
	// folding is what the statements that are events of the frame need: made by the
	// first one, so that a frame without one (an implicit transaction's, an unsampled
	// one's) carries none of it.
	folding *frameFolding
}

// unspanned is what an implicit frame on its statement's span keeps, at no allocation, for
// a span of its own started at its end: its connection (the span's attributes) and its
// statement (the filter's and the span name's argument, as a frame span's BEGIN).
type unspanned struct {
	conn *pgx.Conn
	sql  string
}

// Starter starts the frame spans of a tracer: with its OpenTelemetry tracer, as its
// configuration names and filters them (the statement, sanitized, is what a Filter and a
// span name function are given).
type Starter struct {
	Cfg       *settings.Config
	Tracer    trace.Tracer
	Sanitized *sanitize.Sanitizer
}

// FrameStartOptions are the frame span's start options, built once so that Start
// allocates nothing for them. No explicit timestamp: boxing a time.Time allocates, and
// the SDK reads the clock itself. The kind is INTERNAL: the frame groups the statement
// spans, which are the CLIENT calls (see "Span kind" in the package documentation).
var FrameStartOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}

// PhaseEvents are the event names per phase, built once so a transition allocates no name.
var PhaseEvents = func() (names [outcome.PhaseUnknown + 1]string) {
	for p := range names {
		names[p] = schema.EventPhasePrefix + outcome.Phase(p).String()
	}
	return names
}()

// Start starts the span of t's frame, for a transaction that conn is beginning with the
// statement begin ("" when none was seen), or that COMMIT AND CHAIN began after chained,
// whose filter decision and span name it keeps. It is a child of the span in ctx.
// connAttrs are the connection's attributes, made on its first recorded frame.
func (f *Span) Start(t *Starter, ctx context.Context, conn *pgx.Conn, connAttrs *[]attribute.KeyValue, begin string, chained *Span, onStatement bool) {
	f.ParentSpan = trace.SpanContextFromContext(ctx)
	if onStatement {
		// No span of its own: until attach finds the statement's, one that only carries
		// the caller's span context, under which the inner tracer starts the statement's.
		f.SpanCtx, f.OTel = ctx, NoopSpan // ending reads parentSpan while unattached (spanContext)
		f.Unrecorded, f.OnStatement = true, true
		f.unspanned = unspanned{conn: conn, sql: begin}
		return
	}
	name, filtered := "", false
	switch {
	case chained != nil:
		name, filtered = chained.name, chained.Unrecorded
	default:
		name, filtered = t.frameSpanName(ctx, begin)
	}
	if filtered {
		// Not recorded: a span that only carries the caller's span context, so that the
		// inner tracer parents its statement spans as if there were no frame.
		f.SpanCtx, f.OTel = ctx, trace.SpanFromContext(trace.ContextWithSpanContext(context.Background(), f.ParentSpan))
		f.Unrecorded = true
	} else {
		f.name = name
		f.SpanCtx, f.OTel = t.Tracer.Start(ctx, f.name, FrameStartOptions...)
	}
	f.Recording = f.OTel.IsRecording()
	if f.Recording {
		t.connAttrs(conn, connAttrs)
		f.connAttrs = connAttrs
	}
}

// frameSpanName returns the name of the span of a frame begun in ctx with the statement
// begin, and whether a Filter rejects it.
func (t *Starter) frameSpanName(ctx context.Context, begin string) (name string, filtered bool) {
	if t.Cfg.Filter != nil || t.Cfg.SpanNameFunc != nil {
		// A span name leaves the process: both get the text the statement spans get.
		begin = t.Sanitized.InnerSQL(begin, t.Sanitized.Get(begin))
	}
	if t.Cfg.Filter != nil && !t.Cfg.Filter(ctx, begin) {
		return "", true
	}
	name = t.Cfg.SpanName
	if t.Cfg.SpanNameFunc != nil {
		if n := t.Cfg.SpanNameFunc(ctx, begin); n != "" {
			name = n
		}
	}
	return name, false
}

// connAttrs makes, in slot, the connection's, the attributes of conn that every recorded
// frame span carries, on the first: conn.Config() copies the whole configuration, once
// per connection.
func (t *Starter) connAttrs(conn *pgx.Conn, slot *[]attribute.KeyValue) {
	if *slot == nil {
		attrs := []attribute.KeyValue{schema.DBSystemPostgreSQL}
		if !t.Cfg.NoConnDetails {
			cfg := conn.Config()
			attrs = append(attrs,
				schema.DBNamespaceKey.String(cfg.Database),
				schema.ServerAddressKey.String(cfg.Host),
				schema.ServerPortKey.Int(int(cfg.Port)))
		}
		*slot = attrs
	}
}

// SpanContext is the context of the frame's span: while a frame on its statement's span
// has found none (attach), the caller's, as a filtered frame's span carries it.
func (f *Span) SpanContext() trace.SpanContext {
	if f.OnStatement && f.Unrecorded {
		return f.ParentSpan
	}
	return f.OTel.SpanContext()
}

// Attach makes the span the inner tracer started for the frame's one statement (from
// before to after) the frame's span. An implicit transaction is one statement, whose span
// already says what it did: a span of the frame's own would only double it. Nothing is
// written on it until the frame ends (EndWith): a frame that committed adds only what the
// statement's span does not say (its outcome, its kind, its operation id, its status), and
// one that did not commit its phase events too, at the times the evidence recorded them,
// and every attribute of a frame. Where the inner tracer started none that records
// (otelpgx starts none without a recording parent), a committed frame has no span, as the
// statement has none, and one that did not commit gets its own as it ends
// (Starter.StartUnspanned); its metrics, log record and Verdict are as any frame's.
func (f *Span) Attach(before, after context.Context) {
	span := StartedSpan(before, after)
	if span == nil {
		return
	}
	f.OTel, f.SpanCtx, f.Unrecorded, f.Recording = span, after, false, true
}

// StartUnspanned gives f, an implicit frame whose statement had no span that records
// (otelpgx starts none without a recording parent: a background job's write), a span of
// its own as it ends without a commit confirmed, so that a lost or failed autocommit write
// is in the traces wherever it ran; a committed one stays without, at no cost. The span is
// the one WithImplicitFrameSpans would have started, as the Filter and the sampler decide,
// started back at the frame's start, with the phase events at the times the evidence
// recorded them. slot holds the connection's attributes (frame.Conn's).
func (t *Starter) StartUnspanned(s *Span, ev *evidence.Frame, startedAt time.Time, slot *[]attribute.KeyValue) {
	name, filtered := t.frameSpanName(s.SpanCtx, s.unspanned.sql)
	if filtered {
		return
	}
	s.SpanCtx, s.OTel = t.Tracer.Start(s.SpanCtx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithTimestamp(startedAt))
	s.OnStatement, s.Unrecorded = false, false // its span is its own now: end ends it
	s.Recording = s.OTel.IsRecording()
	if !s.Recording {
		return
	}
	t.connAttrs(s.unspanned.conn, slot)
	s.connAttrs = slot
	phaseEventsAt(s.OTel, ev.CommittingAt(), ev.Phase(), ev.ConcludedAt(), time.Time{})
}

// phaseEventsAt adds to span, an implicit frame's, the phase events of a frame that
// became committing at committing (zero if its statement was never handed over) and
// ended in the phase last at concluded: active and committing at the hand-over (no
// earlier than notBefore, the start of a span that began after it), then the last.
func phaseEventsAt(span trace.Span, committing time.Time, last outcome.Phase, concluded, notBefore time.Time) {
	if !committing.IsZero() { // its statement was handed over
		at := trace.WithTimestamp(later(committing, notBefore))
		span.AddEvent(PhaseEvents[outcome.PhaseActive], at)
		span.AddEvent(PhaseEvents[outcome.PhaseCommitting], at)
	}
	span.AddEvent(PhaseEvents[last], trace.WithTimestamp(later(concluded, notBefore)))
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// spanStart returns when span started, where its implementation says (the SDK's spans
// do: sdktrace.ReadOnlySpan), else the zero time.
func spanStart(span trace.Span) time.Time {
	if s, ok := span.(interface{ StartTime() time.Time }); ok {
		return s.StartTime()
	}
	return time.Time{}
}

// PhaseEvent records that f moved to phase to. A folded statement's answer, waiting, goes
// with the event it caused (f.event): BEGIN's with active, COMMIT's and ROLLBACK's with
// the ending phase. A frame on its statement's span writes its phases only at its end,
// and only if it did not commit (EndWith).
func (f *Span) PhaseEvent(to outcome.Phase) {
	if f.Recording && !f.OnStatement {
		f.Event(PhaseEvents[to])
	}
}

// SpanEvent adds the event name, naming the operation id, to the span: a nested frame's
// suspension and resumption of its frame.
func (f *Span) SpanEvent(name string, id outcome.OperationID) {
	if f.OTel.IsRecording() {
		f.OTel.AddEvent(name, trace.WithAttributes(schema.OperationIDKey.String(id.String())))
	}
}

// WithSpan makes f's span the parent of what runs inside the frame; an unrecorded frame
// leaves ctx's own span there, as if there were no frame.
func (f *Span) WithSpan(ctx context.Context) context.Context {
	if f.Unrecorded {
		return ctx
	}
	return trace.ContextWithSpan(ctx, f.OTel)
}

// EndWith writes the outcome attributes and status of e, its frame's ending, and ends the
// span. It is called once, by the frame's end; cfg is the tracer's, postCommitErr the
// follow-up failure of a committed_with_post_commit_failure frame.
func (f *Span) EndWith(e *record.Ending, cfg *settings.Config, postCommitErr error) {
	if !f.Recording {
		f.OTel.End()
		return
	}
	if f.OnStatement { // an implicit frame on its statement's span, which the inner tracer ends
		if e.Outcome == outcome.OutcomeCommitted {
			f.endCommittedStatement(e, cfg)
			return
		}
		phaseEventsAt(f.OTel, e.CommittingAt, e.Phase, e.ConcludedAt, spanStart(f.OTel))
	}
	buf := FrameAttrs.Get().(*[]attribute.KeyValue)
	SetFrameAttrs(f.OTel, buf, f.setOutcomeStatus(e, cfg, f.outcomeAttrs(e, cfg, (*buf)[:0])))
	if postCommitErr != nil {
		f.OTel.AddEvent(schema.EventPostCommitFailed)
	}
	if !f.OnStatement { // the inner tracer ends the statement's span
		f.OTel.End()
	}
}

// committedStatementAttrs are the attributes of a committed implicit frame on its
// statement's span that are the same for every one: tx.outcome and tx.implicit.
var committedStatementAttrs = [...]attribute.KeyValue{schema.OutcomeKey.String(outcome.OutcomeCommitted.String()), schema.ImplicitKey.Bool(true)}

// endCommittedStatement writes what a committed implicit frame adds to its statement's
// span, which already says what the statement did and where (its connection's
// attributes, the tracer's, its nesting in the trace): its outcome, its kind, its
// operation id and its status, and what only some commits have: the attempt of Retry it
// was made in, the reference taken with it (with references on: which transaction it
// was, whether it survived a failover) and the server's warning that it is committed
// only locally. Its phases (active,
// committing, committed: one statement handed over and answered) and the rest of a
// frame's attributes (tx.phase, tx.frame.depth, the tracer's attributes again) would tell
// nothing more; its duration and count are its metric record.
func (f *Span) endCommittedStatement(e *record.Ending, cfg *settings.Config) {
	if !cfg.Strict {
		f.OTel.SetStatus(codes.Ok, "")
	}
	buf := FrameAttrs.Get().(*[]attribute.KeyValue)
	attrs := append(append((*buf)[:0], committedStatementAttrs[:]...), schema.OperationIDKey.String(e.ID.String()))
	if e.AttemptNo > 0 {
		attrs = append(attrs, schema.AttemptKey.Int(e.AttemptNo))
	}
	attrs = refAttrs(e, attrs)
	if e.CommittedLocally {
		attrs = append(attrs, schema.CommittedLocallyKey.Bool(true))
	}
	SetFrameAttrs(f.OTel, buf, attrs)
}

// refAttrs appends to attrs the attributes of e's reference, if it has one.
func refAttrs(e *record.Ending, attrs []attribute.KeyValue) []attribute.KeyValue {
	if e.Ref != nil {
		attrs = append(attrs, schema.ReconciliationRefKey.String(e.Ref.String()))
		if !e.Ref.NoWrites() {
			attrs = append(attrs, schema.ReconciliationXIDKey.String(strconv.FormatUint(e.Ref.XID, 10)))
		}
	}
	return attrs
}

// FrameAttrs holds the slices EndWith builds a frame's attributes in: SetAttributes
// copies what it is given (the SDK appends each value to the span's own), so one slice
// serves frame after frame, where a new one would cost each frame some 1 KB of heap.
var FrameAttrs = sync.Pool{New: func() any {
	s := make([]attribute.KeyValue, 0, 20)
	return &s
}}

// SetFrameAttrs writes attrs, built in buf from frameAttrs, to span in one SetAttributes
// call, and gives buf back to the pool.
func SetFrameAttrs(span trace.Span, buf *[]attribute.KeyValue, attrs []attribute.KeyValue) {
	span.SetAttributes(attrs...)
	clear(attrs) // what the span was given must not stay reachable from the pool
	*buf = attrs[:0]
	FrameAttrs.Put(buf)
}

// outcomeAttrs appends to attrs the attributes a recording frame span ends with, whatever
// its status, so that they are written in one SetAttributes call.
func (f *Span) outcomeAttrs(e *record.Ending, cfg *settings.Config, attrs []attribute.KeyValue) []attribute.KeyValue {
	v := e.Verdict
	if f.connAttrs != nil {
		attrs = append(attrs, *f.connAttrs...)
	}
	attrs = append(attrs, schema.OperationIDKey.String(e.ID.String()), schema.FrameDepthKey.Int(e.Depth))
	attrs = append(attrs, cfg.SpanAttributes...)
	attrs = append(attrs, schema.OutcomeKey.String(e.Outcome.String()), schema.PhaseKey.String(e.Phase.String()))
	if e.Implicit {
		attrs = append(attrs, schema.ImplicitKey.Bool(true))
	}
	if e.Isolation != "" {
		attrs = append(attrs, schema.IsolationKey.String(e.Isolation))
	}
	if e.AccessMode != "" {
		attrs = append(attrs, schema.AccessModeKey.String(e.AccessMode))
	}
	if e.Propagation != "" {
		attrs = append(attrs, schema.PropagationKey.String(e.Propagation))
	}
	if e.AttemptNo > 0 {
		attrs = append(attrs, schema.AttemptKey.Int(e.AttemptNo))
	}
	attrs = refAttrs(e, attrs)
	if e.NoRef != "" && e.Outcome == outcome.OutcomeIndeterminate {
		attrs = append(attrs, schema.NoReferenceKey.String(e.NoRef))
	}
	if e.CommittedLocally {
		attrs = append(attrs, schema.CommittedLocallyKey.Bool(true))
	}
	if e.Outcome == outcome.OutcomeParticipating {
		attrs = append(attrs, schema.PreparedKey.Bool(true))
	}
	if v.SQLState() != "" {
		attrs = append(attrs, schema.DBResponseStatusKey.String(v.SQLState()))
	}
	return attrs
}

// setOutcomeStatus sets the span status of outcome o and returns attrs with the
// attributes that go with that status (tx.retryable, error.type).
func (f *Span) setOutcomeStatus(e *record.Ending, cfg *settings.Config, attrs []attribute.KeyValue) []attribute.KeyValue {
	v := e.Verdict
	switch e.Outcome {
	case outcome.OutcomeCommitted, outcome.OutcomeCommittedWithPostCommitFailure:
		if !cfg.Strict {
			f.OTel.SetStatus(codes.Ok, "")
		}
	case outcome.OutcomeRolledBack:
		attrs = append(attrs, schema.RetryableKey.Bool(v.Retryable()))
		// A deliberate rollback with nothing gone wrong is not an error.
		if e.Deliberate {
			attrs = append(attrs, schema.RollbackKey.String(schema.RollbackDeliberate))
		} else {
			attrs = append(attrs, schema.RollbackKey.String(schema.RollbackFailure), schema.ErrorTypeKey.String(v.Reason()))
			if !f.errExpected {
				f.OTel.SetStatus(codes.Error, schema.StatusDescriptionRolledBack)
			}
		}
	case outcome.OutcomeIndeterminate:
		// Neither Ok nor Error: nothing was determined. tx.outcome says which.
		attrs = append(attrs, schema.ErrorTypeKey.String(v.Reason()))
	}
	return attrs
}

// JudgeErr records whether the first failure the frame saw, of a call made in ctx, was expected:
// the failure that decides its span's status.
func (s *Span) JudgeErr(cfg *settings.Config, ctx context.Context, err error) {
	if err != nil && !s.errJudged {
		s.errJudged, s.errExpected = true, cfg.ExpectedErr(ctx, err)
	}
}

// SavepointEvents are the events of what a savepoint statement did.
var SavepointEvents = [...]string{evidence.SavepointCreated: schema.EventSavepointCreated,
	evidence.SavepointReleased: schema.EventSavepointReleased, evidence.SavepointRolledBack: schema.EventSavepointRolledBack}

// StartedSpan returns the span an inner Start hook put into after, or nil if it started
// none that records.
func StartedSpan(before, after context.Context) trace.Span {
	span := trace.SpanFromContext(after)
	if !span.IsRecording() || SameSpan(span, trace.SpanFromContext(before)) {
		return nil
	}
	return span
}

// SameSpan reports whether a and b are one span. Spans are told apart by their ids,
// never with ==: a span's dynamic type need not be comparable (the SDK's non-recording
// span is not, and == on two of them panics). Only a recording span is compared: its ids
// are its own, where a no-op span may carry its parent's. The ids go first: the SDK's
// IsRecording takes the span's lock, and on the hook paths the spans mostly differ.
func SameSpan(a, b trace.Span) bool {
	sa, sb := a.SpanContext(), b.SpanContext()
	return sa.SpanID() == sb.SpanID() && sa.TraceID() == sb.TraceID() && a.IsRecording() && b.IsRecording()
}

// NoopSpan is boxed once: a noop.Span put in a trace.Span anew would allocate each time.
var NoopSpan trace.Span = noop.Span{}

// SavepointEvent records on f's span what a savepoint statement naming the savepoint name
// did (move, as the evidence moved its stack): its event, with the depth of the savepoint
// it made or named, where the frame saw that savepoint made.
func (f *Span) SavepointEvent(move evidence.SavepointMove, depth int, name string) {
	if depth == 0 { // a savepoint made before the frame was found
		f.Event(SavepointEvents[move], schema.SavepointNameKey.String(name))
		return
	}
	f.Event(SavepointEvents[move], schema.SavepointNameKey.String(name), schema.SavepointDepthKey.Int(depth))
}

// RetryEvent records that the executor runs the frame's transaction again, as attempt n,
// after it ended for reason (its error.type).
func (f *Span) RetryEvent(n int, reason string) {
	if f.OTel.IsRecording() {
		f.OTel.AddEvent(schema.EventRetry, trace.WithAttributes(schema.AttemptKey.Int(n), schema.ErrorTypeKey.String(reason)))
	}
}
