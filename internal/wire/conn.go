// Package wire is the net.Conn pgconn uses on an instrumented connection: it passes every
// call through unchanged — reads, writes, deadlines — and composes the four things the
// instrumentation does there, each in a type and file of its own:
//
//   - closeNotice (close_notice.go): tells the tracer, through a Listener, that the
//     connection was closed;
//   - commitWrite (commit_write.go, with Dialed): accounts for what the write carrying a
//     COMMIT got into the kernel;
//   - readAhead (read_ahead.go, with socketPeek in peek_unix.go): reads ahead above TLS,
//     where a FATAL waiting before COMMIT cannot be peeked at;
//   - splice (splice.go, with the reply reader of reply.go): adds the library's message
//     (an Addition) to one write of the application's — ahead of a BEGIN or COMMIT, or
//     after a statement's messages — and takes its reply out of what pgconn reads, waiting
//     for it before the next write when asked (Await).
//
// Conn is where they meet, and nowhere else. It keeps one invariant for all four: at
// most one read is at the wrapped connection at any moment, whoever started it (pgconn's
// Read, Await, the read ahead of MarkCommit), and a deadline the library sets for a read
// of its own never reaches a read of pgconn's. The reader type (reader.go) keeps it; every
// read of the wrapped connection goes through it, under Conn.mu.
//
// With nothing armed, a write costs one atomic swap and one load. A read where the
// library never reads (no tracking, no TLS read-ahead) is the connection's own; otherwise
// it costs two short sections under a mutex and a walk over the headers of the messages
// it returns (message boundaries, which an addition needs, are followed on every
// connection that tracks them: the instrumentation's all do).
package wire

import (
	"crypto/tls"
	"net"
	"sync"
	"time"
)

// Conn is the net.Conn pgconn uses on an instrumented connection (see the package doc).
type Conn struct {
	net.Conn
	closing closeNotice
	commit  commitWrite
	// peek looks at unread bytes of a plain socket; nil under TLS and where the socket
	// cannot be peeked at. Only the connection's user calls it.
	peek *socketPeek
	// passThrough: the library never reads this connection (no tracking, no reading
	// ahead), so Read and the deadlines are the connection's own.
	passThrough bool
	// mu orders the connection's user (Arm, Collect, MarkCommit, Write's addition) with
	// pgconn's reads, which may run on its background reader's goroutine. It is held
	// across no read or write of the wrapped connection but the reads ahead of MarkCommit
	// and drainTLS, whose deadline has passed or nearly.
	mu     sync.Mutex
	ahead  readAhead
	splice splice
	rd     reader
}

// NewConn wraps conn. listener is told when it is closed (nil: nobody); track follows
// message boundaries in what pgconn reads, which an Addition needs (commit references on).
func NewConn(conn net.Conn, listener Listener, track bool) *Conn {
	c := &Conn{Conn: conn}
	c.closing.listener = listener
	c.splice.track = track
	if tc, ok := conn.(*tls.Conn); ok {
		// Under TLS the socket's writes are counted, and whether bytes wait in it is peeked.
		if d, _ := tc.NetConn().(*Dialed); d != nil {
			c.commit.dialed = d
			if p := newSocketPeek(d.Conn); p != nil {
				c.ahead.tls, c.ahead.waiting = tc, p
			}
		}
	} else {
		c.peek = newSocketPeek(conn)
	}
	c.passThrough = !track && c.ahead.tls == nil
	return c
}

// Listener returns the listener NewConn was given.
func (c *Conn) Listener() Listener { return c.closing.listener }

// Write writes b and, for the first write after MarkCommit, records whether any byte
// was accepted: net.Conn's n counts exactly the bytes the kernel took. A write the library
// armed an addition for carries it (see Arm).
func (c *Conn) Write(b []byte) (int, error) {
	c.splice.wrote(b)
	if a := c.splice.next.Swap(nil); a != nil {
		return c.writeArmed(a, b)
	}
	n, err := c.Conn.Write(b)
	c.commit.wrote(n > 0 || err == nil)
	return n, err
}

