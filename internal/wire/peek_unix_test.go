//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package wire

import "testing"

// BenchmarkWirePeek is MarkCommit on a plain loopback TCP socket with nothing waiting
// (the peek's one system call) and on a connection that cannot be peeked at (none).
func BenchmarkWirePeek(b *testing.B) {
	client, _ := loopback(b)
	for _, tc := range []struct {
		name string
		c    *Conn
	}{
		{"socket", NewConn(client, nil, true)},
		{"none", NewConn(&replayConn{}, nil, true)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if tc.c.MarkCommit(true) {
					b.Fatal("a FATAL")
				}
				tc.c.CommitNotSent()
			}
		})
	}
}
