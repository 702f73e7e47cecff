package classifier_test

// Real-server tests: every rule of the package documentation, produced with real pgx v5 calls against a
// throw-away PostgreSQL (pgtest), classified, and checked against the ground truth
// the server reports afterwards (pg_xact_status of the xid taken before COMMIT, and the
// row itself, read over an admin connection).
//
// The server runs with synchronous_standby_names = 'phantom_standby' (a standby that never
// connects) and synchronous_commit = local; a transaction that sets synchronous_commit = on
// waits in COMMIT (wait_event SyncRep) after its commit record is in local WAL.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// srv is the throw-away server shared by the real-server tests of this package.
var srv *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &srv) }

// realPoll is how often the helpers below sample the server while waiting for a condition.
const realPoll = 2 * time.Millisecond

// SQLSTATE codes the tests expect from the server, as PostgreSQL's errcodes.txt names them.
const (
	codeWarning                  = "01000" // warning
	codeAdminShutdown            = "57P01" // admin_shutdown
	codeNoActiveSQLTransaction   = "25P01" // no_active_sql_transaction
	codeIdleInTransactionTimeout = "25P03" // idle_in_transaction_session_timeout
)

// realCtx bounds every server interaction of a test.
func realCtx(t *testing.T) context.Context { return pgtest.Context(t, 60*time.Second) }

// noticeConn is a pgx connection that records every notice the server sends on it.
type noticeConn struct {
	*pgx.Conn
	mu      sync.Mutex
	notices []*pgconn.Notice
}

// realConnect connects to connString with OnNotice recording notices; configure, if not
// nil, may change the config further. The connection is closed when the test ends.
func realConnect(t *testing.T, ctx context.Context, connString string, configure func(*pgx.ConnConfig)) *noticeConn {
	t.Helper()
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		t.Fatal(err)
	}
	nc := &noticeConn{}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		nc.mu.Lock()
		nc.notices = append(nc.notices, n)
		nc.mu.Unlock()
	}
	if configure != nil {
		configure(cfg)
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc.Conn = c
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(cctx)
	})
	return nc
}

func (c *noticeConn) Notices() []*pgconn.Notice {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*pgconn.Notice(nil), c.notices...)
}

// facts are the wire facts an instrumentation would have after the COMMIT attempt.
func (c *noticeConn) facts() classifier.Facts {
	var f classifier.Facts
	for _, n := range c.Notices() {
		if classifier.CommittedLocallyNotice(n) {
			f.CommittedLocally = true
		}
	}
	f.ConnClosed = c.IsClosed()
	// What the server reported at connection start: PostgreSQL 15 here, so that the
	// PostgreSQL rules apply (TestServerOfRealServer).
	f.Server = classifier.ServerOf(c.PgConn().ParameterStatus)
	return f
}

func logNotices(t *testing.T, c *noticeConn) {
	t.Helper()
	ns := c.Notices()
	if len(ns) == 0 {
		t.Logf("notices: none")
	}
	for _, n := range ns {
		t.Logf("notice: severity=%s unlocalized=%s code=%s message=%q detail=%q (CommittedLocallyNotice=%v)",
			n.Severity, n.SeverityUnlocalized, n.Code, n.Message, n.Detail, classifier.CommittedLocallyNotice(n))
	}
}

// logErr records what pgx returned, with the facts a reviewer wants to see.
func logErr(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Logf("%s: <nil>", what)
		return
	}
	t.Logf("%s: %T: %v (pgconn.SafeToRetry=%v, pgconn.Timeout=%v, context.Canceled=%v, context.DeadlineExceeded=%v)",
		what, err, err, pgconn.SafeToRetry(err), pgconn.Timeout(err),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded))
	for e := errors.Unwrap(err); e != nil; e = errors.Unwrap(e) {
		t.Logf("  wraps %T: %v", e, e)
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		t.Logf("  PgError: severity=%s unlocalized=%s code=%s message=%q detail=%q",
			pgErr.Severity, pgErr.SeverityUnlocalized, pgErr.Code, pgErr.Message, pgErr.Detail)
	}
}

