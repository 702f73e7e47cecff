package pgtest

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// checkTransport fails t unless c's transport is what each end should see: pg_stat_ssl's
// ssl for c's backend is serverSSL, and the client speaks TLS or not as clientTLS says.
// A client's TLS must be verified up to the process's CA, with a certificate for
// 127.0.0.1 and localhost only.
func checkTransport(t *testing.T, c *pgx.Conn, serverSSL, clientTLS bool) {
	t.Helper()
	var gotSSL bool
	if err := c.QueryRow(ContextFor(t), "select ssl from pg_stat_ssl where pid = pg_backend_pid()").Scan(&gotSSL); err != nil {
		t.Fatal(err)
	}
	tc, gotTLS := c.PgConn().Conn().(*tls.Conn)
	if gotSSL != serverSSL || gotTLS != clientTLS {
		t.Fatalf("the server says ssl = %v (want %v), the client has TLS: %v (want %v)", gotSSL, serverSSL, gotTLS, clientTLS)
	}
	if !gotTLS {
		return
	}
	st := tc.ConnectionState()
	a, err := processAuthority()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.VerifiedChains) == 0 {
		t.Fatal("TLS without a verified chain: the client did not verify the server")
	}
	chain := st.VerifiedChains[0]
	if root := chain[len(chain)-1]; !root.Equal(a.cert) {
		t.Errorf("chain ends at %q, want the process's CA", root.Subject)
	}
	leaf := st.PeerCertificates[0]
	if len(leaf.IPAddresses) != 1 || leaf.IPAddresses[0].String() != "127.0.0.1" || !slices.Equal(leaf.DNSNames, []string{"localhost"}) {
		t.Errorf("certificate for %v %v, want 127.0.0.1 and localhost", leaf.IPAddresses, leaf.DNSNames)
	}
}

// connect opens a connection for the test; it closes when the test ends.
func connect(t *testing.T, cfg *pgx.ConnConfig) *pgx.Conn {
	t.Helper()
	ctx := ContextFor(t)
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(ctx) })
	return c
}

// parseConfig is pgx.ParseConfig that fails t.
func parseConfig(t *testing.T, connString string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestTLSConnString: the URL verifies against the CA file in the server's directory, and
// a connection made with it is TLS at both ends, verified; ConnString stays plain TCP on
// the same port.
func TestTLSConnString(t *testing.T) {
	LeakCheck(t)
	u, err := url.Parse(srv.TLSConnString())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if q.Get("sslmode") != "verify-full" || filepath.Dir(q.Get("sslrootcert")) != srv.root || u.Port() != strconv.Itoa(srv.Port()) {
		t.Fatalf("TLSConnString %s: want port %d, sslmode=verify-full and an sslrootcert in %s", u, srv.Port(), srv.root)
	}
	pemCA, err := os.ReadFile(q.Get("sslrootcert"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemCA)
	if block == nil {
		t.Fatalf("%s holds no PEM block", q.Get("sslrootcert"))
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil || !ca.IsCA {
		t.Fatalf("sslrootcert: %v, a CA: %v", err, err == nil && ca.IsCA)
	}

	for _, c := range []struct {
		connString string
		tls        bool
	}{{srv.ConnString(), false}, {srv.TLSConnString(), true}} {
		checkTransport(t, connect(t, parseConfig(t, c.connString)), c.tls, c.tls)
	}
}

// TestTLSVerifyFull: verify-full passes for the server's names with the CA (by URL and by
// TLSConfig) and fails with another CA or for another name.
func TestTLSVerifyFull(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	other, err := newAuthority()
	if err != nil {
		t.Fatal(err)
	}
	otherCA := filepath.Join(t.TempDir(), "other-ca.crt")
	if err := os.WriteFile(otherCA, other.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	byHand := func(serverName string) *pgx.ConnConfig {
		cfg := parseConfig(t, srv.ConnString())
		cfg.TLSConfig = srv.TLSConfig()
		if serverName != "" {
			cfg.TLSConfig.ServerName = serverName
		}
		return cfg
	}
	var unknownCA x509.UnknownAuthorityError
	var wrongName x509.HostnameError
	for _, c := range []struct {
		name    string
		cfg     *pgx.ConnConfig
		wantErr any // nil: connects over TLS
	}{
		{"TLSConnString", parseConfig(t, srv.TLSConnString()), nil},
		{"localhost", parseConfig(t, strings.Replace(srv.TLSConnString(), "@127.0.0.1:", "@localhost:", 1)), nil},
		{"TLSConfig", byHand(""), nil},
		{"another CA", parseConfig(t, strings.Replace(srv.TLSConnString(), url.QueryEscape(srv.certs.ca), url.QueryEscape(otherCA), 1)), &unknownCA},
		{"another name", byHand("db.example"), &wrongName},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := pgx.ConnectConfig(ctx, c.cfg)
			if c.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(ctx)
				checkTransport(t, conn, true, true)
				return
			}
			if err == nil {
				conn.Close(ctx)
				t.Fatal("connected")
			}
			if !errors.As(err, c.wantErr) {
				t.Fatalf("error %v, want a %T", err, c.wantErr)
			}
			t.Logf("error: %v", err)
		})
	}
}

// request is the message a client sends to ask for TLS (sslRequestCode) or GSS
// encryption (gssEncRequestCode).
func request(code uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{0, 0, 0, 8}, code)
}

