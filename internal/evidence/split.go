package evidence

import (
	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Several transactions in one query: a statement that may commit inside itself (CALL, DO,
// VACUUM …), and a string or batch whose reply ends a transaction before its last message
// (wire.Splits).

// ReasonCommittedInside: a statement that may commit inside itself (Set.CommitsInside:
// CALL, DO, VACUUM, CREATE INDEX CONCURRENTLY, …), sent outside a transaction block,
// failed after it began to run: the transactions it committed before the failure are
// durable, and nothing in the reply tells whether there were any. The frame is unknown
// (indeterminate), never a retryable rollback.
const ReasonCommittedInside = "may_have_committed_inside"

// mayHaveCommittedInside is the verdict of a statement that may commit inside, failed as
// v says: unknown, with v's SQLSTATE, never retryable.
func mayHaveCommittedInside(v classifier.Classification) classifier.Classification {
	u, _ := classifier.NewClassification(classifier.EvidenceUnknown, false, v.SQLState(), ReasonCommittedInside)
	return u
}

// Split concludes the open frame, whose transaction the server ended inside the reply of
// the query in flight, with more of that reply after it (wire.Splits): seen is the
// server's tag — COMMIT committed it (a COMMIT in a failed transaction answers ROLLBACK),
// ROLLBACK rolled it back (the frame's first failure its cause, if it had one), PREPARE
// TRANSACTION prepared it. The frame ends with what the server said, whatever became of
// the rest of the query; rest asks for the frame of what followed (StartRest). In a query
// of set with a ROLLBACK TO SAVEPOINT, which answers ROLLBACK too, a ROLLBACK tag is no
// split: the frame goes on.
func (c *Conn[F]) Split(set Set, seen Seen, rest bool) (r Result) {
	var zero F
	f := c.open
	if f == zero || !f.Evidence().Open() || seen == SeenNothing || seen == SeenRollback && set.Has(RollbackTo) {
		return r
	}
	f.Evidence().commit.unsent = false
	r = c.concludeSeen(f, seen)
	if rest {
		r.Start = StartRest
	}
	return r
}

// concludeSeen concludes f as the server's ending tag seen says: COMMIT committed it (a
// COMMIT in a failed transaction answers ROLLBACK), ROLLBACK rolled it back (its first
// failure the cause, if it had one), PREPARE TRANSACTION prepared it.
func (c *Conn[F]) concludeSeen(f F, seen Seen) (r Result) {
	ev := f.Evidence()
	switch seen {
	case SeenRollback:
		v := classifier.Classify(outcome.PhaseActive, nil, classifier.Facts{})
		if ev.Failed() {
			v = ev.FirstFailure() // the rollback is the consequence; the first failure is the cause
		}
		return c.conclude(f, v)
	case SeenPrepare:
		r.Moved = ev.committing()
		ev.commit.prepared = true
		r.merge(c.conclude(f, preparedVerdict))
	default:
		r.Moved = ev.committing()
		facts := classifier.Facts{Server: c.server, CommittedLocally: ev.commit.committedLocally}
		r.merge(c.conclude(f, classifier.Classify(outcome.PhaseCommitting, nil, facts)))
	}
	return r
}
