package otelpgxtx

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txevidence/otelpgxtx/internal/pg"
)

// netConn is the net.Conn pgconn uses on an instrumented connection: [InstrumentConnConfig]
// wraps the one pgconn dialed (and the one a chained AfterNetConnect returned) in it.
// It passes every call through unchanged — reads, writes, deadlines — and reports the
// close: pgx.Conn.Close has no hook, and pgconn closes its net.Conn on every path that
// ends a connection (Close, the asynchronous close after a failure, a fatal error), so
// that is where a frame still open on the connection learns that it has ended.
//
// It also sees the write that carries a COMMIT (see markCommit): whether any of its
// bytes reached the kernel is what tells a commit that never left the process from one
// the server may have executed.
type netConn struct {
	net.Conn
	t *Tracer
	// st is the connection's tracer state, once the tracer keeps any (see stateOf);
	// Close may run on another goroutine than the connection's user, hence atomic.
	st     atomic.Pointer[connState]
	closed atomic.Bool
	// commitWrite is where the write carrying COMMIT is (commitIdle…commitUnsent);
	// pgconn's asynchronous close writes from another goroutine, hence atomic.
	commitWrite atomic.Int32
	// peek looks at unread bytes; nil where the socket cannot be peeked at. Only the
	// connection's user calls it (under the connection state's mutex).
	peek *socketPeek
	// dialed is the socket under TLS, whose count of bytes sent tells whether a COMMIT
	// write reached the kernel; sentAtArm is that count when the COMMIT was armed.
	dialed    *dialedConn
	sentAtArm int64
	// rawPeek peeks at the socket under TLS: whether anything waits to be read ahead.
	rawPeek *socketPeek

	// What follows is the library's part in the stream, with commit references
	// (wire_reply.go) and above TLS (readAhead). Without either, special stays false and
	// Read and Write pass straight through.
	//
	// track: follow message boundaries in what pgconn is given (commit references on).
	track bool
	// special: Read must look at mu's fields: a reply filter, bytes read ahead, tracking.
	special atomic.Bool
	// next is what the library adds to the next write, if that write is the one it was
	// armed for; taken by Write.
	next atomic.Pointer[addition]
	mu   sync.Mutex
	// pos follows message boundaries in what pgconn was given (track).
	pos streamPos
	// filter takes the library's part out of the reply to a write it added to.
	filter *replyFilter
	// ahead are bytes read from the connection but not yet given to pgconn (readAhead),
	// and aheadErr the error that read ended with, if not a timeout.
	ahead    []byte
	aheadErr error
	// added is what became of the last addition: whether it went out, and the library's
	// reply, for the tracer to collect (netConn.takeAddition, Tracer.collectAddition).
	added *addition
}

// addition is a message the library adds to one write of the application's: the write
// must be exactly one simple Query of the text match, else nothing is added.
type addition struct {
	kind  libraryMessage
	match string
	// before is sent ahead of the application's message, in the same write.
	before []byte
	state  additionState
	// reply is what the server answered to it, as far as it was read.
	reply libraryReply
}

// additionState is where an addition is in its life. Each connection has at most one
// in flight: armed by the tracer before a BEGIN or COMMIT is handed to pgconn, taken by
// that write, its reply filtered out of what pgconn reads.
type additionState uint8

const (
	// additionArmed: waiting for the write it was armed for (netConn.next); a write that
	// is not that one leaves it, and the tracer disarms it when the statement ends.
	additionArmed additionState = iota + 1
	// additionUnsent: the write carrying it failed before any of its bytes left: the
	// server has seen nothing of it, and no reply will come.
	additionUnsent
	// additionWritten: some of its bytes left; the reply filter is taking its part of the
	// reply out of what pgconn reads.
	additionWritten
	// additionReplied: its part of the reply was read whole (reply.done).
	additionReplied
)

// The tracer collects an addition with netConn.takeAddition when the statement ends, in
// whichever state it reached; the connection holds none after that.

// sent reports whether any of a's bytes left: the server may have read it.
func (a *addition) sent() bool { return a.state >= additionWritten }

