package otelpgxtx

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestMultiStatementCommit: a transaction written as multi-statement queries, as
// migration tools write it, its connection cut (a real TCP proxy) as COMMIT passes. A
// COMMIT among other statements of one string cannot carry a reference without going
// between the application's statements: the indeterminate frame has none, and says so
// (tx.reconciliation.no_reference=multi_statement, on the span and in the log record;
// automatic reconciliation answers no_reference), unless the xid read after an earlier
// statement found the xid. A string that opens the transaction and writes
// ("begin; insert …") carries the xid read after it, so that a lone COMMIT cut before
// it still leaves a reference; with the marker, the lone COMMIT carries the marker's call.
// Each reference is settled right against the row.
func TestMultiStatementCommit(t *testing.T) {
	pgtest.LeakCheck(t) // registered first, so it runs after the tracers' Close
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	rec, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithWait(5*time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	type harnessOf struct {
		h       *refHarness
		answers chan Reconciliation
	}
	harnesses := map[bool]harnessOf{}
	for _, marked := range []bool{false, true} {
		answers := make(chan Reconciliation, 1)
		ref := WithCommitReference()
		if marked {
			ref = WithCommitMarker(marker)
		}
		h := newRefHarness(t, srv.ConnString(), ref, withAutoReconcile(t, srv.Pool(t, ctx), WithOnReconciled(func(r Reconciliation) { answers <- r }),
			WithRetryBackoff(10*time.Millisecond, 100*time.Millisecond)))
		harnesses[marked] = harnessOf{h, answers}
	}
	for _, hs := range harnesses { // after both harnesses' own leak checks, so that they run first
		t.Cleanup(func() { _ = hs.h.tracer.Close(context.Background()) })
	}
	for i, c := range []struct {
		name      string
		marked    bool
		stmts     []string // %[1]s the table, %[2]d the row's id
		after     bool     // cut after COMMIT (else before it)
		wantRef   bool
		committed bool
	}{
		{"begin; insert; commit", false, []string{"begin; insert into %[1]s (id) values (%[2]d); commit"}, true, false, true},
		{"begin; insert; commit, marker", true, []string{"begin; insert into %[1]s (id) values (%[2]d); commit"}, true, false, true},
		{"begin, then insert; commit", false, []string{"begin", "insert into %[1]s (id) values (%[2]d); commit"}, false, false, false},
		{"begin, then insert; commit, marker", true, []string{"begin", "insert into %[1]s (id) values (%[2]d); commit"}, true, false, true},
		{"begin; insert, then commit, cut before", false, []string{"begin; insert into %[1]s (id) values (%[2]d)", "commit"}, false, true, false},
		{"begin; insert, then commit, cut after", false, []string{"begin; insert into %[1]s (id) values (%[2]d)", "commit"}, true, true, true},
		{"begin; insert, then commit, marker", true, []string{"begin; insert into %[1]s (id) values (%[2]d)", "commit"}, true, true, true},
		{"insert found the xid, then insert; commit", false, []string{"begin", "insert into %[1]s (id) values (%[2]d + 1000)",
			"insert into %[1]s (id) values (%[2]d); commit"}, true, true, true},
	} {
		id := i + 1
		hs := harnesses[c.marked]
		conn, err := hs.h.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The connection's identity check first, in the BEGIN of a transaction of its own.
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, "select 1"); return err }); err != nil {
			t.Fatal(err)
		}
		if c.after {
			hs.h.proxy.CutAfterCommit()
		} else {
			hs.h.proxy.CutBeforeCommit()
		}
		pid := conn.Conn().PgConn().PID()
		for _, s := range c.stmts {
			if strings.Contains(s, "%") {
				s = fmt.Sprintf(s, table, id)
			}
			if _, err = conn.Exec(ctx, s); err != nil {
				break
			}
		}
		conn.Release()
		if err == nil {
			t.Fatalf("%s: the cut connection's COMMIT succeeded", c.name)
		}
		last := lastFrame(t, hs.h.harness)
		if got := attrString(t, last, OutcomeKey); got != "indeterminate" {
			t.Fatalf("%s: %s, want indeterminate (%v)", c.name, got, err)
		}
		ref, ok := refOf(t, last)
		// The cut backend runs what it read, then exits: only then is the row to be read
		// (WaitQuiet can pass before it has run a string sent outside a transaction).
		if err := srv.WaitBackendGone(ctx, pid); err != nil {
			t.Fatal(err)
		}
		present := srv.RowExists(t, ctx, table, id)
		answer := (<-hs.answers).Answer
		committed := c.committed
		if c.marked && c.after && c.wantRef {
			// Automatic reconciliation may fence the marker before the cut backend has run
			// the call ahead of COMMIT: the call then fails, the transaction aborts, and
			// every answer says so. Either way the answers agree with the row.
			committed = answer.Status() == reconcile.Committed
		}
		if present != committed {
			t.Fatalf("%s: row present %v, automatic reconciliation %s", c.name, present, answer.Status())
		}
		if ok != c.wantRef || ok && ref.HasMarker() != c.marked {
			t.Fatalf("%s: reference %v (present %v), want present %v, marker %v", c.name, ref, ok, c.wantRef, c.marked)
		}
		if !ok {
			wantAttr(t, last, string(NoReferenceKey), "multi_statement")
			if !strings.Contains(hs.h.logs.String(), `"`+string(NoReferenceKey)+`":"multi_statement"`) {
				t.Errorf("%s: the log record does not say why there is no reference", c.name)
			}
			if answer.Status() != reconcile.Unknown || answer.Reason() != reconcile.ReasonNoReference {
				t.Errorf("%s: automatic reconciliation %s %q, want unknown no_reference", c.name, answer.Status(), answer.Reason())
			}
			continue
		}
		if _, has := attr(last, NoReferenceKey); has {
			t.Errorf("%s: a frame with a reference says it has none", c.name)
		}
		want := reconcile.Aborted
		if committed {
			want = reconcile.Committed
		}
		res, err := rec.Resolve(ctx, ref, trace.SpanContext{})
		if err != nil || res.Status() != want || answer.Status() != want {
			t.Errorf("%s: reconciled %s %q %v, automatic %s; want %s", c.name, res.Status(), res.Reason(), err, answer.Status(), want)
		}
	}
}
