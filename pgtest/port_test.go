package pgtest

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestReservePort: a reserved port is below the kernel's ephemeral range, no other
// reservation gets it while it is held (another open of its lock, as another process
// makes), one does after Release, and a port something listens on is never reserved.
func TestReservePort(t *testing.T) {
	lo, hi := portRange()
	p, err := ReservePort()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	if p.Number() < lo || p.Number() >= hi {
		t.Fatalf("port %d outside %d-%d", p.Number(), lo, hi-1)
	}
	q, err := ReservePort()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Release()
	if q.Number() == p.Number() {
		t.Fatalf("port %d reserved twice", p.Number())
	}
	dir := filepath.Join(os.TempDir(), "pgtest-ports")
	if again, err := tryPort(dir, p.Number()); err != nil || again != nil {
		t.Fatalf("a held port was reserved again: %v, %v", again, err)
	}
	if err := p.Release(); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	again, err := tryPort(dir, p.Number())
	if err != nil || again == nil {
		t.Fatalf("a released port was not reserved: %v, %v", again, err)
	}
	defer again.Release()

	// Something that is not a test process listens on a port nobody holds.
	var l net.Listener
	for port := lo; port < hi && l == nil; port++ {
		l, _ = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	if l == nil {
		t.Fatal("no port to listen on")
	}
	defer l.Close()
	busy := l.Addr().(*net.TCPAddr).Port
	if got, err := tryPort(dir, busy); err != nil || got != nil {
		t.Fatalf("port %d, which something listens on, was reserved: %v, %v", busy, got, err)
	}
}
