package verdict

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/errs"
	"github.com/txevidence/otelpgxtx/internal/record"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

// endReasonError is the cause of a rollback that no error of the application's showed:
// the frame ended for reason (a classifier or tracer reason, e.g. connection_closed).
type endReasonError struct{ reason string }

func (e endReasonError) Error() string {
	return "otelpgxtx: the transaction was rolled back: " + e.reason
}

// State is a Verdict's answer as the frames tell it, and what a Retry attempt
// asks of it; the frames hold it, in the context NewVerdict made.
type State struct {
	mu  sync.Mutex
	Err error // a bad argument to NewVerdict
	d   Data
	// earlier is what the transactions told before the last one left (see fold).
	earlier Earlier
	// Attempt is the Retry attempt the Verdict is of (from 1), 0 outside Retry: the
	// frames begun with its context carry it as tx.attempt. Set before it is shared.
	Attempt int
}

// Earlier is what the transactions a Verdict was told of before its last one
// leave to its answer: the attempt's work is in the database if any of them committed,
// and may be if any is unknown.
type Earlier struct {
	committed   bool
	committedID outcome.OperationID // the last that committed
	unknown     Data                // the first whose commit is unknown, when unknowns > 0
	unknowns    int
}

// add moves d, the verdict of a transaction that ended, into e.
func (e *Earlier) add(d Data) {
	switch {
	case !d.Set || !d.frame:
	case d.Outcome == outcome.OutcomeCommitted || d.Outcome == outcome.OutcomeCommittedWithPostCommitFailure:
		e.committed, e.committedID = true, d.ID
	case d.Outcome == outcome.OutcomeIndeterminate:
		if e.unknowns == 0 {
			e.unknown = d
		}
		e.unknowns++
	}
}

// Data is what a Verdict holds of the transaction, replaced whole at each record.
type Data struct {
	open    bool // a frame began with the context and has not ended
	Set     bool
	frame   bool // set by a transaction's end (not a savepoint's)
	Outcome outcome.Outcome
	ID      outcome.OperationID
	// Phase is the phase a rollback became certain in.
	Phase            outcome.Phase
	Retryable        bool
	CommittedLocally bool
	Ref              *outcome.ReconciliationRef // an indeterminate one's, if taken
	Cause            error                      // the failure, nil when reason tells
	Reason           string                     // the verdict's reason, for a cause no error showed
	Span             trace.SpanContext          // an indeterminate one's frame span, if recorded
	// awaited is automatic reconciliation's answer to an indeterminate frame, or nil.
	awaited *record.Awaited
}

// Key is the context key of a *Verdict.
type Key struct{}

// Asked is set by the first NewVerdict: until then no hook looks for a Verdict in
// a context, so that a tracer whose callers never ask pays not even the lookup.
var Asked atomic.Bool

// From returns the Verdict ctx carries, or nil; without a lookup until one was made.
func From(ctx context.Context) *State {
	if !Asked.Load() || ctx == nil {
		return nil
	}
	v, _ := ctx.Value(Key{}).(*State)
	return v
}

// Answer is Result's answer.
func (v *State) Answer() (outcome.Result[struct{}], error) {
	v.mu.Lock()
	d := v.d
	earlier := v.earlier
	err := v.Err
	v.mu.Unlock()
	switch {
	case err != nil:
		return nil, err
	case !d.Set && d.open:
		return nil, fmt.Errorf("%w: the transaction begun with this context has not ended", errs.ErrNoVerdict)
	case !d.Set:
		return nil, fmt.Errorf("%w: no transaction of an instrumented connection was begun or ended with this context", errs.ErrNoVerdict)
	}
	return earlier.with(&d), nil
}

// with is the answer for an attempt whose last transaction ended as d, after the
// transactions of e: nothing of the attempt is in the database only if every one of them
// is a proven rollback. So one whose commit is unknown makes the attempt's indeterminate
// (the last such, else the first before it), and a rollback after one that committed
// is a commit with a failure after it — never a rollback, which Retry would run again.
func (e *Earlier) with(d *Data) outcome.Result[struct{}] {
	switch {
	case d.Outcome == outcome.OutcomeIndeterminate:
		return d.Result()
	case e.unknowns > 0:
		return e.unknown.Result()
	case e.committed && d.Outcome == outcome.OutcomeRolledBack:
		r, _ := outcome.NewCommittedWithPostCommitFailure(e.committedID, struct{}{}, d.rollbackCause())
		return r
	}
	return d.Result()
}

// Settleable reports whether the attempt's answer, indeterminate, is the only thing of
// it not known — one transaction whose commit is unknown —, so that settling it answers
// for the attempt; and, if another of its transactions committed, that one's id: then
// a proven abort of the unknown one leaves a commit with a failure after it, no rollback.
func (v *State) Settleable() (ok bool, committed *outcome.OperationID) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e := v.earlier
	unknowns := e.unknowns
	if v.d.Outcome == outcome.OutcomeIndeterminate {
		unknowns++
	}
	if e.committed {
		id := e.committedID
		committed = &id
	}
	return unknowns == 1, committed
}

// Result is d's verdict as a Result.
func (d *Data) Result() outcome.Result[struct{}] { return ResultOf(d, struct{}{}) }

