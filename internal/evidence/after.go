package evidence

import (
	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Ended is what the hooks saw of a query's end, with the transaction status known again.
type Ended struct {
	Set Set
	Err error // the query's error, or a batch's first
	// InTx: the session is in a transaction block after it (pgconn's status T or E).
	InTx   bool
	Closed bool // the connection is closed
	// RollbackTag: COMMIT was answered ROLLBACK (the transaction had failed).
	RollbackTag bool
	// CommitNotSent: the write carrying COMMIT sent nothing, or none came (the net.Conn's
	// account, read only while the frame is committing).
	CommitNotSent bool
	// Savepoint is the name a savepoint statement names (SavepointName), as written.
	Savepoint string
	// What the library's addition to the query's write brought (package reference):
	// FatalBeforeCommit, the server answered its call ahead of COMMIT with a FATAL, after
	// which it read nothing more (COMMIT never ran); AbortedBeforeCommit, with that ERROR
	// (the transaction was aborted when COMMIT was read); ReadFailed, its xid read failed.
	FatalBeforeCommit   bool
	AbortedBeforeCommit error
	ReadFailed          *Failure
	// NothingRan: the query's error came before any of it ran (its statement's prepare
	// failed, so pgx never sent its execution).
	NothingRan bool
	// OneTransaction: the query, which may commit inside, ran in exactly one transaction
	// of its backend (package reference: the backend's virtual transaction ids before and
	// after it), which its error ended: nothing of it committed.
	OneTransaction bool
	// MoreEnds: the reply held more ending tags than were told (Split): the frame's
	// query ran past transactions of its own that ended unseen.
	MoreEnds bool
	// RepliedClean: the last ReadyForQuery of the replies since the query was handed over
	// said idle, with no ErrorResponse since the one before it (package wire): with the
	// connection open, pgconn read the query's reply to its last Sync, and the implicit
	// transaction committed, whatever the client made of the reply.
	RepliedClean bool
}

// After feeds c the end of a query that began in frame f (the zero F if none was open),
// and returns what it decided: where the evidence becomes a verdict.
func (c *Conn[F]) After(f F, e Ended) (r Result) {
	var zero F
	if !e.InTx {
		c.committedInBlock = false
	}
	if f == zero || !f.Evidence().Open() {
		if e.InTx && c.open == zero && !c.committedInBlock {
			// A transaction we did not see begin (BEGIN inside a string we could not read):
			// track it from here rather than not at all.
			r.Start = StartUnseen
		}
		return r
	}
	ev := f.Evidence()
	if e.FatalBeforeCommit {
		ev.commit.endedBeforeCommit = true
	}
	if e.AbortedBeforeCommit != nil {
		ev.failed().abortedBy = e.AbortedBeforeCommit
	}
	if e.ReadFailed != nil {
		ev.failedWith(e.ReadFailed.V, e.ReadFailed.Err)
	}
	facts := classifier.Facts{ConnClosed: e.Closed, CommittedLocally: ev.commit.committedLocally, RollbackTag: e.RollbackTag}
	if e.Err != nil {
		ev.failed().endErr = e.Err // the cause, should this query conclude the frame
	}
	switch ev.Phase() {
	case outcome.PhaseNotStarted:
		if !e.InTx {
			r = c.conclude(f, classifier.Classify(outcome.PhaseNotStarted, e.Err, facts))
			break
		}
		if ev.move(outcome.PhaseActive) {
			r.Moved = r.Moved.With(outcome.PhaseActive)
		}
		c.afterActive(f, e, facts, &r)
	case outcome.PhaseCommitting:
		facts.Server = c.server
		facts.CommitNotSent = e.CommitNotSent
		facts.SessionEndedBeforeCommit = ev.commit.endedBeforeCommit
		facts.AbortedBeforeCommit = ev.abortedBy()
		if facts.CommitNotSent && e.InTx && e.Err != nil {
			// COMMIT never left and the transaction is still open: it ends with the
			// connection, which pgx's Commit closes on such a failure (rolled back: see
			// Abandon), or, should the application go on using it, at its next statement
			// (Before).
			ev.commit.unsent, r.Waits = true, true
			break
		}
		v := classifier.Classify(outcome.PhaseCommitting, e.Err, facts)
		if ev.shape.implicit && e.Err != nil && e.RepliedClean && !e.Closed && c.server == classifier.ServerPostgreSQL {
			// PostgreSQL answered the implicit transaction without an error and went idle:
			// it committed (PostgreSQL commits an implicit transaction before the
			// ReadyForQuery after it, and reports a failed commit as an ERROR). The call's
			// failure is the client's own, made of a reply that came whole (a Scan that
			// could not convert a value): a failure after the commit.
			v = classifier.Classify(outcome.PhaseCommitting, nil, facts)
			ev.failed().failedAfter = e.Err
		}
		if ev.shape.implicit && e.Err != nil && (e.Set.CommitsInside() && !e.NothingRan && !e.OneTransaction || e.MoreEnds) && v.Evidence() == classifier.EvidenceRolledBack &&
			!facts.CommitNotSent && !facts.SessionEndedBeforeCommit && facts.AbortedBeforeCommit == nil {
			// A CALL, a DO block, a VACUUM … sent idle failed after it began to run: what
			// it committed inside before the failure is durable, and no command tag said
			// whether it committed anything. The error proves the rollback of its last
			// transaction only.
			v = mayHaveCommittedInside(v)
		}
		switch {
		case e.Set.Prepares() && v.Evidence() == classifier.EvidenceCommitted:
			// PREPARE TRANSACTION succeeded (or the server said its record is durable
			// locally): the transaction waits for its coordinator, which decides it.
			// Nothing is confirmed, so it is no commit; nor a rollback (see Prepared).
			ev.commit.prepared = true
			v = preparedVerdict
		case e.Set.EndsPrepared():
			v = endedPrepared(e.Set, v)
		}
		r.merge(c.conclude(f, v))
		c.committedInBlock = e.InTx && ev.Phase() == outcome.PhaseCommitted
	case outcome.PhaseActive:
		c.afterActive(f, e, facts, &r)
	}
	if e.Set.Chains() && e.InTx && c.open == zero && e.Err == nil {
		// AND CHAIN began the next transaction at once, with the same characteristics.
		r.Start = StartChained
	}
	return r
}

// afterActive judges a query that ran while f was active: a failure is kept as the cause
// of the rollback that must follow, a rollback concludes f, and a savepoint statement is
// an event (savepoints never change the frame's phase).
func (c *Conn[F]) afterActive(f F, e Ended, facts classifier.Facts, r *Result) {
	ev := f.Evidence()
	if classifier.CompletionUnknown(e.Err) {
		// The server says it cannot tell whether the statement completed (40003): on
		// CockroachDB that can be the commit (RELEASE SAVEPOINT cockroach_restart), and no
		// server that sends it has proven a rollback. The frame is committing from the
		// moment the answer came, and unknown.
		if ev.move(outcome.PhaseCommitting) {
			r.Moved = r.Moved.With(outcome.PhaseCommitting)
		}
		facts.Server = c.server
		r.merge(c.conclude(f, classifier.Classify(outcome.PhaseCommitting, e.Err, facts)))
		return
	}
	if e.Err != nil && !ev.Failed() {
		ev.failedWith(classifier.Classify(outcome.PhaseActive, e.Err, facts), e.Err)
	}
	switch {
	case e.Set.RollsBack() || !e.InTx:
		v := classifier.Classify(outcome.PhaseActive, e.Err, facts)
		if ev.Failed() {
			v = ev.FirstFailure() // the rollback is the consequence; the first failure is the cause
		}
		r.merge(c.conclude(f, v))
	case e.Err == nil && e.Set.MovesSavepoint():
		r.Savepoint = true
		r.SavepointMove, r.SavepointDepth = ev.savepointMoved(e.Set, e.Savepoint)
		r.SavepointName = e.Savepoint
	}
}

// Reasons of a frame whose transaction ended where no query showed it, its error.type
// beside the classifier's reasons. They are the evidence's, not the classifier's, because
// only the tracer sees pool releases, closed connections and idle sessions.
const (
	// ReasonEndedUnobserved: the connection was found outside a transaction at its next
	// query, acquire, release or close, or was closed or released after a statement went
	// past the tracer: the transaction was, or may have been, ended by a path that
	// bypasses pgx's tracer (a statement sent through *pgconn.PgConn directly, a
	// pipeline), which may have been a COMMIT, and the replies did not say how (Seen). The
	// frame is unknown (indeterminate), never a rollback.
	ReasonEndedUnobserved = "ended_unobserved"
	// ReasonReleasedInTransaction: the connection went back to the pool in the middle of
	// the transaction; the pool destroys it, which rolls the transaction back.
	ReasonReleasedInTransaction = "released_in_transaction"
	// ReasonConnectionClosed: the connection closed with the transaction open (a *pgx.Conn
	// closed mid-transaction, a connection database/sql discards).
	ReasonConnectionClosed = "connection_closed"
	// ReasonPrepared: the frame's transaction was prepared (PREPARE TRANSACTION): it waits
	// for its coordinator's COMMIT PREPARED or ROLLBACK PREPARED, and the frame is
	// participating.
	ReasonPrepared = "prepared"
)

// endedPrepared is the verdict of COMMIT PREPARED or ROLLBACK PREPARED (set) from v, the
// classifier's as for COMMIT. Answered, it did what it says: committed, or rolled back on
// purpose. Anything else is unknown with v's reason: an error reply says this call
// changed nothing (the gid unknown, a privilege missing, another database's), so the
// prepared transaction, if there is one, is still its coordinator's to decide — no
// rollback to claim; and a lost reply may have done either.
func endedPrepared(set Set, v classifier.Classification) classifier.Classification {
	if v.Evidence() == classifier.EvidenceCommitted {
		if set.Has(RollbackPrepared) {
			return classifier.Classify(outcome.PhaseActive, nil, classifier.Facts{})
		}
		return v
	}
	u, _ := classifier.NewClassification(classifier.EvidenceUnknown, false, v.SQLState(), v.Reason())
	return u
}

// preparedVerdict is the verdict of a frame whose transaction was prepared: unknown (its
// fate is its coordinator's), never retryable.
var preparedVerdict, _ = classifier.NewClassification(classifier.EvidenceUnknown, false, "", ReasonPrepared)
