package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/errs"
	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/redact"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/internal/verdict"
	"github.com/txevidence/otelpgxtx/outcome"
)

// heldConn is the connection Run holds for one attempt, and how to give it back.
type heldConn struct {
	conn    *pgx.Conn
	release func()
}

// acquire takes the connection an attempt runs on: from a pool, the connection itself,
// or none for any other DB, which begins the transaction on its own.
func acquire(ctx context.Context, db TxBeginner) (heldConn, error) {
	switch db := db.(type) {
	case *pgxpool.Pool:
		pc, err := db.Acquire(ctx)
		if err != nil {
			return heldConn{}, err
		}
		return heldConn{conn: pc.Conn(), release: pc.Release}, nil
	case *pgx.Conn:
		return heldConn{conn: db, release: func() {}}, nil
	}
	return heldConn{}, nil // any other DB: BeginTx, then Tx.Commit
}

// attemptTx is one physical transaction of Run: the connection it holds, the transaction
// begun on it with opts, the scope fn runs in and fn's context, which carries the scope.
type attemptTx struct {
	held heldConn
	tx   pgx.Tx
	sc   *Scope
	ctx  *runContext
}

// runAlloc is what Run allocates per attempt, in one allocation: the scope, the Tx
// handle given to fn, and fn's context.
type runAlloc struct {
	sc  Scope
	tx  runTx
	ctx runContext
}

// release ends every handle of the attempt's transaction and gives its connection back.
func (a *attemptTx) release() {
	a.sc.Tx.end()
	if a.held.release != nil {
		a.held.release()
	}
}

// RunAttempt is one attempt: it begins a transaction, runs fn in it and ends it. It ends
// the frame too, here only, once fn has returned or panicked: the frame's span outlives
// the commit, for the post-commit hooks and the retry event. retry says whether Run
// tries again.
func RunAttempt[T any](ctx context.Context, db TxBeginner, p AttemptPolicy, fn func(context.Context, pgx.Tx) (T, error), n int) (res outcome.Result[T], retry bool) {
	a, res := beginAttempt[T](ctx, db, p, n)
	if res != nil {
		return res, ShouldRetry(ctx, p.MaxAttempts, res, n)
	}
	if f := a.sc.frame; f != nil {
		defer func() { endAttemptFrame(a.sc.t, f, res, retry) }()
	}
	value, err := callFn(ctx, &a, fn)
	res = endAttempt(ctx, &a, value, err)
	return res, ShouldRetry(ctx, p.MaxAttempts, res, n)
}

// endAttemptFrame ends attempt n's frame with its result, through the frame's door: a
// nil result is a panic in fn, which rolled the transaction back; a retried attempt's
// frame says so with a tx.retry event.
func endAttemptFrame[T any](t *frame.Core, f *frame.Frame, res outcome.Result[T], retry bool) {
	o, failed := outcome.OutcomeRolledBack, error(nil)
	if res != nil {
		o, failed = res.Outcome(), postCommitFailure(res)
	} else {
		retry = false
	}
	t.Feed(f, func(ev *evidence.Conn[*frame.Frame]) evidence.Result { return ev.Finish(f, o, failed, retry) })
}

// postCommitFailure is the error of res's post-commit hooks, or nil.
func postCommitFailure[T any](res outcome.Result[T]) error {
	if r, ok := res.(outcome.CommittedWithPostCommitFailure[T]); ok {
		return r.Failure()
	}
	return nil
}

// beginAttempt acquires a connection and begins attempt n's transaction on it. When
// nothing could be begun it returns the not_started rollback instead. The attempt is a
// value, so that Run allocates nothing for it.
func beginAttempt[T any](ctx context.Context, db TxBeginner, p AttemptPolicy, n int) (attemptTx, outcome.Result[T]) {
	opts := p.Opts
	held, err := acquire(ctx, db)
	if err != nil {
		v := classifier.Classify(outcome.PhaseNotStarted, err, classifier.Facts{})
		return attemptTx{}, determinateRollback[T](outcome.OperationID{}, outcome.PhaseNotStarted, err, v.Retryable())
	}
	var tx pgx.Tx
	if held.conn != nil {
		// The frame BEGIN starts carries the policy's references, checked ahead of BEGIN
		// in its write as the tracer's are (see frame.Core.ArmCheck).
		st := frame.State(held.conn.PgConn())
		if st != nil {
			st.Refs.Running(p.Refs)
		}
		tx, err = held.conn.BeginTx(ctx, opts)
		if st != nil {
			st.Refs.Ran()
		}
	} else {
		tx, err = db.BeginTx(ctx, opts)
	}
	if err != nil {
		closed := held.conn != nil && held.conn.IsClosed()
		if held.release != nil {
			held.release()
		}
		v := classifier.Classify(outcome.PhaseNotStarted, err, classifier.Facts{ConnClosed: closed})
		return attemptTx{}, determinateRollback[T](outcome.OperationID{}, outcome.PhaseNotStarted, err, v.Retryable())
	}
	alloc := &runAlloc{}
	alloc.tx.tx = tx
	f, t := frame.FrameOfTx(tx)
	alloc.sc = Scope{Tx: &alloc.tx, frame: f, t: t, Suspended: ScopeFromContext(ctx)}
	sc := &alloc.sc
	sc.Pool, _ = db.(*pgxpool.Pool)
	if f := sc.frame; f != nil {
		f.Managed, f.Propagation, f.AttemptNo = true, p.Propagation, int32(n)
		sc.ID = f.ID
	} else {
		sc.ID = outcome.NewOperationID()
	}
	alloc.ctx = runContext{Context: ctx, sc: sc}
	return attemptTx{held: held, tx: tx, sc: sc, ctx: &alloc.ctx}, nil
}

