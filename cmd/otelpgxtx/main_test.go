package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

var srv *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &srv) }

// cli runs the command in-process with the server's URL as DATABASE_URL.
func cli(t *testing.T, ctx context.Context, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := func(k string) string {
		if k == "DATABASE_URL" {
			return srv.ConnString()
		}
		return ""
	}
	code = run(ctx, args, strings.NewReader(stdin), &out, &errOut, env)
	t.Logf("otelpgxtx %s → %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// indeterminate produces a real indeterminate commit through the library: COMMIT waits for
// the phantom synchronous standby and the backend is terminated, after the commit record
// reached the local WAL. It returns the result and the JSON log record the library wrote.
func indeterminate(t *testing.T, ctx context.Context, policy otelpgxtx.Policy) (outcome.Indeterminate[int], string) {
	t.Helper()
	var logs bytes.Buffer
	cfg, err := pgxpool.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otelpgxtx.InstrumentPool(cfg, otelpgxtx.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil)))); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := srv.Exec(ctx, "drop table if exists cli_t; create table cli_t (id int primary key)"); err != nil {
		t.Fatal(err)
	}
	pids := make(chan uint32, 1)
	done := make(chan outcome.Result[int], 1)
	go func() {
		done <- otelpgxtx.Run(ctx, pool, policy, func(ctx context.Context, tx pgx.Tx) (int, error) {
			pids <- tx.Conn().PgConn().PID()
			if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
				return 0, err
			}
			_, err := tx.Exec(ctx, "insert into cli_t values (1)")
			return 1, err
		})
	}()
	pid := <-pids
	if err := srv.TerminateInSyncRep(ctx, pid); err != nil {
		t.Fatal(err)
	}
	ind, ok := (<-done).(outcome.Indeterminate[int])
	if !ok {
		t.Fatal("the terminated commit is not indeterminate")
	}
	if err := srv.WaitBackendGone(ctx, pid); err != nil {
		t.Fatal(err)
	}
	return ind, strings.TrimSpace(logs.String())
}

func TestReconcileRealIndeterminate(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	ind, record := indeterminate(t, ctx, otelpgxtx.DefaultPolicy())
	ref, ok := ind.Reference()
	if !ok {
		t.Fatal("no reference")
	}
	want := fmt.Sprintf("ref=%s operation=%s resolved=committed\n", ref, ind.OperationID())

	// The log record on standard input, as a log query would pipe it.
	code, out, _ := cli(t, ctx, record+"\n", "reconcile")
	if code != exitSettled || out != want {
		t.Errorf("from the log record: exit %d, %q; want 0, %q", code, out, want)
	}
	runbookShows(t, 3, out)
	// What a log query returns when the operation also stayed unknown at shutdown: its
	// indeterminate record and Tracer.Close's, and the reference alone once more, the
	// bare operation id too. One answer for the one transaction.
	shutdown := strings.Replace(record, `"msg":"`+otelpgxtx.MessageIndeterminate, `"msg":"`+otelpgxtx.MessagePendingAtShutdown, 1)
	if shutdown == record {
		t.Fatalf("the record %s has no message %q", record, otelpgxtx.MessageIndeterminate)
	}
	code, out, _ = cli(t, ctx, strings.Join([]string{ind.OperationID().String(), record, shutdown, ref.String(), record}, "\n")+"\n", "reconcile")
	if code != exitSettled || out != want {
		t.Errorf("the same transaction five times: exit %d, %q; want 0, %q once", code, out, want)
	}
	// The reference as an argument.
	code, out, _ = cli(t, ctx, "", "reconcile", ref.String())
	if want := fmt.Sprintf("ref=%s operation=- resolved=committed\n", ref); code != exitSettled || out != want {
		t.Errorf("from the argument: exit %d, %q; want 0, %q", code, out, want)
	}
	runbookShows(t, 1, out)
	// Quoted, as slog's text handler writes it (its ";flushed=" needs the quotes).
	code, out, _ = cli(t, ctx, strconv.Quote(ref.String())+"\n", "reconcile")
	if want := fmt.Sprintf("ref=%s operation=- resolved=committed\n", ref); code != exitSettled || out != want {
		t.Errorf("quoted: exit %d, %q; want 0, %q", code, out, want)
	}
	// One per line on stdin, with one that stays unknown (another cluster's) and a bare
	// operation id (no reference): exit 1, one line each, in order.
	other := ref
	other.SystemIdentifier++
	op := outcome.NewOperationID()
	code, out, _ = cli(t, ctx, ref.String()+"\n\n"+other.String()+"\n"+op.String()+"\n", "reconcile")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	wantLines := []string{
		fmt.Sprintf("ref=%s operation=- resolved=committed", ref),
		fmt.Sprintf("ref=%s operation=- resolved=unknown reason=other_system", other),
		fmt.Sprintf("ref=- operation=%s resolved=unknown reason=no_reference", op),
	}
	if code != exitUnknown || strings.Join(lines, "|") != strings.Join(wantLines, "|") {
		t.Errorf("stdin: exit %d, %q; want 1, %q", code, lines, wantLines)
	}
}

