// Package pg holds what the otelpgxtx packages share about PostgreSQL and pgx: the SQL
// that reads the identity a reconciliation reference carries, which the instrumentation
// takes and the reconciler compares, what an error's severity says, and the check for
// a nil pgx handle in an interface.
package pg

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
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

// StatsResetSQL is when the server's cumulative statistics were last reset
// (pg_stat_archiver.stats_reset), in microseconds since the Unix epoch, "0" when never.
// It is what tells one incarnation of a server from the next where the start time and the
// timeline do not: when a backend dies hard (SIGKILL, the OOM killer, a segfault), the
// postmaster, with restart_after_crash on, ends every backend and replays WAL in place,
// and crash recovery throws the statistics away (PostgreSQL 15+: xlog.c, StartupXLOG's
// pgstat_discard_stats when the cluster was not shut down cleanly, resetting every
// fixed-numbered kind, the archiver's included, at one new time; 13 and 14: StartupXLOG's
// pgstat_reset_all, after which the restarted collector starts with the current time).
// A clean shutdown keeps them (15+ write them at shutdown; 13 and 14 keep the collector's
// permanent file). They also move at pg_stat_reset_shared (by default a superuser's) and,
// on 13 and 14, when the collector itself is restarted: a change proves no crash, so it
// only ever makes an answer unknown. The view is readable by every role.
const StatsResetSQL = "coalesce((extract(epoch from (select a.stats_reset from pg_catalog.pg_stat_archiver a)) * 1000000)::bigint, 0)::text"

// FlushLSNSQL is how far the server has flushed its WAL (pg_current_wal_flush_lsn, in
// pg_lsn's text form), NULL on a standby, where the function errs.
const FlushLSNSQL = "case when pg_catalog.pg_is_in_recovery() then null else pg_catalog.pg_current_wal_flush_lsn()::text end"

// ShutdownCheckpointSQL says, of the latest checkpoint k (pg_control_checkpoint()),
// whether it is shutdown-type (a shutdown's or a crash recovery's end) in a way an online
// checkpoint cannot look like: redo_lsn = checkpoint_lsn (CreateCheckPoint PANICs when the
// redo pointer of a shutdown or end-of-recovery checkpoint is not the record's own start;
// PostgreSQL 17+ writes an XLOG_CHECKPOINT_REDO record between the two of an online one,
// earlier majors a standby snapshot unless wal_level is minimal, so minimal is excluded
// below 17). Within one postmaster's life a shutdown-type checkpoint is an end of
// recovery, since a shutdown ends it; which postmaster's life it is in, the checkpoint's
// LSN against a flush position of that postmaster says (package reconcile), or its time
// against the postmaster's start when they are seconds apart (package reference).
const ShutdownCheckpointSQL = "(k.redo_lsn = k.checkpoint_lsn" +
	" and (pg_catalog.current_setting('server_version_num')::int >= 170000 or pg_catalog.current_setting('wal_level') <> 'minimal'))::text"

// CheckpointTimeSQL is the latest checkpoint k's time, in whole seconds since the epoch
// (pg_control_checkpoint() has no more).
const CheckpointTimeSQL = "extract(epoch from k.checkpoint_time)::bigint::text"

// ParseFullXID parses pg_control_checkpoint()'s next_xid, "<epoch>:<xid>", into a full
// (xid8) transaction id.
func ParseFullXID(s string) (uint64, error) {
	e, x, ok := strings.Cut(s, ":")
	epoch, err1 := strconv.ParseUint(e, 10, 32)
	xid, err2 := strconv.ParseUint(x, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("unexpected next_xid %q", s)
	}
	return epoch<<32 | xid, nil
}

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

// IsNilHandle reports a typed nil in an interface — a nil *pgxpool.Pool or *pgx.Conn, or
// a nil pointer, func, map or channel of any other type — which would panic on first use
// where a plain nil is refused.
func IsNilHandle(v any) bool {
	if v == nil {
		return false
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Chan, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}

// SameContext reports whether a and b are one context. Only pointers are compared: ==
// on two values of a non-comparable context type panics.
func SameContext(a, b context.Context) bool {
	return a != nil && reflect.TypeOf(a).Kind() == reflect.Pointer && a == b
}
