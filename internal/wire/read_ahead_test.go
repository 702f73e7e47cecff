//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package wire

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// deadlineConn records the read deadlines set on it.
type deadlineConn struct {
	net.Conn
	mu   sync.Mutex
	last time.Time
	sets int
}

func (c *deadlineConn) SetReadDeadline(d time.Time) error {
	c.mu.Lock()
	c.last, c.sets = d, c.sets+1
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(d)
}

// SyscallConn and SetReadBuffer are the TCP socket's, so that it is peeked at as one.
func (c *deadlineConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(*net.TCPConn).SyscallConn()
}
func (c *deadlineConn) SetReadBuffer(n int) error { return c.Conn.(*net.TCPConn).SetReadBuffer(n) }

// readDeadline returns the last read deadline set, and how many were.
func (c *deadlineConn) readDeadline() (time.Time, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, c.sets
}

// gateConn holds back a write, once armed: the first k bytes go out, the rest when
// release is closed — a TLS record still arriving.
type gateConn struct {
	net.Conn
	k       int
	armed   bool
	release chan struct{}
}

func (c *gateConn) Write(b []byte) (int, error) {
	if !c.armed || len(b) <= c.k {
		return c.Conn.Write(b)
	}
	c.armed = false
	n, err := c.Conn.Write(b[:c.k])
	if err != nil {
		return n, err
	}
	<-c.release
	m, err := c.Conn.Write(b[c.k:])
	return n + m, err
}

