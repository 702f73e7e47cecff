package inner

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/framespan"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/redact"
	"github.com/txevidence/otelpgxtx/internal/sanitize"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Err returns what the inner tracer is given of err: err itself for a tracer of the
// application's (see innerAsIs), else what may be recorded of it (see redact.Error).
func (t *Hooks) Err(err error) error {
	if t.AsIs {
		return err
	}
	return redact.Error(err, t.Cfg.ErrorMessages)
}

// innerSQL returns what the inner tracer is given of sql, which s is what the sanitizer
// knows of: sql itself for a tracer of the application's (see innerAsIs), else the
// sanitizer's text.
func (t *Hooks) innerSQL(sql string, s *sanitize.Sanitized) string {
	if t.AsIs {
		return sql
	}
	return t.Sanitized.InnerSQL(sql, s)
}

// QueryStart hands a query's start to the inner tracer, sanitized; s is what the
// sanitizer knows of its SQL.
func (t *Hooks) QueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData, s *sanitize.Sanitized) context.Context {
	if t.query == nil {
		return ctx
	}
	data.SQL = t.innerSQL(data.SQL, s)
	return t.summarized(ctx, t.query.TraceQueryStart(ctx, conn, data), s)
}

// QueryEnd hands a query's end to the inner tracer, its error redacted.
func (t *Hooks) QueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if t.query != nil {
		data.Err = t.Err(data.Err)
		t.query.TraceQueryEnd(ctx, conn, data)
	}
}

// summarized sets s's db.query.summary on the span an inner Start hook started (from
// before to after), if it started one that records, and returns after. A tracer of the
// application's keeps its spans as it made them.
func (t *Hooks) summarized(before, after context.Context, s *sanitize.Sanitized) context.Context {
	if span := t.ownStartedSpan(before, after); span != nil && s.Summary != nil {
		span.SetAttributes(s.Summary...)
	}
	return after
}

// BatchStart hands a batch's start to the inner tracer, its SQL sanitized (see
// innerBatch).
func (t *Hooks) BatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if t.batch != nil {
		inner := data
		inner.Batch = t.innerBatch(data.Batch)
		innerCtx := t.batch.TraceBatchStart(ctx, conn, inner)
		if span := t.ownStartedSpan(ctx, innerCtx); span != nil && data.Batch != nil {
			span.SetAttributes(t.batchSummary(data.Batch))
		}
		ctx = innerCtx
	}
	return ctx
}

// BatchQuery hands one result of a batch to the inner tracer, sanitized.
func (t *Hooks) BatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if t.batch != nil {
		if t.omits(KindBatchQuery) {
			ctx = withoutSpan(ctx)
		} else {
			ctx = t.innerBatchQueryCtx(ctx, data.Err)
		}
		if !t.AsIs {
			data.SQL = t.Sanitized.InnerSQL(data.SQL, t.Sanitized.Get(data.SQL))
		}
		data.Err = t.Err(data.Err)
		t.batch.TraceBatchQuery(ctx, conn, data)
	}
}

// BatchEnd hands a batch's end to the inner tracer, its error redacted.
func (t *Hooks) BatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	if t.batch != nil {
		data.Err = t.Err(data.Err)
		t.batch.TraceBatchEnd(ctx, conn, data)
	}
}

// CopyFromStart hands a copy's start to the inner tracer, with a db.query.summary
// made of the table name (a copy has no SQL text to summarize). Unlike summarized, it
// builds the summary only once a recording span is there, for the concatenation
// allocates; innerBatchStart does the same with its loop over the batch.
func (t *Hooks) CopyFromStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	if t.copy != nil {
		inner := t.copy.TraceCopyFromStart(ctx, conn, data)
		if span := t.ownStartedSpan(ctx, inner); span != nil {
			span.SetAttributes(schema.DBQuerySummaryKey.String("COPY " + data.TableName.Sanitize()))
		}
		ctx = inner
	}
	return ctx
}

// CopyFromEnd hands a copy's end to the inner tracer, its error redacted.
func (t *Hooks) CopyFromEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceCopyFromEndData) {
	if t.copy != nil {
		data.Err = t.Err(data.Err)
		t.copy.TraceCopyFromEnd(ctx, conn, data)
	}
}