// TestProxyTLS: a TLS client through the proxy verifies the proxy's certificate against
// the server's CA file and reaches the server over TLS; the proxy sees the protocol in
// plain text inside (its recording holds the startup message), and a plain client of the
// same proxy stays plain to the server.
func TestProxyTLS(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	p := ProxyFor(t, srv)
	rec := p.Record()
	for _, tr := range transports {
		c := connectVia(t, ctx, p, tr.connString())
		if got := c.PgConn().Conn().RemoteAddr().String(); got != p.Addr() {
			t.Fatalf("%s: connected to %s, not the proxy %s", tr.name, got, p.Addr())
		}
		checkTransport(t, c, tr.name == "tls", tr.name == "tls")
	}
	// Both conversations start with the startup message and the server's authentication:
	// inside TLS the proxy reads the protocol as on plain TCP.
	convs := rec.Conversations()
	if len(convs) != len(transports) {
		t.Fatalf("%d conversations recorded, want %d", len(convs), len(transports))
	}
	for i, conv := range convs {
		client, server := conv.ClientBytes(), conv.ServerBytes()
		if len(client) < 8 || binary.BigEndian.Uint32(client[4:]) != 3<<16 || !bytes.Contains(client, []byte("user\x00postgres\x00")) || !bytes.HasPrefix(server, []byte("R")) {
			t.Errorf("%s: the recording starts with %.40q, answered %.1q; want a startup message for postgres, answered R", transports[i].name, client, server)
		}
	}
}

// TestProxyTLSRefused: the proxy asks its target for TLS only when a client does, and
// passes the target's refusal on, as it refuses GSS encryption itself: a client that
// requires TLS then fails.
func TestProxyTLSRefused(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	// The target refuses TLS and reads what follows until the proxy closes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	requests := make(chan []byte, 2)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				req := make([]byte, 8)
				if _, err := io.ReadFull(conn, req); err == nil {
					requests <- req
					_, _ = conn.Write([]byte("N"))
					_, _ = io.Copy(io.Discard, conn)
				}
			})
		}
	})
	p, err := NewProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })

	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sslRequest := request(sslRequestCode)
	for _, req := range [][]byte{request(gssEncRequestCode), sslRequest} {
		if _, err := conn.Write(req); err != nil {
			t.Fatal(err)
		}
		answer := make([]byte, 1)
		if _, err := io.ReadFull(conn, answer); err != nil || answer[0] != 'N' {
			t.Fatalf("request %x answered %q, %v; want N", req, answer, err)
		}
	}
	if got := <-requests; !bytes.Equal(got, sslRequest) {
		t.Fatalf("the target got %x first, want only the SSLRequest %x", got, sslRequest)
	}

	_, err = pgx.Connect(ctx, p.ConnString(srv.TLSConnString()))
	if err == nil || !strings.Contains(err.Error(), "refused TLS") {
		t.Fatalf("verify-full through a proxy whose target refuses TLS: %v, want the refusal", err)
	}
}

// BenchmarkCertFiles measures what TLS adds to a server's start in this process: a key,
// a certificate signed by the CA (made once per process) and three files.
func BenchmarkCertFiles(b *testing.B) {
	dir := b.TempDir()
	for b.Loop() {
		if _, err := writeCertFiles(dir, nil); err != nil {
			b.Fatal(err)
		}
	}
}
