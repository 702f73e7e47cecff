package pgtest

import (
	"runtime"
	"syscall"
	"time"
)

// sleeper waits until a point in time with the kernel's high-resolution timer: the Go
// runtime's timers round waits below a millisecond up to one, or more on a loaded
// machine, which would swamp a 0.1 ms delay.
type sleeper struct{}

// prSetTimerSlack is PR_SET_TIMERSLACK (linux/prctl.h).
const prSetTimerSlack = 29

// newSleeper pins the calling goroutine to its thread and lowers the thread's timer
// slack (50 µs by default) to 1 ns. The goroutine must call done when it exits.
func newSleeper() sleeper {
	runtime.LockOSThread()
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 1, 0) // best effort
	return sleeper{}
}

// until sleeps until t in nanosleep calls, which the lowered slack lets end on time.
func (sleeper) until(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(int64(d))
		if err := syscall.Nanosleep(&ts, nil); err == nil {
			return
		}
	}
}

// done keeps the thread locked, so that it exits with the goroutine instead of going
// back to the runtime with the changed timer slack.
func (sleeper) done() {}
