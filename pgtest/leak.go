package pgtest

import (
	"testing"

	"go.uber.org/goleak"
)

// LeakCheck fails tb if goroutines started during it outlive it. Main owns os.Exit, so
// the check runs per test rather than once after m.Run; call it first, so that it runs
// after every cleanup registered later (a pool's Close, say).
func LeakCheck(tb testing.TB) {
	tb.Helper()
	ignore := goleak.IgnoreCurrent()
	tb.Cleanup(func() { goleak.VerifyNone(tb, ignore) })
}
