package outcome

import "github.com/txevidence/otelpgxtx/internal/errs"

// Result is how one transaction call ended, with what the caller may rely on. It is
// sealed: its five variants are the only implementations, so a type switch over them is
// exhaustive:
//
//	switch r := res.(type) {
//	case outcome.Committed[T]:                      // continue with r.Value()
//	case outcome.Participating[T]:                  // joined an outer transaction: confirms nothing
//	case outcome.DeterminateRollback[T]:            // rolled back for certain; r.Retryable()
//	case outcome.Indeterminate[T]:                  // hand to reconciliation; never replay
//	case outcome.CommittedWithPostCommitFailure[T]: // committed; report r.Failure()
//	}
type Result[T any] interface {
	// Outcome returns which of the five outcomes this is.
	Outcome() Outcome
	// OperationID returns the id of the transaction frame the call ran in.
	OperationID() OperationID
	// sealed mentions T so that a Committed[string] is not a Result[int], and so that
	// T can be inferred from a variant passed where a Result[T] is expected.
	sealed(T)
}

// Committed is a call whose physical commit was confirmed.
type Committed[T any] struct {
	id               OperationID
	value            T
	committedLocally bool
}

// NewCommitted returns a committed result carrying fn's value. committedLocally records
// that the server confirmed the commit in its local WAL but not its synchronous
// replication (the wait was cancelled).
func NewCommitted[T any](id OperationID, value T, committedLocally bool) Committed[T] {
	return Committed[T]{id: id, value: value, committedLocally: committedLocally}
}

// Outcome returns [OutcomeCommitted].
func (Committed[T]) Outcome() Outcome { return OutcomeCommitted }

// OperationID returns the frame's operation id.
func (r Committed[T]) OperationID() OperationID { return r.id }

// Value returns the value the transaction function returned.
func (r Committed[T]) Value() T { return r.value }

// CommittedLocally reports that the commit is in the primary's WAL but its synchronous
// replication was not confirmed.
func (r Committed[T]) CommittedLocally() bool { return r.committedLocally }

func (Committed[T]) sealed(T) {}

// Participating is a call that joined a transaction begun by an outer call, or one that
// prepared its transaction (PREPARE TRANSACTION) for a coordinator to decide. It never
// claims a commit, not even after the outer transaction commits: only the owner's result
// (or the coordinator's COMMIT PREPARED) says that.
type Participating[T any] struct {
	id    OperationID
	value T
}

// NewParticipating returns a participating result; id is the joined (owner's) frame, or
// the prepared one's.
func NewParticipating[T any](id OperationID, value T) Participating[T] {
	return Participating[T]{id: id, value: value}
}

// Outcome returns [OutcomeParticipating].
func (Participating[T]) Outcome() Outcome { return OutcomeParticipating }

// OperationID returns the operation id of the frame that was joined.
func (r Participating[T]) OperationID() OperationID { return r.id }

// Value returns the value the function returned; it is not known to be committed.
func (r Participating[T]) Value() T { return r.value }

func (Participating[T]) sealed(T) {}

// DeterminateRollback is a transaction that is rolled back for certain.
type DeterminateRollback[T any] struct {
	id        OperationID
	phase     Phase
	cause     error
	retryable bool
}

// NewDeterminateRollback returns a rollback observed in phase (not_started, active or
// committing: the phase the transaction was in when the rollback became certain). It
// refuses a nil cause and a phase that contradicts a certain rollback (committed,
// unknown, or rolled_back itself, which names no moment).
func NewDeterminateRollback[T any](id OperationID, phase Phase, cause error, retryable bool) (DeterminateRollback[T], error) {
	if cause == nil {
		return DeterminateRollback[T]{}, invalid("a determinate rollback needs its cause")
	}
	if phase != PhaseNotStarted && phase != PhaseActive && phase != PhaseCommitting {
		return DeterminateRollback[T]{}, invalid("a determinate rollback cannot be observed in phase %s", phase)
	}
	return DeterminateRollback[T]{id: id, phase: phase, cause: cause, retryable: retryable}, nil
}

// Outcome returns [OutcomeRolledBack].
func (DeterminateRollback[T]) Outcome() Outcome { return OutcomeRolledBack }

// OperationID returns the frame's operation id.
func (r DeterminateRollback[T]) OperationID() OperationID { return r.id }

// Phase returns the phase in which the rollback became certain.
func (r DeterminateRollback[T]) Phase() Phase { return r.phase }

// Cause returns why the transaction was rolled back.
func (r DeterminateRollback[T]) Cause() error { return r.cause }

