package pgtest

import (
	"net"
	"sync/atomic"
	"time"
)

// SetDelay makes the proxy hold every chunk of bytes it relays for a fixed time
// before passing it on: toServer for what the client sends, toClient for what
// the server sends, so every round trip takes toServer+toClient longer, as over
// a network with that latency. Each direction is a queue in arrival order: bytes
// are never reordered or merged with later ones, and a chunk arriving while an
// earlier one waits is not held any longer for it (the delay is latency, not a
// bandwidth limit). A cut or Close drops what is still queued, as a broken
// network would. It applies to connections accepted from then on; zero (the
// default) forwards at once.
func (p *Proxy) SetDelay(toServer, toClient time.Duration) {
	p.mu.Lock()
	p.toServer, p.toClient = max(toServer, 0), max(toClient, 0)
	p.mu.Unlock()
}

// link writes one direction of a proxied connection, after the proxy's delay if
// it has one.
type link struct {
	conn   net.Conn
	before func() // called just before bytes are written to conn; may be nil
	delay  time.Duration
	queue  chan delayed // nil without delay; closed by stop
	failed atomic.Bool  // the delayed writer could not write: the connection is over
}

// delayed is one chunk of bytes and when it is due.
type delayed struct {
	due time.Time
	b   []byte
}

// newLink returns the writer of conn; with a delay, a goroutine of the proxy writes each
// chunk when it is due.
func (p *Proxy) newLink(pc *proxyConn, conn net.Conn, delay time.Duration, before func()) *link {
	l := &link{conn: conn, before: before, delay: delay}
	if delay > 0 {
		l.queue = make(chan delayed, 1024)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			l.deliver(pc)
		}()
	}
	return l
}

// write passes b on now, or queues a copy of it to be written after the delay.
func (l *link) write(b []byte) error {
	if l.queue == nil {
		if l.before != nil {
			l.before()
		}
		_, err := l.conn.Write(b)
		return err
	}
	if l.failed.Load() {
		return net.ErrClosed
	}
	l.queue <- delayed{due: time.Now().Add(l.delay), b: append([]byte(nil), b...)}
	return nil
}

// stop ends the delayed writer once it has written (or dropped) what is queued;
// only after both relays of the connection have returned, as they write.
func (l *link) stop() {
	if l.queue != nil {
		close(l.queue)
	}
}

// deliver writes each queued chunk when it is due, in order. After a failed
// write it closes the connection and drops the rest, so that write never blocks
// on a full queue.
func (l *link) deliver(pc *proxyConn) {
	s := newSleeper()
	defer s.done()
	for c := range l.queue {
		if l.failed.Load() {
			continue
		}
		s.until(c.due)
		if l.before != nil {
			l.before()
		}
		if _, err := l.conn.Write(c.b); err != nil {
			l.failed.Store(true)
			pc.close()
		}
	}
}