func TestReconcileBadInput(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	for _, tc := range []struct {
		name, stdin string
		args        []string
		wantErr     string
	}{
		{"malformed reference", "", []string{"reconcile", "pg:1/x/3"}, `argument 1: outcome: malformed reconciliation reference "pg:1/x/3"`},
		{"zero system identifier", "pg:0/1/3\n", []string{"reconcile"}, `line 1: outcome: malformed reconciliation reference pg:0/1/3: zero system identifier`},
		{"neither", "", []string{"reconcile", "pg:7/1/3", "hello"}, `argument 2: "hello" is neither a reconciliation reference`},
		{"bad JSON", "{\"tx.reconciliation.ref\": \n", []string{"reconcile"}, "line 1: not a JSON log record"},
		{"JSON without the keys", `{"msg":"hello"}` + "\n", []string{"reconcile"}, "line 1: the JSON record has neither tx.reconciliation.ref nor tx.operation_id"},
		{"nothing", "\n\n", []string{"reconcile"}, "nothing to reconcile"},
		{"no subcommand", "", nil, "usage: otelpgxtx <command>"},
		{"unknown flag", "", []string{"reconcile", "-x"}, "flag provided but not defined: -x"},
		{"the old -marker flag", "", []string{"reconcile", "-marker", "public.m", "pg:7/1/3"}, "flag provided but not defined: -marker"},
		{"a table PostgreSQL would fold", "", []string{"reconcile", "-assert-marker", "App.tx_marker", "pg:7/1/3"}, `-assert-marker: malformed marker table "App.tx_marker"`},
		{"an unclosed quote", "", []string{"reconcile", "-assert-marker", `"app.tx_marker`, "pg:7/1/3"}, `-assert-marker: malformed marker table`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := cli(t, ctx, tc.stdin, tc.args...)
			if code != exitBad || out != "" || !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing, %q", code, out, errOut, tc.wantErr)
			}
		})
	}
}

// TestReconcileNoDatabaseKeepsPasswordSecret: a DSN with a password and no server behind
// it exits 2, and the password appears in no output, whichever DSN form.
func TestReconcileNoDatabaseKeepsPasswordSecret(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	const secret = "s3cr3t-Pa55"
	port := deadPort(t)
	for _, dsn := range []string{
		fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/db?sslmode=disable&connect_timeout=5", secret, port),
		fmt.Sprintf("host=127.0.0.1 port=%d user=app password=%s dbname=db sslmode=disable connect_timeout=5", port, secret),
		fmt.Sprintf("host=127.0.0.1 port=%d user=app password='%s' sslmode=bogus", port, secret), // a parse error
		fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/db?sslmode=bogus", secret, port),
	} {
		code, out, errOut := cli(t, ctx, "", "reconcile", "-dsn", dsn, "pg:7/1/3")
		if code != exitBad {
			t.Errorf("%s: exit %d, want 2", dsn, code)
		}
		if strings.Contains(out+errOut, secret) {
			t.Errorf("the password is in the output: %q", out+errOut)
		}
		if !strings.Contains(errOut, "connecting to the database") {
			t.Errorf("stderr %q does not say the database could not be reached", errOut)
		}
	}
}

// deadPort returns a port nothing listens on, held until the test ends so that no other
// test's server starts listening on it (pgtest.ReservePort).
func deadPort(t *testing.T) int {
	t.Helper()
	p, err := pgtest.ReservePort()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Release() })
	return p.Number()
}

