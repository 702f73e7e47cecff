package pgtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Proxy forwards TCP between clients and the server and injects faults.
//
// It parses the frontend (client to server) protocol to find the message that
// carries a COMMIT; server bytes are relayed unparsed (but for connection start under
// ReportVersion). A client that asks for TLS
// (an SSLRequest) gets it if the target agrees, so a Server's TLSConnString works
// through the proxy: to see the COMMIT, the proxy ends the client's TLS session itself,
// with a certificate for 127.0.0.1 and localhost from the CA that signed the servers'
// (so the client still verifies it against the server's sslrootcert), and opens its own
// to the target, which it verifies against the same CA. Faults and delays then apply
// as on plain TCP; a cut closes the TCP connections under both sessions, as a broken
// network would (no TLS close_notify), and TLS handshakes are not delayed. A
// GSSENCRequest is answered 'N' by the proxy itself.
//
// A message carries COMMIT if it is a Query ('Q') one of whose ';'-separated
// statements, or a Parse ('P') whose SQL, after leading whitespace and comments,
// starts with the word COMMIT or END (any case), or a Bind ('B') of a statement whose Parse carried COMMIT on
// the same connection. The Bind rule matters because a client that prepared
// "commit" once (pgx does after conn.Prepare(ctx, "commit", "commit")) later
// sends only Bind/Execute/Sync. A Parse alone counts even if the statement is
// only prepared and never executed.
//
// Once the proxy has cut a connection, it drops every CancelRequest (closing its
// connection unanswered), as a network that lost the path to the server would: pgx
// sends one when it closes a broken connection (pgconn's asyncClose), and one that
// reached the server before a forwarded COMMIT completed would abort it, so that
// "cut after COMMIT" would end committed or aborted by chance.
type Proxy struct {
	target string
	cert   func() (tls.Certificate, error) // the proxy's own, made for its first TLS client
	ln     net.Listener
	ctx    context.Context // cancelled by Close to abort dials in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup // accept loop and one per client connection

	mu     sync.Mutex
	conns  map[*proxyConn]struct{}
	armed  fault
	closed bool

	roundTrips atomic.Int64
	cuts       atomic.Int64

	rec *Recording // set by Record: connections accepted from then on are recorded

	toServer, toClient time.Duration // set by SetDelay, for connections accepted from then on
	version            string        // set by ReportVersion, for connections accepted from then on
}

// fault is the one-shot fault armed for the next message carrying COMMIT.
type fault int

const (
	noFault fault = iota
	cutAfterCommit
	cutBeforeCommit
	holdBeforeCommit
)

// Frontend protocol constants (PostgreSQL docs, "Message Formats").
const (
	cancelRequestCode = 80877102
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
	maxStartupLen     = 10000 // the server's MAX_STARTUP_PACKET_LENGTH
)

// NewProxy listens on 127.0.0.1:0 and forwards every connection to target
// ("host:port").
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{target: target, ln: ln, ctx: ctx, cancel: cancel, conns: map[*proxyConn]struct{}{}}
	p.cert = sync.OnceValues(func() (tls.Certificate, error) {
		a, err := processAuthority()
		if err != nil {
			return tls.Certificate{}, err
		}
		return a.issue()
	})
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's listening address, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Host is the proxy's listening host, always 127.0.0.1.
func (p *Proxy) Host() string { return "127.0.0.1" }

// Port is the proxy's listening port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// ConnString returns base with its host and port replaced by the proxy's,
// keeping everything else. base is a postgres:// URL (host/port query
// parameters are dropped) or a keyword/value string (host= and port= are
// appended; the last occurrence wins in pgx and libpq).
func (p *Proxy) ConnString(base string) string { return connStringAt(base, p.Host(), p.Port()) }

