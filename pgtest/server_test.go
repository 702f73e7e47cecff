package pgtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestServerBasics(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", srv.Port())
	if got := srv.ConnString(); got != want {
		t.Errorf("ConnString = %q, want %q", got, want)
	}
	c, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)

	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	for setting, want := range map[string]string{
		"synchronous_standby_names": "phantom_standby",
		"synchronous_commit":        "local",
		"max_connections":           "200",
		"max_prepared_transactions": "10",
		"listen_addresses":          "127.0.0.1",
		"ssl":                       "on",
		"server_version_num":        "", // logged only
	} {
		var got string
		if err := c.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want != "" && got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
		t.Logf("%s = %s", setting, got)
	}
}

// TestCount: Count answers a count query; WaitForCount returns once the count is the one
// wanted (here: a backend that appears in pg_stat_activity, then leaves it), and fails
// naming the last count when the context ends first.
func TestCount(t *testing.T) {
	ctx := ContextFor(t)
	if n, err := srv.Count(ctx, "select count(*) from generate_series(1, $1::int)", 3); err != nil || n != 3 {
		t.Fatalf("Count = %d, %v; want 3", n, err)
	}
	c, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const byPID = "select count(*) from pg_stat_activity where pid = $1"
	pid := int64(c.PgConn().PID())
	if err := srv.WaitForCount(ctx, 1, "the backend listed", byPID, pid); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitForCount(ctx, 0, "the backend gone", byPID, pid); err != nil {
		t.Fatal(err)
	}
	// Long enough for the first poll to read a count on a loaded machine (with 20 ms, CI
	// once saw none read: "count -1"), so that the error can name it.
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err = srv.WaitForCount(short, 2, "a count never reached", "select 1::bigint")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "count 1, want 2") {
		t.Fatalf("WaitForCount past its deadline: %v, want DeadlineExceeded naming the last count", err)
	}
}

// TestSyncRepWait checks the scenario the configuration exists for: a COMMIT
// that waits for the phantom standby after its commit record is in local WAL.
func TestSyncRepWait(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	srv.FreshTable(t, ctx, "syncrep", "id int primary key")
	cfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	notices := make(chan string, 10)
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices <- n.Severity + ": " + n.Message + " / " + n.Detail }
	a, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	pid := a.PgConn().PID()

	var xid uint64
	for _, sql := range []string{"BEGIN", "INSERT INTO syncrep VALUES (1)", "SET LOCAL synchronous_commit = on"} {
		if _, err := a.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := a.QueryRow(ctx, "SELECT pg_current_xact_id()").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	commitErr := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, "COMMIT")
		commitErr <- err
	}()

	if err := srv.WaitForWaitEvent(ctx, pid, "SyncRep"); err != nil {
		t.Fatal(err)
	}
	// Observed on PostgreSQL 15: during the wait the commit record is in
	// local WAL (and the commit log), but the transaction is still in the
	// proc array, so other sessions neither see the row nor report it
	// committed.
	if n := srv.CountOf(t, ctx, "SELECT count(*) FROM "+"syncrep"+" WHERE id = $1", 1); n != 0 {
		t.Errorf("row visible to another session during the SyncRep wait (count %d), want invisible", n)
	}
	if st, _, err := srv.XactStatus(ctx, xid); err != nil || st != "in progress" {
		t.Errorf("XactStatus during SyncRep wait = %q, %v; want \"in progress\"", st, err)
	}

	if err := srv.Terminate(ctx, pid); err != nil {
		t.Fatal(err)
	}
	if err := <-commitErr; err == nil {
		t.Fatal("COMMIT succeeded although its backend was terminated")
	} else {
		t.Logf("COMMIT error after Terminate: %v (%T)", err, errors.Unwrap(err))
	}
	for len(notices) > 0 {
		t.Logf("notice: %s", <-notices)
	}
	// Terminating cancels only the wait: the transaction stays committed
	// and becomes visible.
	if st := srv.Settled(t, ctx, xid); st != "committed" {
		t.Errorf("XactStatus after Terminate = %q, want committed", st)
	}
	if n := srv.CountOf(t, ctx, "SELECT count(*) FROM "+"syncrep"+" WHERE id = $1", 1); n != 1 {
		t.Errorf("row count after Terminate = %d, want 1", n)
	}
}

func TestCancel(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	c, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	pid := c.PgConn().PID()

	sleepErr := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "SELECT pg_sleep(60)")
		sleepErr <- err
	}()
	if err := srv.WaitForWaitEvent(ctx, pid, "PgSleep"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Cancel(ctx, pid); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if err := <-sleepErr; !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("pg_sleep error = %v, want SQLSTATE 57014", err)
	}
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("connection unusable after cancel: %v", err)
	}
}

func TestBackendHelpersRejectUnknownPID(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	const noSuchPID = 1 // init, never a PostgreSQL backend
	if err := srv.Terminate(ctx, noSuchPID); err == nil {
		t.Error("Terminate of a non-backend succeeded")
	}
	if err := srv.Cancel(ctx, noSuchPID); err == nil {
		t.Error("Cancel of a non-backend succeeded")
	}
	if err := srv.WaitForWaitEvent(ctx, noSuchPID, "SyncRep"); err == nil {
		t.Error("WaitForWaitEvent on a non-backend succeeded")
	}
}