// PrepareStart hands a prepare's start to the inner tracer, sanitized (its statement
// name too: see innerStmtName). A folded prepare starts no span: its
// inner hook gets a context whose span does not record.
func (t *Hooks) PrepareStart(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareStartData, folded bool) context.Context {
	if t.prepare != nil {
		s := t.Sanitized.Get(data.SQL)
		data.SQL = t.innerSQL(data.SQL, s)
		start := func(ctx context.Context) context.Context { return t.prepare.TracePrepareStart(ctx, conn, data) }
		if folded {
			return quietStart(ctx, start)
		}
		ctx = t.summarized(ctx, t.Start(KindPrepare, ctx, start), s)
	}
	return ctx
}

// PrepareEnd hands a prepare's end to the inner tracer, its error redacted.
func (t *Hooks) PrepareEnd(ctx context.Context, conn *pgx.Conn, data pgx.TracePrepareEndData, folded bool) {
	if t.prepare != nil {
		if folded || t.omits(KindPrepare) {
			ctx = withoutSpan(ctx)
		}
		data.Err = t.Err(data.Err)
		t.prepare.TracePrepareEnd(ctx, conn, data)
	}
}

// StmtName returns what the inner tracer, and a prepare's event, are given of a
// prepared statement's name: pgx names the statements it caches by a digest of the raw
// SQL, literals and all, which becomes "stmtcache" unless [WithRawQueryText] or the tracer
// is the application's.
func (t *Hooks) StmtName(name string) string {
	if !t.Cfg.RawQueryText && !t.AsIs && strings.HasPrefix(name, "stmtcache_") {
		return "stmtcache"
	}
	return name
}

// batchSummary returns db.query.summary of a batch as the semantic conventions define
// it: "BATCH " and its statements' summary when they share one, else "BATCH".
func (t *Hooks) batchSummary(b *pgx.Batch) attribute.KeyValue {
	common := ""
	for i, q := range b.QueuedQueries {
		sum := ""
		if s := t.Sanitized.Get(q.SQL); len(s.Summary) > 0 {
			sum = s.Summary[0].Value.AsString()
		}
		if i > 0 && sum != common {
			common = ""
			break
		}
		common = sum
	}
	if common == "" {
		return schema.DBQuerySummaryKey.String("BATCH")
	}
	return schema.DBQuerySummaryKey.String("BATCH " + common)
}

// innerBatch returns the batch an inner tracer is given: the default otelpgx tracer
// reads only its length, but a user's tracer that asked for sanitized text
// ([WithSanitizedInnerTracer]) may read its SQL, which it then gets sanitized, in a copy
// (the queued queries are the caller's).
func (t *Hooks) innerBatch(b *pgx.Batch) *pgx.Batch {
	if b == nil || !t.Cfg.InnerSet || t.Cfg.RawQueryText || t.AsIs {
		return b
	}
	c := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, len(b.QueuedQueries))}
	for i, q := range b.QueuedQueries {
		c.QueuedQueries[i] = &pgx.QueuedQuery{SQL: t.Sanitized.Get(q.SQL).Text, Arguments: q.Arguments}
	}
	return c
}

// ownStartedSpan is startedSpan for the spans this library may add attributes to: those
// of its own inner tracer, never those of a tracer of the application's.
func (t *Hooks) ownStartedSpan(before, after context.Context) trace.Span {
	if t.AsIs {
		return nil
	}
	return framespan.StartedSpan(before, after)
}

// StartCtx makes f's span the parent of what the inner tracer starts. It allocates only
// when someone records and ctx does not already carry the frame's span (inside Run or
// Begin it does): an unsampled frame under an unsampled caller costs nothing. The context
// it makes is kept for the caller's context it was made from, which a transaction's
// statements mostly share, and looked up first.
func StartCtx(ctx context.Context, f *framespan.Span) context.Context {
	if f == nil || f.Unrecorded {
		return ctx
	}
	if pg.SameContext(ctx, f.FramedIn) {
		return f.FramedOut
	}
	in := trace.SpanFromContext(ctx)
	if !f.Recording && !in.IsRecording() || framespan.SameSpan(in, f.OTel) {
		return ctx
	}
	f.FramedIn, f.FramedOut = ctx, trace.ContextWithSpan(ctx, f.OTel)
	return f.FramedOut
}