// ResultOf is the verdict d as a Result carrying value: the one way a verdict becomes a
// Result, for a Verdict's answer and for Run's.
func ResultOf[T any](d *Data, value T) outcome.Result[T] {
	switch d.Outcome {
	case outcome.OutcomeCommitted:
		return outcome.NewCommitted(d.ID, value, d.CommittedLocally)
	case outcome.OutcomeParticipating:
		return outcome.NewParticipating(d.ID, value)
	case outcome.OutcomeCommittedWithPostCommitFailure:
		r, _ := outcome.NewCommittedWithPostCommitFailure(d.ID, value, d.causeErr(errs.ErrRolledBack))
		return r
	case outcome.OutcomeIndeterminate:
		r, err := outcome.NewIndeterminate[T](d.ID, d.causeErr(errs.ErrCommitUnobserved), d.Ref, d.CommittedLocally)
		if err != nil {
			// A reference the tracer took is well formed; should one not be, the outcome is
			// still indeterminate, without it.
			r, _ = outcome.NewIndeterminate[T](d.ID, d.causeErr(errs.ErrCommitUnobserved), nil, d.CommittedLocally)
		}
		if d.Span.IsValid() {
			r = r.WithTraceParent(schema.TraceParent(d.Span))
		}
		return r
	}
	// A cause, and a phase a rollback is observed in: the constructor has nothing to refuse.
	r, _ := outcome.NewDeterminateRollback[T](d.ID, d.Phase, d.rollbackCause(), d.Retryable)
	return r
}

// rollbackCause is the cause of d, a rollback: the failure, or why it ended.
func (d *Data) rollbackCause() error {
	var fallback error
	switch d.Reason {
	case classifier.ReasonRolledBack:
		fallback = errs.ErrRolledBack
	case classifier.ReasonCommitRollback:
		fallback = pgx.ErrTxCommitRollback // as pgx's Commit says it
	default:
		fallback = endReasonError{d.Reason}
	}
	return d.causeErr(fallback)
}

// causeErr is the recorded cause, or fallback when no error showed one.
func (d *Data) causeErr(fallback error) error {
	if d.Cause != nil {
		return d.Cause
	}
	return fallback
}

// Pending returns automatic reconciliation's answer to the indeterminate frame v was
// last told of, or nil when the frame's tracer does not reconcile.
func (v *State) Pending() *record.Awaited {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.d.Outcome != outcome.OutcomeIndeterminate {
		return nil
	}
	return v.d.awaited
}

// Began records that a frame begun with v's context is under way: a verdict recorded
// before belongs to an earlier transaction of the attempt, and is folded into what the
// earlier ones leave (earlierFrames).
func (v *State) Began() {
	v.mu.Lock()
	v.earlier.add(v.d)
	v.d = Data{open: true}
	v.mu.Unlock()
}

// FrameEnded records the verdict of a concluded frame, of ending e. It runs under the
// frame's connection's lock, on whichever goroutine concluded it.
func (v *State) FrameEnded(e *record.Ending) {
	d := Data{Set: true, frame: true, Outcome: e.Outcome, ID: e.ID, CommittedLocally: e.CommittedLocally, Reason: e.Verdict.Reason()}
	switch e.Outcome {
	case outcome.OutcomeCommittedWithPostCommitFailure:
		d.Cause = e.EndErr // the call's failure after the commit
	case outcome.OutcomeIndeterminate:
		d.Cause = e.EndErr
		d.Ref = e.Ref
		if e.Recorded {
			d.Span = e.Span
		}
		d.awaited = e.Awaited
	case outcome.OutcomeRolledBack:
		d.Retryable = e.Verdict.Retryable()
		d.Phase = e.EndedIn
		d.Cause = e.FirstCause
		if d.Cause == nil {
			d.Cause = e.Cause // Run's function's error
		}
		if d.Cause == nil {
			d.Cause = e.EndErr
		}
	}
	v.mu.Lock()
	if !v.d.open {
		v.earlier.add(v.d) // a frame begun in another context, ended with this one
	}
	v.d = d
	v.mu.Unlock()
}

// NotStarted records that a transaction tried with v's context never reached the server:
// the pool could not acquire a connection, or none could be made (refused, a server in
// crash recovery or at its connection limit, a TLS or authentication failure). Nothing
// of it was sent, so it rolled back for certain; whether running it again may succeed is
// the classifier's, as for Run's not_started rollback. It answers only when nothing else
// was recorded: a frame begun or ended with the context is the answer.
func (v *State) NotStarted(err error) {
	c := classifier.Classify(outcome.PhaseNotStarted, err, classifier.Facts{})
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.d.open || v.d.Set && !v.d.frame {
		return
	}
	v.earlier.add(v.d) // a transaction of the attempt that ended before
	v.d = Data{Set: true, frame: true, Outcome: outcome.OutcomeRolledBack, Phase: outcome.PhaseNotStarted, Retryable: c.Retryable(),
		Cause: err, Reason: c.Reason()}
}

// SavepointEnded records the verdict of a savepoint statement of the transaction of
// operation id, answered without error: released (Participating) or rolled back to.
func (v *State) SavepointEnded(id outcome.OperationID, rolledBack bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d := Data{Set: true, open: v.d.open, Outcome: outcome.OutcomeParticipating, ID: id}
	if rolledBack {
		d.Outcome, d.Phase, d.Cause = outcome.OutcomeRolledBack, outcome.PhaseActive, errs.ErrSavepointRolledBack
	}
	v.d = d
}