// Retryable reports whether running the whole transaction again is safe and may succeed
// (serialization failure, deadlock, connection lost before COMMIT was sent).
func (r DeterminateRollback[T]) Retryable() bool { return r.retryable }

func (DeterminateRollback[T]) sealed(T) {}

// Indeterminate is a transaction whose COMMIT was sent and whose fate is unknown. It has
// no retry field on purpose: replaying it can apply the work twice. Resolve it from the
// database's own records instead (see [ReconciliationRef]).
type Indeterminate[T any] struct {
	id               OperationID
	ref              ReconciliationRef
	hasRef           bool
	cause            error
	committedLocally bool
	traceParent      string
}

// NewIndeterminate returns an indeterminate result, whose last observed phase is
// committing: only a failure while committing makes a commit's fate unknown. ref is
// optional; when given it must be well formed. committedLocally records a server warning
// that the commit was already in local WAL. It refuses a nil cause and a zero id, without
// which the outcome could not be reconciled or even found.
func NewIndeterminate[T any](id OperationID, cause error, ref *ReconciliationRef, committedLocally bool) (Indeterminate[T], error) {
	if cause == nil {
		return Indeterminate[T]{}, invalid("an indeterminate outcome needs the failure that made it unknown")
	}
	if id.IsZero() {
		return Indeterminate[T]{}, invalid("an indeterminate outcome needs an operation id")
	}
	r := Indeterminate[T]{id: id, cause: cause, committedLocally: committedLocally}
	if ref != nil {
		if err := ref.Validate(); err != nil {
			return Indeterminate[T]{}, err
		}
		r.ref, r.hasRef = *ref, true
	}
	return r, nil
}

// Outcome returns [OutcomeIndeterminate].
func (Indeterminate[T]) Outcome() Outcome { return OutcomeIndeterminate }

// OperationID returns the frame's operation id.
func (r Indeterminate[T]) OperationID() OperationID { return r.id }

// Reference returns the reconciliation reference, if one was taken before COMMIT.
func (r Indeterminate[T]) Reference() (ReconciliationRef, bool) { return r.ref, r.hasRef }

// Cause returns the failure that left the commit's fate unknown.
func (r Indeterminate[T]) Cause() error { return r.cause }

// CommittedLocally reports that the server warned the commit was already in its local
// WAL before the connection was lost: strong evidence, still not a confirmation.
func (r Indeterminate[T]) CommittedLocally() bool { return r.committedLocally }

// WithTraceParent returns r carrying the W3C traceparent of the span that observed it,
// so that a reconciliation, even in another process, can link back to it.
func (r Indeterminate[T]) WithTraceParent(traceParent string) Indeterminate[T] {
	r.traceParent = traceParent
	return r
}

// TraceParent returns the W3C traceparent recorded with [Indeterminate.WithTraceParent], or "".
func (r Indeterminate[T]) TraceParent() string { return r.traceParent }

func (Indeterminate[T]) sealed(T) {}

// CommittedWithPostCommitFailure is a committed transaction whose follow-up work, run
// after the commit, failed. The commit stands; only the follow-up is to be reported.
type CommittedWithPostCommitFailure[T any] struct {
	id      OperationID
	value   T
	failure error
}

// NewCommittedWithPostCommitFailure returns the result; it refuses a nil failure.
func NewCommittedWithPostCommitFailure[T any](id OperationID, value T, failure error) (CommittedWithPostCommitFailure[T], error) {
	if failure == nil {
		return CommittedWithPostCommitFailure[T]{}, invalid("a post-commit failure needs the failure")
	}
	return CommittedWithPostCommitFailure[T]{id: id, value: value, failure: failure}, nil
}

// Outcome returns [OutcomeCommittedWithPostCommitFailure].
func (CommittedWithPostCommitFailure[T]) Outcome() Outcome {
	return OutcomeCommittedWithPostCommitFailure
}

// OperationID returns the frame's operation id.
func (r CommittedWithPostCommitFailure[T]) OperationID() OperationID { return r.id }

// Value returns the value the transaction function returned; it is committed.
func (r CommittedWithPostCommitFailure[T]) Value() T { return r.value }

// Failure returns the error of the post-commit work.
func (r CommittedWithPostCommitFailure[T]) Failure() error { return r.failure }

func (CommittedWithPostCommitFailure[T]) sealed(T) {}

// invalid is an error of this package wrapping the module's ErrInvalidArgument
// (otelpgxtx.ErrInvalidArgument): a constructor's argument refused.
var invalid = errs.Package("outcome").Invalid
