//go:build !linux

package pgtest

import "time"

// sleeper waits until a point in time; see sleep_linux.go.
type sleeper struct{}

// newSleeper needs no setup where the runtime's timers are all there is.
func newSleeper() sleeper { return sleeper{} }

// until sleeps until t with the runtime's timer.
func (sleeper) until(t time.Time) { time.Sleep(time.Until(t)) }

// done has nothing to undo.
func (sleeper) done() {}