type realWant struct {
	evidence         classifier.Evidence
	retryable        bool
	sqlstate         string
	committedLocally bool
}

func checkVerdict(t *testing.T, v classifier.Classification, w realWant) {
	t.Helper()
	t.Logf("classification: evidence=%v retryable=%v sqlstate=%q committedLocally=%v reason=%q",
		v.Evidence(), v.Retryable(), v.SQLState(), v.CommittedLocally(), v.Reason())
	if v.Evidence() != w.evidence {
		t.Errorf("Evidence() = %v, want %v", v.Evidence(), w.evidence)
	}
	if v.Retryable() != w.retryable {
		t.Errorf("Retryable() = %v, want %v", v.Retryable(), w.retryable)
	}
	if v.SQLState() != w.sqlstate {
		t.Errorf("SQLState() = %q, want %q", v.SQLState(), w.sqlstate)
	}
	if v.CommittedLocally() != w.committedLocally {
		t.Errorf("CommittedLocally() = %v, want %v", v.CommittedLocally(), w.committedLocally)
	}
	if v.Evidence() == classifier.EvidenceUnknown && v.Retryable() {
		t.Error("an unknown classification is retryable")
	}
}

// sqlstateOf is the SQLSTATE an unknown classification should carry for err: the code of a
// server error, or "" for anything else.
func sqlstateOf(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code
	}
	return ""
}

type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// currentXid assigns (if needed) and returns the transaction's full xid, the reconciliation
// reference a reconciler would ask pg_xact_status about.
func currentXid(t *testing.T, ctx context.Context, q queryRower) uint64 {
	t.Helper()
	var xid int64
	if err := q.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	return uint64(xid)
}

func checkXact(t *testing.T, ctx context.Context, xid uint64, want string) {
	t.Helper()
	st := srv.Settled(t, ctx, xid)
	t.Logf("ground truth: pg_xact_status(%d) = %s", xid, st)
	if st != want {
		t.Errorf("pg_xact_status(%d) = %q, want %q", xid, st, want)
	}
}

// backendState returns the backend's state and wait_event from pg_stat_activity; gone is
// true when the backend is no longer listed.
func backendState(ctx context.Context, admin *pgx.Conn, pid uint32) (state, waitEvent string, gone bool, err error) {
	var st, we *string
	err = admin.QueryRow(ctx, "select state, wait_event from pg_stat_activity where pid = $1", int64(pid)).Scan(&st, &we)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", true, nil
	}
	if st != nil {
		state = *st
	}
	if we != nil {
		waitEvent = *we
	}
	return state, waitEvent, false, err
}

// waitBackendSettled polls until the backend has exited or sits idle (outside a
// transaction): either way it has finished the transaction, visibly to other sessions.
func waitBackendSettled(t *testing.T, ctx context.Context, pid uint32) {
	t.Helper()
	waitBackend(t, ctx, pid, func(state string, gone bool) bool { return gone || state == "idle" }, "exited or idle")
}

func waitBackend(t *testing.T, ctx context.Context, pid uint32, done func(state string, gone bool) bool, what string) {
	t.Helper()
	admin, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(realPoll)
	defer tick.Stop()
	for {
		state, _, gone, err := backendState(ctx, admin, pid)
		if err != nil {
			t.Fatalf("pg_stat_activity for backend %d: %v", pid, err)
		}
		if done(state, gone) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("backend %d never %s (last state %q): %v", pid, what, state, ctx.Err())
		case <-tick.C:
		}
	}
}

// rowCount counts the rows with id in table over an admin connection.
func rowCount(t *testing.T, ctx context.Context, table string, id int) int {
	t.Helper()
	admin, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	var n int
	if err := admin.QueryRow(ctx, "select count(*) from "+table+" where id = $1", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func checkRow(t *testing.T, ctx context.Context, table string, id int, present bool) {
	t.Helper()
	n := rowCount(t, ctx, table, id)
	t.Logf("ground truth: %d row(s) with id=%d in %s", n, id, table)
	want := 0
	if present {
		want = 1
	}
	if n != want {
		t.Errorf("%d row(s) with id=%d in %s, want %d", n, id, table, want)
	}
}

// commitAsync runs tx.Commit(ctx) on its own goroutine.
func commitAsync(ctx context.Context, tx pgx.Tx) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- tx.Commit(ctx) }()
	return ch
}

