package otelpgxtx

import (
	"net"
	"sync/atomic"

	"github.com/txevidence/otelpgxtx/internal/wire"
)

// newNetConn wraps conn, the net.Conn pgconn dialed (or the one a chained
// AfterNetConnect returned), in the net.Conn of internal/wire, with the tracer told when
// it closes. It follows message boundaries on every connection, whatever the tracer's
// options: commit references need them, and a Policy of Run's may ask for references on
// any connection.
func newNetConn(conn net.Conn, t *Tracer) *wire.Conn {
	return wire.NewConn(conn, &closeWatch{t: t}, true)
}

// closeWatch is the tracer's side of a wrapped connection's close notice: it concludes
// the frame open on the connection (see Tracer.netConnClosed), once the connection has
// tracer state (stateOf stores it). Close may run on another goroutine than the
// connection's user, hence atomic.
type closeWatch struct {
	t  *Tracer
	st atomic.Pointer[connState]
}

// NetConnClosed concludes the frame open on the closed connection, if any.
func (w *closeWatch) NetConnClosed() {
	if st := w.st.Load(); st != nil {
		w.t.netConnClosed(st)
	}
}
