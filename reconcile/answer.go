package reconcile

import (
	"fmt"

	"github.com/txevidence/otelpgxtx/outcome"
)

// Status is what reconciliation learned of a transaction: its tx.outcome.resolved.
type Status uint8

const (
	// Unknown: still unknown; [Answer.Reason] says why. Never guess.
	Unknown Status = iota
	// Committed: the transaction committed, in the history of the server asked (and, where
	// synchronous replication is configured, its standbys confirmed it).
	Committed
	// Aborted: it did not commit, and never will: the work is not there.
	Aborted
	// NoWrites: the transaction had no xid when COMMIT was sent; it wrote nothing, so
	// whether it committed changes nothing.
	NoWrites
)

// statusNames are the tx.outcome.resolved values, indexed by Status.
var statusNames = [...]string{Unknown: "unknown", Committed: "committed", Aborted: "aborted", NoWrites: "no_writes"}

// String returns the tx.outcome.resolved value.
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Answer is what a [Reconciler] answers: a [Status], and why it is unknown.
type Answer struct {
	status Status
	reason string
	ref    outcome.ReconciliationRef
}

// UnknownAnswer is the answer unknown for reason, about ref: for an outcome settled
// without asking the database (automatic reconciliation's [ReasonQueueFull] and
// [ReasonStopped]).
func UnknownAnswer(reason string, ref outcome.ReconciliationRef) Answer {
	return Answer{reason: reason, ref: ref}
}

// Status returns what is known now.
func (a Answer) Status() Status { return a.status }

// Reason returns why the status is unknown, or "".
func (a Answer) Reason() string { return a.reason }

// Reference returns the reference that was resolved (the zero reference when there was
// none).
func (a Answer) Reference() outcome.ReconciliationRef { return a.ref }

// Reasons an answer is unknown, its error.type (tx.reconcile spans; the
// error_type label of otelpgxtx.reconciliations). Each says why PostgreSQL's records
// cannot prove the outcome now, or why nothing was asked.
const (
	// ReasonInProgress: still in progress after the wait (a synchronous-replication wait).
	ReasonInProgress = "in_progress"
	// ReasonPrepared: the transaction is prepared (PREPARE TRANSACTION, two-phase commit),
	// listed in pg_prepared_xacts: it waits for its coordinator's COMMIT PREPARED or
	// ROLLBACK PREPARED, and is neither committed nor aborted until then. Asked again
	// after the coordinator decided, the answer is what it decided.
	ReasonPrepared = "prepared"
	// ReasonTooOld: pg_xact_status is NULL: the commit log no longer covers the xid.
	ReasonTooOld = "too_old"
	// ReasonInTheFuture: the server has not assigned the xid yet: another history.
	ReasonInTheFuture = "in_the_future"
	// ReasonOtherSystem: the reference names another cluster.
	ReasonOtherSystem = "other_system"
	// ReasonNoReference: no reference was taken before COMMIT (a frame without references,
	// or whose xid never arrived).
	ReasonNoReference = "no_reference"
	// ReasonOtherTimeline: a failover happened since and the commit log says committed
	// below the new timeline's proven boundary (or no boundary is proven yet, or the
	// server is not on a later timeline): an xid may be handed out again after a fork.
	ReasonOtherTimeline = "other_timeline"
	// ReasonServerRestarted: the commit log says committed, but the server restarted
	// since the xid was taken (or the reference has no start time), the xid is below
	// the restart's boundary, and another restart in between could have handed it out.
	ReasonServerRestarted = "server_restarted"
	// ReasonCrashRecovered: the commit log says committed, but the server went through
	// crash recovery since the reference's connection was checked: a backend died hard
	// (SIGKILL, the OOM killer, a segfault) and the postmaster replayed WAL in place, keeping
	// its start time and timeline, and an xid whose records were lost may have been handed
	// out again. It is told by the statistics' reset time, which crash recovery moves; a
	// pg_stat_reset_shared does too, and a reference without it (pg:…/<start> alone) gets
	// this answer as well. Only a commit marker settles it.
	ReasonCrashRecovered = "crash_recovered"
	// ReasonNotReplicated: committed on the server asked, but its synchronous standbys did
	// not confirm the commit within the wait: a failover could still lose it. Retried.
	ReasonNotReplicated = "not_replicated"
	// ReasonMarkerGone: the marker row was pruned between the fence and the lookup.
	ReasonMarkerGone = "marker_gone"
	// ReasonMarkerPruned: no marker row, but reconcile.PruneMarkers has removed rows as
	// recent as the reference (or, asked without a reference, any): absence proves nothing.
	// Nothing was fenced.
	ReasonMarkerPruned = "marker_pruned"
	// ReasonOtherDatabase: the reference's marker table is in another database than the
	// one the reconciler is connected to. Nothing was fenced.
	ReasonOtherDatabase = "other_database"
	// ReasonEvidenceConflict: the reference's xid is conclusive on the server asked (the
	// incarnation that assigned it, with no crash recovery since, says committed or aborted) and the marker row says
	// otherwise. Logged at level ERROR; nothing was fenced.
	ReasonEvidenceConflict = "evidence_conflict"
	// ReasonQueueFull: automatic reconciliation's queue was full when the frame ended; its
	// log record is what is left to settle it with.
	ReasonQueueFull = "queue_full"
	// ReasonStopped: the tracer was closed before the outcome was settled; a log record
	// "transaction commit outcome still unknown at shutdown" carries what the operator
	// command needs to settle it.
	ReasonStopped = "stopped"
)

// AnswerError is an answer that is not committed, as the cause of a result: the rollback
// otelpgxtx.Retry returns after an aborted or no_writes answer, and the Indeterminate it
// returns when the answer stays unknown. Err is the failure that left the commit's
// outcome unknown in the first place, so that errors.Is still finds it; errors.As finds
// the answer.
type AnswerError struct {
	Answer Answer
	Err    error
}

// Error says the answer, its reason, and the failure; of a nil *AnswerError, that it is
// nil, rather than panic inside the caller's logging.
func (e *AnswerError) Error() string {
	if e == nil {
		return "reconcile: <nil *AnswerError>"
	}
	s := "reconcile: " + e.Answer.status.String()
	if e.Answer.reason != "" {
		s += " (" + e.Answer.reason + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the failure that left the commit's outcome unknown (nil for a nil
// *AnswerError).
func (e *AnswerError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}
