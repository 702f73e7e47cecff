package otelpgxtx

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/txevidence/otelpgxtx/internal/evidence"
)

// Transaction-control statements as events of their frame (InnerSpanTransactionControl,
// folded by default). The frame span already says what the spans of BEGIN, COMMIT,
// ROLLBACK and the savepoint statements say — tx.phase.active is BEGIN's answer,
// tx.phase.committing to tx.phase.committed is COMMIT's round trip, the frame's status and
// error.type are COMMIT's failure, tx.savepoint.* are the savepoint statements — so each
// such statement is not a span of its own but the event its answer already makes, with
// what only its span had: its operation name, its duration and its SQLSTATE. The inner
// tracer still gets both hooks of the statement, under a span that does not record, so
// that otelpgx starts no span and records its metrics exactly as before.

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
	foldPrepare          // an implicit prepare: an event of its statement's span (prepare_event.go)
)

// fold decides whether q, a query that enter has just recorded, is an event in place of a
// span (of kind k; op names it), marks it so, and returns the context its inner Start
// hook gets.
func (t *core) fold(ctx context.Context, q *queryState, k foldKind, op string) context.Context {
	switch {
	case k == foldControl && t.foldsControl(q):
		q.folded, q.start, q.op = true, time.Now(), op
		return q.frame.standInCtx(ctx)
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

// event adds the event name with attrs to the frame's span, and the answer of the
// statement that caused it, if one is waiting for its event (see answered).
func (f *frameSpan) event(name string, attrs ...attribute.KeyValue) {
	if f.answering {
		f.answering = false
		// Built in the frame's own array: the SDK copies an event's attributes.
		attrs = f.answer.attrs(append(f.eventAttrs[:0], attrs...))
	}
	if len(attrs) == 0 {
		f.span.AddEvent(name)
		return
	}
	f.span.AddEvent(name, trace.WithAttributes(attrs...))
}

// unanswered gives a statement that caused no event of its own — a BEGIN inside the
// transaction, which the server only warns about; a savepoint statement that failed —
// the event eventStatement, so that every statement folded into the frame is one event.
func (f *frameSpan) unanswered(savepoint string) {
	if !f.answering {
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

// savepointEvent records on f's span a savepoint statement of kinds set, naming the
// savepoint name, that succeeded: its event, with the depth of the savepoint it made or
// named, where the frame saw that savepoint made.
func (f *frame) savepointEvent(set evidence.Set, name string) {
	move, depth := f.SavepointMoved(set, name)
	if depth == 0 { // a savepoint made before the frame was found
		f.event(savepointEvents[move], savepointNameKey.String(name))
		return
	}
	f.event(savepointEvents[move], savepointNameKey.String(name), savepointDepthKey.Int(depth))
}