func awaitCommit(t *testing.T, ctx context.Context, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		t.Fatalf("COMMIT did not return: %v", ctx.Err())
		return nil
	}
}

// beginInsert begins a transaction on c, inserts id into table and returns the
// transaction and its xid. Statements in setup run first (after BEGIN).
func beginInsert(t *testing.T, ctx context.Context, c *noticeConn, table string, id int, setup ...string) (pgx.Tx, uint64) {
	t.Helper()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range setup {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if _, err := tx.Exec(ctx, "insert into "+table+" (id) values ($1)", id); err != nil {
		t.Fatal(err)
	}
	return tx, currentXid(t, ctx, tx)
}

const syncRepOn = "set local synchronous_commit = on"

// Row: tag COMMIT, session idle → committed.
func TestRealCommitPlain(t *testing.T) {
	ctx := realCtx(t)
	const table = "real_plain"
	srv.FreshTable(t, ctx, table, "id int primary key")
	c := realConnect(t, ctx, srv.ConnString(), nil)

	tx, xid := beginInsert(t, ctx, c, table, 1)
	err := tx.Commit(ctx)
	logErr(t, "tx.Commit", err)
	logNotices(t, c)
	if err != nil {
		t.Fatalf("tx.Commit: %v", err)
	}
	if st := c.PgConn().TxStatus(); st != 'I' {
		t.Errorf("TxStatus after COMMIT = %q, want 'I'", st)
	}
	checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, c.facts()),
		realWant{evidence: classifier.EvidenceCommitted})

	checkXact(t, ctx, xid, "committed")
	checkRow(t, ctx, table, 1, true)
}

// Row: tag ROLLBACK (pgx.ErrTxCommitRollback) → rolled_back, not retryable.
func TestRealCommitAfterFailedStatement(t *testing.T) {
	const table = "real_failed_stmt"

	t.Run("tx.Commit", func(t *testing.T) {
		ctx := realCtx(t)
		srv.FreshTable(t, ctx, table, "id int primary key")
		c := realConnect(t, ctx, srv.ConnString(), nil)

		tx, xid := beginInsert(t, ctx, c, table, 1)
		_, stmtErr := tx.Exec(ctx, "select 1/0")
		if sqlstateOf(stmtErr) != "22012" {
			t.Fatalf("select 1/0: %v, want 22012", stmtErr)
		}
		err := tx.Commit(ctx)
		logErr(t, "tx.Commit", err)
		logNotices(t, c)
		if !errors.Is(err, pgx.ErrTxCommitRollback) {
			t.Fatalf("tx.Commit = %v, want pgx.ErrTxCommitRollback", err)
		}
		checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, c.facts()),
			realWant{evidence: classifier.EvidenceRolledBack})

		checkXact(t, ctx, xid, "aborted")
		checkRow(t, ctx, table, 1, false)
	})

	t.Run("raw commit tag", func(t *testing.T) {
		ctx := realCtx(t)
		srv.FreshTable(t, ctx, table, "id int primary key")
		c := realConnect(t, ctx, srv.ConnString(), nil)

		if _, err := c.Exec(ctx, "begin"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "insert into "+table+" (id) values (1)"); err != nil {
			t.Fatal(err)
		}
		xid := currentXid(t, ctx, c)
		_, stmtErr := c.Exec(ctx, "select 1/0")
		if sqlstateOf(stmtErr) != "22012" {
			t.Fatalf("select 1/0: %v, want 22012", stmtErr)
		}
		tag, err := c.Exec(ctx, "commit")
		logErr(t, `conn.Exec("commit")`, err)
		t.Logf("command tag: %q", tag.String())
		logNotices(t, c)
		if err != nil {
			t.Fatalf(`conn.Exec("commit"): %v`, err)
		}
		if tag.String() != "ROLLBACK" {
			t.Fatalf("command tag = %q, want ROLLBACK", tag.String())
		}
		f := c.facts()
		f.RollbackTag = tag.String() == "ROLLBACK"
		checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, f),
			realWant{evidence: classifier.EvidenceRolledBack})

		checkXact(t, ctx, xid, "aborted")
		checkRow(t, ctx, table, 1, false)
	})
}

