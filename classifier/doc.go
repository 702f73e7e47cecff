// Package classifier turns what a PostgreSQL client observed — the transaction's phase,
// the error (or none) and a few facts from the wire — into evidence about the
// transaction's fate: committed, rolled back, or unknown.
//
// It is pure: no I/O, and no allocation on the hot path. [Classify] maps (phase, error,
// [Facts]) to a [Classification] of evidence, retryability, SQLSTATE and a fixed reason
// ([ReasonCommitted] …, used as error.type). [NewClassification] refuses a contradiction (a
// retryable unknown or committed classification), the same invariant every type that can
// carry a classification keeps.
//
// # Rules
//
// Only a failure observed while committing may be unknown. Before COMMIT is sent the
// transaction cannot have committed (it never commits without COMMIT), so every ending in
// not_started or active is a rollback, retryable for a serialization failure (40001), a
// deadlock (40P01) and a lost connection, which a new connection can survive.
//
// While committing, each rule below was measured on PostgreSQL 15 through pgx v5 and is
// kept by a real-server test, run on 13 and 18 as well (make test-majors), that asserts the
// classification and the ground truth (pg_xact_status of the xid read before COMMIT, and
// the row itself):
//
//   - tag COMMIT, session idle: committed (TestRealCommitPlain);
//   - tag ROLLBACK, which pgx turns into pgx.ErrTxCommitRollback (the transaction had
//     already failed): rolled back, not retryable (TestRealCommitAfterFailedStatement);
//   - an ERROR-severity *pgconn.PgError (23505 from a deferred constraint, 40001 from
//     serializable snapshot isolation): rolled back, retryable for 40001 and 40P01.
//     PostgreSQL cannot raise an ERROR once the commit record is written (it would PANIC
//     instead) (TestRealCommitDeferredUniqueViolation, TestRealCommitSerializationFailure).
//     Not 40003, statement_completion_unknown, which says itself that the outcome is
//     unknown, whichever server raises it;
//   - FATAL or PANIC (recognised by SeverityUnlocalized, whatever the session's language):
//     unknown. A backend terminated while COMMIT runs a deferred trigger has not committed,
//     one terminated after its commit record has, and the client sees the same FATAL
//     (TestRealCommitFatalDuringDeferredTrigger);
//   - a class 08 connection exception (only a proxy sends one), a closed connection, EOF,
//     a socket error, a timeout or a cancellation after COMMIT was sent: unknown, never
//     retryable, whatever pgconn.SafeToRetry says: it was true for a commit that had
//     happened, with pgx v5.12 (TestRealCommitTerminatedDuringSyncRep,
//     TestRealCommitAfterIdleBackendTerminated, TestRealCommitProxyCut);
//   - success after a WARNING saying the commit is already in the local WAL (01000, the
//     synchronous-replication wait cancelled): committed, with
//     [Classification.CommittedLocally] (TestRealCommitCanceledDuringSyncRep);
//   - WARNING 57P01 "… already committed locally", then the connection closes: unknown,
//     with [Classification.CommittedLocally] as evidence for reconciliation
//     (TestRealCommitTerminatedDuringSyncRep). [CommittedLocallyNotice] recognises both
//     warnings, in every language of PostgreSQL 15's message catalogs
//     (TestRealCommittedLocallyLocalized, TestRealCommittedLocallyOtherDatabaseEncoding).
//
// Three failures while committing are proofs that COMMIT never ran, and so certain,
// retryable rollbacks. Each is shown on a real server, for plain pgx and the executor
// alike, by TestCommitNotExecuted in the otelpgxtx package:
//
//   - [ReasonCommitNotSent]: the write carrying COMMIT failed before the kernel accepted
//     a byte of it, or COMMIT was never written ([Facts.CommitNotSent]; also shown by
//     TestCommitContextDoneBeforeWrite), and the connection is closed: bytes that never
//     reached the kernel cannot be read by the server;
//   - [ReasonSessionEndedBeforeCommit]: a FATAL or PANIC was already waiting unread
//     before COMMIT was written ([Facts.SessionEndedBeforeCommit]): after a FATAL the
//     backend exits (elog.c, proc_exit) and reads nothing more;
//   - [ReasonIdleInTransactionTimeout]: FATAL 25P03. PostgreSQL arms
//     idle_in_transaction_session_timeout only while waiting for a command inside a
//     transaction block, disarms it once a message is read, and checks for it before
//     executing that message (postgres.c PostgresMain; ProcessInterrupts), so its FATAL
//     always precedes the COMMIT.
//
// And one failure proves that COMMIT rolled back although its reply was lost: an ERROR
// (not FATAL, not class 08) in reply to the library's call sent ahead of COMMIT in the
// same write ([Facts.AbortedBeforeCommit]). PostgreSQL reads a write's messages in
// order, that ERROR leaves the transaction aborted, and the COMMIT of an aborted
// transaction rolls it back (xact.c, EndTransactionBlock). The rollback takes the ERROR's
// reason, so a serialization failure is retryable. Shown on a real server by
// TestCommitReplyLostAfterCallFailed in the otelpgxtx package (a lock timeout at the
// marker's insert, then a proxy that cuts between the call's reply and COMMIT's), for
// plain pgx and the executor; the otelpgxtx tracer reports it only on a connection to the
// server itself, never through a pooler (whose own error could come after the server
// committed).
//
// A 57P01 FATAL that arrives after COMMIT was written proves nothing: a backend
// terminated during the commit may already have written its commit record.
//
// # Which servers each rule holds for
//
// pgx also talks to servers that speak PostgreSQL's protocol but are not PostgreSQL, and to
// poolers in front of PostgreSQL. [Facts.Server] says which server answered (from what it
// reported at connection start, see [ServerOf]); a rule that rests on PostgreSQL's own
// behaviour makes a classification determinate only for [ServerPostgreSQL], and the zero
// value, [ServerUnknown], gets only the rules every server keeps:
//
//   - every server: success is committed; the tag ROLLBACK (pgx.ErrTxCommitRollback) is a
//     rollback, the server's own statement; [ReasonCommitNotSent] (bytes that never left
//     the process cannot be read); an ERROR of the SQL standard's class 40, transaction
//     rollback, is a rollback; SQLSTATE 40003, statement_completion_unknown, is unknown
//     ([ReasonCompletionUnknown]: CockroachDB's "result is ambiguous"), and never a
//     rollback, although class 40; FATAL, class 08 and a lost connection are unknown;
//   - PostgreSQL only (measured on PostgreSQL 15, and through PgBouncer 1.18 in front of
//     it): any other ERROR in reply to COMMIT is a rollback (elsewhere it is unknown:
//     CockroachDB answers XXA00 for a transaction that committed with a failed schema
//     change); [ReasonIdleInTransactionTimeout] (25P03 is PostgreSQL's code, and the
//     timer's order its own); [ReasonSessionEndedBeforeCommit] (a PostgreSQL backend exits
//     after a FATAL); and, in the otelpgxtx tracer, the committed-locally warnings, whose
//     texts and 57P01 code are PostgreSQL's.
//
// CockroachDB's documented replies (40003 for an ambiguous commit, RELEASE SAVEPOINT
// cockroach_restart as the commit of its retry protocol) are tested against a scripted
// server that answers as its documentation says (the otelpgxtx package's
// TestCommitAnswerOnOtherServers, TestCockroachRestartProtocol); no CockroachDB runs in
// these tests.
//
// Two server behaviours the rules rely on, also measured: statement_timeout does not
// interrupt COMMIT's synchronous-replication wait
// (TestRealStatementTimeoutDoesNotInterruptSyncRepWait), and a COMMIT outside a transaction
// is answered with the tag COMMIT and a WARNING 25P01 ("there is no transaction in
// progress"): it committed nothing, and the tracer makes no frame of it
// (TestRealCommitWithoutTransaction).
package classifier