// buildCLI builds the command as an operator gets it and returns the program's path.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "otelpgxtx")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestBuild builds the command as an operator gets it (go build) and runs it once.
func TestBuild(t *testing.T) {
	bin := buildCLI(t)
	cmd := exec.Command(bin, "reconcile", "pg:7/1/0")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+srv.ConnString())
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "ref=pg:7/1/0 operation=- resolved=no_writes\n" {
		t.Fatalf("otelpgxtx reconcile pg:7/1/0: %v, %q", err, out)
	}
	cmd = exec.Command(bin)
	if err := cmd.Run(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != exitBad {
		t.Fatalf("otelpgxtx without a subcommand: %v, want exit 2", err)
	}
}

// TestReconcileByMarker: with -assert-marker, a bare operation id given as an argument
// settles by the commit-marker table: committed for an operation Run committed with the
// marker, aborted (and fenced) for one that never committed. The table is read in both
// spellings; the same ids on standard input stay unknown: the assertion is the operator's,
// for what they typed.
func TestReconcileByMarker(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	res := commitWithMarker(t, ctx, cliMarkerPool(t, ctx), pgx.Identifier{"public", "cli_marker"})
	never := outcome.NewOperationID()
	want := fmt.Sprintf("ref=- operation=%s resolved=committed\nref=- operation=%s resolved=aborted\n", res.OperationID(), never)
	for _, table := range []string{"public.cli_marker", `"public"."cli_marker"`} {
		code, out, _ := cli(t, ctx, "", "reconcile", "-assert-marker", table, res.OperationID().String(), never.String())
		if code != exitSettled || out != want {
			t.Errorf("-assert-marker %s: exit %d, %q; want 0, %q", table, code, out, want)
		}
	}
	code, out, errOut := cli(t, ctx, res.OperationID().String()+"\n", "reconcile", "-assert-marker", "public.cli_marker")
	if want := fmt.Sprintf("ref=- operation=%s resolved=unknown reason=no_reference\n", res.OperationID()); code != exitUnknown || out != want {
		t.Errorf("an operation id on standard input: exit %d, %q; want 1, %q", code, out, want)
	}
	// The flag that did nothing is said on standard error, not ignored in silence.
	const notice = "-assert-marker applies only to operation ids given as arguments"
	if !strings.Contains(errOut, notice) {
		t.Errorf("standard input with -assert-marker: stderr %q, want %q", errOut, notice)
	}
	if _, _, errOut := cli(t, ctx, "", "reconcile", "-assert-marker", "public.cli_marker", res.OperationID().String()); strings.Contains(errOut, notice) {
		t.Errorf("an operation id as an argument: stderr %q says the flag does not apply", errOut)
	}
}

// cliMarkerPool creates public.cli_marker, empty, and returns an instrumented pool.
func cliMarkerPool(t *testing.T, ctx context.Context, opts ...otelpgxtx.Option) *pgxpool.Pool {
	t.Helper()
	ddl, err := reconcile.MarkerTableDDL(pgx.Identifier{"public", "cli_marker"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Exec(ctx, "drop table if exists cli_marker; "+ddl); err != nil {
		t.Fatal(err)
	}
	return cliPool(t, ctx, opts...)
}

// commitWithMarker commits a Run on pool with table as its commit marker, or fails t. The
// transaction takes an xid, so that the marker function writes its row (a transaction
// without one leaves nothing durable, and no marker).
func commitWithMarker(t *testing.T, ctx context.Context, pool *pgxpool.Pool, table pgx.Identifier) outcome.Result[int] {
	t.Helper()
	p := otelpgxtx.DefaultPolicy()
	p.CommitMarker = table
	res := otelpgxtx.Run(ctx, pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, "select pg_current_xact_id()")
		return 1, err
	})
	if res.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("Run with the marker table %v: %T", table, res)
	}
	return res
}