// Row: ERROR-severity PgError (23505 from a deferred constraint) → rolled_back, not retryable.
func TestRealCommitDeferredUniqueViolation(t *testing.T) {
	ctx := realCtx(t)
	const table = "real_deferred_unique"
	srv.FreshTable(t, ctx, table, "id int primary key, k int unique deferrable initially deferred")
	if err := srv.Exec(ctx, "insert into "+table+" (id, k) values (1, 7)"); err != nil {
		t.Fatal(err)
	}
	c := realConnect(t, ctx, srv.ConnString(), nil)

	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The duplicate is accepted here: the check is deferred to COMMIT.
	if _, err := tx.Exec(ctx, "insert into "+table+" (id, k) values (2, 7)"); err != nil {
		t.Fatalf("insert (deferred check should not fail yet): %v", err)
	}
	xid := currentXid(t, ctx, tx)
	err = tx.Commit(ctx)
	logErr(t, "tx.Commit", err)
	logNotices(t, c)
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok || pgErr.Code != "23505" || pgErr.SeverityUnlocalized != "ERROR" {
		t.Fatalf("tx.Commit = %v, want an ERROR 23505", err)
	}
	checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, c.facts()),
		realWant{evidence: classifier.EvidenceRolledBack, sqlstate: "23505"})

	checkXact(t, ctx, xid, "aborted")
	checkRow(t, ctx, table, 2, false)
}

// Row: ERROR-severity PgError (40001 from SSI) → rolled_back, retryable.
func TestRealCommitSerializationFailure(t *testing.T) {
	ctx := realCtx(t)
	const table = "real_write_skew"
	srv.FreshTable(t, ctx, table, "id int primary key, v int not null")
	if err := srv.Exec(ctx, "insert into "+table+" (id, v) values (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}
	c1 := realConnect(t, ctx, srv.ConnString(), nil)
	c2 := realConnect(t, ctx, srv.ConnString(), nil)
	opts := pgx.TxOptions{IsoLevel: pgx.Serializable}
	tx1, err := c1.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	tx2, err := c2.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Write skew: each reads both rows, then updates the row the other did not.
	var sum int
	for _, tx := range []pgx.Tx{tx1, tx2} {
		if err := tx.QueryRow(ctx, "select sum(v) from "+table).Scan(&sum); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx1.Exec(ctx, "update "+table+" set v = v + 1 where id = 1"); err != nil {
		t.Fatalf("tx1 update: %v", err)
	}
	if _, err := tx2.Exec(ctx, "update "+table+" set v = v + 1 where id = 2"); err != nil {
		t.Fatalf("tx2 update (the failure must come at COMMIT, not here): %v", err)
	}
	xid1 := currentXid(t, ctx, tx1)
	xid2 := currentXid(t, ctx, tx2)

	if err := tx1.Commit(ctx); err != nil {
		t.Fatalf("first COMMIT: %v", err)
	}
	err = tx2.Commit(ctx)
	logErr(t, "second tx.Commit", err)
	logNotices(t, c2)
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok || pgErr.Code != "40001" || pgErr.SeverityUnlocalized != "ERROR" {
		t.Fatalf("second COMMIT = %v, want an ERROR 40001", err)
	}
	checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, c2.facts()),
		realWant{evidence: classifier.EvidenceRolledBack, retryable: true, sqlstate: "40001"})

	checkXact(t, ctx, xid1, "committed")
	checkXact(t, ctx, xid2, "aborted")
	admin, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	var v2 int
	if err := admin.QueryRow(ctx, "select v from "+table+" where id = 2").Scan(&v2); err != nil {
		t.Fatal(err)
	}
	if v2 != 0 {
		t.Errorf("row 2 has v = %d, want 0 (the failed transaction's update)", v2)
	}
}