// maxWriteBuf bounds the room kept for the next write carrying an addition.
const maxWriteBuf = 16 << 10

// writeArmed writes b, the first write since a was armed, with a's message if it is the
// write a was armed for (see Arm), into the connection's write buffer when nobody else
// holds it.
func (c *Conn) writeArmed(a *Addition, b []byte) (int, error) {
	var buf []byte
	mine := c.splice.wbufBusy.CompareAndSwap(false, true)
	if mine {
		buf = c.splice.wbuf[:0]
		defer c.splice.wbufBusy.Store(false)
	}
	out, cut, ok := a.addTo(b, buf)
	if mine && ok && cap(out) <= maxWriteBuf {
		c.splice.wbuf = out[:0]
	}
	switch {
	case !ok:
		// Not yet the write a was armed for: pgx writes, in a write of their own ahead of
		// the statement's, the preparation of its statement and the closing of the
		// statements its cache evicted. a waits for the statement's write, unless Collect
		// withdrew it meanwhile.
		c.splice.next.CompareAndSwap(nil, a)
	case c.startAddition(a):
		return c.writeAdded(a, b, out, cut)
	}
	n, err := c.Conn.Write(b)
	c.commit.wrote(n > 0 || err == nil)
	return n, err
}

// startAddition puts a's reply filter in place, before a byte of its write leaves: the
// reply may come before Write returns. It refuses, and a is withdrawn, when the stream is
// no longer where Arm found it (a reply pgconn has not read yet, after a write in
// between): a reply reader must start at the reply's first message.
func (c *Conn) startAddition(a *Addition) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.atRest() {
		return false
	}
	c.splice.start(a)
	return true
}

// writeAdded writes out, which is b with a's message added, the first cut bytes of it the
// library's alone. pgconn is told how much of b was sent, so that what it says of a
// failed write (safe to retry when nothing was) stays true of its own bytes.
func (c *Conn) writeAdded(a *Addition, b, out []byte, cut int) (int, error) {
	m, err := c.Conn.Write(out)
	if m == 0 {
		// Nothing left, so no reply can come: nothing else moves it.
		c.mu.Lock()
		a.state = additionUnsent
		c.mu.Unlock()
	}
	mine := m > cut // some of the application's bytes left
	c.commit.wrote(mine || err == nil)
	switch {
	case err == nil:
		return len(b), nil
	case !mine:
		return 0, err
	case a.After:
		return min(m, len(b)), err
	}
	return min(max(m-cut, 1), len(b)-1), err
}

// Arm has the write a was armed for carry a: the first write of the application's that
// is that write (writes before it go out alone), as long as the stream is still at the
// boundary where Arm found it. It is refused, and
// nothing is added, when the server's stream is not at a message boundary, a reply
// filter is still at work, or something read ahead is still to be given to pgconn: a
// reply reader must start at the reply's first message.
func (c *Conn) Arm(a *Addition) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.atRest() {
		return false
	}
	c.splice.arm(a)
	return true
}

// atRest reports whether a reply reader could start at the next byte the server sends:
// the stream at a message boundary, no reply filter at work, nothing read ahead still
// held for pgconn. c.mu is held.
func (c *Conn) atRest() bool {
	return c.splice.pos.atBoundary() && c.splice.filter == nil && c.ahead.state() == aheadEmpty
}

// Collect ends the life of the last addition on the connection: it withdraws one its
// write never took, and returns what became of one that was written, once; nil if none
// was. An addition made after the application's messages (After) whose reply is still on
// its way is kept, unless final: Collect returns nil and pending true, and the reply
// filter takes the reply out of what pgconn reads whenever it comes.
func (c *Conn) Collect(final bool) (a *Addition, pending bool) {
	c.splice.next.Store(nil)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.splice.collect(final)
}