// newNetConn wraps conn; track follows message boundaries (commit references on).
func newNetConn(conn net.Conn, t *Tracer, track bool) *netConn {
	c := &netConn{Conn: conn, t: t, track: track}
	if tc, ok := conn.(*tls.Conn); ok {
		// Under TLS the socket's writes are counted, and whether bytes wait in it is peeked.
		if c.dialed, _ = tc.NetConn().(*dialedConn); c.dialed != nil {
			c.rawPeek = newSocketPeek(c.dialed.Conn)
		}
	} else {
		c.peek = newSocketPeek(conn)
	}
	return c
}

// dialedConn is the net.Conn pgconn dialed, as the instrumented DialFunc returns it. It
// counts the bytes its writes got into the kernel: above TLS, where a write's n counts
// plaintext and a failed record says nothing of how much of it left, that count is what
// tells a COMMIT whose bytes never reached the kernel (see netConn.wrote).
type dialedConn struct {
	net.Conn
	sent atomic.Int64
}

func (c *dialedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.sent.Add(int64(n))
	return n, err
}

// NetConn returns the dialed net.Conn, as tls.Conn does.
func (c *dialedConn) NetConn() net.Conn { return c.Conn }

// The states of netConn.commitWrite.
const (
	commitIdle   int32 = iota
	commitMarked       // the tracer marked the position before COMMIT: the next write carries it
	commitSent         // that write got at least one byte into the kernel
	commitUnsent       // that write failed before the kernel accepted any byte
)

// Write writes b and, for the first write after markCommit, records whether any byte
// was accepted: net.Conn's n counts exactly the bytes the kernel took. A write the library
// armed an addition for carries it (see addTo).
func (c *netConn) Write(b []byte) (int, error) {
	if a := c.next.Swap(nil); a != nil {
		if out, cut, ok := a.addTo(b); ok {
			return c.writeAdded(a, b, out, cut)
		}
	}
	n, err := c.Conn.Write(b)
	c.wrote(n > 0 || err == nil)
	return n, err
}

// wrote records, for the first write after markCommit, whether COMMIT's bytes reached
// the kernel.
func (c *netConn) wrote(sent bool) {
	if c.commitWrite.Load() == commitMarked {
		if c.dialed != nil {
			// Under TLS: whether any byte of this write's records reached the kernel.
			sent = c.dialed.sent.Load() > c.sentAtArm
		}
		s := commitSent
		if !sent {
			s = commitUnsent
		}
		c.commitWrite.CompareAndSwap(commitMarked, s)
	}
}

// writeAdded writes out, which is b with a's message added, the first cut bytes of it the
// library's alone. The reply filter is in place before a byte leaves: the reply may come
// before Write returns. pgconn is told how much of b was sent, so that what it says of a
// failed write (safe to retry when nothing was) stays true of its own bytes.
func (c *netConn) writeAdded(a *addition, b, out []byte, cut int) (int, error) {
	c.mu.Lock()
	c.filter = &replyFilter{kind: a.kind}
	c.added = a
	// Written before a byte leaves, under mu: pgconn's background reader may read the
	// whole reply, and move it on to replied, before Write returns.
	a.state = additionWritten
	c.special.Store(true)
	c.mu.Unlock()
	m, err := c.Conn.Write(out)
	if m == 0 {
		// Nothing left, so no reply can come: nothing else moves it.
		c.mu.Lock()
		a.state = additionUnsent
		c.mu.Unlock()
	}
	mine := m > cut // some of the application's bytes left
	c.wrote(mine || err == nil)
	if err == nil {
		return len(b), nil
	}
	if !mine {
		return 0, err
	}
	return min(max(m-cut, 1), len(b)-1), err
}

// addTo returns b with a's message added, and how many of its first bytes are the
// library's alone; ok is false, and nothing is added, unless b is exactly one simple
// Query of the text a was armed for: a batch, a pipeline, the extended protocol or any
// other statement is left exactly as it is.
func (a *addition) addTo(b []byte) (out []byte, cut int, ok bool) {
	if len(b) != 1+4+len(a.match)+1 || b[0] != 'Q' || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-1 ||
		string(b[5:len(b)-1]) != a.match || b[len(b)-1] != 0 {
		return nil, 0, false
	}
	out = append(append(make([]byte, 0, len(a.before)+len(b)), a.before...), b...)
	return out, len(a.before), true
}

