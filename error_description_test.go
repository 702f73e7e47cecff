package otelpgxtx

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
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

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
		got := redactError(c.err).Error()
		if !strings.HasPrefix(got, "otelpgxtx: "+c.want) || !strings.HasSuffix(got, fmt.Sprintf("; error of type %T", c.err)) {
			t.Errorf("redactError(%v) = %q, want %q… and its type", c.err, got, c.want)
		}
	}
	for _, err := range []error{errors.New("unable to encode 'secret'"), &net.OpError{Op: "read", Err: errors.New("secret")}} {
		if got := redactError(err).Error(); !strings.HasSuffix(got, fmt.Sprintf(" of type %T (message redacted)", err)) {
			t.Errorf("redactError(%v) = %q, want it redacted to its type", err, got)
		}
	}
	// The exact sentinels pass as they are: their text is fixed and already plain.
	if got := redactError(context.Canceled); got != context.Canceled {
		t.Errorf("redactError(context.Canceled) = %v", got)
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
		got := redactError(err).Error()
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

// TestErrorDescriptionsOfRealFaults makes each fault for real and reads what the statement
// spans (otelpgx's, given redacted errors) say: an indeterminate COMMIT cut by the proxy,
// the next statement on that connection, a connection reset, a deadline, a cancellation,
// a pool acquire that times out, and a connection refused — each in the fixed words of its
// kind, never "(message redacted)", and never an address or a statement.
func TestErrorDescriptionsOfRealFaults(t *testing.T) {
	proxy := newProxy(t)
	// COMMIT's own span (not the default event of its frame) holds its error.
	h := newHarness(t, proxy.ConnString(srv.ConnString()), 1, WithInnerSpans(InnerSpanTransactionControl))
	table := newTable(t, testCtx(t))
	// Statement spans are made under a recording span, as in a traced request.
	ctx, root := h.tp.Tracer("test").Start(testCtx(t), "request")
	defer root.End()

	status := func(name string, match func(tracetest.SpanStub) bool) string {
		t.Helper()
		spans := h.exp.GetSpans()
		for i := len(spans) - 1; i >= 0; i-- {
			if s := spans[i]; match(s) {
				if s.Status.Code != codes.Error {
					t.Fatalf("%s: span %q status %v, want Error", name, s.Name, s.Status.Code)
				}
				return s.Status.Description
			}
		}
		t.Fatalf("%s: no span; spans: %v", name, names(spans))
		return ""
	}
	byName := func(n string) func(tracetest.SpanStub) bool {
		return func(s tracetest.SpanStub) bool { return s.Name == n }
	}
	// Each fault leaves a backend sleeping behind the proxy: stop it, so that nothing
	// waits for it.
	stopSleeps := func() {
		t.Helper()
		if err := srv.Exec(ctx, "select pg_cancel_backend(pid) from pg_stat_activity where wait_event = 'PgSleep'"); err != nil {
			t.Fatal(err)
		}
	}
	want := func(name, got, words string) {
		t.Helper()
		if !strings.HasPrefix(got, "otelpgxtx: "+words) || strings.Contains(got, "redacted") ||
			strings.Contains(got, "127.0.0.1") || strings.Contains(got, table) {
			t.Errorf("%s: recorded %q, want it to start %q", name, got, "otelpgxtx: "+words)
		}
	}

	// The example: a COMMIT whose answer never comes, then the same connection.
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id) values (1)", table)); err != nil {
		t.Fatal(err)
	}
	proxy.CutAfterCommit()
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the cut COMMIT succeeded")
	}
	// pgconn reports a connection lost while it waits for a reply as closed (its reader saw
	// the end of the connection and closed it): the words say both.
	want("indeterminate COMMIT", status("COMMIT", byName("COMMIT")), "connection closed: the server, a proxy or the network")
	if got := attrString(t, onlyFrame(t, h), OutcomeKey); got != "indeterminate" {
		t.Fatalf("frame %s, want indeterminate", got)
	}
	if _, err := conn.Exec(ctx, "select 1"); err == nil {
		t.Fatal("a statement on the cut connection succeeded")
	}
	want("statement on a closed connection", status("SELECT", byName("SELECT")), "connection closed:")
	conn.Release()

	// A connection reset by the network while the application waits for a reply.
	conn, err = h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "select pg_sleep(30) /* reset */")
		errc <- err
	}()
	if err := srv.WaitForWaitEvent(ctx, conn.Conn().PgConn().PID(), "PgSleep"); err != nil {
		t.Fatal(err)
	}
	proxy.ResetAll()
	if err := <-errc; err == nil {
		t.Fatal("the statement survived the reset")
	}
	conn.Release()
	stopSleeps()
	want("reset", status("reset", byName("SELECT")), "connection closed:")

	// A deadline, and a cancellation, of the caller's context.
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = h.pool.Exec(dctx, "select pg_sleep(30) /* deadline */")
	cancel()
	if err == nil {
		t.Fatal("pg_sleep outlived its deadline")
	}
	stopSleeps()
	want("deadline", status("deadline", byName("SELECT")), "timeout: the caller's context deadline")
	cctx, cancel := context.WithCancel(ctx)
	conn, err = h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = srv.WaitForWaitEvent(ctx, conn.Conn().PgConn().PID(), "PgSleep")
		cancel()
	}()
	if _, err = conn.Exec(cctx, "select pg_sleep(30) /* cancel */"); err == nil {
		t.Fatal("pg_sleep outlived its cancellation")
	}
	// The caller's own cancellation is expected: its span keeps the exception, not Error.
	spans := h.exp.GetSpans()
	if s := spans[len(spans)-1]; s.Name != "SELECT" || s.Status.Code == codes.Error || !slices.ContainsFunc(s.Events, func(e sdktrace.Event) bool {
		return strings.Contains(fmt.Sprint(e.Attributes), "context canceled")
	}) {
		t.Errorf("canceled: span %q status %v events %v, want Unset and the cancellation in its exception", s.Name, s.Status, s.Events)
	}
	conn.Release()
	stopSleeps()

	// The pool's one connection is held: an acquire with a deadline times out.
	conn, err = h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := h.pool.Acquire(actx); err == nil {
		t.Fatal("a second acquire from a pool of one succeeded")
	}
	cancel()
	conn.Release()
	// pgxpool returns the context's own error, whose fixed text is recorded as it is.
	if got := status("acquire", byName("pool.acquire")); got != context.DeadlineExceeded.Error() {
		t.Errorf("acquire timeout: recorded %q, want %q", got, context.DeadlineExceeded.Error())
	}

	// Nothing listens: a new pool's connect span says so.
	addr := proxy.ConnString(srv.ConnString())
	if err := proxy.Close(); err != nil {
		t.Fatal(err)
	}
	h = newHarness(t, addr, 1)
	ctx, root = h.tp.Tracer("test").Start(ctx, "request")
	defer root.End()
	if _, err := h.pool.Exec(ctx, "select 1"); err == nil {
		t.Fatal("connected through a closed proxy")
	}
	want("connect refused", status("connect", byName("connect")), "connection refused:")
}
