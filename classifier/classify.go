package classifier

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Facts are observations from the wire that the error alone does not carry.
type Facts struct {
	// RollbackTag: the server answered COMMIT with the command tag ROLLBACK, because the
	// transaction had already failed (pgx.Tx.Commit turns it into pgx.ErrTxCommitRollback).
	RollbackTag bool
	// CommittedLocally: while committing, the server sent a WARNING saying the commit is
	// in its local WAL and only the synchronous-replication wait was cut short
	// (see [CommittedLocallyNotice]).
	CommittedLocally bool
	// ConnClosed: the connection was found closed after the failure. Before COMMIT was
	// sent this means the session died, which a retry on a new connection can survive.
	ConnClosed bool
	// CommitNotSent: COMMIT's bytes never reached the kernel — the write that carried it
	// failed before the kernel accepted any of them, or it was never written (pgconn
	// refused it, its context already done) — so the server never read it.
	CommitNotSent bool
	// SessionEndedBeforeCommit: before COMMIT was written, the server had already sent
	// a FATAL (or PANIC) error, after which it reads nothing more from the session.
	SessionEndedBeforeCommit bool
	// AbortedBeforeCommit: the server answered a message sent ahead of COMMIT in
	// COMMIT's own write and transaction (the library's call) with this ERROR, so the
	// transaction was aborted before the server read COMMIT.
	AbortedBeforeCommit error
	// Server is the kind of server that answered (see [ServerOf]); the rules that rest on
	// PostgreSQL's own behaviour apply only to [ServerPostgreSQL].
	Server ServerKind
}

// Reasons returned by [Classification.Reason]. They are few and fixed so that they can be
// used as the error.type attribute and as a metric label.
const (
	ReasonCommitted            = "committed"
	ReasonRolledBack           = "rolled_back"
	ReasonUnknown              = "unknown"
	ReasonCommitRollback       = "commit_rollback"
	ReasonSerializationFailure = "serialization_failure"
	ReasonDeadlock             = "deadlock"
	ReasonConstraintViolation  = "constraint_violation"
	ReasonServerError          = "server_error"
	ReasonServerFatal          = "server_fatal"
	ReasonConnectionLost       = "connection_lost"
	ReasonCanceled             = "canceled"
	ReasonDeadlineExceeded     = "deadline_exceeded"
	ReasonApplicationError     = "application_error"
	// ReasonCommitNotSent: COMMIT's bytes never left the process; the connection is gone.
	ReasonCommitNotSent = "commit_not_sent"
	// ReasonSessionEndedBeforeCommit: the server ended the session (FATAL) before COMMIT
	// was written.
	ReasonSessionEndedBeforeCommit = "session_ended_before_commit"
	// ReasonIdleInTransactionTimeout: the server ended the session for
	// idle_in_transaction_session_timeout, which it only does before reading COMMIT.
	ReasonIdleInTransactionTimeout = "idle_in_transaction_timeout"
	// ReasonCompletionUnknown: the server itself said that it does not know whether the
	// statement completed (SQLSTATE 40003, statement_completion_unknown: CockroachDB's
	// "result is ambiguous").
	ReasonCompletionUnknown = "completion_unknown"
)

// SQLSTATE codes the classifier knows; they are PostgreSQL's, not this package's
// contract, so they stay unexported.
const (
	sqlStateSerializationFailure = "40001"
	sqlStateDeadlockDetected     = "40P01"
	sqlStateAdminShutdown        = "57P01"
	sqlStateWarning              = "01000"
	// sqlStateIdleInTransactionTimeout is idle_in_transaction_session_timeout's FATAL
	// (57P05 is idle_session_timeout, sent only outside a transaction).
	sqlStateIdleInTransactionTimeout = "25P03"
	// sqlStateCompletionUnknown is statement_completion_unknown: the SQL standard's code
	// for a statement whose completion the server cannot tell.
	sqlStateCompletionUnknown = "40003"
)

