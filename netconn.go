package otelpgxtx

import (
	"net"
	"sync/atomic"
)

// netConn is the net.Conn pgconn uses on an instrumented connection: [InstrumentConnConfig]
// wraps the one pgconn dialed (and the one a chained AfterNetConnect returned) in it.
// It passes every call through unchanged — reads, writes, deadlines — and reports the
// close: pgx.Conn.Close has no hook, and pgconn closes its net.Conn on every path that
// ends a connection (Close, the asynchronous close after a failure, a fatal error), so
// that is where a frame still open on the connection learns that it has ended.
//
// It also sees the write that carries a COMMIT (see armCommit): whether any of its
// bytes reached the kernel is what tells a commit that never left the process from one
// the server may have executed.
type netConn struct {
	net.Conn
	t *Tracer
	// st is the connection's tracer state, once the tracer keeps any (see stateOf);
	// Close may run on another goroutine than the connection's user, hence atomic.
	st     atomic.Pointer[connState]
	closed atomic.Bool
	// commitWrite is where the write carrying COMMIT is (commitIdle…commitUnsent);
	// pgconn's asynchronous close writes from another goroutine, hence atomic.
	commitWrite atomic.Int32
	// peek looks at unread bytes; nil where the socket cannot be peeked at. Only the
	// connection's user calls it (under the connection state's mutex).
	peek *socketPeek
}

func newNetConn(conn net.Conn, t *Tracer) *netConn {
	return &netConn{Conn: conn, t: t, peek: newSocketPeek(conn)}
}

// The states of netConn.commitWrite.
const (
	commitIdle   int32 = iota
	commitArmed        // the tracer marked the position before COMMIT: the next write carries it
	commitSent         // that write got at least one byte into the kernel
	commitUnsent       // that write failed before the kernel accepted any byte
)

// Write writes b and, for the first write after armCommit, records whether any byte
// was accepted: net.Conn's n counts exactly the bytes the kernel took.
func (c *netConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if c.commitWrite.Load() == commitArmed {
		s := commitSent
		if n == 0 && err != nil {
			s = commitUnsent
		}
		c.commitWrite.CompareAndSwap(commitArmed, s)
	}
	return n, err
}

// armCommit marks the position before a COMMIT is handed to pgconn: the next write
// carries it (or something before it, which only makes commitUnsent rarer). It also
// reports whether the server had already ended the session before that write: a FATAL
// waiting unread in the socket (see socketPeek).
func (c *netConn) armCommit() (sessionEnded bool) {
	c.commitWrite.Store(commitArmed)
	return c.peek.sessionEnded()
}

// commitUnsent reports whether the write armCommit marked failed before the kernel
// accepted any of its bytes, and disarms it.
func (c *netConn) commitNotSent() bool {
	return c.commitWrite.Swap(commitIdle) == commitUnsent
}

// Close closes the connection and, the first time, concludes the frame open on it.
func (c *netConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		if st := c.st.Load(); st != nil {
			c.t.netConnClosed(st)
		}
	}
	return err
}

// NetConn returns the wrapped connection, as tls.Conn does: PgConn.Conn returns the
// wrapper, not the net.Conn a chained AfterNetConnect returned.
func (c *netConn) NetConn() net.Conn { return c.Conn }

// fatalBeforeCommit reports whether buf, bytes the server sent while the session was
// idle in a transaction, holds an ErrorResponse of severity FATAL or PANIC. The
// protocol says the server closes the connection after one ("FATAL ... the server will
// close the connection", ErrorResponse in the protocol's message flow), and PostgreSQL
// exits the backend (elog.c errfinish: proc_exit for FATAL, abort for PANIC), which
// rolls back its transaction: a COMMIT written after it is never read. A message cut
// off by the end of buf is not judged.
func fatalBeforeCommit(buf []byte) bool {
	for len(buf) >= 5 {
		typ := buf[0]
		n := int(uint32(buf[1])<<24 | uint32(buf[2])<<16 | uint32(buf[3])<<8 | uint32(buf[4]))
		if n < 4 || len(buf) < 1+n {
			return false
		}
		body := buf[5 : 1+n]
		if typ == 'E' && fatalSeverity(body) {
			return true
		}
		buf = buf[1+n:]
	}
	return false
}

// fatalSeverity reads an ErrorResponse body's severity: 'V' (never localized, 9.6+)
// if present, else 'S'.
func fatalSeverity(body []byte) bool {
	var s, v string
	for len(body) > 0 && body[0] != 0 {
		code := body[0]
		end := 1
		for end < len(body) && body[end] != 0 {
			end++
		}
		if end == len(body) {
			return false
		}
		switch code {
		case 'S':
			s = string(body[1:end])
		case 'V':
			v = string(body[1:end])
		}
		body = body[end+1:]
	}
	if v == "" {
		v = s
	}
	return v == "FATAL" || v == "PANIC"
}
