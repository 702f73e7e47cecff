package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

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
