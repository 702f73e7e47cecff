package otelpgxtx

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/auto"
	"github.com/txevidence/otelpgxtx/internal/executor"
	"github.com/txevidence/otelpgxtx/internal/record"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// Retry is the retry loop of code that uses pgx or database/sql directly, made safe: it
// calls attempt — one transaction of the caller's own, a pgx.BeginFunc, or a
// database/sql BeginTx … Commit — with a context carrying a fresh [Verdict], and calls it
// again only when that verdict is a retryable rollback (serialization failure, deadlock,
// connection lost before COMMIT was sent, a transaction that never reached the server
// because no connection could be acquired or made), up to maxAttempts calls in all, after a
// jittered exponential backoff (DefaultPolicy's), while ctx lasts. Begin and end the
// transaction with the context attempt is given.
//
// With [WithReconciler], an indeterminate commit is settled before Retry answers: the
// reconciler is asked (or, when the tracer reconciles in the background
// ([WithAutoReconcile]), its answer is awaited instead of asking twice), again while the
// transaction is still in progress, within [WithReconcileWait]. Committed is then
// returned as Committed, with a nil error; aborted or no_writes (the work is not in the
// database) is a retryable rollback, so the attempt runs again; only an answer that stays
// unknown is returned as Indeterminate, its Cause a [reconcile.AnswerError] with the
// reason.
//
// It returns the last call's verdict and error, as the call returned it:
//
//   - Committed: done (err is nil, unless attempt failed after its commit);
//   - DeterminateRollback: rolled back for certain, and not retried: not retryable, or no
//     attempt or time left;
//   - Indeterminate: COMMIT was sent and its fate is unknown. Retry never replays it:
//     without WithReconciler, hand it to reconciliation (reconcile.Indeterminate, or the
//     callback of [WithAutoReconcile]), which says whether running it again is safe;
//   - Participating: attempt prepared its transaction (PREPARE TRANSACTION): its
//     coordinator decides it, and Retry never runs it again. A lost reply to PREPARE is
//     Indeterminate, as a lost COMMIT's.
//
// When the tracer cannot tell how a call ended (its transaction was on a connection that
// is not instrumented, or was not begun or ended with the context given, and no
// instrumented pool failed to connect with it), nothing is retried and the error wraps
// [ErrNoVerdict] and attempt's error, if any. A nil ctx or attempt, maxAttempts below 1,
// or a refused option is an error wrapping [ErrInvalidArgument]; attempt is not called.
//
// A Retry call is one trace: its span (otelpgxtx.retry, from the tracer provider of the
// span in ctx, else the global one) is the parent of every attempt's transactions, each
// attempt an event of it with its outcome, the settling of an indeterminate one another,
// and it ends with the call's tx.outcome. The attempts' frames carry tx.attempt.
//
// An attempt may make several transactions: autocommit writes (each an implicit
// transaction), transactions one after another, a string or batch with COMMIT in the
// middle (a transaction before it, another after), a procedure that COMMITs inside (whose
// failure is Indeterminate unless the references prove it ran in one transaction). Its verdict is theirs together (see
// [Verdict]): it is run again only when every one of them is a proven, retryable
// rollback; one that committed before another failed makes the attempt
// CommittedWithPostCommitFailure, never run again; and an indeterminate one is settled
// only when it is the only thing of the attempt not known (a proven abort of it beside a
// commit is CommittedWithPostCommitFailure).
//
// Retry is not an executor: the caller's code begins and ends its transaction as before.
// [Run] is the executor, with propagation, isolation and post-commit work; use it where
// the code can change.
func Retry(ctx context.Context, maxAttempts int, attempt func(ctx context.Context) error, opts ...RetryOption) (outcome.Result[struct{}], error) {
	switch {
	case ctx == nil:
		return nil, invalid("Retry: nil context")
	case attempt == nil:
		return nil, invalid("Retry: nil attempt function")
	case maxAttempts < 1:
		return nil, invalid("Retry: maxAttempts %d, want at least 1", maxAttempts)
	}
	cfg := retryConfig{wait: defaultReconcileWait}
	for _, o := range opts {
		if o != nil {
			o.applyRetry(&cfg)
		}
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	p := DefaultPolicy()
	ctx, span := retryTracer(ctx).Start(ctx, schema.SpanNameRetry, trace.WithSpanKind(trace.SpanKindInternal))
	for n := 1; ; n++ {
		vctx, v := NewVerdict(ctx)
		v.s.Attempt = n
		err := attempt(vctx)
		res, verr := v.Result()
		retryAttemptEvent(span, n, res, verr)
		if verr != nil {
			endRetrySpan(span, n, nil)
			return nil, errors.Join(err, verr)
		}
		if ind, ok := res.(outcome.Indeterminate[struct{}]); ok && cfg.rec != nil {
			if one, committed := v.s.Settleable(); one {
				res, err = cfg.settle(ctx, ind, v.s.Pending(), err)
				retrySettledEvent(span, res)
				if r, ok := res.(outcome.DeterminateRollback[struct{}]); ok && committed != nil {
					// Another transaction of the attempt committed: its work is in the
					// database, whatever became of this one.
					res, _ = outcome.NewCommittedWithPostCommitFailure(*committed, struct{}{}, r.Cause())
				}
			}
		}
		if !executor.ShouldRetry(ctx, maxAttempts, res, n) || !waitBackoff(ctx, p, n) {
			endRetrySpan(span, n, res)
			return res, err
		}
	}
}

// retryTracer is the tracer of Retry's span: from the provider of the span in ctx (the
// application's, that its request's span came from), else the global one.
func retryTracer(ctx context.Context) trace.Tracer {
	tp := otel.GetTracerProvider()
	if s := trace.SpanFromContext(ctx); s.SpanContext().IsValid() {
		tp = s.TracerProvider()
	}
	return tp.Tracer(schema.ScopeName, trace.WithInstrumentationVersion(schema.Version))
}

// retryAttemptEvent records attempt n's end on the Retry span: its verdict res, or verr.
func retryAttemptEvent(span trace.Span, n int, res outcome.Result[struct{}], verr error) {
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{schema.AttemptKey.Int(n)}
	if verr != nil {
		attrs = append(attrs, schema.ErrorTypeKey.String("no_verdict"))
	} else {
		attrs = append(attrs, schema.OutcomeKey.String(res.Outcome().String()), schema.OperationIDKey.String(res.OperationID().String()))
	}
	span.AddEvent(schema.EventRetryAttempt, trace.WithAttributes(attrs...))
}

// retrySettledEvent records on the Retry span what settling an indeterminate attempt
// answered: res, committed, a rollback (aborted, no_writes), or still indeterminate
// with the reconciler's answer in its cause.
func retrySettledEvent(span trace.Span, res outcome.Result[struct{}]) {
	if !span.IsRecording() {
		return
	}
	status, reason := reconcile.Unknown, ""
	switch r := res.(type) {
	case outcome.Committed[struct{}]:
		status = reconcile.Committed
	case outcome.DeterminateRollback[struct{}]:
		status = reconcile.Aborted
		if ae, ok := errors.AsType[*reconcile.AnswerError](r.Cause()); ok {
			status = ae.Answer.Status()
		}
	case outcome.Indeterminate[struct{}]:
		if ae, ok := errors.AsType[*reconcile.AnswerError](r.Cause()); ok {
			reason = ae.Answer.Reason()
		}
	}
	attrs := []attribute.KeyValue{schema.ResolvedOutcomeKey.String(status.String())}
	if reason != "" {
		attrs = append(attrs, schema.ErrorTypeKey.String(reason))
	}
	span.AddEvent(schema.EventRetrySettled, trace.WithAttributes(attrs...))
}

// endRetrySpan ends the Retry span after n attempts with the call's verdict res (nil:
// none): Ok when committed, Error for a rollback or no verdict, Unset when it stays
// unknown or participating — the rule of the frame spans.
func endRetrySpan(span trace.Span, n int, res outcome.Result[struct{}]) {
	if span.IsRecording() {
		span.SetAttributes(schema.AttemptKey.Int(n))
		switch {
		case res == nil:
			span.SetAttributes(schema.ErrorTypeKey.String("no_verdict"))
			span.SetStatus(codes.Error, "no verdict")
		default:
			span.SetAttributes(schema.OutcomeKey.String(res.Outcome().String()))
			switch res.Outcome() {
			case outcome.OutcomeCommitted, outcome.OutcomeCommittedWithPostCommitFailure:
				span.SetStatus(codes.Ok, "")
			case outcome.OutcomeRolledBack:
				span.SetStatus(codes.Error, schema.StatusDescriptionRolledBack)
			}
		}
	}
	span.End()
}

// RetryOption configures [Retry]: [WithReconciler], [WithReconcileWait].
type RetryOption interface {
	applyRetry(*retryConfig)
}

// retryConfig is what the RetryOptions set; err is the first option refused.
type retryConfig struct {
	rec  *reconcile.Reconciler
	wait time.Duration
	err  error
}

// retryOptionFunc is a RetryOption that sets one field of retryConfig.
type retryOptionFunc func(*retryConfig)

// applyRetry calls f.
func (f retryOptionFunc) applyRetry(c *retryConfig) { f(c) }

// defaultReconcileWait is how long Retry waits for an answer unless WithReconcileWait
// says otherwise: above the reconciler's own wait (5 s by default) and a crash
// recovery's few seconds, below what a caller waiting on a request would bear.
const defaultReconcileWait = 10 * time.Second

// WithReconciler has [Retry] settle an indeterminate commit itself before it answers, by
// asking r (give it a pool of its own, as to [WithAutoReconcile]), unless the frame's
// tracer reconciles it in the background: that answer is awaited instead. A nil r is
// refused.
func WithReconciler(r *reconcile.Reconciler) RetryOption {
	return retryOptionFunc(func(c *retryConfig) {
		if r == nil {
			refuse(&c.err, invalid("WithReconciler: nil reconciler (make one with reconcile.New)"))
			return
		}
		c.rec = r
	})
}

// WithReconcileWait bounds how long [Retry] spends settling one indeterminate commit
// (10 s by default): it asks again while the answer may still change (the transaction
// in progress or prepared, its synchronous standbys not confirming yet, the database not reachable),
// or waits that long for automatic reconciliation's answer. One ask may run past the
// bound by the reconciler's own wait (reconcile.WithWait). Zero asks once, or takes
// automatic reconciliation's answer only if it is there; a negative wait is refused.
func WithReconcileWait(d time.Duration) RetryOption {
	return retryOptionFunc(func(c *retryConfig) {
		if d < 0 {
			refuse(&c.err, invalid("WithReconcileWait: negative wait %v", d))
			return
		}
		c.wait = d
	})
}

// errNotAnswered is the cause of an Indeterminate whose automatic reconciliation had not
// answered once within the wait.
var errNotAnswered = errors.New("otelpgxtx: automatic reconciliation had not answered within the wait (WithReconcileWait); its callback will")

// settle turns ind, the verdict of an attempt that failed with err, into what the
// database answers: Committed (with a nil error), a retryable rollback (aborted,
// no_writes), or ind again, its cause carrying the answer, when the answer stays unknown.
func (c *retryConfig) settle(ctx context.Context, ind outcome.Indeterminate[struct{}], w *record.Awaited, err error) (outcome.Result[struct{}], error) {
	ans, aerr := c.answer(ctx, ind, w)
	if aerr == nil {
		switch ans.Status() {
		case reconcile.Committed:
			return outcome.NewCommitted(ind.OperationID(), struct{}{}, ind.CommittedLocally()), nil
		case reconcile.Aborted, reconcile.NoWrites:
			// Rolled back for certain, after COMMIT was sent: safe to run again.
			r, _ := outcome.NewDeterminateRollback[struct{}](ind.OperationID(), outcome.PhaseCommitting,
				&reconcile.AnswerError{Answer: ans, Err: ind.Cause()}, true)
			return r, err
		}
	}
	cause := error(&reconcile.AnswerError{Answer: ans, Err: ind.Cause()})
	if aerr != nil {
		cause = errors.Join(ind.Cause(), aerr)
	}
	var ref *outcome.ReconciliationRef
	if r, ok := ind.Reference(); ok {
		ref = &r
	}
	// The same operation, reference and trace parent: only the cause says more.
	out, nerr := outcome.NewIndeterminate[struct{}](ind.OperationID(), cause, ref, ind.CommittedLocally())
	if nerr != nil {
		return ind, err
	}
	return out.WithTraceParent(ind.TraceParent()), err
}

// answer is the database's answer to ind: automatic reconciliation's, from w, when the
// tracer reconciles; else the reconciler's, asked again while it may still change, within
// the wait.
func (c *retryConfig) answer(ctx context.Context, ind outcome.Indeterminate[struct{}], w *record.Awaited) (reconcile.Answer, error) {
	deadline := time.Now().Add(c.wait)
	if w != nil {
		timer := time.NewTimer(c.wait)
		select {
		case <-w.Done:
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
		ans, final, ok := w.Last()
		switch {
		case final && (ans.Reason() == reconcile.ReasonQueueFull || ans.Reason() == reconcile.ReasonStopped):
			// Nothing was asked: the queue was full, or the tracer closed. Ask here.
		case ok:
			return ans, nil
		case ctx.Err() != nil:
			return reconcile.Answer{}, ctx.Err()
		default:
			return reconcile.Answer{}, errNotAnswered
		}
	}
	pause := 50 * time.Millisecond
	for {
		ans, err := reconcile.Indeterminate(ctx, c.rec, ind)
		if errors.Is(err, ErrInvalidArgument) || err == nil && !auto.MayChange(ans) || !time.Now().Add(pause).Before(deadline) {
			return ans, err
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ans, errors.Join(err, ctx.Err())
		case <-timer.C:
		}
		pause = min(2*pause, time.Second)
	}
}
