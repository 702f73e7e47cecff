//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package wire

import (
	"net"
	"syscall"
)

// socketPeek looks, without consuming and without waiting, at what the server sent that
// pgconn has not read yet. Only a plain TCP or Unix socket is read (TLS bytes cannot
// be). It runs in RawConn.Control, not Read: pgconn's background reader may be blocked
// in a Read on the socket, holding its read lock until the server speaks. Everything
// is set up once per connection, so that a peek costs one system call and no
// allocation.
type socketPeek struct {
	rc  syscall.RawConn
	fn  func(fd uintptr)
	buf []byte
	n   int
	err error
}

func newSocketPeek(c net.Conn) *socketPeek {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	if _, isSocket := c.(interface{ SetReadBuffer(int) error }); !isSocket {
		return nil // a pipe or a TLS connection: no protocol bytes to peek at
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	p := &socketPeek{rc: rc, buf: make([]byte, 5)}
	p.fn = func(fd uintptr) {
		p.n, _, p.err = syscall.Recvfrom(int(fd), p.buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}
	return p
}

// sessionEnded reports a FATAL waiting unread in the socket. Bytes pgconn already
// buffered are not seen: that only misses evidence.
func (p *socketPeek) sessionEnded() bool {
	if p == nil {
		return false
	}
	p.buf = p.buf[:5]
	if err := p.rc.Control(p.fn); err != nil || p.err != nil || p.n < 5 {
		return false
	}
	p.buf = make([]byte, peekSize) // only when something is waiting, which is rare
	if err := p.rc.Control(p.fn); err != nil || p.err != nil || p.n <= 0 {
		return false
	}
	return fatalBeforeCommit(p.buf[:p.n])
}

// waiting reports whether any byte is waiting unread in the socket, whatever it is
// (under TLS, ciphertext): one system call, no allocation.
func (p *socketPeek) waiting() bool {
	if p == nil {
		return false
	}
	p.buf = p.buf[:1]
	err := p.rc.Control(p.fn)
	p.buf = p.buf[:5]
	return err == nil && p.err == nil && p.n > 0
}