// cliPool returns an instrumented pool on the test server, closed when the test ends.
func cliPool(t *testing.T, ctx context.Context, opts ...otelpgxtx.Option) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otelpgxtx.InstrumentPool(cfg, opts...); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestPlainCommitNeverAborted is the runbook as an operator follows it, through the built
// command and its standard input: a plain pgx transaction of an application that also
// uses a commit marker (for its Run calls) commits locally and loses its connection in the
// synchronous-replication wait. Its log record has an operation id and no reference: it
// wrote no marker, so the marker table proves nothing about it. Piped to the command with
// -assert-marker, it stays unknown (no_reference), exit 1, and nothing is fenced; the row
// it wrote is there. (Answered aborted, the runbook would have the work redone: applied
// twice.)
func TestPlainCommitNeverAborted(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	var logs bytes.Buffer
	pool := cliMarkerPool(t, ctx, otelpgxtx.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	if err := srv.Exec(ctx, "drop table if exists cli_plain; create table cli_plain (id int primary key)"); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	commitTerminatedInSyncRep(t, ctx, conn, "insert into cli_plain values (1)")
	conn.Release()
	record := strings.TrimSpace(logs.String())
	if !strings.Contains(record, `"tx.operation_id"`) || strings.Contains(record, `"tx.reconciliation.ref"`) {
		t.Fatalf("want one indeterminate record with an operation id and no reference:\n%s", record)
	}

	cmd := exec.CommandContext(ctx, buildCLI(t), "reconcile", "-assert-marker", "public.cli_marker")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+srv.ConnString())
	cmd.Stdin = strings.NewReader(record + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run()
	t.Logf("stdout: %s\nstderr: %s", stdout.String(), stderr.String())
	if code := cmd.ProcessState.ExitCode(); code != exitUnknown || !strings.HasSuffix(stdout.String(), " resolved=unknown reason=no_reference\n") {
		t.Errorf("exit %d, %q; want 1, unknown no_reference", code, stdout.String())
	}
	admin, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var rows, fences int
	if err := admin.QueryRow(ctx, "select (select count(*) from cli_plain), (select count(*) from cli_marker)").Scan(&rows, &fences); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || fences != 0 {
		t.Errorf("the transaction's row: %d (it committed), marker rows: %d; want 1 and no fence", rows, fences)
	}
}

// commitTerminatedInSyncRep runs sql in a transaction on conn and has pgtest's
// TerminateInSyncRep terminate its backend in COMMIT's synchronous-replication wait: the
// commit is local, its reply never comes.
func commitTerminatedInSyncRep(t *testing.T, ctx context.Context, conn *pgxpool.Conn, sql string) {
	t.Helper()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := conn.Conn().PgConn().PID()
	if _, err := tx.Exec(ctx, "set local synchronous_commit = on; "+sql); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() { committed <- tx.Commit(ctx) }()
	if err := srv.TerminateInSyncRep(ctx, pid); err != nil {
		t.Fatal(err)
	}
	if err := <-committed; err == nil {
		t.Fatal("the terminated COMMIT succeeded")
	}
	if err := srv.WaitBackendGone(ctx, pid); err != nil {
		t.Fatal(err)
	}
}

// TestSearchPathMarker is the wrong answer that made the marker a function, through the
// command: the application's session has SET search_path TO tenant, public and the tenant
// schema a marker table of its own; a plain pgx COMMIT with WithCommitMarker(public …)
// terminated in its synchronous-replication wait committed. Its log record, piped to the
// command with no flag, answers committed; the tenant's table is untouched.
func TestSearchPathMarker(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	var logs bytes.Buffer
	pool := cliMarkerPool(t, ctx, otelpgxtx.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))),
		otelpgxtx.WithCommitMarker(pgx.Identifier{"public", "cli_marker"}))
	decoy, err := reconcile.MarkerTableDDL(pgx.Identifier{"cli_tenant", "cli_marker"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Exec(ctx, "drop table if exists cli_sp; create table cli_sp (id int primary key); drop table if exists cli_tenant.cli_marker; "+decoy); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "set search_path to cli_tenant, public"); err != nil {
		t.Fatal(err)
	}
	commitTerminatedInSyncRep(t, ctx, conn, "insert into public.cli_sp values (1)")
	conn.Release()
	record := strings.TrimSpace(logs.String())
	if !strings.Contains(record, `;marker=`) || !strings.Contains(record, `\"postgres\".\"public\".\"cli_marker\"`) {
		t.Fatalf("want one indeterminate record whose reference names postgres.public.cli_marker:\n%s", record)
	}
	code, out, _ := cli(t, ctx, record+"\n", "reconcile")
	if code != exitSettled || !strings.HasSuffix(out, " resolved=committed\n") {
		t.Errorf("exit %d, %q; want 0, committed", code, out)
	}
	admin, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var rows, decoys int
	if err := admin.QueryRow(ctx, "select (select count(*) from public.cli_sp), (select count(*) from cli_tenant.cli_marker)").Scan(&rows, &decoys); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || decoys != 0 {
		t.Errorf("the transaction's row: %d, the tenant's marker rows: %d; want 1 and 0", rows, decoys)
	}
}