// arm has the next write carry a, if it is the one a was armed for. It is refused, and
// nothing is added, when the server's stream is not at a message boundary or a reply
// filter is still at work: a reply reader must start at the reply's first message.
func (c *netConn) arm(a *addition) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.filter != nil || !c.pos.atBoundary() || len(c.ahead) > 0 || c.aheadErr != nil {
		return false
	}
	c.added = nil
	a.state = additionArmed
	c.next.Store(a)
	return true
}

// disarm withdraws an addition the next write did not take.
func (c *netConn) disarm() { c.next.Store(nil) }

// takeAddition returns what became of the last addition, once: nil if none was made.
func (c *netConn) takeAddition() *addition {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.added
	c.added = nil
	if a != nil && c.filter != nil && c.filter.kind == a.kind {
		a.reply = c.filter.lib // as far as it was read
	}
	return a
}

// Read reads what the server sent, less the library's part of a reply (see replyFilter),
// after the bytes read ahead. Without commit references and with nothing read ahead it
// is the connection's Read.
func (c *netConn) Read(p []byte) (int, error) {
	if !c.special.Load() && !c.track {
		return c.Conn.Read(p)
	}
	for {
		c.mu.Lock()
		n, err, done := c.deliver(p)
		c.mu.Unlock()
		if done {
			return n, err
		}
		n, err = c.Conn.Read(p)
		c.mu.Lock()
		if c.filter == nil || n == 0 && err == nil {
			c.pos.advance(p[:n])
			c.mu.Unlock()
			return n, err
		}
		c.filter.feed(p[:n])
		if err != nil && !isTimeout(err) {
			c.aheadErr = err
		}
		c.mu.Unlock()
		if err != nil && isTimeout(err) {
			// A timeout belongs to the deadline of this read; with nothing to give, it is the
			// answer. With something to give, the next read meets the deadline again.
			c.mu.Lock()
			n, _, done := c.deliver(p)
			c.mu.Unlock()
			if done && n > 0 {
				return n, nil
			}
			return 0, err
		}
	}
}

// deliver gives p what is ready for pgconn — the filter's output, bytes read ahead, or an
// error they ended with — and reports whether Read is done. c.mu is held.
func (c *netConn) deliver(p []byte) (n int, err error, done bool) {
	if f := c.filter; f != nil {
		if len(c.ahead) > 0 {
			f.feed(c.ahead)
			c.ahead = nil
		}
		switch {
		case f.err != nil:
			_ = c.Conn.Close()
			return 0, f.err, true
		case len(f.out) > 0:
			n = copy(p, f.out)
			f.out = f.out[n:]
			c.pos.advance(p[:n])
			if f.finished() && len(f.out) == 0 {
				c.endFilter()
			}
			return n, nil, true
		case f.finished():
			c.endFilter()
		case c.aheadErr != nil:
			err, c.aheadErr = c.aheadErr, nil
			return 0, err, true
		default:
			return 0, nil, false
		}
	}
	if len(c.ahead) > 0 {
		n = copy(p, c.ahead)
		c.ahead = c.ahead[n:]
		c.pos.advance(p[:n])
		if len(c.ahead) == 0 {
			c.ahead = nil
			c.settle()
		}
		return n, nil, true
	}
	if c.aheadErr != nil {
		err, c.aheadErr = c.aheadErr, nil
		c.settle()
		return 0, err, true
	}
	return 0, nil, false
}

// endFilter keeps what the library read of its reply and goes back to passing bytes
// through. c.mu is held.
func (c *netConn) endFilter() {
	if c.added != nil {
		c.added.reply = c.filter.lib
		c.added.state = additionReplied
	}
	c.filter = nil
	c.settle()
}

// settle clears special once nothing is left for Read to look at. c.mu is held.
func (c *netConn) settle() {
	if c.filter == nil && len(c.ahead) == 0 && c.aheadErr == nil {
		c.special.Store(false)
	}
}

// readAheadWait bounds readAhead's read once bytes are known to wait in the socket.
const readAheadWait = 5 * time.Millisecond

