package otelpgxtx

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// frame is one physical transaction as the instrumentation sees it. Its depth, parent,
// connection and id are fixed at creation; its phase moves on each transition. Its own
// fields are its span and its place among frames; the rest is in one part per concern —
// evidence, what a Verdict is told, folded statements, the executor's, the reference —
// so that a change to one concern reads one part.
//
// Its life has two ends, kept apart because the executor runs post-commit work between
// them: conclude records the verdict and takes the frame off its connection; the Tracer's
// endFrame ends it — its span, metrics, log record and reconciliation — called by
// conclude, unless the executor manages the frame.
//
// The owning connection's goroutine changes it; other goroutines only read its phase
// and end state (atomics) and add events to its span (which is safe for concurrent use),
// except that the close of its connection may conclude it on another goroutine, under the
// connection state's mutex (see closeWatch).
type frame struct {
	t      *Tracer
	span   trace.Span
	id     outcome.OperationID
	depth  int
	parent *frame // the suspended outer frame, or nil
	// parentSpan is the span context the frame span was started under, so that a chained
	// transaction (COMMIT AND CHAIN) gets the same parent.
	parentSpan trace.SpanContext
	conn       *pgconn.PgConn
	startedAt  time.Time
	// framedIn and framedOut are innerStartCtx's last caller context and its answer;
	// only the connection's user calls it.
	framedIn, framedOut context.Context
	// spanCtx is the context the frame span was started in and returned by Start: it
	// carries the frame span, for metric exemplars, at no allocation.
	spanCtx context.Context
	// connAttrs are the connection's attributes, from its connState.
	connAttrs []attribute.KeyValue

	phase atomic.Uint32 // outcome.Phase
	// concluded: the verdict is recorded and the frame left its connection (conclude).
	concluded atomic.Bool
	spanEnded atomic.Bool // the frame was ended (Tracer.endFrame)
	// unrecorded: a Filter rejected the frame; its span only carries the caller's span
	// context, and nothing is parented to it.
	unrecorded bool
	// recording is the span's IsRecording at start, which holds until it ends: the SDK's
	// IsRecording takes the span's lock, and the hooks ask on every statement.
	recording bool
	name      string // the span's name, for the next frame of COMMIT AND CHAIN

	frameEvidence  // what was observed of the transaction, and the verdict it makes
	frameAnswer    // what a Verdict is told (verdict.go)
	frameFolding   // statements that are events of the frame (control_events.go)
	frameExecutor  // what Run sets (run.go, attempt.go)
	frameReference // its commit reference (reference_tracer.go)
}

// frameEvidence is what the frame observed of its transaction, and the classifier's
// verdict of it.
type frameEvidence struct {
	committingAt     time.Time
	concludedAt      time.Time
	committedLocally bool
	// endedBeforeCommit: the server had sent a FATAL before COMMIT was written.
	endedBeforeCommit bool
	firstErr          classifier.Classification // the classification of the first failed query, if any
	hasErr            bool
	classification    classifier.Classification // the final one, once concluded
	// errJudged and errExpected: whether the first failure was an expected one (see
	// judgeErr); an expected failure leaves the span's status Unset.
	errJudged, errExpected bool
	// commitUnsent: COMMIT failed without a byte of it leaving, on a connection still in
	// the transaction (see afterQuery): the frame waits, committing, for what comes next.
	commitUnsent bool

	isolation  string
	accessMode string
	// wrote: a statement that may write was sent in the transaction; readOnly: it began
	// READ ONLY. Commit references are taken only for a frame that wrote and can.
	wrote, readOnly bool
}

// frameAnswer is what the frame tells a Verdict (verdict.go): asked is the one in the
// context the frame began in, or nil; firstCause the error of the first failed query;
// endErr the error of the query that concluded the frame; endedIn the phase it was
// concluded from.
type frameAnswer struct {
	asked *Verdict
	// unsentAsked is a Verdict in the context of a COMMIT that never left (commitUnsent),
	// told when the frame ends, after that call returned.
	unsentAsked *Verdict
	firstCause  error
	endErr      error
	endedIn     outcome.Phase
	// awaited is automatic reconciliation's answer, made when the frame ends unknown on a
	// tracer that reconciles (WithAutoReconcile): a Retry told this frame waits for it.
	awaited *awaited
}

