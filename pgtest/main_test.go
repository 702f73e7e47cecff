package pgtest

import (
	"context"
	"errors"
	"testing"
	"time"
)

// srv is the package's shared server, started by Main.
var srv *Server

func TestMain(m *testing.M) { Main(m, &srv) }

// testCtx bounds every server interaction of a test.
func testCtx(t *testing.T) context.Context { return Context(t, 60*time.Second) }

// waitXactDone waits until the transaction has settled and returns its status.
func waitXactDone(t *testing.T, ctx context.Context, xid uint64) string {
	t.Helper()
	st, err := srv.WaitXactSettled(ctx, xid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// countRows counts rows with id in table over a direct admin connection.
func countRows(t *testing.T, ctx context.Context, table string, id int) int {
	t.Helper()
	n, err := srv.Count(ctx, "SELECT count(*) FROM "+table+" WHERE id = $1", id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// freshTable (re)creates table with an int primary key "id", so tests can
// run repeatedly (-count) against the one server.
func freshTable(t *testing.T, ctx context.Context, table string) {
	t.Helper()
	if err := srv.Exec(ctx, "DROP TABLE IF EXISTS "+table+"; CREATE TABLE "+table+" (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
}

// TestContext: the context has the bound asked for, and the test's end cancels it.
func TestContext(t *testing.T) {
	var ctx context.Context
	t.Run("test", func(t *testing.T) {
		before := time.Now()
		ctx = Context(t, time.Hour)
		if dl, ok := ctx.Deadline(); !ok || dl.Before(before.Add(time.Hour)) {
			t.Fatalf("deadline %v %v, want at least an hour from %v", dl, ok, before)
		}
		if ctx.Err() != nil {
			t.Fatalf("live test's context: %v", ctx.Err())
		}
	})
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("context after its test ended: %v, want cancelled", ctx.Err())
	}
}
