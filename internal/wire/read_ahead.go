package wire

import (
	"errors"
	"net"
	"time"
)

// peekSize bounds what socketPeek looks at, and what a read ahead takes at once:
// PostgreSQL's FATAL messages are far shorter, and a longer one is just not recognised.
const peekSize = 2048

// readAheadWait bounds readAhead's read once bytes are known to wait in the socket.
const readAheadWait = 5 * time.Millisecond

// readAhead holds what was read from the connection before pgconn asked for it: above TLS
// (a *tls.Conn from pgconn's own handshake), where the socket's bytes are ciphertext and
// cannot be peeked at, reading ahead before COMMIT is how a FATAL waiting there is seen
// (fill); and the error a read met while the reply filter still had bytes for pgconn,
// which pgconn gets after them. Conn.mu guards it.
type readAhead struct {
	// tls is the connection read ahead on, nil where there is no reading ahead (no TLS,
	// or a socket under it that cannot be peeked at); waiting peeks at that socket.
	tls     net.Conn
	waiting *socketPeek
	buf     []byte // bytes read, not yet given to pgconn
	err     error  // the error a read ended with (never a timeout), given after buf
}

// aheadState is what a readAhead holds for pgconn.
type aheadState uint8

const (
	aheadEmpty aheadState = iota // nothing: pgconn reads the connection
	aheadBytes                   // bytes, and perhaps an error after them
	aheadError                   // an error alone, for pgconn's next Read
)

// state names what r holds.
func (r *readAhead) state() aheadState {
	switch {
	case len(r.buf) > 0:
		return aheadBytes
	case r.err != nil:
		return aheadError
	}
	return aheadEmpty
}

// wanted reports whether fill has something to read: a connection read ahead on, nothing
// held, and bytes waiting in its socket (a peek: one system call). Only crypto/tls is
// known here to end a read at its deadline and to resume after it; another net.Conn could
// block the COMMIT. Nothing waiting in the socket: nothing to read, and no wait.
func (r *readAhead) wanted() bool {
	return r.tls != nil && r.state() == aheadEmpty && r.waiting.waiting()
}

// fill reads what the server has sent that pgconn has not read, and keeps it for
// pgconn's next Read; it returns what it read. Its caller has checked wanted, holds the
// connection's one read (see reader) and has set the read deadline: readAheadWait at
// most, which a record arriving whole never meets, and one still arriving meets only in
// this rare case.
func (r *readAhead) fill() []byte {
	buf := make([]byte, peekSize)
	n, err := r.tls.Read(buf)
	if n > 0 {
		r.buf = buf[:n]
	}
	r.keepErr(err)
	return r.buf
}

// keepErr keeps err, a read's error, for pgconn's next Read; a timeout belongs to the
// read's own deadline and is not kept.
func (r *readAhead) keepErr(err error) {
	if err != nil && !isTimeout(err) {
		r.err = err
	}
}

// takeBytes returns the bytes held, and holds them no more.
func (r *readAhead) takeBytes() []byte {
	b := r.buf
	r.buf = nil
	return b
}

// takeErr returns the error held, and holds it no more.
func (r *readAhead) takeErr() error {
	err := r.err
	r.err = nil
	return err
}

// give copies into p what is held: the bytes first, the error once they are given.
func (r *readAhead) give(p []byte) (int, error) {
	if len(r.buf) == 0 {
		return 0, r.takeErr()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	if len(r.buf) == 0 {
		r.buf = nil
	}
	return n, nil
}

// isTimeout reports a read that ended at its deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