// frameFolding is what the frame keeps of the statements that are its events, not spans
// (control_events.go): standIn takes the span's place for the inner tracer's hooks of
// such a statement; answer is its answer, waiting for the event it makes while answering;
// savepoints are the names of the open savepoints, outermost first (savepoint_depth.go).
type frameFolding struct {
	standIn    frameStandIn
	answer     statementAnswer
	answering  bool
	eventAttrs [5]attribute.KeyValue // an answering event's attributes are built here
	savepoints []string
}

// frameExecutor is what Run sets on the frames of its attempts.
type frameExecutor struct {
	managed     bool  // the executor ends the span, after post-commit work
	cause       error // why the executor rolled back
	propagation string
	attempt     int
}

// frameReference is the frame's commit reference: what its COMMIT carries for one, and
// what it got.
type frameReference struct {
	// refs is what its COMMIT carries for a reference (the tracer's options, or Run's).
	refs references
	// xid is the transaction's xid as the xid read after one of its statements found it
	// (armXIDRead); 0 while none was found, and then COMMIT's write carries the read.
	xid uint64
	ref *outcome.ReconciliationRef
	// marker is the marker function whose call the COMMIT write carries (WithCommitMarker).
	marker *markerFn
}

// currentPhase is f's phase; other goroutines read it too, hence the atomic.
func (f *frame) currentPhase() outcome.Phase { return outcome.Phase(f.phase.Load()) }

// open reports whether f's transaction is still going on.
func (f *frame) open() bool { return !f.concluded.Load() }

// chainCtx rebuilds the context f was begun in: the next frame of COMMIT AND CHAIN
// begins in it, under the same parent span and suspended frame.
func (f *frame) chainCtx() context.Context {
	ctx := trace.ContextWithSpanContext(context.Background(), f.parentSpan)
	if f.parent != nil {
		ctx = contextWithFrame(ctx, f.parent)
	}
	return ctx
}

