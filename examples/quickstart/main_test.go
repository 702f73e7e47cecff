package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
		admin, err := srv.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // the operator's second terminal
			defer wg.Done()
			terminateInSyncRep(ctx, t, admin)
		}()
		var spans, out bytes.Buffer
		err = run(ctx, srv.ConnString(), true, &spans, &out)
		wg.Wait()
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

// terminateInSyncRep ends the backend that waits for the synchronous standby, as the page's
// psql command does.
func terminateInSyncRep(ctx context.Context, t *testing.T, admin *pgx.Conn) {
	for ctx.Err() == nil {
		var n int
		err := admin.QueryRow(ctx, "select count(pg_terminate_backend(pid)) from pg_stat_activity where wait_event = 'SyncRep'").Scan(&n)
		if err != nil {
			t.Error(err)
			return
		}
		if n > 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
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
