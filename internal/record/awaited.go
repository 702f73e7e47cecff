package record

import (
	"sync"

	"github.com/txevidence/otelpgxtx/reconcile"
)

// Awaited is automatic reconciliation's answer for one frame, for [Retry] to wait for
// rather than ask the database a second time: the last answer an attempt got, and the
// final one, once done is closed.
type Awaited struct {
	Done chan struct{}
	once sync.Once
	mu   sync.Mutex
	ans  reconcile.Answer
	has  bool // ans is an attempt's answer (the final one once done is closed)
}

// NewAwaited returns an answer not given yet.
func NewAwaited() *Awaited { return &Awaited{Done: make(chan struct{})} }

// Attempted records the answer of an attempt that will be retried (in progress, not
// replicated): what a Retry that stops waiting answers with.
func (w *Awaited) Attempted(ans reconcile.Answer) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.ans, w.has = ans, true
	w.mu.Unlock()
}

// Settled records the final answer.
func (w *Awaited) Settled(ans reconcile.Answer) {
	if w == nil {
		return
	}
	w.once.Do(func() {
		w.Attempted(ans)
		close(w.Done)
	})
}

// Last returns the latest answer and whether it is final; ok is false while no attempt
// has answered.
func (w *Awaited) Last() (ans reconcile.Answer, final, ok bool) {
	select {
	case <-w.Done:
		final = true
	default:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ans, final, w.has
}
