package pgtest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
// starts with the word COMMIT or END (any case), or PREPARE TRANSACTION or ROLLBACK PREPARED, or a Bind ('B') of a statement whose Parse carried COMMIT on
// the same connection. The Bind rule matters because a client that prepared
// "commit" once (pgx does after conn.Prepare(ctx, "commit", "commit")) later
// sends only Bind/Execute/Sync. A Parse alone counts even if the statement is
// only prepared and never executed.
//
// Once the proxy has begun to cut a connection, it drops every CancelRequest (closing
// its connection unanswered), as a network that lost the path to the server would: pgx
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
	// cutting is set before a cut closes or blocks anything, and stays set: from then on
	// every CancelRequest is dropped. Counting the cut after the close (cuts) let pgx's
	// cancel of the connection just closed through while a CutAll was still counting.
	cutting atomic.Bool
	// dropped counts the CancelRequests dropped.
	dropped atomic.Int64
	// afterClose, a test's seam, runs after CutAll or ResetAll closed a connection.
	afterClose func()

	rec *Recording // set by Record: connections accepted from then on are recorded
	// implicitText is ImplicitCommits' text, "" for none.
	implicitText string

	toServer, toClient time.Duration // set by SetDelay, for connections accepted from then on
	version            string        // set by ReportVersion, for connections accepted from then on
}

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
	pc := &proxyConn{client: client, server: server, stmts: map[string]bool{}, implicit: map[string]bool{}}
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
	// cutAtReady: CutBetweenReplies fired; the server's replies go to the client up to
	// the first ReadyForQuery, then the connection is cut.
	cutAtReady atomic.Bool
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
	// implicit: prepared statement name -> its SQL holds the text of ImplicitCommits;
	// boundImplicit: the last Bind was of one.
	implicit      map[string]bool
	boundImplicit bool
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
	var ready *readyEnd
	for {
		n, err := pc.serverIO.Read(buf)
		data := rw.rewrite(buf[:n])
		if len(data) > 0 && pc.conv != nil {
			pc.conv.server.append(data)
		}
		if ready == nil && pc.cutAtReady.Load() {
			ready = &readyEnd{}
		}
		if ready != nil && len(data) > 0 {
			if k, found := ready.through(data); found {
				p.cutting.Store(true)
				_ = pc.toClient.write(data[:k])
				pc.blocked.Store(true)
				p.cuts.Add(1)
				return // serve's goroutine closes both sides
			}
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
				p.dropped.Add(1)
				pc.close()
				return
			}
			if cut {
				p.cutting.Store(true)
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
