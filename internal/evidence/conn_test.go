package evidence

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// testFrame is the caller's frame of these tests: nothing but the evidence.
type testFrame struct{ ev Frame }

func (f *testFrame) Evidence() *Frame { return &f.ev }

// step is one event of a sequence: a query's start and end (sql, its error, the
// transaction status after it), or the connection's end.
type step struct {
	sql     string
	err     error
	inTx    bool
	notSent bool   // its COMMIT's write sent nothing
	abandon string // the connection ended for this reason instead (no query)
	// unseen: the transaction ended before this query where no query showed it (a
	// statement sent through the PgConn): the connection is idle when it starts; seen is
	// what the replies the connection read showed of that end.
	unseen bool
	seen   Seen
	// pastHooks: the connection is closed as this query starts, after a statement the
	// hooks did not see whose reply was not read (Statement.EndedPastHooks).
	pastHooks bool
	// clean: the replies since the query was handed over reached an idle ReadyForQuery
	// with no ErrorResponse; closed: the connection is closed after it.
	clean, closed bool
	// splits: the ending tags inside the query's reply that more of it followed
	// (wire.Splits); nothingRan: its prepare failed.
	splits     []Seen
	nothingRan bool
}

// run feeds steps to a new connection's evidence as the hooks would, starting the frames
// it asks for, and returns every frame and the phases each moved to, in order.
func run(t *testing.T, server classifier.ServerKind, steps []step) ([]*testFrame, []string) {
	t.Helper()
	c := NewConn[*testFrame](server)
	var frames []*testFrame
	var moves []string
	record := func(f *testFrame, r Result) {
		r.Moved.Each(func(p outcome.Phase) { moves = append(moves, p.String()) })
		if r.Ended {
			moves = append(moves, "|")
		}
	}
	start := func(b Begun) *testFrame {
		f := &testFrame{}
		record(f, c.Start(f, b))
		frames = append(frames, f)
		return f
	}
	inTx := false // the transaction status before the next query
	for _, s := range steps {
		if s.abandon != "" {
			record(c.Open(), c.Abandon(s.abandon, s.seen))
			inTx = false
			continue
		}
		if s.unseen {
			inTx = false
		}
		set := Classify(s.sql)
		commits := set.Decides() || !inTx && set.EndsPrepared()
		ended, r := c.Before(Statement{Set: set, Idle: !inTx, Commits: commits, Seen: s.seen, Implicit: true, EndedPastHooks: s.pastHooks})
		if ended != nil {
			record(ended, r)
		}
		begins := r.Start
		switch begins {
		case StartBlock:
			iso, access := BeginOptions(s.sql)
			start(Begun{Phase: outcome.PhaseNotStarted, Isolation: iso, AccessMode: access})
		case StartPrepared:
			start(Begun{})
		case StartImplicit:
			start(Begun{Implicit: true, Wrote: true})
		}
		f := c.Open()
		// An implicit transaction's one statement is its commit (the caller's Commits).
		record(f, c.Send(Statement{Set: set, Idle: !inTx, Commits: commits || begins == StartImplicit}))
		for _, seen := range s.splits {
			if r := c.Split(set, seen, true); r.Ended {
				record(f, r)
				b := Begun{Phase: outcome.PhaseActive}
				if !s.inTx {
					b.Phase, b.Implicit, b.Rest = outcome.PhaseCommitting, true, true
				}
				f = start(b)
			}
		}
		r = c.After(f, Ended{Set: set, Err: s.err, InTx: s.inTx, Closed: s.closed, RepliedClean: s.clean, NothingRan: s.nothingRan,
			CommitNotSent: s.notSent && f != nil && f.ev.Phase() == outcome.PhaseCommitting})
		record(f, r)
		inTx = s.inTx
		switch r.Start {
		case StartUnseen:
			start(Begun{Phase: outcome.PhaseActive})
		case StartChained:
			start(Begun{Phase: outcome.PhaseActive, Chained: &f.ev})
		}
	}
	return frames, moves
}

var (
	lost       = io.ErrUnexpectedEOF
	unique     = &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "23505"}
	serial     = &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "40001"}
	completion = &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "40003"}
	deadline   = context.DeadlineExceeded
	undefined  = &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "42704"}
	inBlock    = &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "25001"}
)