// Await reads what the server sent until the reply to the addition made after the
// application's messages (After) is whole, or until deadline, so that the library holds
// it before the application's next write; what of pgconn's it reads is kept for pgconn,
// an error included (a timeout is the deadline's, and is not). It keeps the one-reader
// invariant (see reader): while a read of pgconn's is at the connection — its background
// reader outlives a slow write by one read — it waits for that read's bytes to reach the
// filter rather than read beside it. It reports whether the reply is whole.
func (c *Conn) Await(deadline time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	var buf []byte
	var timer *time.Timer
	for {
		f := c.splice.filter
		if f == nil || !f.after {
			return c.splice.added == nil || c.splice.added.state != additionWritten
		}
		if f.lib.Done {
			if f.finished() && len(f.out) == 0 {
				c.splice.end()
			}
			return true
		}
		if c.ahead.state() != aheadEmpty {
			return false // what a read ended with is kept: no more will come
		}
		if c.rd.reading {
			if timer == nil {
				timer = time.NewTimer(time.Until(deadline))
				defer timer.Stop()
			}
			if !c.waitRead(timer.C) {
				return f.lib.Done
			}
			continue
		}
		if buf == nil {
			buf = make([]byte, peekSize)
		}
		var err error
		if !c.libRead(buf, deadline, func(n int, rerr error) {
			f.feed(buf[:n])
			if err = rerr; err == nil && f.lib.Done && c.ahead.tls != nil {
				c.drainTLS(f, buf)
			}
		}) {
			return false
		}
		c.ahead.keepErr(err) // pgconn's, after what the filter holds; a timeout is not
		if err != nil && !f.lib.Done {
			return false
		}
	}
}

// Read reads what the server sent, less the library's part of a reply (see replyFilter),
// after the bytes read ahead. Where the library never reads (passThrough) it is the
// connection's Read. Otherwise each turn gives pgconn what is held, if anything, or
// waits for a read of the library's at the connection to end (see reader), or reads the
// connection and accounts for what came: two short sections under mu, none across the
// read itself.
func (c *Conn) Read(p []byte) (int, error) {
	if c.passThrough {
		return c.Conn.Read(p)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if n, err, done := c.deliver(p); done {
			return n, err
		}
		if c.rd.reading {
			c.waitRead(nil)
			continue
		}
		c.rd.take()
		c.mu.Unlock()
		n, err := c.Conn.Read(p)
		c.mu.Lock()
		c.rd.release()
		if n, err, done := c.received(p, n, err); done {
			return n, err
		}
	}
}

// received accounts for what a read of the connection returned into p, and reports
// whether Read is done with it. Without a reply filter it is pgconn's as it came. With
// one, the bytes go through the filter in place: pgconn's part stays in p, the library's
// taken out of it (feedInPlace), and what did not fit waits in the filter for the next
// Read; an error is kept for after the filter's output. A timeout belongs to the deadline
// of this read: with nothing to give, it is the answer, with something, the next read
// meets the deadline again. c.mu is held.
func (c *Conn) received(p []byte, n int, err error) (int, error, bool) {
	f := c.splice.filter
	if f == nil || n == 0 && err == nil {
		if c.splice.track {
			c.splice.delivered(p[:n])
		}
		return n, err, true
	}
	k := f.feedInPlace(p[:n])
	timeout := err != nil && isTimeout(err)
	if !timeout {
		c.ahead.keepErr(err)
	}
	if k > 0 {
		c.splice.delivered(p[:k])
		if f.finished() && len(f.out) == 0 {
			c.splice.end()
		}
		return k, nil, true
	}
	if !timeout {
		return 0, nil, false
	}
	if n, _, done := c.deliver(p); done && n > 0 {
		return n, nil, true
	}
	return 0, err, true
}

