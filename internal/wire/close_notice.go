package wire

import "sync/atomic"

// Listener is told once that the connection's net.Conn was closed. It is what crosses
// from the wrapper to the tracer: pgx.Conn.Close has no hook, and pgconn closes its
// net.Conn on every path that ends a connection (Close, the asynchronous close after a
// failure, a fatal error), so that is where a frame still open on the connection learns
// that it has ended.
type Listener interface {
	NetConnClosed()
}

// closeNotice tells its listener, the first time the connection is closed, that it was.
// Its two states are open and closed (closed false, then true, once); Close may run on
// another goroutine than the connection's user, hence atomic.
type closeNotice struct {
	listener Listener // nil: nobody to tell
	closed   atomic.Bool
}

// closing records a close; the first one tells the listener.
func (n *closeNotice) closing() {
	if n.closed.CompareAndSwap(false, true) && n.listener != nil {
		n.listener.NetConnClosed()
	}
}