// TestConnSequences: sequences of events, as the hooks feed them, give each frame the
// phases, outcome and reason the tracer's rules say (docs/classifier.md), with no server
// and no OpenTelemetry.
func TestConnSequences(t *testing.T) {
	for _, tc := range []struct {
		name   string
		server classifier.ServerKind
		steps  []step
		moves  string // the phases moved to, "|" where a frame ended
		last   outcome.Outcome
		reason string
		// retryable and deliberate are the last frame's.
		retryable, deliberate bool
		// frame, if not 0, is the one the outcome is of, counted from 1 (a later frame may
		// still be open).
		frame int
	}{
		{name: "committed", steps: []step{{sql: "begin", inTx: true}, {sql: "insert into t values (1)", inTx: true}, {sql: "commit"}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted},
		{name: "deliberate rollback", steps: []step{{sql: "begin", inTx: true}, {sql: "rollback"}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonRolledBack, deliberate: true},
		{name: "a failure, then the rollback it causes", steps: []step{{sql: "begin", inTx: true}, {sql: "insert into t values (1)", err: unique, inTx: true}, {sql: "rollback"}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonConstraintViolation},
		{name: "serialization failure at COMMIT", steps: []step{{sql: "begin", inTx: true}, {sql: "update t set v = 1", inTx: true}, {sql: "commit", err: serial}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonSerializationFailure, retryable: true},
		{name: "connection lost while committing", steps: []step{{sql: "begin", inTx: true}, {sql: "commit", err: lost}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonConnectionLost},
		{name: "connection lost before COMMIT", steps: []step{{sql: "begin", inTx: true}, {sql: "insert into t values (1)", err: lost}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonConnectionLost, retryable: true},
		{name: "a COMMIT never written, then the connection's end", steps: []step{{sql: "begin", inTx: true}, {sql: "commit", err: deadline, inTx: true, notSent: true}, {abandon: ReasonConnectionClosed}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonCommitNotSent, retryable: true},
		{name: "a COMMIT never written, then another COMMIT", steps: []step{{sql: "begin", inTx: true}, {sql: "commit", err: deadline, inTx: true, notSent: true}, {sql: "commit"}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted},
		{name: "a COMMIT never written, then another statement", steps: []step{{sql: "begin", inTx: true}, {sql: "commit", err: deadline, inTx: true, notSent: true}, {sql: "select 1", inTx: true}},
			moves: "active committing unknown | active", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonDeadlineExceeded, frame: 1},
		{name: "the connection found idle", steps: []step{{sql: "begin", inTx: true}, {sql: "select 1", unseen: true}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: ReasonEndedUnobserved, frame: 1},
		{name: "found idle after a COMMIT the wire saw", steps: []step{{sql: "begin", inTx: true}, {sql: "insert into t values (1)", inTx: true}, {sql: "select 1", unseen: true, seen: SeenCommit}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted, frame: 1},
		{name: "found idle after a ROLLBACK the wire saw", steps: []step{{sql: "begin", inTx: true}, {sql: "select 1", unseen: true, seen: SeenRollback}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonRolledBack, deliberate: true, frame: 1},
		{name: "found idle after a PREPARE the wire saw", steps: []step{{sql: "begin", inTx: true}, {sql: "select 1", unseen: true, seen: SeenPrepare}},
			moves: "active committing unknown |", last: outcome.OutcomeParticipating, reason: ReasonPrepared, frame: 1},
		{name: "released after a COMMIT the wire saw", steps: []step{{sql: "begin", inTx: true}, {abandon: ReasonEndedUnobserved, seen: SeenCommit}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted},
		{name: "the wire's word is no rollback's for a frame released in its transaction", steps: []step{{sql: "begin", inTx: true}, {abandon: ReasonReleasedInTransaction, seen: SeenCommit}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack, reason: ReasonReleasedInTransaction},
		{name: "found closed after a statement went past the hooks", steps: []step{{sql: "begin", inTx: true}, {sql: "insert into t values (1)", inTx: true},
			{sql: "select 1", pastHooks: true, err: lost, closed: true}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: ReasonEndedUnobserved, frame: 1},
		{name: "closed with the transaction open", steps: []step{{sql: "begin", inTx: true}, {sql: "insert into t values (1)", inTx: true}, {abandon: ReasonConnectionClosed}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack, reason: ReasonConnectionClosed},
		{name: "prepared", steps: []step{{sql: "begin", inTx: true}, {sql: "insert into t values (1)", inTx: true}, {sql: "prepare transaction 'g1'"}, {sql: "commit"}},
			moves: "active committing unknown |", last: outcome.OutcomeParticipating, reason: ReasonPrepared},
		{name: "PREPARE's reply lost", steps: []step{{sql: "begin", inTx: true}, {sql: "prepare transaction 'g1'", err: lost}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonConnectionLost},
		{name: "PREPARE refused by the server", steps: []step{{sql: "begin", inTx: true}, {sql: "prepare transaction 'g1'", err: unique}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonConstraintViolation},
		{name: "COMMIT PREPARED", steps: []step{{sql: "commit prepared 'g1'"}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted},
		{name: "ROLLBACK PREPARED", steps: []step{{sql: "rollback prepared 'g1'"}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonRolledBack, deliberate: true},
		{name: "COMMIT PREPARED's reply lost", steps: []step{{sql: "commit prepared 'g1'", err: lost}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonConnectionLost},
		{name: "COMMIT PREPARED refused: nothing changed, no rollback", steps: []step{{sql: "commit prepared 'g1'", err: undefined}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate},
		{name: "ROLLBACK PREPARED's reply lost", steps: []step{{sql: "rollback prepared 'g1'", err: lost}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonConnectionLost},
		{name: "COMMIT PREPARED in a transaction block: no frame of its own", steps: []step{{sql: "begin", inTx: true}, {sql: "commit prepared 'g1'", err: inBlock, inTx: true}, {sql: "rollback"}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack},
		{name: "PREPARE's write never left", steps: []step{{sql: "begin", inTx: true}, {sql: "prepare transaction 'g1'", err: deadline, inTx: true, notSent: true}, {abandon: ReasonConnectionClosed}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonCommitNotSent, retryable: true},
		{name: "a statement that ends the transaction", steps: []step{{sql: "begin", inTx: true}, {sql: "select 1"}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonRolledBack, deliberate: true},
		{name: "released while committing", steps: []step{{sql: "begin", inTx: true}, {abandon: ReasonReleasedInTransaction}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack, reason: ReasonReleasedInTransaction},
		{name: "a BEGIN not seen", steps: []step{{sql: "select 1", inTx: true}, {sql: "commit"}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted},
		{name: "COMMIT AND CHAIN", steps: []step{{sql: "begin isolation level serializable", inTx: true}, {sql: "commit and chain", inTx: true}, {sql: "rollback"}},
			moves: "active committing committed | active rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonRolledBack, deliberate: true},
		{name: "completion unknown inside the transaction", steps: []step{{sql: "begin", inTx: true}, {sql: "release savepoint cockroach_restart", err: completion, inTx: true}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonCompletionUnknown},
		{name: "BEGIN and COMMIT in one string", steps: []step{{sql: "begin; insert into t values (1); commit"}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted},
		// Implicit transactions: a statement that may write, sent idle.
		{name: "implicit: committed", steps: []step{{sql: "insert into t values (1)"}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted},
		{name: "implicit: several statements in one string, one transaction", steps: []step{{sql: "insert into t values (1); update t set v = 2"}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted},
		{name: "implicit: an ERROR is its rollback", steps: []step{{sql: "insert into t values (1)", err: unique}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonConstraintViolation},
		{name: "implicit: a serialization failure, retryable", steps: []step{{sql: "update t set v = 1", err: serial}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonSerializationFailure, retryable: true},
		{name: "implicit: the reply lost", steps: []step{{sql: "insert into t values (1)", err: lost, closed: true}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonConnectionLost},
		{name: "implicit: never sent", steps: []step{{sql: "insert into t values (1)", err: lost, closed: true, notSent: true}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonCommitNotSent, retryable: true},
		{name: "implicit: the client failed after a clean reply", steps: []step{{sql: "insert into t values (1) returning v", err: deadline, clean: true}},
			moves: "active committing committed |", last: outcome.OutcomeCommittedWithPostCommitFailure, reason: classifier.ReasonCommitted},
		{name: "implicit: a clean reply proves nothing on another server", server: classifier.ServerCockroachDB, steps: []step{{sql: "insert into t values (1)", err: deadline, clean: true}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonDeadlineExceeded},
		{name: "implicit: an ERROR proves nothing on another server", server: classifier.ServerCockroachDB, steps: []step{{sql: "insert into t values (1)", err: unique}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonServerError},
		{name: "implicit: a read is no frame", steps: []step{{sql: "select 1"}, {sql: "insert into t values (1)"}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted},
		{name: "implicit: SELECT FOR UPDATE writes", steps: []step{{sql: "select * from t for update", err: lost, closed: true}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonConnectionLost},
		// Several transactions in one query: a frame ends at each ending tag inside the reply.
		{name: "split: insert; commit; insert; 1/0, sent idle", steps: []step{{sql: "insert into t values (1); commit; insert into t values (2); select 1/0", err: undefined, splits: []Seen{SeenCommit}}},
			moves: "active committing committed | active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonServerError, frame: 2},
		{name: "split: the part before the COMMIT committed", steps: []step{{sql: "insert into t values (1); commit; insert into t values (2); select 1/0", err: undefined, splits: []Seen{SeenCommit}}},
			moves: "active committing committed | active committing rolled_back |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted, frame: 1},
		{name: "split: begin … commit, then a reply lost", steps: []step{{sql: "begin; insert into t values (1); commit; insert into t values (2)", err: lost, closed: true, splits: []Seen{SeenCommit}}},
			moves: "active committing committed | active committing unknown |", last: outcome.OutcomeIndeterminate, reason: classifier.ReasonConnectionLost, frame: 2},
		{name: "split: commit, then a block left open", steps: []step{{sql: "begin", inTx: true}, {sql: "commit; begin; insert into t values (2)", inTx: true, splits: []Seen{SeenCommit}}, {sql: "rollback"}},
			moves: "active committing committed | active rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonRolledBack, deliberate: true},
		{name: "split: a rollback, then a commit", steps: []step{{sql: "begin; insert into t values (1); rollback; insert into t values (2); commit; insert into t values (3); select 1/0", err: undefined, splits: []Seen{SeenRollback, SeenCommit}}},
			moves: "active committing rolled_back | active committing committed | active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonRolledBack, deliberate: true, frame: 1},
		{name: "split: ROLLBACK is no split beside a ROLLBACK TO SAVEPOINT", steps: []step{{sql: "begin; savepoint a; insert into t values (1); rollback to a; insert into t values (2); commit; select 1/0", err: undefined, splits: []Seen{SeenRollback, SeenCommit}}},
			moves: "active committing committed | active committing rolled_back |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted, frame: 1},
		{name: "split: prepared, then more", steps: []step{{sql: "begin; insert into t values (1); prepare transaction 'g'; insert into t values (2); select 1/0", err: undefined, splits: []Seen{SeenPrepare}}},
			moves: "active committing unknown | active committing rolled_back |", last: outcome.OutcomeParticipating, reason: ReasonPrepared, frame: 1},
		// Statements that may commit inside: their failure proves no rollback.
		{name: "call: failed after it ran", steps: []step{{sql: "call p($1)", err: serial}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: ReasonCommittedInside},
		{name: "do: failed after it ran", steps: []step{{sql: "do $$ begin commit; end $$", err: unique}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: ReasonCommittedInside},
		{name: "vacuum: failed after it ran", steps: []step{{sql: "vacuum t, u", err: undefined}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: ReasonCommittedInside},
		{name: "create index concurrently: failed after it ran", steps: []step{{sql: "create unique index concurrently i on t (v)", err: unique}},
			moves: "active committing unknown |", last: outcome.OutcomeIndeterminate, reason: ReasonCommittedInside},
		{name: "call: its prepare failed, nothing ran", steps: []step{{sql: "call p($1)", err: undefined, nothingRan: true}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonServerError},
		{name: "call: never sent", steps: []step{{sql: "call p($1)", err: lost, closed: true, notSent: true}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonCommitNotSent, retryable: true},
		{name: "call: committed", steps: []step{{sql: "call p($1)"}},
			moves: "active committing committed |", last: outcome.OutcomeCommitted, reason: classifier.ReasonCommitted},
		{name: "call: in a transaction block, the block's", steps: []step{{sql: "begin", inTx: true}, {sql: "call p($1)", err: serial, inTx: true}, {sql: "rollback"}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonSerializationFailure, retryable: true},
		{name: "call: in a string of several statements, atomic", steps: []step{{sql: "insert into t values (1); call p(1)", err: serial}},
			moves: "active committing rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonSerializationFailure, retryable: true},
		{name: "implicit: a write in a transaction block is the block's", steps: []step{{sql: "begin", inTx: true}, {sql: "insert into t values (1)", inTx: true}, {sql: "rollback"}},
			moves: "active rolled_back |", last: outcome.OutcomeRolledBack, reason: classifier.ReasonRolledBack, deliberate: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			server := tc.server
			if server == classifier.ServerUnknown {
				server = classifier.ServerPostgreSQL
			}
			frames, moves := run(t, server, tc.steps)
			if got := strings.Join(moves, " "); got != tc.moves {
				t.Errorf("moves %q, want %q", got, tc.moves)
			}
			if len(frames) == 0 {
				t.Fatal("no frame")
			}
			last := &frames[len(frames)-1].ev
			if tc.frame != 0 {
				last = &frames[tc.frame-1].ev
			}
			if last.Open() {
				t.Fatal("the last frame is still open")
			}
			v := last.Verdict()
			if last.Outcome() != tc.last || tc.reason != "" && v.Reason() != tc.reason || v.Retryable() != tc.retryable || last.Deliberate() != tc.deliberate {
				t.Errorf("%s %q retryable %v deliberate %v, want %s %q %v %v", last.Outcome(), v.Reason(), v.Retryable(), last.Deliberate(),
					tc.last, tc.reason, tc.retryable, tc.deliberate)
			}
		})
	}
}

// TestChainKeepsCharacteristics: the next transaction of COMMIT AND CHAIN has the
// isolation and access mode BEGIN gave the first.
func TestChainKeepsCharacteristics(t *testing.T) {
	frames, _ := run(t, classifier.ServerPostgreSQL, []step{{sql: "begin isolation level serializable read only", inTx: true}, {sql: "commit and chain", inTx: true}, {sql: "commit"}})
	if len(frames) != 2 {
		t.Fatalf("%d frames, want 2", len(frames))
	}
	for i, f := range frames {
		if f.ev.Isolation() != "serializable" || f.ev.AccessMode() != "read only" {
			t.Errorf("frame %d: %q %q", i, f.ev.Isolation(), f.ev.AccessMode())
		}
	}
	if !frames[0].ev.ReadOnly() {
		t.Error("the first frame is not read-only")
	}
}

// TestSavepointDepth: savepoints push and pop by PostgreSQL's rules, names folded as
// identifiers are, in the evidence (Conn.After), whether a span records them or not.
func TestSavepointDepth(t *testing.T) {
	c := NewConn[*testFrame](classifier.ServerPostgreSQL)
	f := &testFrame{}
	c.Start(f, Begun{Phase: outcome.PhaseActive})
	for i, tc := range []struct {
		sql   string
		move  SavepointMove
		depth int
	}{
		{"savepoint a", SavepointCreated, 1},
		{"savepoint B", SavepointCreated, 2},
		{`savepoint "c"`, SavepointCreated, 3},
		{"rollback to savepoint b", SavepointRolledBack, 2},
		{"savepoint d", SavepointCreated, 3},
		{"release savepoint A", SavepointReleased, 1},
		{"release x", SavepointReleased, 0},
		{"savepoint a", SavepointCreated, 1},
	} {
		r := c.After(f, Ended{Set: Classify(tc.sql), InTx: true, Savepoint: SavepointName(tc.sql)})
		if move, depth := r.SavepointMove, r.SavepointDepth; !r.Savepoint || move != tc.move || depth != tc.depth {
			t.Errorf("%d %q: %v %d, want %v %d", i, tc.sql, move, depth, tc.move, tc.depth)
		}
	}
}

// TestNoticeOnlyWhileCommitting: the committed-locally warning is evidence only while the
// frame commits, and a frame ends once.
func TestNoticeOnlyWhileCommitting(t *testing.T) {
	c := NewConn[*testFrame](classifier.ServerPostgreSQL)
	f := &testFrame{}
	c.Start(f, Begun{Phase: outcome.PhaseActive})
	c.Notice()
	if f.ev.CommittedLocally() {
		t.Fatal("committed locally while active")
	}
	c.Send(Statement{Set: Classify("commit"), Commits: true})
	c.Notice()
	r := c.After(f, Ended{Set: Classify("commit"), Err: lost})
	if !r.Ended || f.ev.Outcome() != outcome.OutcomeIndeterminate || !f.ev.CommittedLocally() || !f.ev.Verdict().CommittedLocally() {
		t.Fatalf("%+v %s %v", r, f.ev.Outcome(), f.ev.CommittedLocally())
	}
	if r := c.Conclude(f, classifier.Classification{}); r.Ended || c.Open() != nil {
		t.Fatalf("a second conclusion: %+v, open %v", r, c.Open())
	}
}