// Rows: "conn closed with SafeToRetry" and "WARNING 57P01 notice, then the connection
// closes" — the backend is terminated while COMMIT waits for synchronous replication.
func TestRealCommitTerminatedDuringSyncRep(t *testing.T) {
	ctx := realCtx(t)
	const table = "real_terminated_syncrep"
	srv.FreshTable(t, ctx, table, "id int primary key")
	c := realConnect(t, ctx, srv.ConnString(), nil)
	pid := c.PgConn().PID()

	tx, xid := beginInsert(t, ctx, c, table, 1, syncRepOn)
	done := commitAsync(ctx, tx)
	if err := srv.TerminateInSyncRep(ctx, pid); err != nil {
		t.Fatal(err)
	}
	err := awaitCommit(t, ctx, done)
	logErr(t, "tx.Commit", err)
	logNotices(t, c)
	// Reported, not asserted: it was true with pgx v5.12, for a commit that had happened.
	t.Logf("pgconn.SafeToRetry(err) = %v", pgconn.SafeToRetry(err))
	if err == nil {
		t.Fatal("tx.Commit returned nil after the backend was terminated")
	}
	var sawNotice bool
	for _, n := range c.Notices() {
		if n.Code == codeAdminShutdown && n.SeverityUnlocalized == "WARNING" {
			sawNotice = true
		}
	}
	if !sawNotice {
		t.Error("no WARNING 57P01 notice was received")
	}
	// A FATAL is recognised by SeverityUnlocalized. The server sends no
	// FATAL here (it stops output after the WARNING); if it ever does, it must be FATAL.
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.SeverityUnlocalized != "FATAL" {
		t.Errorf("commit error is a PgError with SeverityUnlocalized %q, want FATAL", pgErr.SeverityUnlocalized)
	}
	f := c.facts()
	t.Logf("facts: %+v", f)
	checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, f),
		realWant{evidence: classifier.EvidenceUnknown, sqlstate: sqlstateOf(err), committedLocally: true})

	pgtest.NoError(t, srv.WaitBackendGone(ctx, pid))
	checkXact(t, ctx, xid, "committed")
	checkRow(t, ctx, table, 1, true)
}

