//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package otelpgxtx

import (
	"net"
	"syscall"
)

// peekSize bounds what sessionEndedBeforeWrite looks at: PostgreSQL's FATAL messages are
// far shorter, and a longer one is just not recognised.
const peekSize = 2048

// sessionEndedBeforeWrite looks, without consuming and without waiting, at what the
// server sent that pgconn has not read yet, and reports a FATAL there. Only a plain TCP
// or Unix socket is read (TLS bytes cannot be); a read that would block costs one
// system call. Bytes pgconn already buffered are not seen: that only misses evidence.
// It runs in RawConn.Control, not Read: pgconn's background reader may be blocked in a
// Read on the socket, holding its read lock until the server speaks.
func sessionEndedBeforeWrite(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var hdr [5]byte
	var n int
	var rerr error
	if err := rc.Control(func(fd uintptr) {
		n, _, rerr = syscall.Recvfrom(int(fd), hdr[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil || rerr != nil || n < len(hdr) {
		return false
	}
	buf := make([]byte, peekSize) // only when something is waiting, which is rare
	if err := rc.Control(func(fd uintptr) {
		n, _, rerr = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil || rerr != nil || n <= 0 {
		return false
	}
	return fatalBeforeCommit(buf[:n])
}
