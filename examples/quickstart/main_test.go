package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txevidence/otelpgxtx/pgtest"
)

var srv *pgtest.Server

// The throw-away server has the settings docs/quickstart.md asks for:
// synchronous_standby_names = 'phantom_standby' and synchronous_commit = local.
func TestMain(m *testing.M) { pgtest.Main(m, &srv) }

// TestQuickstart runs the program as docs/quickstart.md does: once plainly (transferred),
// once with -wait-for-standby and its backend terminated in the synchronous-replication
// wait (the commit indeterminate, settled committed by Retry's reconciler, not replayed).
// Each run moves the money exactly once; its spans were exported; the shutdown left no
// goroutine behind.
func TestQuickstart(t *testing.T) {
	t.Run("committed", func(t *testing.T) {
		pgtest.LeakCheck(t)
		ctx := pgtest.Context(t, time.Minute)
		before := balance(t, ctx)
		var spans, out bytes.Buffer
		if err := run(ctx, srv.ConnString(), false, &spans, &out); err != nil {
			t.Fatal(err)
		}
		// The page: "It prints `transferred` on standard error".
		if got := shape(out.String()); got != "transferred" {
			t.Errorf("output:\n%s\nwant transferred, as the page shows", out.String())
		}
		if !strings.Contains(spans.String(), `"Value": "committed"`) {
			t.Errorf("exported spans:\n%s\nwant a frame span with tx.outcome committed", spans.String())
		}
		if moved := before - balance(t, ctx); moved != 10 {
			t.Errorf("moved %d, want 10: once", moved)
		}
	})
	t.Run("indeterminate", func(t *testing.T) {
		pgtest.LeakCheck(t)
		ctx := pgtest.Context(t, time.Minute)
		before := balance(t, ctx)
		pids := make(chan uint32, 1)
		ran := make(chan struct{})
		terminated := make(chan error, 1)
		go func() { // the operator's second terminal
			select {
			case pid := <-pids:
				terminated <- srv.TerminateInSyncRep(ctx, pid)
			case <-ran: // it printed no backend to end
				terminated <- nil
			}
		}()
		var spans, out bytes.Buffer
		err := run(ctx, srv.ConnString(), true, &spans, pidReader{w: &out, pids: pids})
		close(ran)
		if err := <-terminated; err != nil {
			t.Error(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		// What it printed is what docs/quickstart.md shows, but for what differs between
		// runs (numbers).
		if got, want := shape(out.String()), shape(docSample(t)); got != want {
			t.Errorf("output, in shape:\n%s\nthe page shows, in shape:\n%s", got, want)
		}
		if !strings.Contains(spans.String(), `"Value": "indeterminate"`) {
			t.Errorf("exported spans:\n%s\nwant a frame span with tx.outcome indeterminate", spans.String())
		}
		if moved := before - balance(t, ctx); moved != 10 {
			t.Errorf("moved %d, want 10: once, and not replayed", moved)
		}
	})
}

// balance is the first account's balance (100 before the first run).
func balance(t *testing.T, ctx context.Context) int {
	t.Helper()
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var b int
	err = conn.QueryRow(ctx, "select coalesce((select balance from quickstart_accounts where id = 1), 100)").Scan(&b)
	if err != nil && strings.Contains(err.Error(), "does not exist") {
		return 100
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// terminateCommand is the command the program prints for the operator to end the backend
// whose COMMIT waits for the synchronous standby.
var terminateCommand = regexp.MustCompile(`select pg_terminate_backend\(([0-9]+)\)`)

// pidReader is the program's out for the test: it writes to w, and reads the backend's
// pid from the terminate command as the page's operator does, so that the test ends that
// backend, and no other, in its synchronous-replication wait.
type pidReader struct {
	w    io.Writer
	pids chan<- uint32 // the pid of the first command printed
}

// Write sends on pids the pid of the terminate command in p, the first time one is
// written, and writes p to w. fmt.Fprintf writes each line in one Write, so a command is
// never split between two.
func (r pidReader) Write(p []byte) (int, error) {
	if m := terminateCommand.FindSubmatch(p); m != nil {
		if pid, err := strconv.ParseUint(string(m[1]), 10, 32); err == nil {
			select {
			case r.pids <- uint32(pid):
			default: // one already sent
			}
		}
	}
	return r.w.Write(p)
}

// shapes replace what differs between runs by placeholders, in this order: a reference
// holds numbers, an operation id may start with digits.
var shapes = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`pg:[0-9/]+`), "<reference>"},
	{regexp.MustCompile(`[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+(Z|[+-][0-9]{2}:[0-9]{2})`), "<time>"},
	{regexp.MustCompile(`\b[0-9a-f]{32}\b`), "<id>"},
	{regexp.MustCompile(`\b[0-9a-f]{16}\b`), "<span id>"},
	{regexp.MustCompile(`\b[0-9]+\b`), "<n>"},
}

// shape is text with what differs between runs replaced, and no blank lines at its ends.
func shape(text string) string {
	for _, s := range shapes {
		text = s.re.ReplaceAllString(text, s.with)
	}
	return strings.TrimSpace(text)
}

// docSample is the output docs/quickstart.md shows for the indeterminate run: the block
// after the one that ends in cat app.log.
func docSample(t *testing.T) string {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "quickstart.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)cat app.log\n```\n\n```\n(.*?)```").FindStringSubmatch(string(page))
	if m == nil {
		t.Fatal("docs/quickstart.md has no output block after cat app.log")
	}
	// The library's log record goes to slog's default logger, not to run's out.
	return regexp.MustCompile(`(?m)^[0-9]{4}/[0-9]{2}/[0-9]{2} .* WARN .*\n`).ReplaceAllString(m[1], "")
}