// Row: "success with a WARNING notice 'already committed locally' (01000)" — the
// caller's context ends during the synchronous-replication wait.
func TestRealCommitCanceledDuringSyncRep(t *testing.T) {
	const table = "real_canceled_syncrep"

	// With a CancelRequestContextWatcherHandler, pgx sends a cancel request: the server
	// stops waiting, warns 01000 "already committed locally" and completes the COMMIT.
	t.Run("CancelRequestContextWatcherHandler", func(t *testing.T) {
		ctx := realCtx(t)
		srv.FreshTable(t, ctx, table, "id int primary key")
		c := realConnect(t, ctx, srv.ConnString(), func(cfg *pgx.ConnConfig) {
			cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
				// The deadline is only a fallback; it must not fire before the reply.
				return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 30 * time.Second}
			}
		})
		pid := c.PgConn().PID()

		tx, xid := beginInsert(t, ctx, c, table, 1, syncRepOn)
		commitCtx, cancelCommit := context.WithCancel(ctx)
		defer cancelCommit()
		done := commitAsync(commitCtx, tx)
		if err := srv.WaitForWaitEvent(ctx, pid, "SyncRep"); err != nil {
			t.Fatal(err)
		}
		cancelCommit()
		err := awaitCommit(t, ctx, done)
		logErr(t, "tx.Commit", err)
		logNotices(t, c)
		var sawNotice bool
		for _, n := range c.Notices() {
			if n.Code == codeWarning && n.SeverityUnlocalized == "WARNING" &&
				n.Message == "canceling wait for synchronous replication due to user request" {
				sawNotice = true
			}
		}
		if !sawNotice {
			t.Error(`no WARNING 01000 "canceling wait for synchronous replication due to user request" notice`)
		}
		f := c.facts()
		t.Logf("facts: %+v", f)
		v := classifier.Classify(outcome.PhaseCommitting, err, f)
		if err == nil {
			checkVerdict(t, v, realWant{evidence: classifier.EvidenceCommitted, committedLocally: true})
		} else {
			checkVerdict(t, v, realWant{evidence: classifier.EvidenceUnknown, sqlstate: sqlstateOf(err), committedLocally: true})
		}

		waitBackendSettled(t, ctx, pid)
		checkXact(t, ctx, xid, "committed")
		checkRow(t, ctx, table, 1, true)
	})

	// pgx's default (DeadlineContextWatcherHandler) expires the socket's deadline: Commit
	// returns context.Canceled at once and the connection is closed. pgx v5.13 then sends a
	// cancel request from its asynchronous close (asyncClose) and discards whatever the
	// server still sends, so the client never sees the 01000 warning, while the server
	// completes the COMMIT.
	t.Run("default DeadlineContextWatcherHandler", func(t *testing.T) {
		ctx := realCtx(t)
		srv.FreshTable(t, ctx, table, "id int primary key")
		c := realConnect(t, ctx, srv.ConnString(), nil)
		pid := c.PgConn().PID()

		tx, xid := beginInsert(t, ctx, c, table, 1, syncRepOn)
		commitCtx, cancelCommit := context.WithCancel(ctx)
		defer cancelCommit()
		done := commitAsync(commitCtx, tx)
		if err := srv.WaitForWaitEvent(ctx, pid, "SyncRep"); err != nil {
			t.Fatal(err)
		}
		cancelCommit()
		err := awaitCommit(t, ctx, done)
		logErr(t, "tx.Commit", err)
		logNotices(t, c)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("tx.Commit = %v, want context.Canceled", err)
		}
		f := c.facts()
		t.Logf("facts: %+v", f)
		if !f.ConnClosed {
			t.Error("the connection is not closed after the cancelled COMMIT")
		}
		checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, f),
			realWant{evidence: classifier.EvidenceUnknown})

		// Informational: the cancel request races with this sample.
		if admin, err := srv.Conn(ctx); err == nil {
			state, waitEvent, gone, err := backendState(ctx, admin, pid)
			t.Logf("backend right after Commit returned: state=%q wait_event=%q gone=%v err=%v", state, waitEvent, gone, err)
			_ = admin.Close(ctx)
		}
		// The backend ends only if something released its SyncRep wait: pgx's cancel request.
		pgtest.NoError(t, srv.WaitBackendGone(ctx, pid))
		checkXact(t, ctx, xid, "committed")
		checkRow(t, ctx, table, 1, true)
	})
}

// statement_timeout does not interrupt COMMIT's synchronous-replication
// wait (the backend disables it before it commits).
func TestRealStatementTimeoutDoesNotInterruptSyncRepWait(t *testing.T) {
	ctx := realCtx(t)
	const table = "real_stmt_timeout_syncrep"
	srv.FreshTable(t, ctx, table, "id int primary key")
	c := realConnect(t, ctx, srv.ConnString(), nil)
	pid := c.PgConn().PID()

	tx, xid := beginInsert(t, ctx, c, table, 1, syncRepOn)
	// Set after the insert: on a loaded machine the insert itself can take 10 ms.
	if _, err := tx.Exec(ctx, "set local statement_timeout = '10ms'"); err != nil {
		t.Fatal(err)
	}
	done := commitAsync(ctx, tx)
	if err := srv.WaitForWaitEvent(ctx, pid, "SyncRep"); err != nil {
		t.Fatal(err)
	}
	// Poll until COMMIT has been running for 50 times statement_timeout, checking at
	// each sample that it is still in the SyncRep wait.
	admin, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(realPoll)
	defer tick.Stop()
	for {
		var waitEvent *string
		var elapsedMs float64
		err := admin.QueryRow(ctx, `select wait_event, extract(epoch from clock_timestamp() - query_start) * 1000
			from pg_stat_activity where pid = $1`, int64(pid)).Scan(&waitEvent, &elapsedMs)
		if err != nil {
			t.Fatal(err)
		}
		if waitEvent == nil || *waitEvent != "SyncRep" {
			t.Fatalf("after %.0f ms the backend left the SyncRep wait (wait_event %v)", elapsedMs, waitEvent)
		}
		if elapsedMs >= 500 {
			t.Logf("COMMIT still in SyncRep after %.0f ms with statement_timeout = 10ms", elapsedMs)
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-tick.C:
		}
	}
	// A cancel (pg_cancel_backend) ends the wait: committed, with the 01000 warning.
	if err := srv.Cancel(ctx, pid); err != nil {
		t.Fatal(err)
	}
	err = awaitCommit(t, ctx, done)
	logErr(t, "tx.Commit", err)
	logNotices(t, c)
	if err != nil {
		t.Fatalf("tx.Commit after pg_cancel_backend: %v", err)
	}
	checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, c.facts()),
		realWant{evidence: classifier.EvidenceCommitted, committedLocally: true})
	checkXact(t, ctx, xid, "committed")
	checkRow(t, ctx, table, 1, true)
}

