package otelpgxtx

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/txevidence/otelpgxtx/internal/framespan"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// TestOneEndingCloseAndHook: a connection's close, on another goroutine, races the hooks
// of a COMMIT (and of a statement before it) on the real server, both driven at once:
// each frame ends once, through apply, in one order — one terminal phase event, its span
// ended once, counted once, its Verdict told once — whichever wins. Run it with -race.
func TestOneEndingCloseAndHook(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 4)
	table := srv.NewTable(t, ctx, tableColumns)
	const rounds = 40
	outcomes := map[string]int{}
	for i := range rounds {
		pc, err := h.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conn := pc.Hijack() // closed below: the pool must not hand it out again
		vctx, v := NewVerdict(ctx)
		tx, err := conn.Begin(vctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(vctx, fmt.Sprintf("insert into %s (id, k) values (%d, %d)", table, i, i)); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		start := make(chan struct{})
		go func() {
			defer wg.Done()
			<-start
			_ = conn.PgConn().Conn().Close() // the net.Conn: its close notice concludes the frame
		}()
		close(start)
		if i%2 == 0 {
			_, _ = tx.Exec(vctx, "select 1")
		}
		_ = tx.Commit(vctx)
		wg.Wait()
		_ = conn.Close(context.WithoutCancel(ctx))
		res, err := v.Result()
		if err != nil {
			t.Fatalf("round %d: no verdict: %v", i, err)
		}
		outcomes[res.Outcome().String()]++
	}
	fs := h.frames()
	if len(fs) != rounds {
		t.Fatalf("%d frames for %d transactions", len(fs), rounds)
	}
	for _, f := range fs {
		terminal := 0
		for _, e := range f.Events {
			if e.Name == framespan.PhaseEvents[outcome.PhaseCommitted] || e.Name == framespan.PhaseEvents[outcome.PhaseRolledBack] || e.Name == framespan.PhaseEvents[outcome.PhaseUnknown] {
				terminal++
			}
		}
		if terminal != 1 {
			t.Fatalf("frame %s: %d terminal phase events", f.SpanContext.SpanID(), terminal)
		}
	}
	for id, n := range h.ends.ends {
		if n != 1 {
			t.Fatalf("span %v ended %d times", id, n)
		}
	}
	var counted int64
	for _, n := range h.countsByOutcome(t, ctx) {
		counted += n
	}
	if counted != rounds {
		t.Fatalf("%d frames counted for %d transactions", counted, rounds)
	}
	var seen []string
	for o, n := range outcomes {
		seen = append(seen, fmt.Sprintf("%s %d", o, n))
	}
	t.Logf("verdicts: %s", strings.Join(seen, ", "))
}
