// Package pgtest runs a real, throw-away PostgreSQL cluster for tests, a
// fault-injecting TCP proxy and a real PgBouncer in front of it, and a primary
// with a streaming standby that fails over and back (Cluster). Tests start the
// servers themselves (see Main), so nothing but the PostgreSQL server programs
// (and PgBouncer, for StartPgBouncer) has to be installed.
//
// Every server also serves TLS on its port (ssl = on), with a certificate for
// 127.0.0.1 and localhost signed by a CA that the test process makes in Go: ConnString
// connects in plain TCP, TLSConnString over TLS verified as sslmode=verify-full does.
// The proxy, PgBouncer and the Cluster have a TLSConnString too, so a test can run
// over either transport with the same faults.
//
// It is internal: a test harness shaped by this repository's tests (Main owns the
// test binary, re-executes it as a proxy process, checks leaks), not part of the
// instrumentation API. The runnable examples, modules of their own, still import it:
// Go allows it to any package under the module's path.
package pgtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Server is a running throw-away cluster. Its methods are safe for concurrent
// use, but StopImmediate, Restart and Close change the state every other
// user of the server observes.
type Server struct {
	bins    binaries
	cred    *syscall.Credential // run server programs as this user; nil means "as ourselves"
	root    string              // temp dir holding dataDir and sockDir; removed by Close
	dataDir string
	sockDir string
	logFile string
	port    int
	lease   *Port     // holds port against other test processes until Close
	certs   certFiles // in root: the server's certificate and key, and the CA's certificate

	// reaperIn is the write end of the reaper's stdin; see startReaper.
	reaper   *exec.Cmd
	reaperIn io.Closer

	mu      sync.Mutex
	running bool
	closed  bool
	held    []int // processes HoldBackgroundWriters stopped

}

// Start creates a cluster in a fresh temp dir, on a reserved 127.0.0.1 port (ReservePort) and
// a private unix socket dir, and starts it. Authentication is trust, the
// superuser is "postgres". Call Close to stop it and remove its files.
func Start() (*Server, error) {
	s, err := newServer("pgtest-", "data")
	if err != nil {
		return nil, err
	}
	if err := s.create(); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// newServer finds the programs, a port and a fresh root directory, lays out the
// directories and arms the cleanup process; the data directory is not made yet.
// logIn is the directory of the server log relative to the root.
func newServer(prefix, logIn string) (*Server, error) {
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	port, err := ReservePort()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("pgtest: creating the cluster directory: %w", err), port.Release())
	}
	s := &Server{
		bins:    bins,
		cred:    cred,
		root:    root,
		dataDir: filepath.Join(root, "data"),
		sockDir: filepath.Join(root, "sock"),
		logFile: filepath.Join(root, logIn, "server.log"),
		port:    port.Number(),
		lease:   port,
	}
	if err := s.layout(); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// layout makes the socket directory and the TLS files, hands the directories to the
// server's user and starts the cleanup process.
func (s *Server) layout() error {
	if err := os.Mkdir(s.sockDir, 0o700); err != nil {
		return err
	}
	if s.cred != nil {
		// The server programs run as s.cred and must own what they write to.
		for _, dir := range []string{s.root, s.sockDir} {
			if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return err
			}
		}
	}
	certs, err := writeCertFiles(s.root, s.cred)
	if err != nil {
		return err
	}
	s.certs = certs
	return s.startReaper()
}

// create runs initdb, configures and starts the cluster.
func (s *Server) create() error {
	if err := s.initdb(); err != nil {
		return err
	}
	if err := s.writeConfig(""); err != nil {
		return err
	}
	return s.startServer(context.Background())
}

// initdb creates the data directory: trust authentication, no fsync, UTF8 and the C
// locale, so that server messages and sorting are the same on every machine.
func (s *Server) initdb() error {
	return s.run(context.Background(), s.bins.initdb, "-D", s.dataDir,
		"-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C")
}

