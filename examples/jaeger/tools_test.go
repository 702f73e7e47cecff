package main

// The external programs the end-to-end tests run (Jaeger v2, Prometheus): where the
// scripts cache them, and how a test runs one.

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// toolPath returns the cached program name in the cache directory dir that script
// builds, or the path in the environment variable env. Its absence is a failure, never a
// skip: a skipped end-to-end test passes silently.
func toolPath(t *testing.T, env, script, dir, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	cache := os.Getenv("OTELPGXTX_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				t.Fatal(err)
			}
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "otelpgxtx")
	}
	bin := filepath.Join(cache, dir, name)
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s is missing (%v).\nBuild it once (a few minutes) from the repository root with:\n\n\t%s\n\n"+
			"(`make test` does), which caches it at %s; or set %s to the program. This test does not skip.",
			name, err, script, bin, env)
	}
	return bin
}

// httpGet GETs path?q from the server at addr (host:port) and returns the status and body.
func httpGet(ctx context.Context, client *http.Client, addr, path string, q url.Values) (int, []byte, error) {
	u := "http://" + addr + path
	if q != nil {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// toolProc is a program runTool started.
type toolProc struct {
	name    string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when it has exited; err is then set
	err     error
	logPath string
}

// runTool starts cmd (its output appended to name.log in dir) until the test ends, and
// waits until readyURL answers 200 through client.
func runTool(t *testing.T, name, dir string, cmd *exec.Cmd, client *http.Client, readyURL string) *toolProc {
	t.Helper()
	p := &toolProc{name: name, cmd: cmd, exited: make(chan struct{}), logPath: filepath.Join(dir, name+".log")}
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatal(err)
	}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		client.CloseIdleConnections()
		// Whatever it stores is the test's own: a slow shutdown is not waited for.
		p.stop(syscall.SIGTERM, 3*time.Second)
		if t.Failed() {
			t.Logf("%s log (last lines):\n%s", name, p.logTail())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := client.Get(readyURL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-p.exited:
			t.Fatalf("%s exited before it was ready: %v\n%s", name, p.err, p.logTail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after 60s (last: %v)\n%s", name, err, p.logTail())
		}
	}
}

// stop sends sig and waits for the program to exit, killing it after wait; it returns
// how the program ended. A second call only waits.
func (p *toolProc) stop(sig os.Signal, wait time.Duration) error {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	return p.err
}

func (p *toolProc) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}
