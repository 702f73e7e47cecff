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
type netConn struct {
	net.Conn
	t *Tracer
	// st is the connection's tracer state, once the tracer keeps any (see stateOf);
	// Close may run on another goroutine than the connection's user, hence atomic.
	st     atomic.Pointer[connState]
	closed atomic.Bool
}

// Close closes the connection and, the first time, ends the frame open on it.
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