func TestStopImmediateRestart(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	srv.FreshTable(t, ctx, "restart", "id int primary key")
	for round := 1; round <= 2; round++ {
		if err := srv.Exec(ctx, "INSERT INTO restart VALUES ($1)", round); err != nil {
			t.Fatal(err)
		}
		if err := srv.StopImmediate(); err != nil {
			t.Fatal(err)
		}
		if c, err := srv.Conn(ctx); err == nil {
			c.Close(ctx)
			t.Fatal("connected to a stopped server")
		}
		if err := srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		c, err := srv.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		err = c.QueryRow(ctx, "SELECT count(*) FROM restart").Scan(&n)
		c.Close(ctx)
		if err != nil || n != round {
			t.Fatalf("round %d: %d rows, %v; want %d", round, n, err, round)
		}
	}
	if err := srv.Restart(ctx); err == nil {
		t.Error("Restart of a running server succeeded")
	}
}

// TestCleanupAfterPanic runs this test binary again with a panicking test
// and checks that the child's server is stopped and its files removed.
func TestCleanupAfterPanic(t *testing.T) {
	if os.Getenv("PGTEST_PANIC_CHILD") == "1" {
		fmt.Printf("PGTEST_ROOT=%s\nPGTEST_PORT=%d\n", srv.root, srv.Port())
		panic("deliberate panic to test cleanup")
	}
	LeakCheck(t)
	ctx := ContextFor(t)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCleanupAfterPanic$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGTEST_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || !bytes.Contains(out, []byte("deliberate panic")) {
		t.Fatalf("child did not panic as planned: %v\n%s", err, out)
	}
	var root string
	var port int
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "PGTEST_ROOT="); ok {
			root = v
		}
		if v, ok := strings.CutPrefix(sc.Text(), "PGTEST_PORT="); ok {
			port, _ = strconv.Atoi(v)
		}
	}
	if root == "" || port == 0 {
		t.Fatalf("child printed no server details:\n%s", out)
	}

	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		_, statErr := os.Stat(root)
		conn, dialErr := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if dialErr == nil {
			conn.Close()
		}
		if os.IsNotExist(statErr) && dialErr != nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("after the child panicked: stat %s: %v; dial port %d: %v", root, statErr, port, dialErr)
		case <-tick.C:
		}
	}
}

// TestRestartFailureShowsLog breaks the configuration of the stopped server
// and checks that the start error carries the server log's explanation.
func TestRestartFailureShowsLog(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	conf := filepath.Join(srv.dataDir, "postgresql.conf")
	orig, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.WriteFile(conf, orig, 0); err != nil {
			t.Fatal(err)
		}
		if err := srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}()
	if err := os.WriteFile(conf, append(bytes.Clone(orig), "shared_buffers = 'plenty'\n"...), 0); err != nil {
		t.Fatal(err)
	}
	err = srv.Restart(ctx)
	if err == nil {
		t.Fatal("Restart with a broken configuration succeeded")
	}
	if !strings.Contains(err.Error(), `"shared_buffers"`) {
		t.Errorf("error lacks the server log's reason: %v", err)
	}
	t.Logf("start error:\n%v", err)
}

func TestStartClose(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	if s.Port() == srv.Port() {
		t.Error("second server shares the first one's port")
	}
	if err := s.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.root); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Close: %v", s.root, err)
	}
	if s.reaper.ProcessState == nil || !s.reaper.ProcessState.Exited() {
		t.Error("cleanup process still running after Close")
	}
	if c, err := s.Conn(ctx); err == nil {
		c.Close(ctx)
		t.Error("connected after Close")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.StopImmediate(); err == nil {
		t.Error("StopImmediate after Close succeeded")
	}
	if err := s.Restart(ctx); err == nil {
		t.Error("Restart after Close succeeded")
	}
}

// TestMainFailsWhenServerCannotStart runs this test binary with an unusable
// TMPDIR, so Start fails inside Main: the binary must exit 1 with install
// advice, not skip.
func TestMainFailsWhenServerCannotStart(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestServerBasics$", "-test.v")
	cmd.Env = append(os.Environ(), "TMPDIR="+filepath.Join(t.TempDir(), "missing"))
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
		t.Fatalf("exit = %v, want exit status 1\n%s", err, out)
	}
	for _, want := range []string{"apt-get install postgresql", "missing"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if bytes.Contains(out, []byte("SKIP")) || bytes.Contains(out, []byte("=== RUN")) {
		t.Errorf("tests ran or skipped without a server:\n%s", out)
	}
	t.Logf("output:\n%s", out)
}

// BenchmarkStart measures what a server of its own costs a test: Start (initdb, the
// configuration, the TLS files, pg_ctl start) and Close.
func BenchmarkStart(b *testing.B) {
	for b.Loop() {
		s, err := Start()
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
