package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/pgtest"
)

func TestStaleReleasedMidTransaction(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	pc := acquireInTransaction(t, ctx, h)
	pc.Release() // the pool destroys a connection released mid-transaction
	f := onlyFrame(t, h)
	wantAttr(t, f, "tx.outcome", "rolled_back")
	wantAttr(t, f, "error.type", evidence.ReasonReleasedInTransaction)
	wantStatus(t, f, codes.Error, schema.StatusDescriptionRolledBack)
	// The next transaction starts clean.
	tx := mustBegin(t, ctx, h.pool)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantOutcomes(t, h, "rolled_back", "committed")
	wantEvents(t, h.frames()[1], "tx.phase.active", "tx.phase.committing", "tx.phase.committed")
	h.wantNoFrames(t, ctx)
}

func TestStaleConnectionClosedByServer(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	tx := mustBegin(t, ctx, h.pool)
	if err := srv.Terminate(ctx, tx.Conn().PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "select 1"); err == nil {
		t.Fatal("statement on a terminated backend succeeded")
	}
	_ = tx.Rollback(ctx)
	f := onlyFrame(t, h)
	wantAttr(t, f, "tx.outcome", "rolled_back")
	wantAttr(t, f, "tx.retryable", "true") // the session died before COMMIT was sent
	wantEvents(t, f, "tx.phase.active", "tx.phase.rolled_back")
	h.wantNoFrames(t, ctx)
}

func TestStaleContextCancelledMidTransaction(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	tx := mustBegin(t, ctx, h.pool)
	qctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := tx.Exec(qctx, "select pg_sleep(30)")
		done <- err
	}()
	if err := srv.WaitForWaitEvent(ctx, tx.Conn().PgConn().PID(), "PgSleep"); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled statement error = %v", err)
	}
	_ = tx.Rollback(ctx)
	f := onlyFrame(t, h)
	wantAttr(t, f, "tx.outcome", "rolled_back")
	wantAttr(t, f, "error.type", "canceled")
	wantAttr(t, f, "tx.retryable", "false")
	h.wantNoFrames(t, ctx)
}

// TestStaleNewBeginOnFramedConnection: the transaction ends where the tracer cannot see
// it (a rollback sent through pgconn directly); the next BEGIN must not inherit its frame.
func TestStaleNewBeginOnFramedConnection(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	withConn(t, ctx, h, func(c *pgx.Conn) {
		mustExec(t, ctx, c, "begin", "select 1")
		if _, err := c.PgConn().Exec(ctx, "rollback").ReadAll(); err != nil {
			t.Fatal(err)
		}
		mustExec(t, ctx, c, "begin", "select 2", "commit")
	})
	// The rollback past the tracer is the server's word that pgconn read (its ROLLBACK
	// tag, then idle): a deliberate rollback.
	wantOutcomes(t, h, "rolled_back", "committed")
	fs := h.frames()
	wantAttr(t, fs[0], string(RollbackKey), RollbackDeliberate)
	wantEvents(t, fs[1], "tx.phase.active", "tx.phase.committing", "tx.phase.committed")
	if attrString(t, fs[0], OperationIDKey) == attrString(t, fs[1], OperationIDKey) {
		t.Fatal("the new frame reuses the old operation id")
	}
}

// TestStaleManyTransactionsRandomFailures runs many transactions through a small pool with
// random failures; every frame must end once, leave its connection, and carry only its
// own transaction's phases.
func TestStaleManyTransactionsRandomFailures(t *testing.T) {
	// Ten thousand transactions: on a loaded machine under -race they took over
	// pgtest.TestTimeout, which bounds a test's few server interactions, not a workload.
	ctx := pgtest.Context(t, 5*time.Minute)
	h := newHarness(t, "", 4)
	table := srv.NewTable(t, ctx, tableColumns)
	n := 10000
	if s := os.Getenv("OTELPGXTX_STALE_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	seed := rand.Uint64()
	t.Logf("seed %d (set OTELPGXTX_STALE_N to change the count)", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	want := map[string]int{}
	for i := range n {
		outcome, err := randomTransaction(ctx, h, table, i, rng.IntN(6))
		if err != nil {
			t.Fatalf("transaction %d: %v", i, err)
		}
		want[outcome]++
	}
	got := map[string]int{}
	for _, f := range h.frames() {
		v, _ := attr(f, OutcomeKey)
		got[v.AsString()]++
		evs := eventNames(f)
		if len(evs) < 2 || evs[0] != "tx.phase.active" {
			t.Fatalf("frame events %v do not start with its own BEGIN", evs)
		}
		terminal := 0
		for _, e := range evs {
			if e == "tx.phase.committed" || e == "tx.phase.rolled_back" || e == "tx.phase.unknown" {
				terminal++
			}
		}
		if terminal != 1 || evs[len(evs)-1] != "tx.phase."+attrString(t, f, PhaseKey) {
			t.Fatalf("frame events %v: want exactly one terminal phase, last, matching tx.phase", evs)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("outcomes by span = %v, by the calls = %v", got, want)
	}
	for id, c := range h.ends.ends {
		if c != 1 {
			t.Fatalf("span %v ended %d times", id, c)
		}
	}
	h.wantNoFrames(t, ctx)
	t.Logf("%d transactions: %v", n, got)
}

// randomTransaction runs one transaction of the given kind and returns the outcome the
// caller knows for certain.
func randomTransaction(ctx context.Context, h *harness, table string, i, kind int) (string, error) {
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx)
	switch kind {
	case 0, 1: // commit
		if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id) values (%d)", table, i)); err != nil {
			return "", err
		}
		return "committed", tx.Commit(ctx)
	case 2: // deliberate rollback
		return "rolled_back", tx.Rollback(ctx)
	case 3: // statement error, then commit answers ROLLBACK
		if _, err := tx.Exec(ctx, "select 1/0"); err == nil {
			return "", errors.New("division by zero succeeded")
		}
		if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
			return "", fmt.Errorf("commit after error = %v", err)
		}
		return "rolled_back", nil
	case 4: // deferred violation at COMMIT
		if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id, k) values (%d, -1), (%d, -1)", table, -2*i-1, -2*i-2)); err != nil {
			return "", err
		}
		if err := tx.Commit(ctx); err == nil {
			return "", errors.New("deferred violation committed")
		}
		return "rolled_back", nil
	default: // released mid-transaction: the pool destroys the connection
		conn := tx.Conn()
		if _, err := conn.Exec(ctx, "select 1"); err != nil {
			return "", err
		}
		if err := conn.Close(ctx); err != nil {
			return "", err
		}
		if err := tx.Rollback(ctx); err == nil {
			return "", errors.New("rollback on a closed connection succeeded")
		}
		return "rolled_back", nil
	}
}