// isTimeout reports a read that ended at its deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// readAhead reads what the server has sent that pgconn has not read, and keeps it for
// pgconn's next Read: above TLS (a *tls.Conn from pgconn's own handshake), where the
// socket's bytes are ciphertext and cannot be peeked at, it is how a FATAL waiting before
// COMMIT is seen. It reads only when bytes wait in the socket (a peek), under a read
// deadline of readAheadWait that it clears after: only the connection's user calls it,
// between statements, when pgconn has no deadline set. A read still in flight then is
// pgconn's background reader's, which drops a timeout and stops, and whose bytes pgconn
// reads before these.
func (c *netConn) readAhead() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, isTLS := c.Conn.(*tls.Conn); !isTLS || !c.rawPeek.waiting() || c.filter != nil || len(c.ahead) > 0 || c.aheadErr != nil {
		// Only crypto/tls is known here to end a read at its deadline and to resume after
		// it; another net.Conn could block the COMMIT. Nothing waiting in the socket:
		// nothing to read, and no wait.
		return nil
	}
	// Something waits: a record arriving whole is read at once; one still arriving is
	// waited for this long at most, only in this rare case.
	if err := c.Conn.SetReadDeadline(time.Now().Add(readAheadWait)); err != nil {
		return nil
	}
	buf := make([]byte, peekSize)
	n, err := c.Conn.Read(buf)
	_ = c.Conn.SetReadDeadline(time.Time{})
	if n > 0 {
		c.ahead = buf[:n]
		c.special.Store(true)
	}
	if err != nil && !isTimeout(err) {
		c.aheadErr = err
		c.special.Store(true)
	}
	return c.ahead
}

// markCommit marks the position before a COMMIT is handed to pgconn: the next write
// carries it (or something before it, which only makes commitUnsent rarer). It also
// reports whether the server had already ended the session before that write: a FATAL
// waiting unread in the socket (see socketPeek) or, where the socket cannot be peeked at
// (TLS), read ahead (see readAhead).
func (c *netConn) markCommit() (sessionEnded bool) {
	if c.dialed != nil {
		c.sentAtArm = c.dialed.sent.Load()
	}
	c.commitWrite.Store(commitMarked)
	if c.peek != nil {
		return c.peek.sessionEnded()
	}
	if c.track && !c.atBoundary() {
		return false // bytes from the middle of a message cannot be judged
	}
	return fatalBeforeCommit(c.readAhead())
}

// atBoundary reports whether pgconn was given whole messages so far (track).
func (c *netConn) atBoundary() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pos.atBoundary()
}

// commitUnsent reports whether the write markCommit marked failed before the kernel
// accepted any of its bytes, and disarms it.
func (c *netConn) commitNotSent() bool {
	return c.commitWrite.Swap(commitIdle) == commitUnsent
}

// Close closes the connection and, the first time, concludes the frame open on it.
func (c *netConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		if st := c.st.Load(); st != nil {
			c.t.netConnClosed(st)
		}
	}
	return err
}

// NetConn returns the wrapped connection, as tls.Conn does: PgConn.Conn returns the
// wrapper, not the net.Conn a chained AfterNetConnect returned.
func (c *netConn) NetConn() net.Conn { return c.Conn }

// fatalBeforeCommit reports whether buf, bytes the server sent while the session was
// idle in a transaction, holds an ErrorResponse of severity FATAL or PANIC. The
// protocol says the server closes the connection after one ("FATAL ... the server will
// close the connection", ErrorResponse in the protocol's message flow), and PostgreSQL
// exits the backend (elog.c errfinish: proc_exit for FATAL, abort for PANIC), which
// rolls back its transaction: a COMMIT written after it is never read. A message cut
// off by the end of buf is not judged.
func fatalBeforeCommit(buf []byte) bool {
	for len(buf) >= 5 {
		typ := buf[0]
		n := int(uint32(buf[1])<<24 | uint32(buf[2])<<16 | uint32(buf[3])<<8 | uint32(buf[4]))
		if n < 4 || len(buf) < 1+n {
			return false
		}
		body := buf[5 : 1+n]
		if typ == 'E' && fatalSeverity(body) {
			return true
		}
		buf = buf[1+n:]
	}
	return false
}

// fatalSeverity reads an ErrorResponse body's severity: 'V' (never localized, 9.6+)
// if present, else 'S'.
func fatalSeverity(body []byte) bool {
	var s, v string
	for len(body) > 0 && body[0] != 0 {
		code := body[0]
		end := 1
		for end < len(body) && body[end] != 0 {
			end++
		}
		if end == len(body) {
			return false
		}
		switch code {
		case 'S':
			s = string(body[1:end])
		case 'V':
			v = string(body[1:end])
		}
		body = body[end+1:]
	}
	return pg.Fatal(s, v)
}
