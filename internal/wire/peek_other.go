//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package wire

import "net"

// socketPeek has no non-blocking peek on this platform: no evidence.
type socketPeek struct{}

func newSocketPeek(net.Conn) *socketPeek { return nil }

func (p *socketPeek) sessionEnded() bool { return false }

func (p *socketPeek) waiting() bool { return false }
