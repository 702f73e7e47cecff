package pgtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Port is a TCP port on 127.0.0.1 held for one server of a test until Release.
//
// A port the kernel picks (listen on port 0, close) is in its ephemeral range, where the
// source port of any outgoing connection of any process on the machine may take it before
// the server binds it; CI saw a server fail to start so ("could not bind ... Address
// already in use") while other test packages ran beside it. A Port is below that range,
// which the kernel never hands out by itself, and is locked (flock on a file in a
// directory shared by all processes) so that two test processes never pick the same one;
// the lock goes when the process does, however it ends.
type Port struct {
	n    int
	lock *os.File
}

// ReservePort holds a port for a server to listen on: one that nothing listens on now and
// that no other test process holds.
func ReservePort() (*Port, error) {
	dir := filepath.Join(os.TempDir(), "pgtest-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, fmt.Errorf("pgtest: the port lock directory: %w", err)
	}
	// Every user's test processes share the directory: the server programs may run as
	// another user than the test (see serverCredential), and so may another checkout's CI.
	_ = os.Chmod(dir, 0o777|os.ModeSticky)
	lo, hi := portRange()
	n := hi - lo
	start := rand.IntN(n)
	for i := range n {
		port := lo + (start+i)%n
		p, err := tryPort(dir, port)
		if err != nil {
			return nil, err
		}
		if p != nil {
			return p, nil
		}
	}
	return nil, fmt.Errorf("pgtest: no free port in %d-%d on 127.0.0.1", lo, hi-1)
}

// tryPort holds port if no other process holds it and nothing listens on it; nil, nil
// when it is taken.
func tryPort(dir string, port int) (*Port, error) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return nil, nil // another user's lock file we cannot open: theirs
		}
		return nil, fmt.Errorf("pgtest: a port lock file: %w", err)
	}
	_ = f.Chmod(0o666)
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("pgtest: locking a port: %w", err)
	}
	// Something that is not a test process (or one that has died while its server lives
	// on, until its reaper stops it) may listen there.
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		_ = f.Close()
		return nil, nil
	}
	if err := l.Close(); err != nil {
		_ = f.Close()
		return nil, err
	}
	return &Port{n: port, lock: f}, nil
}

// portRange is the ten thousand ports just below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range; 32768 when it cannot be read), above the
// privileged ones.
func portRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 2048 {
				hi = v
			}
		}
	}
	return max(1024, hi-10000), hi
}

// Number is the port's number.
func (p *Port) Number() int { return p.n }

// Addr is "127.0.0.1:port".
func (p *Port) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.n)) }

// Release lets other test processes take the port; call it once the server is stopped.
// It is idempotent.
func (p *Port) Release() error {
	if p == nil || p.lock == nil {
		return nil
	}
	err := p.lock.Close()
	p.lock = nil
	return err
}
