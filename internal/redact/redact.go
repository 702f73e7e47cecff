// Package redact decides what of an error the otelpgxtx packages may record by default:
// a server error keeps its severity, SQLSTATE and the SQLSTATE's class, never its message
// (which can quote the statement's values); an error that carries no user data is
// described in fixed words an operator can act on; anything else is named by its type.
package redact

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Error returns what may be recorded of err: all of it when full (the user asked for
// error messages), else its redacted form.
func Error(err error, full bool) error {
	if full {
		return err
	}
	return redact(err)
}

// sqlStateClasses names the SQLSTATE classes of PostgreSQL's error codes appendix: the
// fixed description that replaces a server message.
var sqlStateClasses = map[string]string{
	"00": "successful completion", "01": "warning", "02": "no data",
	"03": "SQL statement not yet complete", "08": "connection exception",
	"09": "triggered action exception", "0A": "feature not supported",
	"0B": "invalid transaction initiation", "0F": "locator exception", "0L": "invalid grantor",
	"0P": "invalid role specification", "0Z": "diagnostics exception", "20": "case not found",
	"21": "cardinality violation", "22": "data exception", "23": "integrity constraint violation",
	"24": "invalid cursor state", "25": "invalid transaction state",
	"26": "invalid SQL statement name", "27": "triggered data change violation",
	"28": "invalid authorization specification",
	"2B": "dependent privilege descriptors still exist", "2D": "invalid transaction termination",
	"2F": "SQL routine exception", "34": "invalid cursor name", "38": "external routine exception",
	"39": "external routine invocation exception", "3B": "savepoint exception",
	"3D": "invalid catalog name", "3F": "invalid schema name", "40": "transaction rollback",
	"42": "syntax error or access rule violation", "44": "WITH CHECK OPTION violation",
	"53": "insufficient resources", "54": "program limit exceeded",
	"55": "object not in prerequisite state", "57": "operator intervention",
	"58": "system error", "72": "snapshot failure", "F0": "configuration file error",
	"HV": "foreign data wrapper error", "P0": "PL/pgSQL error", "XX": "internal error",
}

// redactedNote ends every redacted message, so that a reader knows the text is withheld.
const redactedNote = " (message redacted)"

// redact returns what may be recorded of err by default: a server error becomes a
// *pgconn.PgError with only its severity, SQLSTATE and the SQLSTATE class as message
// (the server's message, detail and hint can quote the statement's values); any other
// error becomes one that names its type and, for the kinds that carry no user data
// (a lost or closed connection, a timeout, a cancellation), says in fixed words what
// happened (see describeError). Errors whose text is fixed pass as they are.
func redact(err error) error {
	if err == nil || err == context.Canceled || err == context.DeadlineExceeded || errors.Is(err, sql.ErrNoRows) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		desc := "server error"
		if len(pgErr.Code) == 5 {
			if c, ok := sqlStateClasses[pgErr.Code[:2]]; ok {
				desc = c
			}
		}
		return &pgconn.PgError{Severity: pgErr.Severity, SeverityUnlocalized: pgErr.SeverityUnlocalized,
			Code: pgErr.Code, Message: desc + redactedNote}
	}
	return describeError(err)
}

// redactedError stands for an error whose message must not be recorded.
type redactedError struct{ msg string }

// Error returns the redacted text: the error's kind and type, never its message.
func (e *redactedError) Error() string { return e.msg }

// errorDescription names one kind of error that carries no user data, in words an
// operator can act on. The words are the library's own: nothing of the error's text is
// quoted, so an error whose text holds a secret (a wrapped message, a host name, an
// operation) is described by exactly these words and its type, and nothing else.
type errorDescription struct {
	is   func(error) bool
	text string
}

// errorDescriptions are tried in order, the first that matches wins: a timeout or a
// cancellation before the network error it caused, a connection that was reset before
// the end of file that followed.
var errorDescriptions = []errorDescription{
	{isErr(context.Canceled), "canceled: the caller's context was canceled before the operation completed"},
	{isErr(context.DeadlineExceeded), "timeout: the caller's context deadline passed before the operation completed"},
	{isNetTimeout, "timeout: the network did not answer in time (a read or write deadline, or the kernel's TCP timeout)"},
	{isErr(syscall.ECONNREFUSED), "connection refused: nothing accepts connections at the server's address (is PostgreSQL, or the pooler, running and listening there?)"},
	{isErr(syscall.ECONNRESET), "connection reset: the server, a proxy or the network dropped the connection (ECONNRESET)"},
	{isErr(syscall.EPIPE), "broken pipe: the other side had already closed the connection when this process wrote to it (EPIPE)"},
	{isErr(syscall.EHOSTUNREACH, syscall.ENETUNREACH), "network unreachable: no route to the server's address"},
	{isDNSError, "host name not resolved: the DNS lookup of the server's host failed"},
	{isErr(io.ErrUnexpectedEOF, io.EOF), "connection lost: the server or the network closed the connection before the reply was complete (EOF)"},
	{isErr(net.ErrClosed, pgconn.ErrConnClosed), "connection closed: the server, a proxy or the network closed the connection while a reply was awaited, or this process had closed it after an earlier failure"},
	{isErr(pgx.ErrTxClosed), "transaction closed: the transaction was used after its Commit or Rollback"},
	{isErr(pgx.ErrTxCommitRollback), "rolled back at COMMIT: the transaction had failed before COMMIT, so the server rolled it back"},
	{isErr(pgx.ErrTooManyRows), "too many rows: a single-row query returned more than one row"},
	{isErr(pgconn.ErrReadOnlyConnection, pgconn.ErrStandbyConnection), "server refused by target_session_attrs: it is read-only or a standby (after a failover, the old primary)"},
	{isErr(pgconn.ErrReadWriteConnection, pgconn.ErrPrimaryConnection), "server refused by target_session_attrs: it is a read-write primary where a standby was asked for"},
}

// isErr returns a test for any of targets in an error's chain.
func isErr(targets ...error) func(error) bool {
	return func(err error) bool {
		for _, target := range targets {
			if errors.Is(err, target) {
				return true
			}
		}
		return false
	}
}

// isNetTimeout reports a timeout of the network or of pgconn's own deadline, which pgconn
// reports with pgconn.Timeout; a context deadline is matched before it.
func isNetTimeout(err error) bool {
	var netErr net.Error
	return pgconn.Timeout(err) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) ||
		errors.As(err, &netErr) && netErr.Timeout()
}

// isDNSError reports a failed lookup of the server's host name.
func isDNSError(err error) bool {
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr)
}

// describeError returns what may be recorded of an error that is not the server's: a
// fixed description and its type when the error is of a kind that carries no user data,
// else the redacted form that names its type only.
func describeError(err error) error {
	for _, d := range errorDescriptions {
		if d.is(err) {
			return &redactedError{msg: fmt.Sprintf("otelpgxtx: %s; error of type %T", d.text, err)}
		}
	}
	kind := "error"
	var netErr net.Error
	if errors.As(err, &netErr) {
		kind = "network error"
	}
	return &redactedError{msg: fmt.Sprintf("otelpgxtx: %s of type %T%s", kind, err, redactedNote)}
}
