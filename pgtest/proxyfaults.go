package pgtest

import (
	"encoding/binary"
	"net"
)

// fault is the one-shot fault armed for the next message carrying COMMIT.
type fault int

const (
	noFault fault = iota
	cutAfterCommit
	cutBeforeCommit
	holdBeforeCommit
	cutBetweenReplies
)

// CutAfterCommit arms a one-shot fault for the next message carrying COMMIT
// on any connection: the proxy forwards that message and the rest of the
// extended-protocol batch up to and including the next Sync (for a simple
// Query, just the Query), so the server executes the COMMIT, then closes both
// connections; no server byte sent after the COMMIT was seen reaches the
// client. The client cannot tell whether it committed. The server may still
// be finishing the COMMIT when the client sees the error: poll for the
// outcome (e.g. XactStatus) rather than assume it.
// Arming again before the fault fires replaces the armed fault.
func (p *Proxy) CutAfterCommit() { p.arm(cutAfterCommit) }

// CutBeforeCommit arms a one-shot fault for the next message carrying
// COMMIT: the messages before it that the proxy already holds (in practice,
// those sent in the same write) are forwarded, the COMMIT message and
// everything after it are not, and both connections are closed. The server
// then rolls the transaction back once it notices the lost connection.
// Arming again before the fault fires replaces the armed fault.
func (p *Proxy) CutBeforeCommit() { p.arm(cutBeforeCommit) }

// HoldBeforeCommit arms a one-shot fault for the next message carrying COMMIT: as
// CutBeforeCommit, but only the client's connection is closed. The server's stays open,
// silent, until the proxy is closed or the server ends it: the server keeps the transaction
// open, idle, as when
// a partition or a host that died leaves it waiting for a client it has not noticed is
// gone (with TCP keepalives off, for hours).
func (p *Proxy) HoldBeforeCommit() { p.arm(holdBeforeCommit) }

// CutBetweenReplies arms a one-shot fault for the next message carrying COMMIT: the
// client's write goes to the server whole, and of the server's replies to it only those up
// to and including the first ReadyForQuery reach the client, then both connections are
// closed. For a write whose Query ahead of COMMIT is the library's call, the client gets
// the call's reply and not COMMIT's, which the server still executes.
// Arming again before the fault fires replaces the armed fault.
func (p *Proxy) CutBetweenReplies() { p.arm(cutBetweenReplies) }

// ImplicitCommits makes the proxy take for a COMMIT, from now on, every statement whose
// SQL holds text ("" for none), sent as the implicit transaction it is outside a
// transaction block (the caller's to make sure): a Query that holds it, and the Execute
// of a portal bound to a prepared statement whose Parse held it — not the Parse itself,
// which pgx may send alone, to prepare, a round trip before it executes. The faults then
// fire there: CutBeforeCommit drops the Execute (or the Query) and what follows, so the
// server never runs the statement; CutAfterCommit forwards through the next Sync, at
// which the server commits the implicit transaction, and cuts.
func (p *Proxy) ImplicitCommits(text string) {
	p.mu.Lock()
	p.implicitText = text
	p.mu.Unlock()
}

// implicitCommits is ImplicitCommits' text.
func (p *Proxy) implicitCommits() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.implicitText
}

// arm sets the fault the next COMMIT a client sends triggers.
func (p *Proxy) arm(f fault) {
	p.mu.Lock()
	p.armed = f
	p.mu.Unlock()
}

// takeFault consumes the armed fault, so exactly one COMMIT sees it.
func (p *Proxy) takeFault() fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.armed
	p.armed = noFault
	return f
}

// CutAll closes every live connection (both sides) now. Each connection it
// closes counts as one cut.
func (p *Proxy) CutAll() {
	p.closeAll(nil)
}

// closeAll closes every live connection, each after prepare (if any) on its client
// side, once the proxy is marked cutting: the CancelRequest pgx sends for a connection
// it finds closed must meet a proxy that already drops it.
func (p *Proxy) closeAll(prepare func(client net.Conn)) {
	conns := p.live()
	if len(conns) > 0 {
		p.cutting.Store(true)
	}
	for _, pc := range conns {
		pc.blocked.Store(true)
		if prepare != nil {
			prepare(pc.client)
		}
		if pc.close() {
			p.cuts.Add(1)
		}
		if p.afterClose != nil {
			p.afterClose()
		}
	}
}

// ResetAll aborts every live connection now, as a firewall or load balancer that drops
// a connection does: the client side with a TCP reset (SO_LINGER 0), so that the
// client's next write fails without sending a byte; the server side with a close. Each
// connection it aborts counts as one cut.
func (p *Proxy) ResetAll() {
	p.closeAll(func(client net.Conn) {
		if tc, ok := client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
	})
}

// Cuts is the number of cuts performed: one per fired CutAfterCommit, CutBeforeCommit or
// CutBetweenReplies, plus one per connection closed by CutAll or ResetAll.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

// forwardTyped appends the typed message msg to out unless a COMMIT fault drops it, and
// reports whether to cut the connection once out is forwarded.
func (p *Proxy) forwardTyped(pc *proxyConn, out, msg []byte) ([]byte, bool) {
	if pc.cutAtSync {
		return append(out, msg...), msg[0] == 'S'
	}
	if pc.carriesCommit(msg, p.implicitCommits()) {
		switch p.takeFault() {
		case cutBeforeCommit:
			pc.blocked.Store(true)
			return out, true
		case holdBeforeCommit:
			pc.blocked.Store(true)
			pc.hold = true
			return out, true
		case cutBetweenReplies:
			pc.cutAtReady.Store(true) // before the write: its replies must see it
			return append(out, msg...), false
		case cutAfterCommit:
			pc.blocked.Store(true)
			out = append(out, msg...)
			if msg[0] == 'Q' {
				return out, true
			}
			pc.cutAtSync = true
			return out, false
		}
	}
	return append(out, msg...), false
}

// readyEnd finds the end of the first ReadyForQuery in a server stream read from a
// message boundary: a client waits for the replies to one write before the next, so the
// stream is at one when the write that armed CutBetweenReplies goes out.
type readyEnd struct {
	head  []byte // the header read so far of the current message
	rest  int    // bytes left of the current message
	ready bool   // the current message is a ReadyForQuery
}

// through returns how many bytes of b belong to the client, and whether they end with the
// first ReadyForQuery.
func (r *readyEnd) through(b []byte) (n int, found bool) {
	for n < len(b) {
		if r.rest > 0 {
			k := min(r.rest, len(b)-n)
			r.rest, n = r.rest-k, n+k
			if r.rest == 0 && r.ready {
				return n, true
			}
			continue
		}
		k := min(5-len(r.head), len(b)-n)
		r.head, n = append(r.head, b[n:n+k]...), n+k
		if len(r.head) < 5 {
			break
		}
		r.ready, r.rest = r.head[0] == 'Z', int(binary.BigEndian.Uint32(r.head[1:5]))-4
		r.head = r.head[:0]
		if r.rest <= 0 && r.ready {
			return n, true
		}
	}
	return n, false
}
