package pgtest

import (
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
)

// negotiate answers what a client sends before its startup message (or CancelRequest)
// and returns the connections the relays use. A GSSENCRequest is refused. An
// SSLRequest is passed on to the target; if the target agrees, the proxy opens a TLS
// session to it, agrees in turn and ends the client's TLS session itself, and the relays
// use the two sessions. The first message that is neither request is left for the relay,
// which reads it from the returned client connection. A Recording starts there too, so
// that it is the same over TLS as over plain TCP.
func (p *Proxy) negotiate(pc *proxyConn) (client, server net.Conn, err error) {
	for {
		var req [8]byte
		if _, err := io.ReadFull(pc.client, req[:]); err != nil {
			return nil, nil, err
		}
		n, code := binary.BigEndian.Uint32(req[:4]), binary.BigEndian.Uint32(req[4:])
		if n != 8 || code != sslRequestCode && code != gssEncRequestCode {
			return &prefixConn{Conn: pc.client, prefix: req[:]}, pc.server, nil
		}
		if pc.serverSpoke.Swap(false) {
			p.roundTrips.Add(1)
		}
		answer, server := byte('N'), pc.server
		if code == sslRequestCode {
			if answer, server, err = p.targetTLS(pc.server); err != nil {
				return nil, nil, err
			}
		}
		pc.serverSpoke.Store(true) // before the write, as the relay marks it
		if _, err := pc.client.Write([]byte{answer}); err != nil {
			return nil, nil, err
		}
		if answer == 'S' {
			cert, err := p.cert()
			if err != nil {
				return nil, nil, err
			}
			client := tls.Server(pc.client, &tls.Config{Certificates: []tls.Certificate{cert}})
			if err := client.HandshakeContext(p.ctx); err != nil {
				return nil, nil, err
			}
			return client, server, nil
		}
		// Refused: the client goes on in plain text, or gives up.
	}
}

// targetTLS asks the target for TLS as a client does and returns its answer, 'S' or
// 'N'; after 'S', also the TLS session with it, which verifies the target's certificate
// against the process's CA for the host the proxy dialed.
func (p *Proxy) targetTLS(server net.Conn) (byte, net.Conn, error) {
	var req [8]byte
	binary.BigEndian.PutUint32(req[:4], 8)
	binary.BigEndian.PutUint32(req[4:], sslRequestCode)
	if _, err := server.Write(req[:]); err != nil {
		return 0, nil, err
	}
	var answer [1]byte
	if _, err := io.ReadFull(server, answer[:]); err != nil {
		return 0, nil, err
	}
	switch answer[0] {
	case 'N':
		return 'N', server, nil
	case 'S':
	default:
		return 0, nil, fmt.Errorf("pgtest: proxy target %s answered an SSLRequest with %q", p.target, answer[0])
	}
	a, err := processAuthority()
	if err != nil {
		return 0, nil, err
	}
	host, _, err := net.SplitHostPort(p.target)
	if err != nil {
		return 0, nil, err
	}
	tc := tls.Client(server, a.clientConfig(host))
	if err := tc.HandshakeContext(p.ctx); err != nil {
		return 0, nil, err
	}
	return 'S', tc, nil
}

// prefixConn is a connection whose first bytes were read already: Read returns them
// before reading on.
type prefixConn struct {
	net.Conn
	prefix []byte
}

// Read returns what is left of the prefix, then reads the connection.
func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) == 0 {
		return c.Conn.Read(b)
	}
	n := copy(b, c.prefix)
	c.prefix = c.prefix[n:]
	return n, nil
}
