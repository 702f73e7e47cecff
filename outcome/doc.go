// Package outcome holds the outcome algebra of a PostgreSQL transaction as Go types:
// the evidence [Phase] of a physical transaction, the five [Outcome] values that the
// tracer writes as tx.outcome, and the sealed [Result] that the executor returns.
//
// # Outcomes
//
// A transaction call ends in one of five outcomes, and two of them cannot be folded into
// a boolean or an error without lying:
//
//   - committed: the physical commit was confirmed; continue with follow-up work;
//   - participating: the call only joined an outer transaction, or prepared its transaction
//     for a coordinator to decide (two-phase commit); it confirms nothing;
//   - rolled_back: rolled back for certain; retry only if it is marked retryable;
//   - indeterminate: COMMIT was sent and its fate is unknown; hand it to reconciliation,
//     never replay it;
//   - committed_with_post_commit_failure: committed, but work after the commit failed;
//     report it, never undo the commit.
//
// Folding participating into success reports uncommitted work as committed; folding it
// into failure reports a normal path as failed. Folding indeterminate into failure
// invites a retry that can apply the work twice; folding it into success hides possible
// data loss.
//
// Two sentences hold the whole algebra: a participant result never claims commit; an
// indeterminate result never grants replay authority. The types enforce both: there is
// no way to build a [Participating] that says committed, and [Indeterminate] has no
// retry field at all. Every constructor refuses a contradiction: a rollback "observed" in
// committed or unknown ([NewDeterminateRollback]), an indeterminate result without its
// cause or operation id ([NewIndeterminate]), a post-commit failure without its error.
//
// # Phases
//
// One physical transaction moves through six phases, whose lower-case names are the
// tx.phase attribute and the tx.phase.* events:
//
//	not_started → active → committing → committed | rolled_back | unknown
//	not_started → rolled_back   (BEGIN failed)
//	active      → rolled_back   (explicit ROLLBACK, or the session died before COMMIT was sent)
//
// The tracer records only these transitions. committing is recorded before COMMIT is
// handed to the driver; unknown is evidence, not a guess: the driver could confirm
// neither commit nor rollback, and only a failure observed while committing can lead
// there. An
// [Indeterminate] result therefore always follows committing.
//
// # Identity and reconciliation
//
// An [OperationID] names one frame across its span, its result, its log records and its
// reconciliation. A [ReconciliationRef] is what PostgreSQL needs to be asked later
// whether the transaction committed: its xid and the identity of the cluster history
// that assigned it, or the row of a commit-marker table.
package outcome
