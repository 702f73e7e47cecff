package redact

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestRedactServerError: a server error keeps severity, SQLSTATE and its class; a wrapped
// message, detail and hint are gone; fixed sentinels pass.
func TestRedactServerError(t *testing.T) {
	pgErr := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: `invalid input syntax for type integer: "4111-secret"`,
		Detail: "secret detail", Hint: "secret hint"}
	got := redact(fmt.Errorf("wrapped %q: %w", "secret", pgErr))
	var red *pgconn.PgError
	if !errors.As(got, &red) || red.Code != "22P02" || red.Severity != "ERROR" {
		t.Fatalf("redact = %#v, want a PgError with the code", got)
	}
	if msg := got.Error(); strings.Contains(msg, "secret") || msg != "ERROR: data exception (message redacted) (SQLSTATE 22P02)" {
		t.Errorf("redacted message %q", msg)
	}
	other := redact(fmt.Errorf("failed to encode args[0]: %w", fmt.Errorf("unable to encode %q", "secret")))
	if msg := other.Error(); strings.Contains(msg, "secret") || !strings.Contains(msg, "*fmt.wrapError") {
		t.Errorf("redacted message %q", msg)
	}
	for _, keep := range []error{nil, context.Canceled, context.DeadlineExceeded, pgx.ErrNoRows} {
		if got := redact(keep); got != keep {
			t.Errorf("redact(%v) = %v, want it unchanged", keep, got)
		}
	}
	if got := redact(fmt.Errorf("x %q: %w", "secret", context.Canceled)).Error(); strings.Contains(got, "secret") || !strings.Contains(got, "canceled") {
		t.Errorf("wrapped cancellation redacted as %q", got)
	}
}

// TestErrorDescriptions: errors that carry no user data are described in fixed words,
// whatever wraps them; anything else stays redacted to its type.
func TestErrorDescriptions(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string // the start of the description, after "otelpgxtx: "
	}{
		{fmt.Errorf("failed to receive message: %w", io.ErrUnexpectedEOF), "connection lost:"},
		{&net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}, "connection reset:"},
		{&net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}, "connection refused:"},
		{&net.OpError{Op: "write", Net: "tcp", Err: &os.SyscallError{Syscall: "write", Err: syscall.EPIPE}}, "broken pipe:"},
		{fmt.Errorf("timeout: %w", context.DeadlineExceeded), "timeout: the caller's context deadline"},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, "timeout: the network"},
		{fmt.Errorf("x: %w", context.Canceled), "canceled:"},
		{fmt.Errorf("conn: %w", pgconn.ErrConnClosed), "connection closed:"},
		{fmt.Errorf("use: %w", net.ErrClosed), "connection closed:"},
		{pgx.ErrTxClosed, "transaction closed:"},
		{pgx.ErrTxCommitRollback, "rolled back at COMMIT:"},
		{&net.DNSError{Err: "no such host", Name: "db.internal", IsNotFound: true}, "host name not resolved:"},
		{fmt.Errorf("connect: %w", pgconn.ErrReadOnlyConnection), "server refused by target_session_attrs: it is read-only"},
		// A reset that ends in EOF is the reset: the first description that matches wins.
		{errors.Join(syscall.ECONNRESET, io.EOF), "connection reset:"},
	} {
		got := redact(c.err).Error()
		if !strings.HasPrefix(got, "otelpgxtx: "+c.want) || !strings.HasSuffix(got, fmt.Sprintf("; error of type %T", c.err)) {
			t.Errorf("redact(%v) = %q, want %q… and its type", c.err, got, c.want)
		}
	}
	for _, err := range []error{errors.New("unable to encode 'secret'"), &net.OpError{Op: "read", Err: errors.New("secret")}} {
		if got := redact(err).Error(); !strings.HasSuffix(got, fmt.Sprintf(" of type %T (message redacted)", err)) {
			t.Errorf("redact(%v) = %q, want it redacted to its type", err, got)
		}
	}
	// The exact sentinels pass as they are: their text is fixed and already plain.
	if got := redact(context.Canceled); got != context.Canceled {
		t.Errorf("redact(context.Canceled) = %v", got)
	}
}

// plantedError wraps err under a message of the fuzzer's choosing.
type plantedError struct {
	msg string
	err error
}

func (e *plantedError) Error() string { return e.msg + ": " + e.err.Error() }
func (e *plantedError) Unwrap() error { return e.err }

// plantedTimeout is a net.Error whose text is the fuzzer's.
type plantedTimeout string

func (e plantedTimeout) Error() string   { return string(e) }
func (e plantedTimeout) Timeout() bool   { return true }
func (e plantedTimeout) Temporary() bool { return false }

// FuzzErrorDescription plants text in every place an error can carry it — a wrapping
// message, a net.OpError's operation and address, a syscall's name, a URL, a joined error,
// a timeout's own text — around every error the descriptions know, and requires the
// recorded text to be one of the fixed texts the library can write for that error's type:
// nothing planted leaks through a description.
func FuzzErrorDescription(f *testing.F) {
	f.Add("password=hunter2", uint8(0), uint8(0))
	f.Add("4111 1111 1111 1111", uint8(3), uint8(5))
	f.Add("SELECT 'secret'", uint8(7), uint8(12))
	f.Fuzz(func(t *testing.T, planted string, shape, base uint8) {
		bases := []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNRESET, syscall.ECONNREFUSED, syscall.EPIPE,
			syscall.ETIMEDOUT, syscall.EHOSTUNREACH, context.Canceled, context.DeadlineExceeded, net.ErrClosed,
			pgconn.ErrConnClosed, pgx.ErrTxClosed, pgx.ErrTxCommitRollback, os.ErrDeadlineExceeded,
			plantedTimeout(planted), errors.New(planted), &net.DNSError{Err: planted, Name: planted, Server: planted}}
		b := bases[int(base)%len(bases)]
		var err error
		switch shape % 8 {
		case 0:
			err = fmt.Errorf("%s: %w", planted, b)
		case 1:
			err = &net.OpError{Op: planted, Net: "tcp", Addr: &net.UnixAddr{Name: planted, Net: "unix"}, Err: b}
		case 2:
			err = &os.SyscallError{Syscall: planted, Err: b}
		case 3:
			err = &plantedError{msg: planted, err: b}
		case 4:
			err = errors.Join(errors.New(planted), b)
		case 5:
			err = fmt.Errorf("%w: %s", b, planted)
		case 6:
			err = &url.Error{Op: planted, URL: planted, Err: b}
		case 7:
			err = fmt.Errorf("%s: %w", planted, &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: planted, Err: b}})
		}
		got := redact(err).Error()
		var allowed []string
		for _, d := range errorDescriptions {
			allowed = append(allowed, fmt.Sprintf("otelpgxtx: %s; error of type %T", d.text, err))
		}
		for _, kind := range []string{"error", "network error"} {
			allowed = append(allowed, fmt.Sprintf("otelpgxtx: %s of type %T (message redacted)", kind, err))
		}
		if !slices.Contains(allowed, got) {
			t.Fatalf("%#v recorded as %q: not one of the library's fixed texts", err, got)
		}
	})
}
