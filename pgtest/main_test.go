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