// writeConfig appends our settings, then extra, to postgresql.conf; later lines win.
func (s *Server) writeConfig(extra string) error {
	conf := fmt.Sprintf(`
# added by pgtest
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
max_connections = 200
shared_buffers = 32MB
# Two-phase commit's tests prepare a few transactions at a time, and end each.
max_prepared_transactions = 10
logging_collector = off
# Speed only: the OS keeps the files across an immediate stop, so nothing a
# test can observe depends on these.
fsync = off
full_page_writes = off
# A synchronous standby that never connects: a transaction that sets
# synchronous_commit = on waits in COMMIT (wait_event SyncRep) after its
# commit record is in local WAL; everything else commits locally.
synchronous_standby_names = 'phantom_standby'
synchronous_commit = local
# No transactions of the server's own: a test that kills a backend (KillBackend) hands
# the lost xid to its next transaction, which an autovacuum between the two would take.
autovacuum = off
# TLS on the same port, for clients that ask for it (TLSConnString); the others get
# plain TCP as before.
ssl = on
ssl_cert_file = '%s'
ssl_key_file = '%s'
`, s.port, s.sockDir, s.certs.cert, s.certs.key) + extra
	f, err := os.OpenFile(filepath.Join(s.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(conf)
	return errors.Join(err, f.Close())
}

// startServer runs pg_ctl start, which waits until the server accepts
// connections (or fails, in which case the log tail explains why).
func (s *Server) startServer(ctx context.Context) error {
	if err := s.run(ctx, s.bins.pgCtl, "start", "-w", "-t", "60", "-D", s.dataDir, "-l", s.logFile); err != nil {
		return fmt.Errorf("%w\nserver log (%s) ends with:\n%s", err, s.logFile, s.logTail(30))
	}
	s.running = true
	return nil
}

// ConnString returns a URL for the postgres superuser over TCP
// (trust auth, no TLS).
func (s *Server) ConnString() string {
	return fmt.Sprintf("postgres://postgres@%s:%d/postgres?sslmode=disable", s.Host(), s.port)
}

// TLSConnString returns a URL for the postgres superuser over TLS that verifies the
// server as sslmode=verify-full does: its certificate, for 127.0.0.1 and localhost, is
// signed by the CA whose certificate is the file sslrootcert names, in the server's
// directory. Through a Proxy (Proxy.ConnString) it verifies the same way.
func (s *Server) TLSConnString() string {
	return fmt.Sprintf("postgres://postgres@%s:%d/postgres?%s", s.Host(), s.port, tlsQuery(s.certs.ca))
}

// TLSConfig returns a client configuration that verifies the server as TLSConnString
// does, for a test that sets pgconn.Config.TLSConfig itself; each call returns a new one.
func (s *Server) TLSConfig() *tls.Config {
	// The authority exists: the server's certificate was made by it.
	a, _ := processAuthority()
	return a.clientConfig(s.Host())
}

// Host is the address the server listens on: always 127.0.0.1.
func (s *Server) Host() string { return "127.0.0.1" }

// Port is the TCP port the server listens on; it stays the same across
// StopImmediate and Restart.
func (s *Server) Port() int { return s.port }

// Conn opens an admin (superuser) connection; the caller closes it.
func (s *Server) Conn(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, s.ConnString())
}

// Pool returns a pool on the server, without any tracer, closed when tb ends (a test
// that checks for leaks calls LeakCheck first, so that the check runs after the close).
func (s *Server) Pool(tb testing.TB, ctx context.Context) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(ctx, s.ConnString())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// StopImmediate stops the server like a crash (pg_ctl stop -m immediate):
// backends are killed without a shutdown checkpoint and the data is kept, so
// Restart goes through crash recovery.
func (s *Server) StopImmediate() error { return s.stop("immediate") }

// StopFast stops the server as a clean shutdown does (pg_ctl stop -m fast): every
// backend ends its session — an idle one sends its client FATAL 57P01 first — and the
// server writes a shutdown checkpoint. Restart starts it again.
func (s *Server) StopFast() error { return s.stop("fast") }

// stop stops the running server with pg_ctl's shutdown mode.
func (s *Server) stop(mode string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resumeHeld() // a stopped process would never exit
	if s.closed {
		return errors.New("pgtest: server is closed")
	}
	if !s.running {
		return errors.New("pgtest: server is not running")
	}
	if err := s.run(context.Background(), s.bins.pgCtl, "stop", "-m", mode, "-w", "-D", s.dataDir); err != nil {
		return err
	}
	s.running = false
	return nil
}

// Restart starts the server again after StopImmediate or StopFast, on the same port, and
// returns once a connection succeeds (bounded by ctx).
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("pgtest: server is closed")
	}
	if s.running {
		return errors.New("pgtest: server is already running")
	}
	if err := s.startServer(ctx); err != nil {
		return err
	}
	// pg_ctl -w already waited for the "ready" state; a real connection is
	// what callers rely on, so confirm it.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := s.Conn(ctx)
		if err == nil {
			return c.Close(ctx)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: server restarted but does not accept connections: %w", err)
		case <-tick.C:
		}
	}
}

// Close stops the server (immediate mode) and removes all its directories.
// It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resumeHeld()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	if s.running {
		errs = append(errs, s.run(context.Background(), s.bins.pgCtl, "stop", "-m", "immediate", "-w", "-D", s.dataDir))
		s.running = false
	}
	errs = append(errs, os.RemoveAll(s.root), s.lease.Release())
	if s.reaper != nil {
		// Nothing is left for the reaper to do; let it run its no-op cleanup.
		_ = s.reaperIn.Close()
		_ = s.reaper.Wait()
	}
	return errors.Join(errs...)
}

// startReaper starts a detached shell that stops the cluster and removes its
// directories as soon as its stdin reaches EOF, which happens when this
// process exits for any reason. That is the only way to clean up after a
// test panics: the panic kills the process from the test's goroutine, so no
// defer or recover in TestMain ever runs.
func (s *Server) startReaper() error {
	const script = `while read -r _; do :; done; "$0" stop -m immediate -w -D "$1" >/dev/null 2>&1; rm -rf "$2"`
	cmd := exec.Command("/bin/sh", "-c", script, s.bins.pgCtl, s.dataDir, s.root)
	cmd.Dir = "/"
	cmd.Env = serverEnv()
	// Own process group: a Ctrl-C aimed at the test must not kill the reaper.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: starting cleanup process: %w", err)
	}
	s.reaper, s.reaperIn = cmd, in
	return nil
}

// run executes a server program as s.cred and returns its output on failure.
func (s *Server) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = s.root
	cmd.Env = serverEnv()
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// pg_ctl redirects the postmaster's output to the log file, so nothing
	// should keep our pipe open; if something does, don't hang forever.
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgtest: %s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

// logTail returns the last n lines of the server log, for error messages.
func (s *Server) logTail(n int) string { return fileTail(s.logFile, n) }

// fileTail returns the last n lines of the log file at path, for error messages.
func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// serverCredential returns the user to run the server programs as: initdb
// and postgres refuse to run as root, so root uses the "postgres" OS user.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, PostgreSQL must run as another user, but: %w "+
			"(`apt-get install postgresql` creates the postgres user)", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// serverEnv is our environment without PG* variables, which would otherwise
// redirect the server programs (PGDATA, PGPORT, ...).
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}
