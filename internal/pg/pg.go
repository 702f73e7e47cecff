// Package pg holds what the otelpgxtx packages share about PostgreSQL and pgx: the SQL
// that reads the identity a reconciliation reference carries, which the instrumentation
// captures and the reconciler compares, what an error's severity says, and the check for
// a nil pgx handle in an interface.
package pg

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TimelineSQL is the timeline the server writes WAL on, the first eight hex digits of
// the current WAL file's name, NULL on a standby. pg_control_checkpoint() shows the
// previous timeline until the first checkpoint after a promotion, which PostgreSQL 15 only
// requests after writing its end-of-recovery record (xlog.c, PerformRecoveryXLogAction),
// so an xid assigned meanwhile would be filed under the wrong history.
const TimelineSQL = "case when pg_is_in_recovery() then null else " +
	"('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint::text end"

// ServerStartSQL is pg_postmaster_start_time() in microseconds since the Unix epoch.
const ServerStartSQL = "(extract(epoch from pg_postmaster_start_time()) * 1000000)::bigint::text"

// InFailedTransaction is the SQLSTATE of a statement sent in a transaction that has
// already failed (25P02): the statement was not executed.
const InFailedTransaction = "25P02"

// Fatal reports whether an ErrorResponse of severity (its S field, which may be
// translated) and unlocalized (its V field, PostgreSQL 9.6+, never translated; "" when the
// server sent none) ends the session: FATAL or PANIC. The server closes the connection after
// one and reads nothing more, so what follows it was never executed. It is the one reading
// of a severity in the module: a server with lc_messages in another language must not be
// taken for one that sent an ERROR.
func Fatal(severity, unlocalized string) bool {
	if unlocalized == "" {
		unlocalized = severity
	}
	return unlocalized == "FATAL" || unlocalized == "PANIC"
}

// Transient reports whether an error of SQLSTATE code is something that happened to the
// statement rather than the server's answer to what it asked: a cancel or a statement
// timeout (57), a lock it could not get (55P03, 55006), a serialization failure or a
// deadlock (40), resources (53), an I/O error (58), a broken connection (08). Asking again
// later may succeed, so the library's own checks (the cluster identity, the marker
// function) are asked again after one, and take any other error as the answer.
func Transient(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "08", "40", "53", "57", "58":
		return true
	}
	return code == "55P03" || code == "55006"
}

// FatalError reports whether err is a server error of severity FATAL or PANIC (see Fatal).
func FatalError(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && Fatal(pgErr.Severity, pgErr.SeverityUnlocalized)
}

// IsNilHandle reports a typed nil pool or connection, which would panic on first use.
func IsNilHandle(v any) bool {
	switch v := v.(type) {
	case *pgxpool.Pool:
		return v == nil
	case *pgx.Conn:
		return v == nil
	}
	return false
}