// Row: FATAL PgError in reply to COMMIT → unknown. The backend is terminated while COMMIT
// runs a deferred trigger (before the commit record), so this fate is "aborted"; the
// client cannot tell that from a FATAL after the commit record.
func TestRealCommitFatalDuringDeferredTrigger(t *testing.T) {
	ctx := realCtx(t)
	const table = "real_fatal_trigger"
	srv.FreshTable(t, ctx, table, "id int primary key")
	if err := srv.Exec(ctx, `
		create or replace function real_fatal_trigger_sleep() returns trigger language plpgsql as
			$$ begin perform pg_sleep(60); return null; end $$;
		create constraint trigger real_fatal_trigger_sleep after insert on `+table+`
			deferrable initially deferred for each row execute function real_fatal_trigger_sleep()`); err != nil {
		t.Fatal(err)
	}
	c := realConnect(t, ctx, srv.ConnString(), nil)
	pid := c.PgConn().PID()

	tx, xid := beginInsert(t, ctx, c, table, 1)
	done := commitAsync(ctx, tx)
	if err := srv.WaitForWaitEvent(ctx, pid, "PgSleep"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Terminate(ctx, pid); err != nil {
		t.Fatal(err)
	}
	err := awaitCommit(t, ctx, done)
	logErr(t, "tx.Commit", err)
	logNotices(t, c)
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok {
		t.Fatalf("tx.Commit = %v, want a *pgconn.PgError", err)
	}
	if pgErr.SeverityUnlocalized != "FATAL" || pgErr.Code != codeAdminShutdown {
		t.Fatalf("commit error: SeverityUnlocalized=%q Code=%q, want FATAL 57P01", pgErr.SeverityUnlocalized, pgErr.Code)
	}
	f := c.facts()
	t.Logf("facts: %+v", f)
	checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, f),
		realWant{evidence: classifier.EvidenceUnknown, sqlstate: codeAdminShutdown})

	pgtest.NoError(t, srv.WaitBackendGone(ctx, pid))
	checkXact(t, ctx, xid, "aborted")
	checkRow(t, ctx, table, 1, false)
}