// loopback returns both ends of a TCP connection on the loopback interface.
func loopback(t testing.TB) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// tlsPair returns the wrapper over TLS over a counted loopback socket, as an instrumented
// connection has it, the server's TLS end, the socket's deadline recorder, and the gate
// on the server's socket.
func tlsPair(t *testing.T) (*Conn, *tls.Conn, *deadlineConn, *gateConn) {
	t.Helper()
	rawClient, rawServer := loopback(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "wire"}, DNSNames: []string{"wire"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	gate := &gateConn{Conn: rawServer, release: make(chan struct{})}
	srv := tls.Server(gate, &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	dc := &deadlineConn{Conn: rawClient}
	tc := tls.Client(&Dialed{Conn: dc}, &tls.Config{RootCAs: roots, ServerName: "wire"})
	done := make(chan error, 1)
	go func() { done <- srv.Handshake() }()
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c := NewConn(tc, nil, true)
	if c.ahead.tls == nil || c.commit.dialed == nil || c.peek != nil {
		t.Fatal("the wrapper does not read ahead on TLS over a counted socket")
	}
	return c, srv, dc, gate
}

// waitWaiting waits until bytes wait unread in the socket p peeks at.
func waitWaiting(t *testing.T, p *socketPeek) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !p.waiting() {
		if time.Now().After(deadline) {
			t.Fatal("nothing arrived in the socket")
		}
		time.Sleep(time.Millisecond) // polling the socket: no event says bytes arrived
	}
}

// fatalMsg is the FATAL a terminated backend sends.
func fatalMsg(t *testing.T) []byte {
	return msg(t, &pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"})
}

// TestReadAhead drives the read-ahead above TLS on a real loopback TCP connection: nothing
// waiting reads nothing and sets no deadline; a FATAL waiting is read ahead at
// MarkCommit, judged, and given to pgconn first; a record still arriving meets the
// deadline, holds nothing, and the TLS connection reads it whole afterwards; the peer's
// close after its FATAL is given after the FATAL. Every deadline set is cleared.
func TestReadAhead(t *testing.T) {
	fatal := fatalMsg(t)
	buf := make([]byte, 256)

	t.Run("nothing waiting", func(t *testing.T) {
		c, _, dc, _ := tlsPair(t)
		if c.MarkCommit(true) || c.ahead.state() != aheadEmpty || held(c) {
			t.Fatal("evidence, or something held, with nothing sent")
		}
		if _, sets := dc.readDeadline(); sets != 0 {
			t.Fatalf("%d read deadlines set with nothing waiting", sets)
		}
	})

	t.Run("a FATAL waiting", func(t *testing.T) {
		c, srv, dc, _ := tlsPair(t)
		if _, err := srv.Write(fatal); err != nil {
			t.Fatal(err)
		}
		waitWaiting(t, c.ahead.waiting)
		// Not asked to judge (a server not PostgreSQL), it reads nothing ahead.
		if c.MarkCommit(false) || c.ahead.state() != aheadEmpty || held(c) {
			t.Fatalf("unjudged, the FATAL was read ahead: state %d", c.ahead.state())
		}
		if _, sets := dc.readDeadline(); sets != 0 {
			t.Fatalf("unjudged, %d read deadlines set", sets)
		}
		if !c.MarkCommit(true) || c.ahead.state() != aheadBytes || !held(c) {
			t.Fatalf("the FATAL was not read ahead: state %d", c.ahead.state())
		}
		if d, sets := dc.readDeadline(); sets != 2 || !d.IsZero() {
			t.Fatalf("read deadline %v after %d sets: not cleared", d, sets)
		}
		if n, err := c.Read(buf); !bytes.Equal(buf[:n], fatal) || err != nil || held(c) {
			t.Fatalf("pgconn read %q, %v", buf[:n], err)
		}
	})

	t.Run("a record still arriving", func(t *testing.T) {
		c, srv, dc, gate := tlsPair(t)
		gate.k, gate.armed = 3, true // the record's header, not its body
		wrote := make(chan error, 1)
		go func() { _, err := srv.Write(fatal); wrote <- err }()
		waitWaiting(t, c.ahead.waiting)
		if c.MarkCommit(true) || c.ahead.state() != aheadEmpty || held(c) {
			t.Fatalf("a record cut short was judged or held: state %d", c.ahead.state())
		}
		if d, sets := dc.readDeadline(); sets != 2 || !d.IsZero() {
			t.Fatalf("read deadline %v after %d sets: not cleared", d, sets)
		}
		close(gate.release)
		if err := <-wrote; err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAtLeast(c, buf, len(fatal))
		if err != nil || !bytes.Equal(buf[:got], fatal) {
			t.Fatalf("after the deadline pgconn read %q, %v", buf[:got], err)
		}
	})

	t.Run("the peer closes after its FATAL", func(t *testing.T) {
		c, srv, _, _ := tlsPair(t)
		if _, err := srv.Write(fatal); err != nil {
			t.Fatal(err)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		waitWaiting(t, c.ahead.waiting)
		if !c.MarkCommit(true) {
			t.Fatal("the FATAL was not seen")
		}
		var got []byte
		for {
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				if err != io.EOF || !bytes.Equal(got, fatal) {
					t.Fatalf("pgconn read %q, %v; want the FATAL, then EOF", got, err)
				}
				break
			}
		}
	})

	t.Run("a filter at work", func(t *testing.T) {
		c, srv, dc, _ := tlsPair(t)
		c.splice.filter = &replyFilter{kind: LibraryCall, commit: true}
		if _, err := srv.Write(fatal); err != nil {
			t.Fatal(err)
		}
		waitWaiting(t, c.ahead.waiting)
		if c.MarkCommit(true) || c.ahead.state() != aheadEmpty {
			t.Fatal("read ahead under a reply filter")
		}
		if _, sets := dc.readDeadline(); sets != 0 {
			t.Fatal("a read deadline set under a reply filter")
		}
	})
}

// TestMarkCommitPlainSocket: on a plain TCP socket a FATAL waiting is peeked at, not
// consumed: pgconn still reads it whole; not asked to judge, MarkCommit does not look.
func TestMarkCommitPlainSocket(t *testing.T) {
	client, server := loopback(t)
	c := NewConn(client, nil, true)
	if c.peek == nil || c.ahead.tls != nil {
		t.Fatal("no peek on a TCP socket")
	}
	if c.MarkCommit(true) {
		t.Fatal("evidence with nothing sent")
	}
	fatal := fatalMsg(t)
	if _, err := server.Write(fatal); err != nil {
		t.Fatal(err)
	}
	waitWaiting(t, c.peek)
	if c.MarkCommit(false) {
		t.Fatal("unjudged (a server not PostgreSQL), the FATAL was judged")
	}
	if !c.MarkCommit(true) || held(c) {
		t.Fatal("the FATAL was not seen, or was consumed")
	}
	got := make([]byte, len(fatal))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, fatal) {
		t.Fatalf("pgconn read %q, %v", got, err)
	}
}
