package framespan

import (
	"context"
	"errors"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/schema"
)

// Statements as events of a span: a transaction-control statement's answer is an event of
// its frame's span, an implicit prepare an event of its statement's span.

// Transaction-control statements as events of their frame (InnerSpanTransactionControl,
// folded by default). The frame span already says what the spans of BEGIN, COMMIT,
// ROLLBACK and the savepoint statements say — tx.phase.active is BEGIN's answer,
// tx.phase.committing to tx.phase.committed is COMMIT's round trip, the frame's status and
// error.type are COMMIT's failure, tx.savepoint.* are the savepoint statements — so each
// such statement is not a span of its own but the event its answer already makes, with
// what only its span had: its operation name, its duration and its SQLSTATE. The inner
// tracer still gets both hooks of the statement, under a span that does not record, so
// that otelpgx starts no span and records its metrics exactly as before.

// frameFolding is what the span keeps of the statements that are its events, not spans
// : standIn takes the span's place for the inner tracer's hooks of
// such a statement; answer is its answer, waiting for the event it makes while answering.
type frameFolding struct {
	standIn    frameStandIn
	answer     StatementAnswer
	answering  bool
	eventAttrs [5]attribute.KeyValue // an answering event's attributes are built here
}

// StatementAnswer is what the event of a statement without a span of its own carries
// beyond the event's own attributes.
type StatementAnswer struct {
	op       string        // db.operation.name, as the statement's span would have been named
	took     time.Duration // from its Start hook to its End hook
	sqlState string        // the server's SQLSTATE when it failed with one
}

// attrs appends the answer's attributes to attrs.
func (a *StatementAnswer) attrs(attrs []attribute.KeyValue) []attribute.KeyValue {
	attrs = append(attrs, schema.DBOperationNameKey.String(a.op), schema.StatementDurationKey.Float64(a.took.Seconds()))
	if a.sqlState != "" {
		attrs = append(attrs, schema.DBResponseStatusKey.String(a.sqlState))
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

// Event adds the event name with attrs to the frame's span, and the answer of the
// statement that caused it, if one is waiting for its event (see answered).
func (f *Span) Event(name string, attrs ...attribute.KeyValue) {
	if p := f.folding; p != nil && p.answering {
		p.answering = false
		// Built in the folding's own array: the SDK copies an event's attributes.
		attrs = p.answer.attrs(append(p.eventAttrs[:0], attrs...))
	}
	if len(attrs) == 0 {
		f.OTel.AddEvent(name)
		return
	}
	f.OTel.AddEvent(name, trace.WithAttributes(attrs...))
}

// AnswerOf returns the answer of a statement named op that started at start and ended
// now with err.
func AnswerOf(op string, start time.Time, err error) StatementAnswer {
	a := StatementAnswer{op: op, took: time.Since(start)}
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) {
		a.sqlState = pgErr.Code
	}
	return a
}

// FoldKind is which kind of event a query may be in place of its span.
type FoldKind uint8

const (
	FoldNone    FoldKind = iota
	FoldControl          // a transaction-control statement: an event of its frame
	FoldPrepare          // an implicit prepare: an event of its statement's span
)

// Folds returns what the statements that are events of f need, made at the first.
func (f *Span) Folds() *frameFolding {
	if f.folding == nil {
		f.folding = &frameFolding{standIn: frameStandIn{sc: f.OTel.SpanContext()}}
	}
	return f.folding
}

// StandInCtx returns ctx with the frame's stand-in as its span. The context it makes is
// kept for the context it was made from, which a transaction's BEGIN and COMMIT mostly
// share (see inner.StartCtx), and looked up first.
func (p *frameFolding) StandInCtx(ctx context.Context) context.Context {
	if !pg.SameContext(ctx, p.standIn.in) {
		p.standIn.in, p.standIn.out = ctx, trace.ContextWithSpan(ctx, &p.standIn)
	}
	return p.standIn.out
}

// Answered records a, the answer of a statement folded into the frame: the next event of
// the frame that answers a statement carries it (see Span.Event).
func (p *frameFolding) Answered(a StatementAnswer) {
	p.answer, p.answering = a, true
}

// Unanswered gives a statement that caused no event of its own — a BEGIN inside the
// transaction, which the server only warns about; a savepoint statement that failed —
// the event eventStatement, so that every statement folded into the frame is one event.
func (f *Span) Unanswered(savepoint string) {
	if f.folding == nil || !f.folding.answering {
		return
	}
	if savepoint != "" {
		f.Event(schema.EventStatement, schema.SavepointNameKey.String(savepoint))
		return
	}
	f.Event(schema.EventStatement)
}

// PrepareEvent adds the event of q, a folded prepare that ended with err, to the
// statement's span in ctx (the context its Start hook returned: see innerPrepareStart).
func PrepareEvent(ctx context.Context, start time.Time, name string, err error) {
	a := AnswerOf("", start, err)
	attrs := make([]attribute.KeyValue, 0, 3)
	attrs = append(attrs, schema.StatementDurationKey.Float64(a.took.Seconds()))
	if name != "" {
		attrs = append(attrs, otelpgx.PrepareStmtNameKey.String(name))
	}
	if a.sqlState != "" {
		attrs = append(attrs, schema.DBResponseStatusKey.String(a.sqlState))
	}
	trace.SpanFromContext(ctx).AddEvent(schema.EventPrepare, trace.WithAttributes(attrs...))
}