// connStringAt is base pointed at host:port, as documented on Proxy.ConnString.
func connStringAt(base, host string, port int) string {
	if u, err := url.Parse(base); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = net.JoinHostPort(host, strconv.Itoa(port))
		if q := u.Query(); q.Has("host") || q.Has("port") {
			q.Del("host")
			q.Del("port")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	return strings.TrimSpace(base + fmt.Sprintf(" host=%s port=%d", host, port))
}

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

// ReportVersion has the server_version the server reports at connection start (its
// ParameterStatus) reach the client as v, for connections accepted from then on: the
// client sees a server of that version, whatever runs behind ("" stops it).
func (p *Proxy) ReportVersion(v string) {
	p.mu.Lock()
	p.version = v
	p.mu.Unlock()
}

// CutAll closes every live connection (both sides) now. Each connection it
// closes counts as one cut.
func (p *Proxy) CutAll() {
	for _, pc := range p.live() {
		pc.blocked.Store(true)
		if pc.close() {
			p.cuts.Add(1)
		}
	}
}

// ResetAll aborts every live connection now, as a firewall or load balancer that drops
// a connection does: the client side with a TCP reset (SO_LINGER 0), so that the
// client's next write fails without sending a byte; the server side with a close. Each
// connection it aborts counts as one cut.
func (p *Proxy) ResetAll() {
	for _, pc := range p.live() {
		pc.blocked.Store(true)
		if tc, ok := pc.client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		if pc.close() {
			p.cuts.Add(1)
		}
	}
}

// RoundTrips counts client-to-server round trips over all connections. Per
// connection, a round trip is counted when data arrives from the client and
// either it is the first client data on that connection or the proxy has
// relayed server data (or answered an SSLRequest) to the client since the
// last counted round trip. In other words it counts the transitions
// "server replied" -> "client sends". Examples: connecting with trust auth is
// 1 (over TLS 2: the SSLRequest, then the startup; the handshake is not
// counted); a query sent in one write and answered is 1; a batch that
// pipelines many messages before reading the reply is 1; a pgx query with
// arguments whose statement is not cached yet is 2 (prepare, then execute).
func (p *Proxy) RoundTrips() int64 { return p.roundTrips.Load() }

// ResetRoundTrips sets the RoundTrips counter to zero.
func (p *Proxy) ResetRoundTrips() { p.roundTrips.Store(0) }

// Cuts is the number of cuts performed: one per fired CutAfterCommit or
// CutBeforeCommit, plus one per connection closed by CutAll.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

// Close stops listening, closes all live connections and waits for all of
// the proxy's goroutines to exit. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()

	p.cancel()
	err := p.ln.Close()
	for _, pc := range p.live() {
		pc.close()
	}
	p.wg.Wait()
	return err
}

// live returns the open proxied connections, to act on them outside the lock.
func (p *Proxy) live() []*proxyConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	return conns
}

// acceptLoop proxies every accepted connection until the listener is closed.
func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed (or broken) listener
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve relays one client connection until either side closes or a cut.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	var d net.Dialer
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	pc := &proxyConn{client: client, server: server, stmts: map[string]bool{}}
	pc.serverSpoke.Store(true) // the first client send is a round trip

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		pc.close()
		return
	}
	toServer, toClient := p.toServer, p.toClient
	pc.version = p.version
	p.conns[pc] = struct{}{}
	if p.rec != nil {
		pc.conv = p.rec.add()
		defer close(pc.conv.done)
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()

	if pc.clientIO, pc.serverIO, err = p.negotiate(pc); err != nil {
		pc.close()
		return
	}
	pc.toServer = p.newLink(pc, pc.serverIO, toServer, nil)
	// Mark before writing: once the client has the reply it may send again, and
	// that send must see the mark.
	pc.toClient = p.newLink(pc, pc.clientIO, toClient, func() { pc.serverSpoke.Store(true) })
	defer pc.toServer.stop()
	defer pc.toClient.stop()

	done := make(chan struct{})
	pc.serverDone = done
	go func() {
		defer close(done)
		p.relayServer(pc)
		pc.close()
	}()
	p.relayClient(pc)
	pc.close()
	<-done
}

// proxyConn is one client connection and its server connection. Fields
// below "client goroutine only" are touched by relayClient alone.
type proxyConn struct {
	client, server net.Conn // the TCP connections, which a cut closes
	closeOnce      sync.Once
	// clientIO and serverIO are what the relays read and write: client and server, or
	// TLS sessions over them (see negotiate). Set before the relays start.
	clientIO, serverIO net.Conn

	// blocked stops relaying server bytes: set before a COMMIT that will be
	// cut is forwarded, so its reply can never reach the client.
	blocked atomic.Bool
	// serverSpoke is set when bytes went to the client since the last
	// counted round trip.
	serverSpoke atomic.Bool

	conv *Conversation // nil unless the proxy records
	// version, when set, replaces the server_version the server reports (ReportVersion).
	version string

	toServer, toClient *link // the only way bytes are written to either side
	// serverDone is closed once the server's side has ended (its relay returned).
	serverDone <-chan struct{}

	// client goroutine only:
	started   bool            // startup message seen; typed messages follow
	opaque    bool            // unparseable stream: forward blindly
	cutAtSync bool            // CutAfterCommit fired: cut after the next Sync
	hold      bool            // HoldBeforeCommit fired: the server's connection stays open
	dropped   bool            // a CancelRequest after a cut: closed, not forwarded
	stmts     map[string]bool // prepared statement name -> its SQL is a COMMIT
}

// close closes both sides and reports whether this call did it.
func (pc *proxyConn) close() bool {
	did := false
	pc.closeOnce.Do(func() {
		did = true
		pc.client.Close()
		pc.server.Close()
	})
	return did
}