// TestSettleAfterRestart stops an application with outcomes automatic reconciliation
// could not settle — its database for reconciliation is unreachable (a refused port), and
// its queue holds one outcome, so a second is dropped — and settles them from what it
// left in its JSON log: the shutdown record of the pending one and the indeterminate
// record of the dropped one, piped to the command.
func TestSettleAfterRestart(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	marker := pgx.Identifier{"public", "cli_restart_marker"}
	ddl, err := reconcile.MarkerTableDDL(marker)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Exec(ctx, "drop table if exists cli_restart_marker; "+ddl+"; drop table if exists cli_restart; create table cli_restart (id int primary key)"); err != nil {
		t.Fatal(err)
	}
	proxy, err := pgtest.NewProxy(fmt.Sprintf("%s:%d", srv.Host(), srv.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	down, err := pgxpool.New(ctx, fmt.Sprintf("postgres://x@127.0.0.1:%d/x?connect_timeout=2", deadPort(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()

	var logs bytes.Buffer
	got := make(chan otelpgxtx.Reconciliation, 4)
	cfg, err := pgxpool.ParseConfig(proxy.ConnString(srv.ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(down)
	if err != nil {
		t.Fatal(err)
	}
	tracer, err := otelpgxtx.InstrumentPool(cfg, otelpgxtx.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))),
		otelpgxtx.WithAutoReconcile(rec, otelpgxtx.WithQueue(1, 1), otelpgxtx.WithRetryBackoff(time.Millisecond, 20*time.Millisecond),
			otelpgxtx.WithOnReconciled(func(r otelpgxtx.Reconciliation) { got <- r })))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	p := otelpgxtx.DefaultPolicy()
	p.CommitMarker = marker
	var ids []outcome.OperationID
	for id := 1; id <= 2; id++ {
		res := otelpgxtx.Run(ctx, pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
			proxy.CutAfterCommit()
			_, err := tx.Exec(ctx, "insert into cli_restart values ($1)", id)
			return id, err
		})
		if _, ok := res.(outcome.Indeterminate[int]); !ok {
			t.Fatalf("Run %d: %T, want indeterminate", id, res)
		}
		ids = append(ids, res.OperationID())
	}
	// The second found the queue full.
	if r := <-got; r.OperationID != ids[1] || r.Answer.Reason() != reconcile.ReasonQueueFull {
		t.Fatalf("first reconciliation %+v, want %s dropped (queue_full)", r, ids[1])
	}
	// The application stops; the first is still pending.
	if err := tracer.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.OperationID != ids[0] || r.Answer.Reason() != reconcile.ReasonStopped {
		t.Fatalf("reconciliation at Close %+v, want %s stopped", r, ids[0])
	}
	select {
	case r := <-got:
		t.Fatalf("a third reconciliation: %+v", r)
	default:
	}

	// What it left: the shutdown record of the pending one, the indeterminate record of
	// the dropped one.
	var left []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		switch {
		case strings.Contains(line, otelpgxtx.MessagePendingAtShutdown) && strings.Contains(line, ids[0].String()),
			strings.Contains(line, "indeterminate") && strings.Contains(line, ids[1].String()):
			left = append(left, line)
		}
	}
	if len(left) != 2 {
		t.Fatalf("log records to settle: %q\nlog:\n%s", left, logs.String())
	}
	// The backends the proxy cut may not have run the COMMIT that reached them yet; a
	// reconciliation asked before that would fence the marker and rightly say aborted.
	if err := srv.WaitQuiet(ctx); err != nil {
		t.Fatal(err)
	}
	code, out, _ := cli(t, ctx, strings.Join(left, "\n")+"\n", "reconcile")
	for _, id := range ids {
		if !strings.Contains(out, "operation="+id.String()+" resolved=committed\n") {
			t.Errorf("operation %s not settled committed", id)
		}
	}
	if code != exitSettled {
		t.Errorf("exit %d, want 0", code)
	}
}

// TestMarkerDDLAsDocumented runs the runbook's marker-table block as written, with the
// built command on PATH and the test server as DATABASE_URL, then commits a Run with that
// table as its marker and settles its operation id by -assert-marker: the table the
// runbook makes is one the library writes and the command reads.
func TestMarkerDDLAsDocumented(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	const first = "```sh\notelpgxtx marker-ddl "
	start := strings.Index(string(page), first)
	if start < 0 {
		t.Fatalf("docs/runbook.md has no block starting %q", first)
	}
	block, _, _ := strings.Cut(string(page)[start+len("```sh\n"):], "```")
	if err := srv.Exec(ctx, "drop schema if exists app cascade"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", block)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(buildCLI(t))+string(os.PathListSeparator)+os.Getenv("PATH"),
		"DATABASE_URL="+srv.ConnString())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the runbook's block\n%s\nfailed (it needs psql, the PostgreSQL client): %v\n%s", block, err, out)
	}

	res := commitWithMarker(t, ctx, cliPool(t, ctx), pgx.Identifier{"app", "tx_marker"})
	code, out, _ := cli(t, ctx, "", "reconcile", "-assert-marker", `"app"."tx_marker"`, res.OperationID().String())
	if want := fmt.Sprintf("ref=- operation=%s resolved=committed\n", res.OperationID()); code != exitSettled || out != want {
		t.Errorf("-assert-marker on the runbook's table: exit %d, %q; want 0, %q", code, out, want)
	}
	// An indeterminate commit that wrote its marker there settles by its reference alone,
	// as the runbook's second sample line shows.
	p := otelpgxtx.DefaultPolicy()
	p.CommitMarker = pgx.Identifier{"app", "tx_marker"}
	ind, _ := indeterminate(t, ctx, p)
	ref, ok := ind.Reference()
	if !ok || !ref.HasMarker() {
		t.Fatalf("the indeterminate commit has no marker reference: %v", ref)
	}
	code, out, _ = cli(t, ctx, "", "reconcile", ref.String())
	if code != exitSettled {
		t.Errorf("reconcile %s: exit %d; want 0", ref, code)
	}
	runbookShows(t, 2, out)

	// A table name PostgreSQL would fold is refused, not guessed at.
	if code, _, errOut := cli(t, ctx, "", "marker-ddl", "App.tx_marker"); code != exitBad || !strings.Contains(errOut, "App.tx_marker") {
		t.Errorf("marker-ddl App.tx_marker: exit %d, stderr %q; want 2 naming it", code, errOut)
	}
}

// runbookShows checks that out, the command's one line of output, is the nth line of the
// runbook's sample output but for what differs between runs (references' numbers and
// times, ids).
func runbookShows(t *testing.T, n int, out string) {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	const intro = "It prints one line per transaction"
	_, after, ok := strings.Cut(string(page), intro)
	_, sample, ok2 := strings.Cut(after, "```\n")
	sample, _, ok3 := strings.Cut(sample, "```")
	lines := strings.Split(strings.TrimSpace(sample), "\n")
	if !ok || !ok2 || !ok3 || n > len(lines) {
		t.Fatalf("docs/runbook.md has no sample output of %d lines after %q", n, intro)
	}
	shape := func(s string) string {
		s = regexp.MustCompile(`;checked=[0-9]+`).ReplaceAllString(strings.TrimSpace(s), ";checked=<time>")
		s = regexp.MustCompile(`;flushed=[0-9A-F]+/[0-9A-F]+`).ReplaceAllString(s, ";flushed=<position>")
		s = regexp.MustCompile(`pg:[0-9/]+`).ReplaceAllString(s, "pg:<reference>")
		return regexp.MustCompile(`\b[0-9a-f]{32}\b`).ReplaceAllString(s, "<operation id>")
	}
	if got, want := shape(out), shape(lines[n-1]); got != want {
		t.Errorf("the command printed, in shape:\n%s\nthe runbook's sample line %d, in shape:\n%s", got, n, want)
	}
}
