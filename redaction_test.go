package otelpgxtx

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/txevidence/otelpgxtx/pgtest"
)

// TestErrorDescriptionsOfRealFaults makes each fault for real and reads what the statement
// spans (otelpgx's, given redacted errors) say: an indeterminate COMMIT cut by the proxy,
// the next statement on that connection, a connection reset, a deadline, a cancellation,
// a pool acquire that times out, and a connection refused — each in the fixed words of its
// kind, never "(message redacted)", and never an address or a statement.
func TestErrorDescriptionsOfRealFaults(t *testing.T) {
	proxy := pgtest.ProxyFor(t, srv)
	// COMMIT's own span (not the default event of its frame) holds its error.
	h := newHarness(t, proxy.ConnString(srv.ConnString()), 1, WithInnerSpans(InnerSpanTransactionControl))
	table := srv.NewTable(t, pgtest.ContextFor(t), tableColumns)
	// Statement spans are made under a recording span, as in a traced request.
	ctx, root := h.tp.Tracer("test").Start(pgtest.ContextFor(t), "request")
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

	// An indeterminate COMMIT: its answer never comes; then the same connection.
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
	// Long enough that the deadline passes while the server sleeps, not during the
	// acquire, on a loaded machine too.
	dctx, cancel := context.WithTimeout(ctx, time.Second)
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