// callFn runs fn in the attempt's transaction, with its scope and frame in the context.
// A panic in fn rolls back, releases the connection and panics again.
func callFn[T any](ctx context.Context, a *attemptTx, fn func(context.Context, pgx.Tx) (T, error)) (T, error) {
	sc := a.sc
	var fctx context.Context = a.ctx
	if f := sc.frame; f != nil {
		fctx = f.WithSpan(fctx)
	}
	defer func() {
		if pv := recover(); pv != nil {
			cause := fmt.Errorf("otelpgxtx: panic in the transaction function: %v", pv)
			rollbackAttempt(ctx, sc, a.tx, cause)
			sc.takeHooks()
			a.release()
			panic(pv)
		}
	}()
	return fn(fctx, sc.Tx)
}

// endAttempt ends the transaction after fn returned err: it rolls back when fn failed, a
// participant doomed the transaction or a result is unread, and commits otherwise.
func endAttempt[T any](ctx context.Context, a *attemptTx, value T, err error) outcome.Result[T] {
	sc, tx := a.sc, a.tx
	if err == nil {
		err = sc.rollbackCause()
	}
	if err == nil && tx.Conn() != nil && tx.Conn().PgConn().IsBusy() {
		// pgconn would refuse COMMIT on a busy connection before sending a byte, so the
		// transaction is rolled back, for certain, instead of being left to look unknown.
		err = errs.ErrUnreadResult
	}
	if err != nil {
		v := rollbackAttempt(ctx, sc, tx, err)
		sc.takeHooks()
		a.release()
		if v.Evidence() == classifier.EvidenceUnknown {
			// The server could not tell whether a statement completed, and that statement
			// may have been the commit (see evidence.Conn.After): never a rollback.
			return resultOfCommit[T](ctx, sc, commitOutcome{classification: v, err: err}, nil, value)
		}
		return determinateRollback[T](sc.ID, outcome.PhaseActive, err, v.Retryable())
	}
	cr := commitAttempt(ctx, sc, tx)
	hooks := sc.takeHooks()
	a.release()
	return resultOfCommit(ctx, sc, cr, hooks, value)
}

// resultOfCommit is the result of the COMMIT that cr describes: a confirmed commit runs
// the AfterCommit hooks, a prepared transaction is participating, an unobserved one is
// indeterminate, and anything else rolled back.
func resultOfCommit[T any](ctx context.Context, sc *Scope, cr commitOutcome, hooks []func(context.Context) error, value T) outcome.Result[T] {
	f := sc.frame
	v := cr.classification
	switch v.Evidence() {
	case classifier.EvidenceCommitted:
		if perr := runHooks(ctx, sc.t, f, hooks); perr != nil {
			// perr is not nil: the constructor has nothing to refuse.
			r, _ := outcome.NewCommittedWithPostCommitFailure(sc.ID, value, perr)
			return r
		}
		return outcome.NewCommitted(sc.ID, value, v.CommittedLocally())
	case classifier.EvidenceUnknown:
		if f != nil && f.Ev.Prepared() && cr.err == nil {
			// fn prepared the transaction (PREPARE TRANSACTION): its coordinator decides
			// it, so nothing is confirmed and no hook runs (see Run). Had fn failed after,
			// its error is the cause of an Indeterminate.
			return outcome.NewParticipating(sc.ID, value)
		}
		d := verdict.Data{Outcome: outcome.OutcomeIndeterminate, ID: sc.ID, Cause: cr.err, Ref: cr.ref, CommittedLocally: v.CommittedLocally()}
		if f != nil {
			d.Span = f.OTel.SpanContext()
		}
		return verdict.ResultOf(&d, value)
	}
	d := verdict.Data{Outcome: outcome.OutcomeRolledBack, ID: sc.ID, Phase: outcome.PhaseCommitting, Cause: cr.err,
		Reason: classifier.ReasonCommitRollback, Retryable: v.Retryable()} // no error: COMMIT answered ROLLBACK, as pgx says it
	return verdict.ResultOf(&d, value)
}