// withSpan makes f's span the parent of what runs inside the frame; an unrecorded frame
// leaves ctx's own span there, as if there were no frame.
func (f *frame) withSpan(ctx context.Context) context.Context {
	if f.unrecorded {
		return ctx
	}
	return trace.ContextWithSpan(ctx, f.span)
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

// startFrame begins a frame for a transaction that conn is beginning with the statement
// begin ("" when none was seen), or that COMMIT AND CHAIN began after chained, whose
// filter decision and span name it keeps. Its span is a child of the span in ctx; if ctx
// carries an open frame on another connection, that frame is suspended and the new one is
// one level deeper.
func (t *Tracer) startFrame(ctx context.Context, conn *pgx.Conn, st *connState, phase outcome.Phase, begin string, chained *frame) *frame {
	f := &frame{t: t, conn: conn.PgConn(), id: outcome.NewOperationID(), startedAt: time.Now(),
		parentSpan: trace.SpanContextFromContext(ctx), frameReference: frameReference{refs: t.cfg.references()}}
	switch {
	case chained != nil:
		f.refs = chained.refs
	case st.running:
		f.refs = st.runRefs
	}
	if outer := openFrameFromContext(ctx); outer != nil && outer.conn != f.conn {
		f.parent, f.depth = outer, outer.depth+1
	}
	if chained == nil && (t.cfg.filter != nil || t.cfg.spanNameFunc != nil) {
		// A span name leaves the process: both get the text the statement spans get.
		begin = t.sanitized.innerSQL(begin, t.sanitized.get(begin))
	}
	if chained != nil && chained.unrecorded || chained == nil && t.cfg.filter != nil && !t.cfg.filter(ctx, begin) {
		// Not recorded: a span that only carries the caller's span context, so that the
		// inner tracer parents its statement spans as if there were no frame.
		f.spanCtx, f.span = ctx, trace.SpanFromContext(trace.ContextWithSpanContext(context.Background(), f.parentSpan))
		f.unrecorded = true
	} else {
		f.name = t.cfg.spanName
		switch {
		case chained != nil:
			f.name = chained.name
		case t.cfg.spanNameFunc != nil:
			if n := t.cfg.spanNameFunc(ctx, begin); n != "" {
				f.name = n
			}
		}
		f.spanCtx, f.span = t.tracer.Start(ctx, f.name, frameStartOptions...)
	}
	f.recording = f.span.IsRecording()
	if f.recording {
		f.standIn.sc = f.span.SpanContext()
		// Written with the outcome attributes when the frame ends, in one SetAttributes.
		if st.attrs == nil {
			st.attrs = []attribute.KeyValue{dbSystemPostgreSQL}
			if !t.cfg.noConnDetails {
				cfg := conn.Config() // a copy of the whole configuration: once per connection
				st.attrs = append(st.attrs,
					dbNamespaceKey.String(cfg.Database),
					serverAddressKey.String(cfg.Host),
					serverPortKey.Int(int(cfg.Port)))
			}
		}
		f.connAttrs = st.attrs
	}
	if f.parent != nil && f.parent.span.IsRecording() {
		f.parent.span.AddEvent(eventSuspended, trace.WithAttributes(OperationIDKey.String(f.id.String())))
	}
	if phase != outcome.PhaseNotStarted {
		f.transition(phase)
	}
	if f.asked = verdictFrom(ctx); f.asked != nil {
		f.asked.began()
	}
	st.frame = f
	return f
}

// canTransition reports whether a transaction may move from one phase to another: the
// graph of package outcome's documentation, which only the tracer walks.
// In particular only committing may become unknown: an error outside committing is
// never a reason to doubt a commit that was never asked for.
func canTransition(from, to outcome.Phase) bool {
	switch from {
	case outcome.PhaseNotStarted:
		return to == outcome.PhaseActive || to == outcome.PhaseRolledBack
	case outcome.PhaseActive:
		return to == outcome.PhaseCommitting || to == outcome.PhaseRolledBack
	case outcome.PhaseCommitting:
		return to == outcome.PhaseCommitted || to == outcome.PhaseRolledBack || to == outcome.PhaseUnknown
	}
	return false
}

// transition moves f to phase to and records the event. An illegal transition is a bug
// in the caller; it is ignored rather than allowed to corrupt the evidence.
func (f *frame) transition(to outcome.Phase) bool {
	from := f.currentPhase()
	if !canTransition(from, to) {
		return false
	}
	f.phase.Store(uint32(to))
	if to == outcome.PhaseCommitting {
		f.committingAt = time.Now()
	}
	if f.recording {
		// A folded statement's answer, waiting, goes with the event it caused (f.event):
		// BEGIN's with active, COMMIT's and ROLLBACK's with the ending phase.
		f.event(phaseEvents[to])
	}
	return true
}

// conclude records the verdict: the terminal phase, and the frame leaves its connection.
// Unless the executor manages the frame, the span ends too. It runs at most once.
func (f *frame) conclude(st *connState, v classifier.Classification) {
	if !f.concluded.CompareAndSwap(false, true) {
		return
	}
	f.endedIn = f.currentPhase()
	var to outcome.Phase
	switch v.Evidence() {
	case classifier.EvidenceCommitted:
		to = outcome.PhaseCommitted
	case classifier.EvidenceUnknown:
		to = outcome.PhaseUnknown
	default:
		to = outcome.PhaseRolledBack
	}
	if !f.transition(to) && f.currentPhase() != to {
		// Only committing may become unknown or committed (the classifier guarantees
		// it); anything else is recorded as the rollback it must be.
		f.transition(outcome.PhaseRolledBack)
	}
	if v.CommittedLocally() {
		f.committedLocally = true
	}
	f.classification = v
	f.concludedAt = time.Now()
	if st != nil && st.frame == f {
		st.frame = nil
	}
	if f.parent != nil && f.parent.span.IsRecording() {
		f.parent.span.AddEvent(eventResumed, trace.WithAttributes(OperationIDKey.String(f.id.String())))
	}
	if f.t.auto != nil && f.currentPhase() == outcome.PhaseUnknown {
		f.awaited = newAwaited() // before any Verdict is told, so that each is told this one
	}
	if f.asked != nil {
		f.asked.frameEnded(f)
	}
	if !f.managed {
		f.t.endFrame(f, f.outcomeOf(), nil)
	}
}

// outcomeOf maps the terminal phase to the frame's outcome.
func (f *frame) outcomeOf() outcome.Outcome {
	switch f.currentPhase() {
	case outcome.PhaseCommitted:
		return outcome.OutcomeCommitted
	case outcome.PhaseUnknown:
		return outcome.OutcomeIndeterminate
	}
	return outcome.OutcomeRolledBack
}

// endSpan writes the outcome attributes and status and ends the span. It is called once,
// by the Tracer's endFrame; postCommitErr is the follow-up failure of a
// committed_with_post_commit_failure frame.
func (f *frame) endSpan(o outcome.Outcome, postCommitErr error) {
	if !f.recording {
		f.span.End()
		return
	}
	buf := frameAttrs.Get().(*[]attribute.KeyValue)
	setFrameAttrs(f.span, buf, f.setOutcomeStatus(o, f.outcomeAttrs(o, (*buf)[:0])))
	if postCommitErr != nil {
		f.span.AddEvent(eventPostCommitFailed)
	}
	f.span.End()
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
func (f *frame) outcomeAttrs(o outcome.Outcome, attrs []attribute.KeyValue) []attribute.KeyValue {
	v := f.classification
	attrs = append(attrs, f.connAttrs...)
	attrs = append(attrs, OperationIDKey.String(f.id.String()), FrameDepthKey.Int(f.depth))
	attrs = append(attrs, f.t.cfg.spanAttributes...)
	attrs = append(attrs, OutcomeKey.String(o.String()), PhaseKey.String(f.currentPhase().String()))
	if f.isolation != "" {
		attrs = append(attrs, IsolationKey.String(f.isolation))
	}
	if f.accessMode != "" {
		attrs = append(attrs, AccessModeKey.String(f.accessMode))
	}
	if f.propagation != "" {
		attrs = append(attrs, PropagationKey.String(f.propagation))
	}
	if f.attempt > 0 {
		attrs = append(attrs, AttemptKey.Int(f.attempt))
	}
	if f.ref != nil {
		attrs = append(attrs, ReconciliationRefKey.String(f.ref.String()))
		if !f.ref.NoWrites() {
			attrs = append(attrs, ReconciliationXIDKey.String(strconv.FormatUint(f.ref.XID, 10)))
		}
	}
	if f.committedLocally {
		attrs = append(attrs, CommittedLocallyKey.Bool(true))
	}
	if v.SQLState() != "" {
		attrs = append(attrs, dbResponseStatusKey.String(v.SQLState()))
	}
	return attrs
}

// deliberateRollback reports whether f, rolled back, was ended on purpose with nothing
// gone wrong: the one rule behind its span status and its metric series.
func (f *frame) deliberateRollback() bool {
	return !f.hasErr && f.cause == nil && f.classification.Reason() == classifier.ReasonRolledBack
}

// setOutcomeStatus sets the span status of outcome o and returns attrs with the
// attributes that go with that status (tx.retryable, error.type).
func (f *frame) setOutcomeStatus(o outcome.Outcome, attrs []attribute.KeyValue) []attribute.KeyValue {
	v := f.classification
	switch o {
	case outcome.OutcomeCommitted, outcome.OutcomeCommittedWithPostCommitFailure:
		if f.t.cfg.status == StatusOkOnCommit {
			f.span.SetStatus(codes.Ok, "")
		}
	case outcome.OutcomeRolledBack:
		attrs = append(attrs, RetryableKey.Bool(v.Retryable()))
		// A deliberate rollback with nothing gone wrong is not an error.
		if f.deliberateRollback() {
			attrs = append(attrs, RollbackKey.String(RollbackDeliberate))
		} else {
			attrs = append(attrs, RollbackKey.String(RollbackFailure), errorTypeKey.String(v.Reason()))
			if !f.errExpected {
				f.span.SetStatus(codes.Error, statusDescriptionRolledBack)
			}
		}
	case outcome.OutcomeIndeterminate:
		// Neither Ok nor Error: nothing was determined. tx.outcome says which.
		attrs = append(attrs, errorTypeKey.String(v.Reason()))
	}
	return attrs
}

// Frames travel in contexts as an immutable linked list: a context holds the innermost
// frame, which points to its suspended parent. No cleanup can resurrect a frame there:
// a concluded frame is skipped, never reused.
type frameKey struct{}

// contextWithFrame returns ctx with f as its innermost frame.
func contextWithFrame(ctx context.Context, f *frame) context.Context {
	return context.WithValue(ctx, frameKey{}, f)
}

// openFrameFromContext returns the innermost frame in ctx whose transaction is open.
func openFrameFromContext(ctx context.Context) *frame {
	f, _ := ctx.Value(frameKey{}).(*frame)
	for f != nil && !f.open() {
		f = f.parent
	}
	return f
}