// Classify returns the evidence about a transaction's fate, given the phase it was in
// when err (or success, err == nil) was observed, and facts from the wire.
//
// In committing, nil is a commit (unless the tag was ROLLBACK); an ERROR-severity
// server error, pgx.ErrTxCommitRollback or a ROLLBACK tag is a certain rollback
// (retryable for 40001 and 40P01); anything else — FATAL/PANIC, a class 08 connection
// exception (which only a proxy sends), a lost connection, a timeout, a cancellation —
// is unknown and never retryable. pgconn.SafeToRetry is not
// consulted there: it was true for a commit that had happened.
//
// In not_started and active, the transaction cannot have committed, so every ending is
// a rollback; it is retryable for 40001, 40P01 and a lost connection. A terminal phase
// is returned as its own evidence.
func Classify(phase outcome.Phase, err error, f Facts) Classification {
	switch phase {
	case outcome.PhaseCommitting:
		return classifyCommit(err, f)
	case outcome.PhaseCommitted:
		return Classification{evidence: EvidenceCommitted, committedLocally: f.CommittedLocally, reason: ReasonCommitted}
	case outcome.PhaseUnknown:
		v := unknown(err, f)
		v.reason = ReasonUnknown
		return v
	case outcome.PhaseRolledBack:
		v := classifyBeforeCommit(err, f)
		v.retryable = false
		if err == nil {
			v.reason = ReasonRolledBack
		}
		return v
	}
	return classifyBeforeCommit(err, f)
}

// classifyCommit classifies a COMMIT: a rollback only when the server said so or
// provably never ran it, a commit only on its success, and unknown otherwise.
func classifyCommit(err error, f Facts) Classification {
	if err != nil && !f.CommittedLocally {
		if v, ok := abortedBeforeCommit(f); ok {
			return v
		}
		if v, ok := notCommitted(err, f); ok {
			return v
		}
	}
	if err == nil {
		if f.RollbackTag {
			return Classification{evidence: EvidenceRolledBack, reason: ReasonCommitRollback}
		}
		return Classification{evidence: EvidenceCommitted, committedLocally: f.CommittedLocally, reason: ReasonCommitted}
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return Classification{evidence: EvidenceRolledBack, reason: ReasonCommitRollback}
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && !isFatal(pgErr) && rolledBackError(pgErr, f.Server) {
		return serverError(pgErr)
	}
	return unknown(err, f)
}

// rolledBackError reports whether pgErr, an ERROR in reply to COMMIT, proves that the
// transaction rolled back. PostgreSQL raises no ERROR once its commit record is written
// (it would be a PANIC), so on PostgreSQL every ERROR does — except class 08, which only
// a proxy in between sends, after the server may have committed, and 40003, which says
// itself that the outcome is not known. Any other server may raise an ERROR after it
// committed (CockroachDB's XXA00, "transaction committed with schema change failure"):
// there only the SQL standard's class 40, transaction rollback, proves a rollback, and
// 40003 is in that class but says the opposite.
func rolledBackError(pgErr *pgconn.PgError, server ServerKind) bool {
	switch {
	case pgErr.Code == sqlStateCompletionUnknown, isConnectionClass(pgErr):
		return false
	case server == ServerPostgreSQL:
		return true
	}
	return len(pgErr.Code) == 5 && pgErr.Code[:2] == "40"
}

// CompletionUnknown reports whether err is the server's own statement that it does not
// know whether the statement completed (SQLSTATE 40003), which, in reply to a statement
// that can commit, leaves the commit unknown, whatever else the error says.
func CompletionUnknown(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == sqlStateCompletionUnknown
}

// abortedBeforeCommit recognises a COMMIT whose reply was lost after an ERROR had aborted
// its transaction: PostgreSQL reads the messages of a write in order, an ERROR inside a
// transaction block leaves it aborted, and the COMMIT of an aborted transaction rolls it
// back (postgres.c, exec_simple_query; xact.c, EndTransactionBlock: TBLOCK_ABORT). A
// FATAL has a rule of its own, and class 08 comes only from a proxy in between, which may
// send it after the server committed. Shown by the otelpgxtx package's
// TestCommitReplyLostAfterCallFailed.
func abortedBeforeCommit(f Facts) (Classification, bool) {
	pgErr, ok := errors.AsType[*pgconn.PgError](f.AbortedBeforeCommit)
	if !ok || f.Server != ServerPostgreSQL || isFatal(pgErr) || isConnectionClass(pgErr) {
		return Classification{}, false
	}
	return serverError(pgErr), true
}

// notCommitted recognises a failed COMMIT the server provably never executed. Each rule
// is shown against a real server in the otelpgxtx package's TestCommitNotExecuted.
func notCommitted(err error, f Facts) (Classification, bool) {
	v := Classification{evidence: EvidenceRolledBack, retryable: true}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		v.sqlstate = pgErr.Code
		// PostgreSQL arms this timeout only while waiting for a command in a transaction
		// block, disarms it once a message is read and checks for it before executing
		// that message (postgres.c PostgresMain, steps 4–5; ProcessInterrupts): its FATAL
		// always precedes the COMMIT, which then never runs.
		if pgErr.Code == sqlStateIdleInTransactionTimeout && isFatal(pgErr) && f.Server == ServerPostgreSQL {
			v.reason = ReasonIdleInTransactionTimeout
			return v, true
		}
	}
	// The connection must be gone too: pgconn closes it when a write fails or a FATAL
	// arrives, and a COMMIT refused locally (conn busy) left a transaction that could
	// still be committed.
	switch {
	case !f.ConnClosed:
		return Classification{}, false
	case f.CommitNotSent:
		v.reason = ReasonCommitNotSent
	case f.SessionEndedBeforeCommit && f.Server == ServerPostgreSQL:
		// After a FATAL, a PostgreSQL backend exits and reads nothing more.
		v.reason = ReasonSessionEndedBeforeCommit
	default:
		return Classification{}, false
	}
	return v, true
}

