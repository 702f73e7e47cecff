package otelpgxtx

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

// endReasonError is the cause of a rollback that no error of the application's showed:
// the frame ended for reason (a classifier or tracer reason, e.g. connection_closed).
type endReasonError struct{ reason string }

func (e endReasonError) Error() string {
	return "otelpgxtx: the transaction was rolled back: " + e.reason
}

// Verdict receives how the transaction that the caller ends ended, as the tracer
// concluded it, for code that uses pgx or database/sql directly rather than [Run]. Make
// one per transaction attempt with [NewVerdict], begin or end the transaction with the
// context it returns, and ask [Verdict.Result] once the call that ended it (Commit,
// Rollback, pgx.BeginFunc, a COMMIT sent by hand) has returned:
//
//	ctx, verdict := otelpgxtx.NewVerdict(ctx)
//	err := pgx.BeginFunc(ctx, pool, work) // or pool.Begin(ctx) … tx.Commit(ctx), or db.BeginTx(ctx, nil) … tx.Commit()
//	if err != nil {
//		res, verr := verdict.Result()
//		// DeterminateRollback with Retryable(): retry; Indeterminate: reconcile, never replay.
//	}
//
// It answers for one transaction, whether or not its frame was sampled or filtered:
//
//   - a transaction that never reached the server: an instrumented pool's Acquire, or an
//     instrumented pgx.Connect, failed with the context (the pool could not connect): a
//     DeterminateRollback in not_started, retryable as Run's is, unless something below
//     was recorded too;
//   - the frame begun (BEGIN) with its context, when that frame ends, by whatever call
//     or on whatever goroutine it ends (so database/sql's Commit, which takes no context,
//     answers through the context given to BeginTx);
//   - the frame ended by a call made with its context (Commit(ctx), Exec(ctx, "commit"));
//   - a savepoint released with its context (pgx's pseudo-nested Tx.Commit): Participating,
//     as [Run]'s Nested is: the work joined the transaction, which is not committed yet; a
//     savepoint rolled back to: a DeterminateRollback that is not retryable, its
//     transaction going on.
//
// The last of these to happen is the answer. A frame begun with the context and not yet
// ended, or no frame at all, is [ErrNoVerdict]. Since the context belongs to the caller,
// a pooled connection handed to another goroutine after Commit never writes to it: the
// answer is always about a transaction of the caller's. Do not share one Verdict between
// transactions that run at the same time.
//
// Asking costs three allocations per transaction (NewVerdict's two, Result's one), about
// 0.4 µs; the hooks allocate nothing for it, and until a process first calls NewVerdict they
// do not even look for one. It never changes what pgx or database/sql return. Its methods
// are safe for concurrent use.
type Verdict struct {
	s verdictState
}

// verdictState is a Verdict's answer as the frames tell it, and what a Retry attempt
// asks of it; the frames hold it, in the context NewVerdict made.
type verdictState struct {
	mu  sync.Mutex
	err error // a bad argument to NewVerdict
	d   verdictData
	// earlier is what the transactions told before the last one left (see fold).
	earlier earlierFrames
	// attempt is the Retry attempt the Verdict is of (from 1), 0 outside Retry: the
	// frames begun with its context carry it as tx.attempt. Set before it is shared.
	attempt int
}

// earlierFrames is what the transactions a Verdict was told of before its last one
// leave to its answer: the attempt's work is in the database if any of them committed,
// and may be if any is unknown.
type earlierFrames struct {
	committed   bool
	committedID outcome.OperationID // the last that committed
	unknown     verdictData         // the first whose commit is unknown, when unknowns > 0
	unknowns    int
}

// fold moves d, the verdict of a transaction that ended, into e.
func (e *earlierFrames) fold(d verdictData) {
	switch {
	case !d.set || !d.frame:
	case d.outcome == outcome.OutcomeCommitted || d.outcome == outcome.OutcomeCommittedWithPostCommitFailure:
		e.committed, e.committedID = true, d.id
	case d.outcome == outcome.OutcomeIndeterminate:
		if e.unknowns == 0 {
			e.unknown = d
		}
		e.unknowns++
	}
}

// verdictData is what a Verdict holds of the transaction, replaced whole at each record.
type verdictData struct {
	open    bool // a frame began with the context and has not ended
	set     bool
	frame   bool // set by a transaction's end (not a savepoint's)
	outcome outcome.Outcome
	id      outcome.OperationID
	// phase is the phase a rollback became certain in.
	phase            outcome.Phase
	retryable        bool
	committedLocally bool
	ref              outcome.ReconciliationRef
	hasRef           bool
	cause            error  // the failure, nil when reason tells
	reason           string // the verdict's reason, for a cause no error showed
	span             trace.SpanContext
	// awaited is automatic reconciliation's answer to an indeterminate frame, or nil.
	awaited *awaited
}

// frameAnswer is what the frame tells a Verdict: asked is the one in the context the
// frame began in, or nil; unsentAsked one in the context of a COMMIT that never left
// (evidence.Result.Waits), told when the frame ends, after that call returned; awaited is
// automatic reconciliation's answer, made when the frame ends unknown on a tracer that
// reconciles (WithAutoReconcile): a Retry told this frame waits for it.
type frameAnswer struct {
	asked       *verdictState
	unsentAsked *verdictState
	awaited     *awaited
}

