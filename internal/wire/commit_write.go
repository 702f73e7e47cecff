package wire

import (
	"net"
	"sync/atomic"
)

// commitWriteState is where the write carrying a COMMIT is.
type commitWriteState = int32

// The states of commitWrite.
const (
	commitIdle   commitWriteState = iota // no COMMIT marked
	commitMarked                         // the tracer marked the position before COMMIT: the next write carries it
	commitSent                           // that write got at least one byte into the kernel
	commitUnsent                         // that write failed before the kernel accepted any byte
)

// commitWrite accounts for what the write carrying a COMMIT got into the kernel: whether
// any of its bytes did is what tells a commit that never left the process from one the
// server may have executed. The tracer marks it before COMMIT is handed to pgconn
// (mark), the next write records what it got in (wrote), and the tracer reads that once
// the statement ends (notSent), which returns it to idle.
type commitWrite struct {
	// state is commitIdle…commitUnsent; pgconn's asynchronous close writes from another
	// goroutine, hence atomic.
	state atomic.Int32
	// dialed is the socket under TLS, nil without TLS; sentAtMark is its count of bytes
	// sent when COMMIT was marked. Only the connection's user touches sentAtMark.
	dialed     *Dialed
	sentAtMark int64
}

// mark marks the position before a COMMIT: the next write carries it (or something
// before it, which only makes commitUnsent rarer).
func (w *commitWrite) mark() {
	if w.dialed != nil {
		w.sentAtMark = w.dialed.sent.Load()
	}
	w.state.Store(commitMarked)
}

// wrote records, for the first write after mark, whether COMMIT's bytes reached the
// kernel: sent says whether the write's n counted any of them. One atomic load when
// nothing is marked.
func (w *commitWrite) wrote(sent bool) {
	if w.state.Load() != commitMarked {
		return
	}
	if w.dialed != nil {
		// Under TLS: whether any byte of this write's records reached the kernel.
		sent = w.dialed.sent.Load() > w.sentAtMark
	}
	s := commitSent
	if !sent {
		s = commitUnsent
	}
	w.state.CompareAndSwap(commitMarked, s)
}

// notSent reports whether COMMIT's bytes never reached the kernel: the marked write failed
// before the kernel accepted any of them, or no write came at all (pgconn refused the
// statement before writing, its context done); and returns the accounting to idle.
func (w *commitWrite) notSent() bool {
	s := w.state.Swap(commitIdle)
	return s == commitUnsent || s == commitMarked
}

// Dialed is the net.Conn pgconn dialed, as the instrumented DialFunc returns it. It
// counts the bytes its writes got into the kernel: above TLS, where a write's n counts
// plaintext and a failed record says nothing of how much of it left, that count is what
// tells a COMMIT whose bytes never reached the kernel (see commitWrite).
type Dialed struct {
	net.Conn
	sent atomic.Int64
}

// Write writes b to the socket and counts what it accepted.
func (c *Dialed) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.sent.Add(int64(n))
	return n, err
}

// NetConn returns the dialed net.Conn, as tls.Conn does.
func (c *Dialed) NetConn() net.Conn { return c.Conn }