// unknown is the classification of a COMMIT whose reply was lost, with the reason the
// failure gives: a lost connection, a server FATAL, or the caller's context.
func unknown(err error, f Facts) Classification {
	v := Classification{evidence: EvidenceUnknown, committedLocally: f.CommittedLocally, reason: ReasonConnectionLost}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		v.sqlstate = pgErr.Code
		switch {
		case pgErr.Code == sqlStateCompletionUnknown:
			v.reason = ReasonCompletionUnknown
		case !isFatal(pgErr) && !isConnectionClass(pgErr):
			v.reason = ReasonServerError // an ERROR that, on this server, proves nothing
		case !isConnectionClass(pgErr):
			v.reason = ReasonServerFatal
		}
	} else if r := contextReason(err); r != "" {
		v.reason = r
	}
	return v
}

// classifyBeforeCommit classifies a failure before COMMIT was sent, which always rolls
// back; only the reason and whether a retry can help vary.
func classifyBeforeCommit(err error, f Facts) Classification {
	if err == nil {
		return Classification{evidence: EvidenceRolledBack, reason: ReasonRolledBack}
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		if isFatal(pgErr) {
			return Classification{evidence: EvidenceRolledBack, retryable: true, sqlstate: pgErr.Code, reason: ReasonServerFatal}
		}
		return serverError(pgErr)
	}
	// A cancelled or expired context is the caller giving up: not a reason to try again.
	if r := contextReason(err); r != "" {
		return Classification{evidence: EvidenceRolledBack, reason: r}
	}
	if f.ConnClosed || isConnectionError(err) {
		return Classification{evidence: EvidenceRolledBack, retryable: true, reason: ReasonConnectionLost}
	}
	return Classification{evidence: EvidenceRolledBack, reason: ReasonApplicationError}
}

// serverError is the rollback an ERROR causes, retryable for the SQLSTATEs that a new
// attempt can get past (serialization failure, deadlock).
func serverError(pgErr *pgconn.PgError) Classification {
	v := Classification{evidence: EvidenceRolledBack, sqlstate: pgErr.Code, reason: ReasonServerError}
	switch {
	case pgErr.Code == sqlStateSerializationFailure:
		v.retryable, v.reason = true, ReasonSerializationFailure
	case pgErr.Code == sqlStateDeadlockDetected:
		v.retryable, v.reason = true, ReasonDeadlock
	case len(pgErr.Code) == 5 && pgErr.Code[:2] == "23":
		v.reason = ReasonConstraintViolation
	}
	return v
}

// isFatal reads the unlocalized severity (PostgreSQL 9.6+), so that a server with
// lc_messages in another language is not mistaken for an ERROR.
func isFatal(pgErr *pgconn.PgError) bool {
	return pg.Fatal(pgErr.Severity, pgErr.SeverityUnlocalized)
}

// isConnectionClass reports SQLSTATE class 08 (connection exception). PostgreSQL does
// not answer COMMIT with it, but a proxy in between (PgBouncer's "server conn crashed?")
// does, with ERROR severity, after the server may have committed.
func isConnectionClass(pgErr *pgconn.PgError) bool {
	return len(pgErr.Code) == 5 && pgErr.Code[:2] == "08"
}

// contextReason names a cancelled or expired context in err, or returns "".
func contextReason(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return ReasonCanceled
	}
	return ""
}

// driverError is implemented by pgconn's own errors about the connection ("conn
// closed", write and read failures, timeouts).
type driverError interface {
	error
	SafeToRetry() bool
}

// isConnectionError reports an error of the connection itself rather than of a statement,
// after which the server has ended the transaction.
func isConnectionError(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	_, ok := errors.AsType[driverError](err)
	return ok
}
