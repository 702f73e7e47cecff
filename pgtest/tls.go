package pgtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// authority is the certificate authority of this process: it signs the certificate of
// every Server, Proxy and PgBouncer the process starts, so that one CA file verifies
// any of them (both nodes of a Cluster, a server and the proxy in front of it). Its key
// is never written anywhere.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte // cert, PEM-encoded: the content of every CA file
	pool *x509.CertPool
}

// certLifetime outlives any test run; the certificates are made anew by every process.
const certLifetime = 7 * 24 * time.Hour

// authorityEnv hands the parent's authority to a child started by StartProxyProcess, so
// that its proxy's certificates verify against the parent servers' CA file.
const authorityEnv = "PGTEST_AUTHORITY"

// processAuthority returns the process's authority, made (or taken from authorityEnv)
// the first time it is asked for.
var processAuthority = sync.OnceValues(func() (*authority, error) {
	if s, ok := os.LookupEnv(authorityEnv); ok {
		return parseAuthority([]byte(s))
	}
	return newAuthority()
})

// newAuthority makes a self-signed CA with an ECDSA P-256 key.
func newAuthority() (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "pgtest CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(certLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pgtest: making the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return authorityOf(cert, key), nil
}

// authorityOf completes an authority from its certificate and key.
func authorityOf(cert *x509.Certificate, key *ecdsa.PrivateKey) *authority {
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &authority{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), pool: pool}
}

// marshal returns a's certificate and key in PEM, for parseAuthority.
func (a *authority) marshal() ([]byte, error) {
	key, err := x509.MarshalPKCS8PrivateKey(a.key)
	if err != nil {
		return nil, err
	}
	return append(append([]byte(nil), a.pem...), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})...), nil
}

// parseAuthority is the authority that marshal wrote.
func parseAuthority(b []byte) (*authority, error) {
	certBlock, rest := pem.Decode(b)
	keyBlock, _ := pem.Decode(rest)
	if certBlock == nil || keyBlock == nil {
		return nil, errors.New("pgtest: the CA handed down lacks a certificate or a key")
	}
	cert, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, err
	}
	ecKey, ok := key.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pgtest: the CA handed down has a %T key, want ECDSA", key)
	}
	return authorityOf(cert, ecKey), nil
}

// issue makes a key and a certificate signed by a for a server on 127.0.0.1 that
// clients may also call localhost.
func (a *authority) issue() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost"},
		NotBefore:   now.Add(-time.Minute),
		NotAfter:    now.Add(certLifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pgtest: making a server certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// certFiles are the paths of a server's TLS files.
type certFiles struct {
	ca   string // the CA certificate, for clients' sslrootcert
	cert string // the server certificate
	key  string // its private key
}

// writeCertFiles issues a certificate and writes it, its key and the CA certificate into
// dir, owned by cred if it is not nil: PostgreSQL refuses a key file that another user
// owns or that others may read.
func writeCertFiles(dir string, cred *syscall.Credential) (certFiles, error) {
	a, err := processAuthority()
	if err != nil {
		return certFiles{}, err
	}
	c, err := a.issue()
	if err != nil {
		return certFiles{}, err
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		return certFiles{}, err
	}
	f := certFiles{ca: filepath.Join(dir, "ca.crt"), cert: filepath.Join(dir, "server.crt"), key: filepath.Join(dir, "server.key")}
	for _, w := range []struct {
		path string
		data []byte
	}{
		{f.ca, a.pem},
		{f.cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})},
		{f.key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})},
	} {
		if err := os.WriteFile(w.path, w.data, 0o600); err != nil {
			return certFiles{}, err
		}
		if cred != nil {
			if err := os.Chown(w.path, int(cred.Uid), int(cred.Gid)); err != nil {
				return certFiles{}, err
			}
		}
	}
	return f, nil
}

// tlsQuery is the query of a URL that connects over TLS and verifies the server as
// verify-full does: signed by the CA in caFile, and for the host named.
func tlsQuery(caFile string) string {
	return "sslmode=verify-full&sslrootcert=" + url.QueryEscape(caFile)
}

// clientConfig verifies a server of this process for host, as sslmode=verify-full does.
func (a *authority) clientConfig(host string) *tls.Config {
	return &tls.Config{RootCAs: a.pool, ServerName: host}
}
