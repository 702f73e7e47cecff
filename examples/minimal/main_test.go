package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/pgtest"
)

var srv *pgtest.Server

// The throw-away server has the settings docs/minimal-service.md asks for:
// synchronous_standby_names = 'phantom_standby' and synchronous_commit = local.
func TestMain(m *testing.M) { pgtest.Main(m, &srv) }

// TestMinimal runs the service as docs/minimal-service.md does: once plainly (committed),
// once with -wait-for-standby and its backend terminated in the synchronous-replication
// wait (indeterminate, reconciled committed), and checks that its spans were exported and
// that the shutdown left no goroutine behind.
func TestMinimal(t *testing.T) {
	t.Run("committed", func(t *testing.T) {
		pgtest.LeakCheck(t)
		ctx := pgtest.Context(t, time.Minute)
		var spans, out bytes.Buffer
		if err := run(ctx, srv.ConnString(), false, &spans, &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "committed: order ") {
			t.Errorf("output:\n%s\nwant a committed order", out.String())
		}
		if !strings.Contains(spans.String(), `"Value": "committed"`) {
			t.Errorf("exported spans:\n%s\nwant a frame span with tx.outcome committed", spans.String())
		}
	})
	t.Run("indeterminate", func(t *testing.T) {
		pgtest.LeakCheck(t)
		ctx := pgtest.Context(t, time.Minute)
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
		for _, want := range []string{"COMMIT will wait", "indeterminate: operation ", "reconciled: committed"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output:\n%s\nwant %q", out.String(), want)
			}
		}
		if !strings.Contains(spans.String(), `"Value": "indeterminate"`) {
			t.Errorf("exported spans:\n%s\nwant a frame span with tx.outcome indeterminate", spans.String())
		}
	})
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
