package evidence

import (
	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Holder is the caller's frame: it holds a Frame, and is told apart by ==.
type Holder interface {
	comparable
	Evidence() *Frame
}

// Conn is the evidence of one connection: the frame open on it, fed the queries of the
// connection as events. It is a state machine: each method takes what the hooks saw and
// returns what the caller is to record (a Result), doing no I/O. It asks the caller to
// start a frame (Before's begin, Result.Start), never makes one: the frame is the
// caller's, whose evidence it initializes (Start). Its methods are the only way a
// Frame's evidence changes: the events of a query are Before, Send (as it is handed
// over) and After; of the connection, Notice, Abandon; of the executor, RolledBackBy and
// Conclude.
type Conn[F Holder] struct {
	open F
	// server is the kind of server, from what it reported at connection start: the
	// classifier's PostgreSQL-only rules apply to PostgreSQL alone.
	server classifier.ServerKind
	// committedInBlock: a frame was concluded committed while the session is still in its
	// transaction block (CockroachDB's RELEASE SAVEPOINT cockroach_restart commits, and only
	// the COMMIT after it ends the block): what follows until the block ends is no new
	// transaction.
	committedInBlock bool
}

// NewConn returns the evidence of a connection to a server of kind server.
func NewConn[F Holder](server classifier.ServerKind) Conn[F] { return Conn[F]{server: server} }

// Server is the kind of server the connection reached.
func (c *Conn[F]) Server() classifier.ServerKind { return c.server }

// Open returns the frame open on the connection, or the zero F.
func (c *Conn[F]) Open() F { return c.open }

// Begun is how a frame the caller starts begins: Depth levels deep, in Phase (not_started
// for a BEGIN about to be sent, active for one found begun), with what its BEGIN says
// (Isolation, AccessMode), or, the next transaction of COMMIT AND CHAIN, Chained's.
type Begun struct {
	Depth                 int
	Phase                 outcome.Phase
	Isolation, AccessMode string
	Chained               *Frame
	// Wrote: the statement that showed the transaction (one found begun) may write.
	Wrote bool
	// Implicit: the frame is an implicit transaction (StartImplicit), which its one
	// query begins and ends.
	Implicit bool
	// Rest: the frame is what a query ran after a split (StartRest).
	Rest bool
}

// Start makes f, a frame the caller started for a Result.Start (or for a statement
// Before asked for), the connection's, its evidence begun as b says; the Result has the
// phase it moved to.
func (c *Conn[F]) Start(f F, b Begun) (r Result) {
	ev := f.Evidence()
	ev.init(b.Depth)
	if b.Chained != nil {
		ev.chainedFrom(b.Chained)
	} else {
		ev.began(b.Isolation, b.AccessMode)
	}
	ev.shape.wrote, ev.shape.implicit = b.Wrote, b.Implicit
	switch {
	case b.Phase == outcome.PhaseCommitting:
		r.Moved = ev.committing() // what follows a split, sent idle: committing from the start
	case b.Phase != outcome.PhaseNotStarted && ev.move(b.Phase):
		r.Moved = r.Moved.With(b.Phase)
	}
	c.open = f
	return r
}

// Failure is a failure pgconn never saw, of the library's own xid read (package
// reference), classified V: the transaction is aborted, and Err is the cause of the
// rollback to come.
type Failure struct {
	V   classifier.Classification
	Err error
}

// Start is a frame the caller must start, told by a Result.
type Start uint8

const (
	StartNone    Start = iota
	StartUnseen        // a transaction whose BEGIN was not seen (inside a string not read): active
	StartChained       // the next transaction of COMMIT AND CHAIN, or ROLLBACK AND CHAIN: active
	// StartRest: what the query in flight ran after a split (Split): an implicit
	// transaction, committing, if the session is idle after the query, else a transaction
	// block an unseen BEGIN began, active.
	StartRest
	// StartBlock: the statement about to be sent (Before) is BEGIN, a transaction block;
	// the frame starts not_started.
	StartBlock
	// StartPrepared: COMMIT PREPARED or ROLLBACK PREPARED, sent outside a transaction
	// block, end a transaction another session prepared: a frame of their own.
	StartPrepared
	// StartImplicit: a statement that may write, sent idle, is an implicit transaction of
	// its own (Set.Implicit): committing from the moment it is handed over, as a COMMIT
	// is, and ended by its reply.
	StartImplicit
)

// Result is what an event decided of a frame.
type Result struct {
	// Moved are the phases the frame moved to, in order: each is an event of its span.
	Moved Phases
	// Ended: the frame was concluded; UnsentEnded: concluded as a COMMIT that never left
	// (a Verdict in that COMMIT's context is told too).
	Ended, UnsentEnded bool
	// Waits: its COMMIT never left (pgconn refused it, its context already done) and the
	// transaction is still open: the frame waits for the connection's end or the next
	// statement.
	Waits bool
	// Savepoint: a savepoint statement succeeded in the frame; SavepointMove is what it
	// did, SavepointDepth the depth of the savepoint it made or named (0: one the frame
	// did not see made). The frame's savepoint stack has moved, whatever is recorded.
	Savepoint      bool
	SavepointMove  SavepointMove
	SavepointDepth int
	SavepointName  string
	// Start is the frame the caller is to start now, after this Result's frame.
	Start Start
	// Finished: the executor, which manages the frame, is done with it (Finish): its
	// outputs get its ending now, with Outcome; FailedAfter is the failure of its
	// post-commit work, if any; Retried: the executor runs the transaction again.
	Finished, Retried bool
	Outcome           outcome.Outcome
	FailedAfter       error
}

// merge adds o's moves and ending to r.
func (r *Result) merge(o Result) {
	r.Moved |= o.Moved
	r.Ended = r.Ended || o.Ended
	r.UnsentEnded = r.UnsentEnded || o.UnsentEnded
}

// Statement is what the hooks know of a query before it is handed to the driver.
type Statement struct {
	Set  Set
	Idle bool // the connection's transaction status is idle
	// Commits: it commits (COMMIT, or CockroachDB's RELEASE SAVEPOINT cockroach_restart),
	// and the connection is not busy: a busy connection refuses the statement before
	// sending a byte, so COMMIT never leaves and the phase stays.
	Commits bool
	// For Send: EndedBeforeCommit, a FATAL was already waiting as COMMIT was handed over
	// (the net.Conn's peek): the session ended before COMMIT was written; ReadFailed, the
	// xid read after an earlier statement, settled before COMMIT, failed.
	EndedBeforeCommit bool
	ReadFailed        *Failure
	// Seen: how the replies the connection read showed the open frame's transaction end,
	// where no query the hooks saw ended it (for Before, which finds the session idle).
	Seen Seen
	// EndedPastHooks: the connection is closed, and a statement the hooks did not see went
	// before this one with its reply not read: it may have ended the transaction (a COMMIT
	// whose reply a fault lost), which pgconn's status, still in it, cannot tell. Before
	// ends the open frame as it does one found idle.
	EndedPastHooks bool
	// Implicit: the caller records implicit transactions (Set.Implicit), this one included.
	Implicit bool
}

// Seen is how the replies to statements the hooks did not see (a COMMIT through the
// PgConn, a pipeline) ended the open frame's transaction, where the connection followed
// them (package wire, with commit references on): the server's one ending command tag
// before its first ReadyForQuery that said idle.
type Seen uint8

const (
	SeenNothing  Seen = iota // not seen, or not told apart: unknown
	SeenCommit               // COMMIT: committed
	SeenRollback             // ROLLBACK: rolled back
	SeenPrepare              // PREPARE TRANSACTION: prepared
)

// Before feeds c a query about to be handed to the driver. The open frame may end here:
// its COMMIT never left and this is no other COMMIT (judged as that COMMIT's failure
// alone judges it: unknown, for nothing tells what the application will do), or the
// connection is idle, so its transaction ended where no query showed it and it must not
// ride into unrelated work. ended is that frame, with what its ending decided; r.Start
// asks the caller to start a frame for the statement (StartBlock, StartPrepared,
// StartImplicit; then Start). The open frame's own part — what it wrote, its COMMIT — is
// told next, by Send.
func (c *Conn[F]) Before(s Statement) (ended F, r Result) {
	var zero F
	if f := c.open; f != zero && f.Evidence().commit.unsent {
		if s.Set.Commits() {
			f.Evidence().commit.unsent = false // another COMMIT goes on in the frame
		} else {
			ended, r = f, c.concludeUnsent(f, classifier.Facts{})
		}
	}
	if f := c.open; f != zero && (s.Idle || s.EndedPastHooks) {
		ended, r = f, c.Abandon(ReasonEndedUnobserved, s.Seen)
	}
	switch {
	case c.open != zero || !s.Idle:
	case s.Set.Has(Begin):
		r.Start = StartBlock
	case s.Set.EndsPrepared():
		r.Start = StartPrepared
	case s.Implicit && s.Set.Implicit():
		r.Start = StartImplicit
	}
	return ended, r
}

// Send feeds the open frame, if any, the statement s as it is handed over (after Before,
// and after the caller started a frame Before asked for): a statement that may write is
// recorded, and a COMMIT moves the frame to committing. The Result has the phases moved to.
func (c *Conn[F]) Send(s Statement) (r Result) {
	var zero F
	f := c.open
	if f == zero {
		return r
	}
	ev := f.Evidence()
	if s.ReadFailed != nil {
		ev.failedWith(s.ReadFailed.V, s.ReadFailed.Err)
	}
	if s.Set.Writes() {
		ev.shape.wrote = true
	}
	if s.Commits {
		ev.commit.endedBeforeCommit = s.EndedBeforeCommit
		r.Moved = ev.committing()
	}
	return r
}

// Notice feeds the open frame the server's "already committed locally" warning: evidence
// only while committing.
func (c *Conn[F]) Notice() {
	var zero F
	if f := c.open; f != zero {
		f.Evidence().notice()
	}
}

// RolledBackBy records that the executor rolls f back for cause, classified v: the first
// failure unless a query failed before.
func (c *Conn[F]) RolledBackBy(f F, cause error, v classifier.Classification) Result {
	f.Evidence().rolledBackBy(cause, v)
	return Result{}
}

// Finish is the executor's end of f, a frame it manages, once its post-commit work is
// done: the frame ended with o (the executor's outcome: committed_with_post_commit_failure
// when that work failed, with failedAfter its error; rolled_back after a panic), and
// retried says whether the executor runs the transaction again. Nothing of the
// evidence moves; the Result hands the frame's ending to the outputs.
func (c *Conn[F]) Finish(f F, o outcome.Outcome, failedAfter error, retried bool) Result {
	return Result{Finished: true, Outcome: o, FailedAfter: failedAfter, Retried: retried}
}

// committing moves f to committing as its COMMIT is handed over (through active, for
// BEGIN and COMMIT in one string) and returns the phases moved to.
func (f *Frame) committing() (moved Phases) {
	if f.Phase() == outcome.PhaseNotStarted && f.move(outcome.PhaseActive) {
		moved = moved.With(outcome.PhaseActive)
	}
	if f.move(outcome.PhaseCommitting) {
		moved = moved.With(outcome.PhaseCommitting)
	}
	return moved
}

// Abandon concludes the open frame, whose transaction ended where no query showed it, for
// reason: the connection was released mid-transaction, closed, or found idle. Found idle
// (ReasonEndedUnobserved), the frame ends as the replies the connection read showed
// (seen: the server's COMMIT, ROLLBACK or PREPARE TRANSACTION), else unknown, as it is
// with COMMIT sent; released or closed with the transaction open and no COMMIT sent, the
// server rolls it back.
func (c *Conn[F]) Abandon(reason string, seen Seen) Result {
	var zero F
	f := c.open
	if f == zero || !f.Evidence().Open() {
		return Result{}
	}
	ev := f.Evidence()
	if reason == ReasonEndedUnobserved && seen != SeenNothing && !ev.commit.unsent && ev.Phase() != outcome.PhaseCommitting {
		// The server's own word, which pgconn read: the command tag of the statement that
		// ended the transaction, then idle. A COMMIT in a failed transaction answers
		// ROLLBACK, so COMMIT is a commit; a ROLLBACK TO SAVEPOINT, which answers ROLLBACK
		// too, never leaves the session idle (wire.EndSeen).
		return c.concludeSeen(f, seen)
	}
	if ev.commit.unsent {
		// Its COMMIT never left. If the session ends with the transaction open (closed, or
		// released to the pool, which destroys it), the server rolls it back (the
		// classifier's commit_not_sent rule); if the transaction ended unseen (a COMMIT past
		// the tracer, on the PgConn), nothing is known.
		closed := reason == ReasonConnectionClosed || reason == ReasonReleasedInTransaction
		return c.concludeUnsent(f, classifier.Facts{ConnClosed: closed, CommitNotSent: closed})
	}
	if ev.Phase() == outcome.PhaseCommitting || reason == ReasonEndedUnobserved {
		// The transaction ended past the tracer, or after its COMMIT left: a commit it
		// may have been. An active frame is committing from the moment its end could be.
		var r Result
		if ev.move(outcome.PhaseCommitting) {
			r.Moved = r.Moved.With(outcome.PhaseCommitting)
		}
		v, _ := classifier.NewClassification(classifier.EvidenceUnknown, false, "", reason)
		r.merge(c.conclude(f, v))
		return r
	}
	v, _ := classifier.NewClassification(classifier.EvidenceRolledBack, false, "", reason)
	ev.failed().hasFirst = true // a failure, though no query showed one
	return c.conclude(f, v)
}

// Conclude concludes f with v, if it is still open: the executor's rollback that never
// reached the tracer (the connection was gone).
func (c *Conn[F]) Conclude(f F, v classifier.Classification) Result {
	if !f.Evidence().Open() {
		return Result{}
	}
	return c.conclude(f, v)
}

// concludeUnsent concludes f, whose COMMIT never left, as facts and that COMMIT's
// failure judge it.
func (c *Conn[F]) concludeUnsent(f F, facts classifier.Facts) Result {
	ev := f.Evidence()
	ev.commit.unsent = false
	facts.Server = c.server
	r := c.conclude(f, classifier.Classify(outcome.PhaseCommitting, ev.EndErr(), facts))
	r.UnsentEnded = r.Ended
	return r
}

// conclude records f's verdict v and takes f off the connection.
func (c *Conn[F]) conclude(f F, v classifier.Classification) Result {
	moved, ok := f.Evidence().conclude(v)
	if !ok {
		return Result{}
	}
	if c.open == f {
		var zero F
		c.open = zero
	}
	return Result{Moved: moved, Ended: true}
}
