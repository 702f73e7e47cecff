package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncer is a real PgBouncer in front of a Server, for tests of what goes through a
// connection pooler: in transaction mode every transaction may run on another server
// connection than the client's previous one, and session state does not follow it.
type PgBouncer struct {
	cmd     *exec.Cmd
	stdin   io.Closer
	exited  chan struct{} // closed when the process has ended
	root    string
	logFile string
	port    int
	lease   *Port     // holds port against other test processes until Close
	certs   certFiles // in root: PgBouncer's certificate and key, and the CA's certificate
}

// pgbouncerDirs are where Debian/Ubuntu's package installs the program, which is not on
// an ordinary user's PATH there.
var pgbouncerDirs = []string{"/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"}

// findPgBouncer returns the path of the pgbouncer program: on PATH, else in pgbouncerDirs.
func findPgBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, dir := range pgbouncerDirs {
		p := filepath.Join(dir, "pgbouncer")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("pgtest: the pgbouncer program was not found on PATH=%q nor in %s; install it, e.g. `apt-get install pgbouncer` (Debian/Ubuntu)",
		os.Getenv("PATH"), strings.Join(pgbouncerDirs, ", "))
}

// StartPgBouncer starts PgBouncer in front of s, pooling in mode ("session",
// "transaction" or "statement") over at most poolSize server connections per database
// and user, on a reserved 127.0.0.1 port (ReservePort) with trust authentication, and returns once a query
// through it is answered (bounded by ctx). Close stops it; so does the end of the test
// process.
func StartPgBouncer(ctx context.Context, s *Server, mode string, poolSize int) (*PgBouncer, error) {
	switch mode {
	case "session", "transaction", "statement":
	default:
		return nil, fmt.Errorf("pgtest: unknown PgBouncer pool mode %q: want session, transaction or statement", mode)
	}
	if poolSize < 1 {
		return nil, fmt.Errorf("pgtest: PgBouncer pool size %d: want at least 1", poolSize)
	}
	exe, err := findPgBouncer()
	if err != nil {
		return nil, err
	}
	port, err := ReservePort()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "pgtest-pgbouncer-")
	if err != nil {
		return nil, errors.Join(err, port.Release())
	}
	b := &PgBouncer{root: root, logFile: filepath.Join(root, "pgbouncer.log"), port: port.Number(), lease: port, exited: make(chan struct{})}
	if err := b.start(ctx, exe, s, mode, poolSize); err != nil {
		return nil, errors.Join(err, b.Close())
	}
	return b, nil
}

// start writes the configuration, starts the process and waits until it answers.
func (b *PgBouncer) start(ctx context.Context, exe string, s *Server, mode string, poolSize int) error {
	conf := filepath.Join(b.root, "pgbouncer.ini")
	users := filepath.Join(b.root, "userlist.txt")
	certs, err := writeCertFiles(b.root, s.cred)
	if err != nil {
		return err
	}
	b.certs = certs
	// Clients may ask for TLS (TLSConnString) or not (ConnString); PgBouncer's own
	// connections to the server stay plain.
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 200
logfile = %s
client_tls_sslmode = allow
client_tls_cert_file = %s
client_tls_key_file = %s
`, s.Host(), s.Port(), b.port, users, mode, poolSize, b.logFile, b.certs.cert, b.certs.key)
	if err := os.WriteFile(conf, []byte(ini), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(users, []byte(`"postgres" ""`+"\n"), 0o600); err != nil {
		return err
	}
	if s.cred != nil {
		// PgBouncer refuses to run as root; it runs as the server's user, like the server.
		for _, p := range []string{b.root, conf, users} {
			if err := os.Chown(p, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return err
			}
		}
	}
	// The shell becomes PgBouncer (exec keeps its pid, so Wait sees PgBouncer's end); a
	// reader left behind on a copy of stdin stops it and removes its files once stdin
	// reaches EOF: at Close, or when this process exits for any reason, a panicking test
	// included.
	const script = `exec 3<&0; { while read -r _ <&3; do :; done; kill $$ 2>/dev/null; rm -rf "$2"; } & exec "$0" "$1"`
	b.cmd = exec.Command("/bin/sh", "-c", script, exe, conf, b.root)
	b.cmd.Dir = b.root
	b.cmd.Env = serverEnv()
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	in, err := b.cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := b.cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: starting pgbouncer: %w", err)
	}
	b.stdin = in
	go func() {
		_ = b.cmd.Wait()
		close(b.exited)
	}()
	return b.waitReady(ctx)
}

// waitReady polls until a query through PgBouncer is answered, the process ends, or ctx
// ends; the log tail explains a failure.
func (b *PgBouncer) waitReady(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := b.ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-b.exited:
			return fmt.Errorf("pgtest: pgbouncer exited: %v\npgbouncer log (%s) ends with:\n%s", b.cmd.ProcessState, b.logFile, fileTail(b.logFile, 20))
		case <-ctx.Done():
			return fmt.Errorf("pgtest: pgbouncer does not answer: %w\npgbouncer log (%s) ends with:\n%s", err, b.logFile, fileTail(b.logFile, 20))
		case <-tick.C:
		}
	}
}

// PgBouncerFor starts PgBouncer for a test, as StartPgBouncer does, and closes it when
// the test ends; one that cannot start fails tb.
func PgBouncerFor(tb testing.TB, ctx context.Context, s *Server, mode string, poolSize int) *PgBouncer {
	tb.Helper()
	b, err := StartPgBouncer(ctx, s, mode, poolSize)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Error(err)
		}
	})
	return b
}

// ping runs one query through PgBouncer on a connection of its own.
func (b *PgBouncer) ping(ctx context.Context) error {
	c, err := pgx.Connect(ctx, b.ConnString())
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, "select 1", pgx.QueryExecModeSimpleProtocol)
	return errors.Join(err, c.Close(ctx))
}

// ConnString returns a URL for the postgres superuser through PgBouncer (no TLS). Named
// prepared statements do not survive a change of server connection, so in transaction
// mode pgx must not cache them: add default_query_exec_mode=exec (or
// simple_protocol).
func (b *PgBouncer) ConnString() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", b.port)
}

// TLSConnString is ConnString over TLS: PgBouncer presents a certificate for 127.0.0.1
// and localhost from the CA that signed the servers', and the URL verifies it as
// sslmode=verify-full does against that CA (sslrootcert, in PgBouncer's directory). The
// TLS session ends at PgBouncer, which reaches the server in plain TCP.
func (b *PgBouncer) TLSConnString() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?%s", b.port, tlsQuery(b.certs.ca))
}

// Close stops PgBouncer, which closes every client and server connection it holds, and
// removes its files. It is idempotent.
func (b *PgBouncer) Close() error {
	var err error
	if b.stdin != nil {
		err = b.stdin.Close()
		b.stdin = nil
		<-b.exited
	}
	return errors.Join(err, os.RemoveAll(b.root), b.lease.Release())
}
