// Package classifier turns what a PostgreSQL client observed — the transaction's phase,
// the error (or none) and a few facts from the wire — into evidence about the
// transaction's fate: committed, rolled back, or unknown.
//
// It is pure: no I/O, and no allocation on the hot path. Its rules are the ones measured
// on PostgreSQL 15 with pgx v5 (see DESIGN.md §5 and the real-server tests beside it):
//
//   - Only a failure observed while committing may be unknown.
//   - An ERROR-severity reply to COMMIT is a certain rollback: PostgreSQL cannot raise
//     an ERROR after the commit record is written (it would PANIC instead).
//   - FATAL/PANIC, a lost connection, a timeout or a cancellation while committing are
//     unknown, whatever pgconn.SafeToRetry says.
package classifier