// rollbackAttempt ends the transaction after fn failed with cause, and returns the verdict:
// the cause decides whether a retry can help.
func rollbackAttempt(ctx context.Context, sc *Scope, tx pgx.Tx, cause error) classifier.Classification {
	conn := tx.Conn()
	closed := conn != nil && conn.IsClosed()
	v := classifier.Classify(outcome.PhaseActive, cause, classifier.Facts{ConnClosed: closed})
	f := sc.frame
	if f != nil && sc.t.Feed(f, func(ev *evidence.Conn[*frame.Frame]) evidence.Result { return ev.RolledBackBy(f, cause, v) }) {
		f.JudgeErr(&sc.t.Cfg, ctx, cause)
	}
	// The caller's context may be what failed; the rollback must still be sent. Its error
	// changes nothing: a failed rollback closes the connection, which rolls back too.
	_ = tx.Rollback(context.WithoutCancel(ctx))
	if f == nil {
		return v
	}
	// Where the rollback never reached the tracer (the connection was gone), the frame is
	// still open: the executor concludes it with its first failure.
	sc.t.Feed(f, func(ev *evidence.Conn[*frame.Frame]) evidence.Result { return ev.Conclude(f, f.Ev.FirstFailure()) })
	return f.Ev.Verdict()
}

// commitOutcome is what commit observed: the classification, the COMMIT's error and the
// reference its frame took.
type commitOutcome struct {
	classification classifier.Classification
	err            error
	ref            *outcome.ReconciliationRef
}

// commitAttempt ends the transaction with pgx's own COMMIT, and returns the classification: the
// frame's, which has seen the server's notices and what the library's additions to the
// writes brought (the reference), or else the classifier's on the error alone.
func commitAttempt(ctx context.Context, sc *Scope, tx pgx.Tx) commitOutcome {
	err := tx.Commit(ctx)
	if f := sc.frame; f != nil && !f.Ev.Open() {
		return commitOutcome{classification: f.Ev.Verdict(), err: err, ref: f.CommitRef.Ref()}
	}
	facts := classifier.Facts{RollbackTag: errors.Is(err, pgx.ErrTxCommitRollback)}
	if conn := tx.Conn(); conn != nil {
		facts.Server = classifier.ServerOf(conn.PgConn().ParameterStatus)
	}
	return commitOutcome{classification: classifier.Classify(outcome.PhaseCommitting, err, facts), err: err}
}

// NotStarted is the result of a call that began nothing: err is never nil here, and
// not_started is a rollback phase, so the constructor cannot refuse it.
func NotStarted[T any](err error) outcome.Result[T] {
	return determinateRollback[T](outcome.OperationID{}, outcome.PhaseNotStarted, err, false)
}

// determinateRollback is the result of a transaction rolled back for certain. Every
// caller passes the error that ended it and a phase a rollback can be observed in, so
// the constructor has nothing to refuse.
func determinateRollback[T any](id outcome.OperationID, phase outcome.Phase, cause error, retryable bool) outcome.DeterminateRollback[T] {
	r, _ := outcome.NewDeterminateRollback[T](id, phase, cause, retryable)
	return r
}

// runHooks runs the post-commit hooks in a tx.post_commit span under the frame. A
// failure (or a panic) in one does not stop the others and never undoes the commit.
func runHooks(ctx context.Context, t *frame.Core, f *frame.Frame, hooks []func(context.Context) error) error {
	if len(hooks) == 0 {
		return nil
	}
	tracer := otel.GetTracerProvider().Tracer(schema.ScopeName)
	if f != nil {
		tracer = t.Tracer
		ctx = f.WithSpan(ctx)
	}
	ctx, span := tracer.Start(ctx, schema.SpanNamePostCommit)
	defer span.End()
	if f != nil && span.IsRecording() {
		span.SetAttributes(schema.OperationIDKey.String(f.ID.String()))
	}
	var errs []error
	for _, h := range hooks {
		if err := runHook(ctx, h); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	if len(errs) == 1 {
		err = errs[0] // keep its type for exception.type
	}
	if err != nil {
		// A hook's error is the application's own and may quote its data.
		span.RecordError(redact.Error(err, t != nil && t.Cfg.ErrorMessages))
		span.SetStatus(codes.Error, "post-commit work failed")
		return err
	}
	return nil
}

// runHook runs one hook, turning its panic into an error so that the others still run.
func runHook(ctx context.Context, h func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("otelpgxtx: panic in a post-commit hook: %v", p)
		}
	}()
	return h(ctx)
}

// TxBeginner is what an attempt begins its transaction on: the root package's DB.
type TxBeginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// AttemptPolicy is what an attempt needs of Run's Policy, made once per Run call.
type AttemptPolicy struct {
	Opts        pgx.TxOptions
	Refs        reference.Refs // the commit references its frame carries
	Propagation string         // Policy.Propagation's name, tx.propagation
	MaxAttempts int
}

// ShouldRetry reports whether Run tries again after attempt n ended with res: only a
// retryable rollback is, and only while attempts and the caller's time are left.
func ShouldRetry[T any](ctx context.Context, maxAttempts int, res outcome.Result[T], n int) bool {
	rb, ok := res.(outcome.DeterminateRollback[T])
	return ok && rb.Retryable() && n < maxAttempts && ctx.Err() == nil
}
