package pgtest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// Main is for TestMain:
//
//	var srv *pgtest.Server
//	func TestMain(m *testing.M) { pgtest.Main(m, &srv) }
//
// It starts one server per test binary, sets *srv, runs the tests, then
// stops the server, removes its files and exits with the tests' code. If
// PostgreSQL cannot be found or started it prints how to install it and
// exits 1: these tests never skip, because a skipped database test passes
// silently.
//
// Cleanup also happens when a test panics or the test binary is killed: a
// panicking test ends the process from its own goroutine, where no defer in
// Main can run, so Start arms a separate cleanup process for that case.
//
// Each setup function runs once the server is up, before the tests: a package whose
// examples read the server from the environment, as an application would, sets it there.
//
// A test binary started by StartProxyProcess runs that proxy instead.
func Main(m *testing.M, srv **Server, setup ...func(*Server)) {
	if isProxy, err := runProxyProcess(); isProxy {
		if err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: proxy process: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	s, err := Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: these tests need a throw-away PostgreSQL server, which could not be started:\n%v\n\n"+
			"If PostgreSQL is not installed, install it, e.g. `apt-get install postgresql` on Debian/Ubuntu.\n", err)
		os.Exit(1)
	}
	*srv = s
	for _, f := range setup {
		f(s)
	}
	os.Exit(runAndClose(m, s))
}

// runAndClose runs the tests and closes the server even if m.Run panics on
// this goroutine; the defer runs during the panic, which then continues with
// its stack trace.
func runAndClose(m *testing.M, s *Server) (code int) {
	defer func() {
		if err := s.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: removing the test server: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}()
	return m.Run()
}

// Context returns the context of one test's work with the server: bounded by d, so that a
// server that stops answering fails the test instead of hanging it, and cancelled when
// the test ends.
func Context(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}