// deliver gives p what is held for pgconn — the filter's output, bytes read ahead, or an
// error they ended with — and reports whether Read is done. A reply the filter cannot
// account for closes the connection. c.mu is held.
func (c *Conn) deliver(p []byte) (n int, err error, done bool) {
	if f := c.splice.filter; f != nil {
		if b := c.ahead.takeBytes(); len(b) > 0 {
			f.feed(b)
		}
		switch {
		case f.state == filterFailed:
			_ = c.Conn.Close()
			return 0, f.err, true
		case len(f.out) > 0:
			n = copy(p, f.out)
			f.out = f.out[n:]
			c.splice.delivered(p[:n])
			if f.finished() && len(f.out) == 0 {
				c.splice.end()
			}
			return n, nil, true
		case f.finished():
			c.splice.end()
		case c.ahead.err != nil:
			return 0, c.ahead.takeErr(), true
		default:
			return 0, nil, false
		}
	}
	if c.ahead.state() == aheadEmpty {
		return 0, nil, false
	}
	n, err = c.ahead.give(p)
	c.splice.delivered(p[:n])
	return n, err, true
}

// drainTLS takes into f, for pgconn, what crypto/tls already holds decrypted or whole
// after Await's read: records it read from the socket with the library's reply, which a
// peek at the socket no longer sees — a FATAL among them is what MarkCommit must judge. A
// read whose deadline has passed returns what is held, and ends at once otherwise (a
// timeout, which crypto/tls resumes after). c.mu is held, and the read with it (libRead
// puts pgconn's deadline back).
func (c *Conn) drainTLS(f *replyFilter, buf []byte) {
	if c.Conn.SetReadDeadline(time.Now()) != nil {
		return
	}
	for {
		n, err := c.Conn.Read(buf)
		f.feed(buf[:n])
		if err != nil {
			c.ahead.keepErr(err) // a timeout: nothing more held
			return
		}
	}
}

// MarkCommit marks the position before a COMMIT is handed to pgconn: the next write
// carries it (see commitWrite). With judge, it also reports whether the server had
// already ended the session before that write: a FATAL waiting unread in the socket (see
// socketPeek) or, where the socket cannot be peeked at (TLS), read ahead (see readAhead).
// Without, it reads nothing (no system call): its caller asks only where the answer can
// change a verdict.
func (c *Conn) MarkCommit(judge bool) (sessionEnded bool) {
	c.commit.mark()
	if !judge {
		return false
	}
	c.mu.Lock()
	var held []byte // read already, for pgconn (Await's read of what followed the xid read)
	if f := c.splice.filter; f != nil {
		held = f.out
	}
	if len(held) == 0 {
		held = c.ahead.buf
	}
	c.mu.Unlock()
	if len(held) > 0 {
		// What the socket holds follows these bytes, and may start inside a message of
		// theirs: only they are judged.
		return fatalBeforeCommit(held)
	}
	if c.peek != nil {
		return c.peek.sessionEnded()
	}
	if c.ahead.tls == nil {
		return false // nothing to read ahead on: no evidence
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.splice.track && !c.splice.pos.atBoundary() || c.splice.filter != nil {
		return false // bytes from the middle of a message cannot be judged
	}
	if c.rd.reading || !c.ahead.wanted() {
		// A read of pgconn's is at the connection (its background reader's last): the
		// bytes are its, and nothing is judged.
		return false
	}
	c.rd.take()
	defer c.rd.release()
	c.rd.own = time.Now().Add(readAheadWait)
	defer c.restoreDeadline()
	if c.Conn.SetReadDeadline(c.rd.effective()) != nil {
		return false
	}
	b := c.ahead.fill()
	return fatalBeforeCommit(b)
}

// CommitNotSent reports whether COMMIT's bytes never reached the kernel since MarkCommit:
// the next write failed before the kernel accepted any of them, or none came; and returns
// the accounting to idle.
func (c *Conn) CommitNotSent() bool { return c.commit.notSent() }

// Close closes the connection and, the first time, tells the listener.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.closing.closing()
	return err
}

// NetConn returns the wrapped connection, as tls.Conn does: PgConn.Conn returns the
// wrapper, not the net.Conn a chained AfterNetConnect returned.
func (c *Conn) NetConn() net.Conn { return c.Conn }