// verdictKey is the context key of a *Verdict.
type verdictKey struct{}

// verdictsAsked is set by the first NewVerdict: until then no hook looks for a Verdict in
// a context, so that a tracer whose callers never ask pays not even the lookup.
var verdictsAsked atomic.Bool

// NewVerdict returns a context carrying a new [Verdict], and the Verdict. Begin or end one
// transaction with the context (see Verdict). A nil ctx is a bad argument: the
// Verdict's Result then returns an error wrapping [ErrInvalidArgument], and the context
// returned is context.Background, so that nothing panics.
func NewVerdict(ctx context.Context) (context.Context, *Verdict) {
	v := &Verdict{}
	if ctx == nil {
		v.s.err = invalid("NewVerdict: nil context")
		return context.Background(), v
	}
	verdictsAsked.Store(true)
	return context.WithValue(ctx, verdictKey{}, &v.s), v
}

// verdictFrom returns the Verdict ctx carries, or nil; without a lookup until one was made.
func verdictFrom(ctx context.Context) *verdictState {
	if !verdictsAsked.Load() || ctx == nil {
		return nil
	}
	v, _ := ctx.Value(verdictKey{}).(*verdictState)
	return v
}

// Result returns how the transaction ended, as one of the variants of [outcome.Result]
// (with no value: struct{}):
//
//   - Committed: the commit was confirmed; CommittedLocally says its synchronous
//     replication was not;
//   - DeterminateRollback: rolled back for certain; Retryable() says whether running the
//     whole transaction again is safe and may succeed (serialization failure, deadlock,
//     connection lost before COMMIT was sent, no connection could be acquired or made);
//     Cause() is the first failure, or why it ended;
//   - Indeterminate: COMMIT was sent and its fate is unknown: never replay it. Reference()
//     is the reconciliation reference when the tracer took one ([WithCommitReference],
//     [WithCommitMarker]); hand it to package reconcile (reconcile.Indeterminate), or wait
//     for [WithAutoReconcile]'s callback with its OperationID();
//   - Participating: a savepoint was released: nothing is committed yet.
//
// OperationID() is the frame's tx.operation_id. When the tracer cannot know, the error
// wraps [ErrNoVerdict] and says why; a nil Verdict, or one from NewVerdict(nil), is an
// error wrapping [ErrInvalidArgument].
func (v *Verdict) Result() (outcome.Result[struct{}], error) {
	if v == nil {
		return nil, invalid("Verdict.Result: nil *Verdict")
	}
	return v.s.answer()
}

// answer is Result's answer.
func (v *verdictState) answer() (outcome.Result[struct{}], error) {
	v.mu.Lock()
	d := v.d
	earlier := v.earlier
	err := v.err
	v.mu.Unlock()
	switch {
	case err != nil:
		return nil, err
	case !d.set && d.open:
		return nil, fmt.Errorf("%w: the transaction begun with this context has not ended", errNoVerdict)
	case !d.set:
		return nil, fmt.Errorf("%w: no transaction of an instrumented connection was begun or ended with this context", errNoVerdict)
	}
	return earlier.with(&d), nil
}

// with is the answer for an attempt whose last transaction ended as d, after the
// transactions of e: nothing of the attempt is in the database only if every one of them
// is a proven rollback. So one whose commit is unknown makes the attempt's indeterminate
// (the last such, else the first before it), and a rollback after one that committed
// is a commit with a failure after it — never a rollback, which Retry would run again.
func (e *earlierFrames) with(d *verdictData) outcome.Result[struct{}] {
	switch {
	case d.outcome == outcome.OutcomeIndeterminate:
		return d.result()
	case e.unknowns > 0:
		return e.unknown.result()
	case e.committed && d.outcome == outcome.OutcomeRolledBack:
		r, _ := outcome.NewCommittedWithPostCommitFailure(e.committedID, struct{}{}, d.rollbackCause())
		return r
	}
	return d.result()
}

// settleable reports whether the attempt's answer, indeterminate, is the only thing of
// it not known — one transaction whose commit is unknown —, so that settling it answers
// for the attempt; and, if another of its transactions committed, that one's id: then
// a proven abort of the unknown one leaves a commit with a failure after it, no rollback.
func (v *verdictState) settleable() (ok bool, committed *outcome.OperationID) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e := v.earlier
	unknowns := e.unknowns
	if v.d.outcome == outcome.OutcomeIndeterminate {
		unknowns++
	}
	if e.committed {
		id := e.committedID
		committed = &id
	}
	return unknowns == 1, committed
}

