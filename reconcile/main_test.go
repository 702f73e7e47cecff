package reconcile_test

// The real-server harness of the reconciler's tests: one PostgreSQL per test binary, as
// the root package's (pgtest.Main), and the references the tests resolve, read with plain
// pgx from the transactions they name, as the instrumentation takes them.

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

var srv *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &srv) }

// xactRef assigns tx its xid, if it has none yet, and returns the reference the
// instrumentation would take for it: the xid with the cluster identity (system
// identifier, timeline), the server's start, its statistics' reset time and its WAL flush
// position, read in the same statement.
func xactRef(t *testing.T, ctx context.Context, tx pgx.Tx) outcome.ReconciliationRef {
	t.Helper()
	var xid, sys, tli, start, reset, flushed string
	if err := tx.QueryRow(ctx, "select pg_current_xact_id()::text, s.system_identifier::text, "+
		pg.TimelineSQL+", "+pg.ServerStartSQL+", "+pg.StatsResetSQL+", "+pg.FlushLSNSQL+" from pg_control_system() s").Scan(&xid, &sys, &tli, &start, &reset, &flushed); err != nil {
		t.Fatal(err)
	}
	var ref outcome.ReconciliationRef
	var err [6]error
	ref.XID, err[0] = strconv.ParseUint(xid, 10, 64)
	ref.SystemIdentifier, err[1] = strconv.ParseUint(sys, 10, 64)
	timeline, e := strconv.ParseUint(tli, 10, 32)
	ref.Timeline, err[2] = uint32(timeline), e
	ref.ServerStart, err[3] = strconv.ParseInt(start, 10, 64)
	ref.StatsReset, err[4] = strconv.ParseInt(reset, 10, 64)
	ref.FlushLSN, err[5] = outcome.ParseLSN(flushed)
	for _, e := range err {
		if e != nil {
			t.Fatalf("reading the reference of %s/%s/%s/%s: %v", xid, sys, tli, start, e)
		}
	}
	return ref
}

// count runs a count query on s.
func count(t *testing.T, ctx context.Context, s *pgtest.Server, query string, args ...any) int {
	t.Helper()
	n, err := s.Count(ctx, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// newConn returns a connection to s, closed when the test ends (a server crash closes it
// first; the close then only frees it).
func newConn(t *testing.T, ctx context.Context, s *pgtest.Server) *pgx.Conn {
	t.Helper()
	conn, err := s.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// insertRef inserts id into table in a transaction on conn and returns the transaction,
// still open, with its reference.
func insertRef(t *testing.T, ctx context.Context, conn *pgx.Conn, table string, id int) (pgx.Tx, outcome.ReconciliationRef) {
	t.Helper()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "insert into "+table+" values ($1)", id); err != nil {
		t.Fatal(err)
	}
	return tx, xactRef(t, ctx, tx)
}

// commitWaiting starts tx's COMMIT on conn and returns, once conn's backend waits for
// event on s (a synchronous-replication wait, a lock in a deferred trigger), the COMMIT's
// error to come.
func commitWaiting(t *testing.T, ctx context.Context, s *pgtest.Server, conn *pgx.Conn, tx pgx.Tx, event string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- tx.Commit(ctx) }()
	if err := s.WaitForWaitEvent(ctx, conn.PgConn().PID(), event); err != nil {
		t.Fatal(err)
	}
	return done
}