// Row: "connection closed ... after sending" — the backend was terminated while idle in
// transaction, and the client sends COMMIT on the dead session.
func TestRealCommitAfterIdleBackendTerminated(t *testing.T) {
	ctx := realCtx(t)
	const table = "real_idle_terminated"
	srv.FreshTable(t, ctx, table, "id int primary key")
	c := realConnect(t, ctx, srv.ConnString(), nil)
	pid := c.PgConn().PID()

	tx, xid := beginInsert(t, ctx, c, table, 1)
	if err := srv.Terminate(ctx, pid); err != nil {
		t.Fatal(err)
	}
	pgtest.NoError(t, srv.WaitBackendGone(ctx, pid))

	err := tx.Commit(ctx)
	logErr(t, "tx.Commit", err)
	logNotices(t, c)
	if err == nil {
		t.Fatal("tx.Commit on a terminated session returned nil")
	}
	f := c.facts()
	t.Logf("facts: %+v", f)
	// From the error alone, while committing, it is unknown; the fact that the FATAL was
	// already waiting before COMMIT was written makes it a rollback (the otelpgxtx
	// package's TestCommitNotExecuted, where the tracer's net.Conn sees it).
	checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, f),
		realWant{evidence: classifier.EvidenceUnknown, sqlstate: sqlstateOf(err)})
	f.SessionEndedBeforeCommit = true
	checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, f),
		realWant{evidence: classifier.EvidenceRolledBack, retryable: true, sqlstate: sqlstateOf(err)})
	f.SessionEndedBeforeCommit = false
	// The same error observed while active (COMMIT never sent) is a retryable rollback.
	checkVerdict(t, classifier.Classify(outcome.PhaseActive, err, f),
		realWant{evidence: classifier.EvidenceRolledBack, retryable: true, sqlstate: sqlstateOf(err)})

	checkXact(t, ctx, xid, "aborted")
	checkRow(t, ctx, table, 1, false)
}

// Row: "connection closed ... after sending". The proxy forwards COMMIT and then cuts, or
// cuts before COMMIT reaches the server: the client cannot tell the two apart, and the
// server's answers differ.
func TestRealCommitProxyCut(t *testing.T) {
	for _, tc := range []struct {
		name    string
		arm     func(*pgtest.Proxy)
		fate    string
		present bool
	}{
		{"after commit", (*pgtest.Proxy).CutAfterCommit, "committed", true},
		{"before commit", (*pgtest.Proxy).CutBeforeCommit, "aborted", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := realCtx(t)
			table := "real_cut_" + strings.ReplaceAll(tc.name, " ", "_")
			srv.FreshTable(t, ctx, table, "id int primary key")
			p := pgtest.ProxyFor(t, srv)
			c := realConnect(t, ctx, p.ConnString(srv.ConnString()), nil)
			pid := c.PgConn().PID()

			tx, xid := beginInsert(t, ctx, c, table, 1)
			tc.arm(p)
			err := tx.Commit(ctx)
			logErr(t, "tx.Commit", err)
			logNotices(t, c)
			if err == nil {
				t.Fatal("tx.Commit through a cut proxy returned nil")
			}
			if p.Cuts() != 1 {
				t.Errorf("proxy Cuts() = %d, want 1", p.Cuts())
			}
			f := c.facts()
			t.Logf("facts: %+v", f)
			checkVerdict(t, classifier.Classify(outcome.PhaseCommitting, err, f),
				realWant{evidence: classifier.EvidenceUnknown, sqlstate: sqlstateOf(err)})

			pgtest.NoError(t, srv.WaitBackendGone(ctx, pid))
			checkXact(t, ctx, xid, tc.fate)
			checkRow(t, ctx, table, 1, tc.present)
		})
	}
}

// COMMIT outside a transaction answers tag COMMIT with a
// WARNING 25P01 — it committed nothing.
func TestRealCommitWithoutTransaction(t *testing.T) {
	ctx := realCtx(t)
	c := realConnect(t, ctx, srv.ConnString(), nil)

	tag, err := c.Exec(ctx, "commit")
	logErr(t, `conn.Exec("commit")`, err)
	t.Logf("command tag: %q", tag.String())
	logNotices(t, c)
	if err != nil {
		t.Fatal(err)
	}
	if tag.String() != "COMMIT" {
		t.Errorf("command tag = %q, want COMMIT", tag.String())
	}
	ns := c.Notices()
	if len(ns) != 1 {
		t.Fatalf("%d notices, want 1", len(ns))
	}
	n := ns[0]
	if n.SeverityUnlocalized != "WARNING" || n.Code != codeNoActiveSQLTransaction {
		t.Errorf("notice %s %s, want WARNING 25P01", n.SeverityUnlocalized, n.Code)
	}
	if classifier.CommittedLocallyNotice(n) {
		t.Error("CommittedLocallyNotice is true for the 25P01 notice")
	}
	if st := c.PgConn().TxStatus(); st != 'I' {
		t.Errorf("TxStatus = %q, want 'I'", st)
	}
}