// relayServer copies the server's bytes to the client, dropping them once a fault has
// blocked the connection.
func (p *Proxy) relayServer(pc *proxyConn) {
	buf := make([]byte, 32<<10)
	rw := versionRewrite{version: pc.version}
	for {
		n, err := pc.serverIO.Read(buf)
		data := rw.rewrite(buf[:n])
		if len(data) > 0 && pc.conv != nil {
			pc.conv.server.append(data)
		}
		if len(data) > 0 && !pc.blocked.Load() {
			if err := pc.toClient.write(data); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// relayClient copies the client's bytes to the server message by message, so that a
// fault can cut the connection at a COMMIT.
func (p *Proxy) relayClient(pc *proxyConn) {
	buf := make([]byte, 32<<10)
	var pending []byte // received but not yet complete messages
	for {
		n, err := pc.clientIO.Read(buf)
		if n > 0 && pc.conv != nil {
			pc.conv.client.append(buf[:n])
		}
		if n > 0 {
			if pc.serverSpoke.Swap(false) {
				p.roundTrips.Add(1)
			}
			pending = append(pending, buf[:n]...)
			out, consumed, cut := p.scan(pc, pending)
			if pc.dropped {
				pc.close()
				return
			}
			if len(out) > 0 {
				if err := pc.toServer.write(out); err != nil {
					return
				}
			}
			if cut {
				p.cuts.Add(1)
				if pc.hold {
					pc.client.Close()
					select { // the server's connection stays open until the proxy closes or the server ends it
					case <-p.ctx.Done():
					case <-pc.serverDone:
					}
				}
				pc.close()
				return
			}
			pending = append(pending[:0], pending[consumed:]...)
		}
		if err != nil {
			return
		}
	}
}

// scan walks the complete messages in data and returns the bytes to forward,
// how many bytes of data it consumed, and whether to cut the connection
// after forwarding.
func (p *Proxy) scan(pc *proxyConn, data []byte) (out []byte, consumed int, cut bool) {
	for {
		rest := data[consumed:]
		if pc.opaque {
			return append(out, rest...), len(data), false
		}
		if !pc.started {
			// Untyped: int32 length (including itself), int32 code, payload.
			if len(rest) < 8 {
				return out, consumed, false
			}
			n := int(binary.BigEndian.Uint32(rest))
			if n < 8 || n > maxStartupLen {
				pc.opaque = true
				continue
			}
			if len(rest) < n {
				return out, consumed, false
			}
			consumed += n
			code := binary.BigEndian.Uint32(rest[4:])
			if code == cancelRequestCode && p.cuts.Load() > 0 {
				pc.dropped = true
				return out, consumed, false
			}
			out = append(out, rest[:n]...)
			pc.started = true // startup or CancelRequest; typed messages follow
			continue
		}

		// Typed: type byte, int32 length (including itself), payload.
		if len(rest) < 5 {
			return out, consumed, false
		}
		n := 1 + int(binary.BigEndian.Uint32(rest[1:]))
		if n < 5 {
			pc.opaque = true
			continue
		}
		if len(rest) < n {
			return out, consumed, false
		}
		msg := rest[:n]
		consumed += n
		out, cut = p.forwardTyped(pc, out, msg)
		if cut {
			return out, consumed, true
		}
	}
}

// forwardTyped appends the typed message msg to out unless a COMMIT fault drops it, and
// reports whether to cut the connection once out is forwarded.
func (p *Proxy) forwardTyped(pc *proxyConn, out, msg []byte) ([]byte, bool) {
	if pc.cutAtSync {
		return append(out, msg...), msg[0] == 'S'
	}
	if pc.carriesCommit(msg) {
		switch p.takeFault() {
		case cutBeforeCommit:
			pc.blocked.Store(true)
			return out, true
		case holdBeforeCommit:
			pc.blocked.Store(true)
			pc.hold = true
			return out, true
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

// carriesCommit applies the rule documented on Proxy and tracks statement
// names from Parse and Close.
func (pc *proxyConn) carriesCommit(msg []byte) bool {
	body := msg[5:]
	switch msg[0] {
	case 'Q':
		sql, _ := cstring(body)
		for stmt := range strings.SplitSeq(sql, ";") { // a ';' inside a literal may split too
			if isCommitSQL(stmt) {
				return true
			}
		}
		return false
	case 'P':
		name, rest := cstring(body)
		sql, _ := cstring(rest)
		isCommit := isCommitSQL(sql)
		if isCommit {
			pc.stmts[name] = true
		} else {
			delete(pc.stmts, name) // a re-Parse of the unnamed statement replaces it
		}
		return isCommit
	case 'B':
		_, rest := cstring(body) // portal name
		stmt, _ := cstring(rest)
		return pc.stmts[stmt]
	case 'C':
		if len(body) > 0 && body[0] == 'S' {
			name, _ := cstring(body[1:])
			delete(pc.stmts, name)
		}
	}
	return false
}

// cstring splits a NUL-terminated string off b.
func cstring(b []byte) (string, []byte) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:]
		}
	}
	return string(b), nil
}

// isCommitSQL reports whether sql starts with the keyword COMMIT or END,
// skipping whitespace and comments (tracing libraries prepend comments).
func isCommitSQL(sql string) bool {
	s := skipSpaceAndComments(sql)
	for _, kw := range []string{"commit", "end"} {
		if len(s) >= len(kw) && strings.EqualFold(s[:len(kw)], kw) &&
			(len(s) == len(kw) || !isIdentByte(s[len(kw)])) {
			return true
		}
	}
	return false
}

// skipSpaceAndComments returns s from its first token on, or "" for an unterminated
// comment.
func skipSpaceAndComments(s string) string {
	for {
		s = strings.TrimLeft(s, " \t\r\n\f\v")
		switch {
		case strings.HasPrefix(s, "--"):
			i := strings.IndexByte(s, '\n')
			if i < 0 {
				return ""
			}
			s = s[i+1:]
		case strings.HasPrefix(s, "/*"): // PostgreSQL nests block comments
			depth, i := 0, 0
			for i < len(s) {
				if strings.HasPrefix(s[i:], "/*") {
					depth, i = depth+1, i+2
				} else if strings.HasPrefix(s[i:], "*/") {
					depth, i = depth-1, i+2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
			if depth != 0 {
				return ""
			}
			s = s[i:]
		default:
			return s
		}
	}
}

// isIdentByte reports a byte that continues an SQL identifier or keyword.
func isIdentByte(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 ||
		'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// Record makes the proxy record every connection it accepts from now on, byte for byte
// in each direction, as received, from the startup message (or CancelRequest) on: to
// compare what clients send, not to inject faults. An SSLRequest or GSSENCRequest and
// its answer are not recorded, and over TLS the bytes are the plain text inside, so a
// conversation reads the same over either transport.
func (p *Proxy) Record() *Recording {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rec == nil {
		p.rec = &Recording{}
	}
	return p.rec
}

// Recording is the conversations of the connections a proxy accepted while recording.
type Recording struct {
	mu    sync.Mutex
	convs []*Conversation
}

// add starts the conversation of a newly accepted connection.
func (r *Recording) add() *Conversation {
	c := &Conversation{done: make(chan struct{})}
	r.mu.Lock()
	r.convs = append(r.convs, c)
	r.mu.Unlock()
	return c
}

// Conversations returns the recorded connections in the order they were accepted.
func (r *Recording) Conversations() []*Conversation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Conversation(nil), r.convs...)
}

// Conversation is one proxied connection's bytes.
type Conversation struct {
	client, server recorded
	done           chan struct{}
}

// Done is closed when both sides of the connection are closed: the recording is complete.
func (c *Conversation) Done() <-chan struct{} { return c.done }

// ClientBytes returns a copy of what the client sent.
func (c *Conversation) ClientBytes() []byte { return c.client.bytes() }

// ServerBytes returns a copy of what the server sent.
func (c *Conversation) ServerBytes() []byte { return c.server.bytes() }

// recorded is one direction's bytes; its relay goroutine appends while tests read.
type recorded struct {
	mu  sync.Mutex
	buf []byte
}

// append records bytes the relay received.
func (r *recorded) append(b []byte) {
	r.mu.Lock()
	r.buf = append(r.buf, b...)
	r.mu.Unlock()
}

// bytes returns a copy, so that a test reads it while the relay appends.
func (r *recorded) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.buf...)
}

// versionRewrite replaces the server_version ParameterStatus in the server's messages up
// to its first ReadyForQuery, the end of connection start; after it, bytes pass as they
// are.
type versionRewrite struct {
	version string
	pending []byte // an incomplete message
	done    bool
}

// rewrite returns what of b goes on to the client now.
func (r *versionRewrite) rewrite(b []byte) []byte {
	if r.version == "" || r.done {
		return b
	}
	r.pending = append(r.pending, b...)
	var out []byte
	for len(r.pending) >= 5 {
		end := 1 + int(binary.BigEndian.Uint32(r.pending[1:5]))
		if end < 5 || len(r.pending) < end {
			break
		}
		msg := r.pending[:end]
		if msg[0] == 'S' && bytes.HasPrefix(msg[5:], []byte("server_version\x00")) {
			msg, _ = (&pgproto3.ParameterStatus{Name: "server_version", Value: r.version}).Encode(nil)
		}
		out = append(out, msg...)
		r.pending = r.pending[end:]
		if msg[0] == 'Z' {
			r.done = true
			out = append(out, r.pending...)
			r.pending = nil
			break
		}
	}
	return out
}