// result is d's verdict as a Result.
func (d *verdictData) result() outcome.Result[struct{}] {
	switch d.outcome {
	case outcome.OutcomeCommitted:
		return outcome.NewCommitted(d.id, struct{}{}, d.committedLocally)
	case outcome.OutcomeParticipating:
		return outcome.NewParticipating(d.id, struct{}{})
	case outcome.OutcomeCommittedWithPostCommitFailure:
		r, _ := outcome.NewCommittedWithPostCommitFailure(d.id, struct{}{}, d.causeErr(errRolledBack))
		return r
	case outcome.OutcomeIndeterminate:
		var ref *outcome.ReconciliationRef
		if d.hasRef {
			ref = &d.ref
		}
		r, err := outcome.NewIndeterminate[struct{}](d.id, d.causeErr(errCommitUnobserved), ref, d.committedLocally)
		if err != nil {
			// A reference the tracer took is well formed; should one not be, the outcome is
			// still indeterminate, without it.
			r, _ = outcome.NewIndeterminate[struct{}](d.id, d.causeErr(errCommitUnobserved), nil, d.committedLocally)
		}
		if d.span.IsValid() {
			r = r.WithTraceParent(schema.TraceParent(d.span))
		}
		return r
	}
	// A cause, and a phase a rollback is observed in: the constructor has nothing to refuse.
	r, _ := outcome.NewDeterminateRollback[struct{}](d.id, d.phase, d.rollbackCause(), d.retryable)
	return r
}

// rollbackCause is the cause of d, a rollback: the failure, or why it ended.
func (d *verdictData) rollbackCause() error {
	var fallback error
	switch d.reason {
	case classifier.ReasonRolledBack:
		fallback = errRolledBack
	case classifier.ReasonCommitRollback:
		fallback = pgx.ErrTxCommitRollback // as pgx's Commit says it
	default:
		fallback = endReasonError{d.reason}
	}
	return d.causeErr(fallback)
}

// causeErr is the recorded cause, or fallback when no error showed one.
func (d *verdictData) causeErr(fallback error) error {
	if d.cause != nil {
		return d.cause
	}
	return fallback
}

// pending returns automatic reconciliation's answer to the indeterminate frame v was
// last told of, or nil when the frame's tracer does not reconcile.
func (v *verdictState) pending() *awaited {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.d.outcome != outcome.OutcomeIndeterminate {
		return nil
	}
	return v.d.awaited
}

// began records that a frame begun with v's context is under way: a verdict recorded
// before belongs to an earlier transaction of the attempt, and is folded into what the
// earlier ones leave (earlierFrames).
func (v *verdictState) began() {
	v.mu.Lock()
	v.earlier.fold(v.d)
	v.d = verdictData{open: true}
	v.mu.Unlock()
}

// frameEnded records the verdict of a concluded frame, of ending e. It runs under the
// frame's connection's lock, on whichever goroutine concluded it.
func (v *verdictState) frameEnded(e *ending) {
	d := verdictData{set: true, frame: true, outcome: e.outcome, id: e.id, committedLocally: e.committedLocally, reason: e.verdict.Reason()}
	switch e.outcome {
	case outcome.OutcomeCommittedWithPostCommitFailure:
		d.cause = e.endErr // the call's failure after the commit
	case outcome.OutcomeIndeterminate:
		d.cause = e.endErr
		if e.ref != nil {
			d.ref, d.hasRef = *e.ref, true
		}
		if e.recorded {
			d.span = e.span
		}
		d.awaited = e.awaited
	case outcome.OutcomeRolledBack:
		d.retryable = e.verdict.Retryable()
		d.phase = e.endedIn
		d.cause = e.firstCause
		if d.cause == nil {
			d.cause = e.cause // Run's function's error
		}
		if d.cause == nil {
			d.cause = e.endErr
		}
	}
	v.mu.Lock()
	if !v.d.open {
		v.earlier.fold(v.d) // a frame begun in another context, ended with this one
	}
	v.d = d
	v.mu.Unlock()
}

// notStarted records that a transaction tried with v's context never reached the server:
// the pool could not acquire a connection, or none could be made (refused, a server in
// crash recovery or at its connection limit, a TLS or authentication failure). Nothing
// of it was sent, so it rolled back for certain; whether running it again may succeed is
// the classifier's, as for Run's not_started rollback. It answers only when nothing else
// was recorded: a frame begun or ended with the context is the answer.
func (v *verdictState) notStarted(err error) {
	c := classifier.Classify(outcome.PhaseNotStarted, err, classifier.Facts{})
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.d.open || v.d.set && !v.d.frame {
		return
	}
	v.earlier.fold(v.d) // a transaction of the attempt that ended before
	v.d = verdictData{set: true, frame: true, outcome: outcome.OutcomeRolledBack, phase: outcome.PhaseNotStarted, retryable: c.Retryable(),
		cause: err, reason: c.Reason()}
}

// savepointEnded records the verdict of a savepoint statement of the transaction of
// operation id, answered without error: released (Participating) or rolled back to.
func (v *verdictState) savepointEnded(id outcome.OperationID, rolledBack bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d := verdictData{set: true, open: v.d.open, outcome: outcome.OutcomeParticipating, id: id}
	if rolledBack {
		d.outcome, d.phase, d.cause = outcome.OutcomeRolledBack, outcome.PhaseActive, errSavepointRolledBack
	}
	v.d = d
}
