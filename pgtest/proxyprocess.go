package pgtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// proxyProcessEnv carries "target toServer toClient" to a test binary started by
// StartProxyProcess; Main then runs the proxy instead of the tests.
const proxyProcessEnv = "PGTEST_PROXY_PROCESS"

// ProxyProcess is a delaying Proxy (see Proxy.SetDelay) in a child process, so that the
// proxy's CPU time and threads are not the test process's: a benchmark that measures
// its own CPU time per transaction through a simulated network stays exact. The child
// is the test binary itself, which must call Main from TestMain. It is handed this
// process's CA, so TLS through it verifies as through a Proxy.
type ProxyProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	host  string
	port  int
}

// StartProxyProcess starts a child process that forwards every connection to target
// ("host:port") with the given one-way delays, and returns once it listens. Close
// ends it; so does the end of the test process, whose exit closes the child's stdin.
func StartProxyProcess(target string, toServer, toClient time.Duration) (*ProxyProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	a, err := processAuthority()
	if err != nil {
		return nil, err
	}
	ca, err := a.marshal()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", proxyProcessEnv, target, toServer, toClient), authorityEnv+"="+string(ca))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pp := &ProxyProcess{cmd: cmd, stdin: stdin}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err == nil {
		var port string
		pp.host, port, err = net.SplitHostPort(strings.TrimSpace(line))
		if err == nil {
			pp.port, err = strconv.Atoi(port)
		}
	}
	if err != nil {
		_ = pp.Close()
		return nil, fmt.Errorf("pgtest: proxy process did not report its address (does TestMain call pgtest.Main?): %q: %w", line, err)
	}
	return pp, nil
}

// ConnString is like Proxy.ConnString, for the child's proxy.
func (pp *ProxyProcess) ConnString(base string) string { return connStringAt(base, pp.host, pp.port) }

// Close stops the child process (its proxy closes every connection) and waits for it.
func (pp *ProxyProcess) Close() error {
	return errors.Join(pp.stdin.Close(), pp.cmd.Wait())
}

// runProxyProcess is the child's side of StartProxyProcess: if this process is such a
// child, it serves until stdin closes and reports true.
func runProxyProcess() (bool, error) {
	spec, ok := os.LookupEnv(proxyProcessEnv)
	if !ok {
		return false, nil
	}
	var target string
	var toServer, toClient time.Duration
	if _, err := fmt.Sscanf(spec, "%s %d %d", &target, &toServer, &toClient); err != nil {
		return true, fmt.Errorf("%s=%q: %w", proxyProcessEnv, spec, err)
	}
	p, err := NewProxy(target)
	if err != nil {
		return true, err
	}
	p.SetDelay(toServer, toClient)
	fmt.Println(p.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it or exits
	return true, p.Close()
}
