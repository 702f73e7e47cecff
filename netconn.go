package otelpgxtx

import (
	"net"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/wire"
)

// newNetConn wraps conn, the net.Conn pgconn dialed (or the one a chained
// AfterNetConnect returned), in the net.Conn of internal/wire, with the tracer told when
// it closes. It follows message boundaries on every connection, whatever the tracer's
// options: commit references need them, and a Policy of Run's may ask for references on
// any connection.
func newNetConn(conn net.Conn, t *Tracer) *wire.Conn {
	return wire.NewConn(conn, &frame.CloseWatch{Closed: t.a.NetConnClosed}, true)
}
