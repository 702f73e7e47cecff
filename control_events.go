package otelpgxtx

import (
	"context"
	"errors"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

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