// EndCtx hides f's span from an inner End hook that did not start a span of its own:
// inner tracers end "the span in ctx", and that must never be the frame's (see
// "Composition with the inner tracer" in the package documentation).
// A span that does not record has nothing an End hook could change.
func EndCtx(ctx context.Context, f *framespan.Span) context.Context {
	if f != nil && f.Recording && framespan.SameSpan(trace.SpanFromContext(ctx), f.OTel) {
		return trace.ContextWithSpan(ctx, framespan.NoopSpan)
	}
	return ctx
}

// omits reports whether the inner tracer's spans of kind k are turned off.
func (t *Hooks) omits(k Kind) bool { return t.Cfg.OmitSpans&(1<<k) != 0 }

// Folds reports whether the spans of kind k — InnerSpanTransactionControl, or the implicit
// prepares of InnerSpanPrepare — are events in place of spans: by default, with the
// default otelpgx inner tracer. A tracer of the application's gets every statement as pgx
// gives it and decides its own spans.
func (t *Hooks) Folds(k Kind) bool {
	return !t.Cfg.InnerSet && t.Cfg.KeepSpans&(1<<k) == 0
}

// Start runs start, an inner Start hook of kind k. For an omitted kind it is given a
// span that does not record, so otelpgx starts none (and still notes the start time for
// its metrics), and the caller's span is put back into what it returns, so that the work
// the hook precedes (a connect inside an acquire) is parented as without it.
func (t *Hooks) Start(k Kind, ctx context.Context, start func(context.Context) context.Context) context.Context {
	if !t.omits(k) {
		return start(ctx)
	}
	return quietStart(ctx, start)
}

// quietStart runs start, an inner Start hook, with a span that does not record in place of
// ctx's, and puts ctx's span back into what it returns.
func quietStart(ctx context.Context, start func(context.Context) context.Context) context.Context {
	return trace.ContextWithSpan(start(withoutSpan(ctx)), trace.SpanFromContext(ctx))
}

// End returns the context for an inner End hook of kind k of a call that failed
// with err (nil: it did not): one without a span for an omitted kind — otelpgx ends "the
// span in the context", which must not be the caller's —, else one whose span cannot take
// the Error status of an expected error (innerEndStatus).
func (t *Hooks) End(k Kind, ctx context.Context, err error) context.Context {
	if t.omits(k) {
		return withoutSpan(ctx)
	}
	return t.EndStatus(ctx, err)
}

// withoutSpan returns ctx with a span that does not record in place of its own.
func withoutSpan(ctx context.Context) context.Context {
	return trace.ContextWithSpan(ctx, framespan.NoopSpan)
}

// EndStatus returns the context for the default otelpgx tracer's End hook of a call
// in ctx that failed with err: when err is expected, the span it ends is wrapped so that
// it cannot set status Error. A tracer of the user's own gets ctx as it is.
func (t *Hooks) EndStatus(ctx context.Context, err error) context.Context {
	if t.Cfg.InnerSet || !t.Cfg.ExpectedErr(ctx, err) {
		return ctx
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return ctx
	}
	return trace.ContextWithSpan(ctx, ExpectedSpan{span})
}

// StatementFrameEndCtx returns the context for the inner End hook of the statement whose
// span is its frame's (framespan.Span.OnStatement), which failed with err: the frame's
// status is the span's, so the inner tracer may set Error only where the frame did —
// a rollback for a failure, unless the failure is expected —, never on a frame that
// committed or whose commit is unknown.
func (t *Hooks) StatementFrameEndCtx(ctx context.Context, ev *evidence.Frame, err error) context.Context {
	if err == nil || ev.Open() || ev.Outcome() == outcome.OutcomeRolledBack && !ev.Deliberate() {
		return t.EndStatus(ctx, err)
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return ctx
	}
	return trace.ContextWithSpan(ctx, ExpectedSpan{span})
}

// innerBatchQueryCtx returns the context for the default otelpgx tracer's TraceBatchQuery
// of a query that failed with err: marked when err is expected.
func (t *Hooks) innerBatchQueryCtx(ctx context.Context, err error) context.Context {
	if t.Cfg.InnerSet || !t.Cfg.ExpectedErr(ctx, err) {
		return ctx
	}
	return expectedCtx{ctx}
}

// Kind is a kind of span the default inner tracer makes: an InnerSpan, by number.
type Kind uint8

// The kinds, numbered as InnerSpan's constants are.
const (
	KindConnect Kind = iota + 1
	KindAcquire
	KindBatchQuery
	KindPrepare
	KindTransactionControl
)
