//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package otelpgxtx

import "net"

// sessionEndedBeforeWrite has no non-blocking peek on this platform: no evidence.
func sessionEndedBeforeWrite(net.Conn) bool { return false }
