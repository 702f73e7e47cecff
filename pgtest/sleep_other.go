//go:build !linux

package pgtest

import "time"

// sleeper waits until a point in time; see sleep_linux.go.
type sleeper struct{}

func newSleeper() sleeper { return sleeper{} }

func (sleeper) until(t time.Time) { time.Sleep(time.Until(t)) }

func (sleeper) done() {}
