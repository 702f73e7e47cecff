package evidence

import (
	"sync/atomic"
	"time"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Frame is the evidence of one frame: the phase its transaction is in, what was observed
// of it, and, once it is concluded, the classifier's verdict. Its depth is fixed at
// creation; the rest moves with the events its connection's Conn is fed.
//
// Only its connection's Conn changes it, fed the events of the hooks (conn.go): its
// exported methods read. The connection's user feeds them; other goroutines read only its
// phase and whether it is concluded (atomics), except that the close of its connection
// may conclude it on another goroutine, under the lock that orders the connection's
// hooks.
type Frame struct {
	phase     atomic.Uint32 // outcome.Phase
	concluded atomic.Bool
	depth     int
	at        moments
	shape     shape
	failure   *failure // nil until something went wrong: most frames never need it
	commit    commitFacts
	verdict   classifier.Classification // the final one, once concluded
	endedIn   outcome.Phase             // the phase it was concluded from
	// savepoints are the names of the open savepoints, outermost first (savepoints.go).
	savepoints []string
}

// moments are when the frame became committing and when it was concluded.
type moments struct{ committing, concluded time.Time }

// shape is what BEGIN and the statements said of the transaction. Commit references are
// taken only for a frame that wrote and can.
type shape struct {
	isolation, accessMode string
	readOnly              bool // it began READ ONLY
	wrote                 bool // a statement that may write was sent in it
	implicit              bool // an implicit transaction: one query, committed by its reply
}

// failure is what went wrong before the end: the first failed query's classification
// and error, the error of the query that concluded the frame, and the executor's cause.
type failure struct {
	first      classifier.Classification
	hasFirst   bool
	firstCause error
	endErr     error
	cause      error // why the executor rolled back
	// abortedBy: the ERROR the server answered the call ahead of COMMIT with, in COMMIT's
	// write: the transaction was aborted before COMMIT was read.
	abortedBy error
	// failedAfter: the call of an implicit transaction that committed failed in the
	// client, after the server's clean reply (Ended.RepliedClean).
	failedAfter error
}

// commitFacts is what COMMIT's write and reply showed.
type commitFacts struct {
	// committedLocally: the server warned that the commit was in its local WAL, its
	// synchronous replication not confirmed.
	committedLocally bool
	// endedBeforeCommit: the server had sent a FATAL before COMMIT was written.
	endedBeforeCommit bool
	// unsent: COMMIT failed without a byte of it leaving, on a connection still in the
	// transaction: the frame waits, committing, for what comes next.
	unsent bool
	// prepared: PREPARE TRANSACTION succeeded: the transaction waits for its coordinator.
	prepared bool
	// What else COMMIT showed is a failure's: abortedBy and failedAfter (failure).
}

// init makes f the evidence of a new frame depth levels deep (0 for a top-level
// transaction), in phase not_started. A Frame is held by value, in the caller's frame.
func (f *Frame) init(depth int) { *f = Frame{depth: depth} }

// Phase is f's phase; other goroutines read it too, hence the atomic.
func (f *Frame) Phase() outcome.Phase { return outcome.Phase(f.phase.Load()) }

// Open reports whether f's transaction is still going on.
func (f *Frame) Open() bool { return !f.concluded.Load() }

// Depth is 0 for a top-level transaction, n when n others are suspended.
func (f *Frame) Depth() int { return f.depth }

// CanTransition reports whether a transaction may move from one phase to another: the
// graph of package outcome's documentation. In particular only committing may become
// unknown: an error outside committing is never a reason to doubt a commit that was never
// asked for.
func CanTransition(from, to outcome.Phase) bool {
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

// move moves f to phase to and reports whether it did. An illegal transition is a bug in
// the caller; it is ignored rather than allowed to corrupt the evidence.
func (f *Frame) move(to outcome.Phase) bool {
	if !CanTransition(f.Phase(), to) {
		return false
	}
	f.phase.Store(uint32(to))
	if to == outcome.PhaseCommitting {
		f.at.committing = time.Now()
	}
	return true
}

// conclude records the verdict v: the terminal phase, which it returns with the phases
// moved to on the way (the caller records their events), and the moment. It reports false
// if f was concluded already: a frame ends once.
func (f *Frame) conclude(v classifier.Classification) (moved Phases, ok bool) {
	if !f.concluded.CompareAndSwap(false, true) {
		return 0, false
	}
	f.endedIn = f.Phase()
	var to outcome.Phase
	switch v.Evidence() {
	case classifier.EvidenceCommitted:
		to = outcome.PhaseCommitted
	case classifier.EvidenceUnknown:
		to = outcome.PhaseUnknown
	default:
		to = outcome.PhaseRolledBack
	}
	if f.move(to) {
		moved = moved.With(to)
	} else if f.Phase() != to && f.move(outcome.PhaseRolledBack) {
		// Only committing may become unknown or committed (the classifier guarantees it);
		// anything else is recorded as the rollback it must be.
		moved = moved.With(outcome.PhaseRolledBack)
	}
	if v.CommittedLocally() {
		f.commit.committedLocally = true
	}
	f.verdict = v
	f.at.concluded = time.Now()
	return moved, true
}

// Outcome maps the terminal phase to the frame's outcome. A prepared transaction's is
// participating: its phase is unknown (its coordinator decides it), and this frame is
// not the call that does.
func (f *Frame) Outcome() outcome.Outcome {
	switch f.Phase() {
	case outcome.PhaseCommitted:
		if f.FailedAfterCommit() != nil {
			return outcome.OutcomeCommittedWithPostCommitFailure
		}
		return outcome.OutcomeCommitted
	case outcome.PhaseUnknown:
		if f.commit.prepared {
			return outcome.OutcomeParticipating
		}
		return outcome.OutcomeIndeterminate
	}
	return outcome.OutcomeRolledBack
}

// Verdict is the classification f was concluded with.
func (f *Frame) Verdict() classifier.Classification { return f.verdict }

// EndedIn is the phase f was concluded from: the phase its rollback became certain in.
func (f *Frame) EndedIn() outcome.Phase { return f.endedIn }

// Deliberate reports whether f, rolled back, was ended on purpose with nothing gone
// wrong: the one rule behind its span status and its metric series.
func (f *Frame) Deliberate() bool {
	return !f.Failed() && f.Cause() == nil && f.verdict.Reason() == classifier.ReasonRolledBack
}

// CommittingAt and ConcludedAt are when f became committing (zero if it never did) and
// when it was concluded.
func (f *Frame) CommittingAt() time.Time { return f.at.committing }

// ConcludedAt is when f was concluded.
func (f *Frame) ConcludedAt() time.Time { return f.at.concluded }

// CommittedLocally reports that the server warned the commit was in its local WAL, its
// synchronous replication not confirmed.
func (f *Frame) CommittedLocally() bool { return f.commit.committedLocally }

// notice records the server's "already committed locally" warning: evidence for f only
// while committing.
func (f *Frame) notice() {
	if f.Phase() == outcome.PhaseCommitting {
		f.commit.committedLocally = true
	}
}

// Unsent reports that f's COMMIT never left and f waits for what comes next.
func (f *Frame) Unsent() bool { return f.commit.unsent }

// Prepared reports whether f's transaction was prepared (PREPARE TRANSACTION): it waits
// for its coordinator.
func (f *Frame) Prepared() bool { return f.commit.prepared }

// began records what BEGIN said of the transaction: its isolation level and access mode,
// as pgx spells them ("" where it does not say).
func (f *Frame) began(isolation, accessMode string) {
	f.shape.isolation, f.shape.accessMode = isolation, accessMode
	f.shape.readOnly = accessMode == "read only"
}

// Isolation and AccessMode are what BEGIN said, or "".
func (f *Frame) Isolation() string { return f.shape.isolation }

// AccessMode is what BEGIN said of the access mode, or "".
func (f *Frame) AccessMode() string { return f.shape.accessMode }

// ReadOnly reports that the transaction began READ ONLY.
func (f *Frame) ReadOnly() bool { return f.shape.readOnly }

// Implicit reports that f is an implicit transaction: one query sent outside a
// transaction block (Conn.Before's StartImplicit).
func (f *Frame) Implicit() bool { return f.shape.implicit }

// FailedAfterCommit is the failure of an implicit transaction's call after its commit
// (see Outcome), or nil.
func (f *Frame) FailedAfterCommit() error { return f.seenFailure().failedAfter }

// abortedBy is the ERROR the call ahead of COMMIT got, or nil (failure.abortedBy).
func (f *Frame) abortedBy() error { return f.seenFailure().abortedBy }

// Wrote reports that a statement that may write was sent in the transaction.
func (f *Frame) Wrote() bool { return f.shape.wrote }

// Failed reports whether a query of f's transaction failed before its end.
func (f *Frame) Failed() bool { return f.seenFailure().hasFirst }

// FirstFailure is the classification of the first failed query, if Failed.
func (f *Frame) FirstFailure() classifier.Classification { return f.seenFailure().first }

// FirstCause is the error of the first failed query, or nil.
func (f *Frame) FirstCause() error { return f.seenFailure().firstCause }

// EndErr is the error of the query that concluded f, or nil.
func (f *Frame) EndErr() error { return f.seenFailure().endErr }

// Cause is why the executor rolled back, or nil.
func (f *Frame) Cause() error { return f.seenFailure().cause }

// noFailure is what a frame that nothing went wrong in reads: never written.
var noFailure failure

// seenFailure is f's failure to read: noFailure until something went wrong.
func (f *Frame) seenFailure() *failure {
	if f.failure == nil {
		return &noFailure
	}
	return f.failure
}

// failed is f's failure, made at the first thing that went wrong.
func (f *Frame) failed() *failure {
	if f.failure == nil {
		f.failure = new(failure)
	}
	return f.failure
}

// failedWith records the first failure, if none was recorded yet.
func (f *Frame) failedWith(v classifier.Classification, err error) {
	if !f.Failed() {
		ff := f.failed()
		ff.first, ff.firstCause, ff.hasFirst = v, err, true
	}
}

// rolledBackBy records that the executor rolls f back for cause, classified v: the first
// failure unless a query failed before.
func (f *Frame) rolledBackBy(cause error, v classifier.Classification) {
	f.failed().cause = cause
	f.failedWith(v, cause)
}

// chainedFrom gives f, the next transaction of COMMIT AND CHAIN, the characteristics of
// the one before it.
func (f *Frame) chainedFrom(prev *Frame) {
	f.shape.isolation, f.shape.accessMode = prev.shape.isolation, prev.shape.accessMode
}
