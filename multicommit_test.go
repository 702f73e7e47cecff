package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/verdict"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// Statements, strings and batches that commit more than once, against the real server: a
// procedure or DO block that COMMITs inside, a string or batch with COMMIT in the middle.
// The rows of a ledger without a key decide every expected outcome: one answer never
// covers several transactions, and Retry never applies committed work twice.

// ledger is one test's: a table without a key (a replay shows as a second row), the
// procedures that write to it, and the advisory lock key its faults wait on.
type ledger struct {
	table string
	lock  int64
}

// newLedger makes the ledger table and its procedures on the test server:
//
//	commit_fail(a, b, code): inserts a, COMMITs, inserts b, raises code
//	commit_twice_fail(code): inserts a, COMMITs, inserts b, COMMITs, inserts c, raises code
//	rollback_commit_fail(code): inserts x, ROLLBACKs, inserts a, COMMITs, raises code
//	fail_only(code): inserts a, raises code — no COMMIT inside
//	commit_ok(_): inserts a, COMMITs, inserts b
//	commit_wait(_): inserts a, COMMITs, waits for the test's advisory lock, inserts b
func newLedger(t *testing.T, w *implicitSetup) *ledger {
	t.Helper()
	n := tableSeq.Add(1)
	l := &ledger{table: fmt.Sprintf("ledger_%d_%d", n, time.Now().UnixNano()%1e9), lock: n + 7_000_000}
	ins := func(v string) string { return "insert into " + l.table + " values (" + v + ");" }
	raise := "raise exception using errcode = code, message = 'fails after its commit';"
	for _, ddl := range []string{
		"create table " + l.table + " (tag text not null)",
		"create procedure " + l.table + "_commit_fail(a text, b text, code text) language plpgsql as $$ begin " +
			ins("a") + " commit; " + ins("b") + raise + " end $$",
		"create procedure " + l.table + "_commit_twice_fail(code text) language plpgsql as $$ begin " +
			ins("'a'") + " commit; " + ins("'b'") + " commit; " + ins("'c'") + raise + " end $$",
		"create procedure " + l.table + "_rollback_commit_fail(code text) language plpgsql as $$ begin " +
			ins("'x'") + " rollback; " + ins("'a'") + " commit; " + raise + " end $$",
		"create procedure " + l.table + "_fail_only(code text) language plpgsql as $$ begin " +
			ins("'a'") + raise + " end $$",
		"create procedure " + l.table + "_commit_ok(code text) language plpgsql as $$ begin " +
			ins("'a'") + " commit; " + ins("'b'") + " end $$",
		fmt.Sprintf("create procedure %s_commit_wait(code text) language plpgsql as $$ begin %s commit; perform pg_advisory_xact_lock(%d); %s end $$",
			l.table, ins("'a'"), l.lock, ins("'b'")),
	} {
		if err := srv.Exec(w.ctx, ddl); err != nil {
			t.Fatalf("%s: %v", ddl, err)
		}
	}
	return l
}

// rows is the ledger's tags, sorted: "a a b" after a replay of a and b.
func (l *ledger) rows(t *testing.T, w *implicitSetup) string {
	t.Helper()
	c, err := srv.Conn(w.ctx)
	mustOK(t, err)
	defer c.Close(context.WithoutCancel(w.ctx))
	r, err := c.Query(w.ctx, "select tag from "+l.table+" order by tag")
	mustOK(t, err)
	tags, err := pgx.CollectRows(r, pgx.RowTo[string])
	mustOK(t, err)
	return strings.Join(tags, " ")
}

// sql is s with {L} the ledger's table and {LOCK} its lock key.
func (l *ledger) sql(s string) string {
	return strings.NewReplacer("{L}", l.table, "{LOCK}", fmt.Sprint(l.lock)).Replace(s)
}

// holdLock takes l's advisory lock on a connection of its own until the returned release.
func (l *ledger) holdLock(t *testing.T, w *implicitSetup) (release func()) {
	t.Helper()
	c, err := srv.Conn(w.ctx)
	mustOK(t, err)
	_, err = c.Exec(w.ctx, "select pg_advisory_lock($1)", l.lock)
	mustOK(t, err)
	return func() { _ = c.Close(context.WithoutCancel(w.ctx)) }
}

// multiCase is one statement, string or batch that may commit more than once, sent on the
// pool with the context given; want is the Verdict's outcome and rows the ledger after one
// attempt; reason is the last frame's error.type, "" to leave it unread.
type multiCase struct {
	name   string
	send   func(ctx context.Context, w *implicitSetup, l *ledger) error
	want   outcome.Outcome
	rows   string
	frames []string // every frame's tx.outcome, in start order
	reason string
	// on, if set, is the outcome with the references on (xid, marker), where the lxid read
	// proves what the error alone cannot: then the one frame has it, and reason is not read.
	on outcome.Outcome
	// fault, if set, runs while the statement is on its way, after its inner commit: the
	// ledger's lock is held until it returns.
	fault func(t *testing.T, w *implicitSetup, pid uint32)
	// arm, if set, arms a fault of the proxy before the statement is sent.
	arm func(w *implicitSetup)
}

// execArgs is pool.Exec of sql with args in query mode m.
func execArgs(m pgx.QueryExecMode, sql string, args ...any) func(ctx context.Context, w *implicitSetup, l *ledger) error {
	return func(ctx context.Context, w *implicitSetup, l *ledger) error {
		_, err := w.h.pool.Exec(ctx, l.sql(sql), append([]any{m}, args...)...)
		return err
	}
}

// batch is pool.SendBatch of sqls, in the default query mode.
func batch(sqls ...string) func(ctx context.Context, w *implicitSetup, l *ledger) error {
	return func(ctx context.Context, w *implicitSetup, l *ledger) error {
		b := &pgx.Batch{}
		for _, s := range sqls {
			b.Queue(l.sql(s))
		}
		return w.h.pool.SendBatch(ctx, b).Close()
	}
}

var (
	cwpcf         = outcome.OutcomeCommittedWithPostCommitFailure
	indeterminate = outcome.OutcomeIndeterminate
	committed     = outcome.OutcomeCommitted
	rolledBack    = outcome.OutcomeRolledBack
)

// terminateInLock terminates the backend pid once it waits for the ledger's lock, after
// its inner commit.
func terminateInLock(t *testing.T, w *implicitSetup, pid uint32) {
	mustOK(t, srv.WaitForWaitEvent(w.ctx, pid, "advisory"))
	mustOK(t, srv.Terminate(w.ctx, pid))
}

// killInLock SIGKILLs the backend pid once it waits for the ledger's lock, after its inner
// commit: the postmaster recovers in place (same start time, same timeline).
func killInLock(t *testing.T, w *implicitSetup, pid uint32) {
	mustOK(t, srv.WaitForWaitEvent(w.ctx, pid, "advisory"))
	mustOK(t, srv.KillBackend(w.ctx, pid))
}

// stopInLock stops the server immediately once the backend pid waits for the ledger's
// lock, after its inner commit, and starts it again: crash recovery under a new postmaster
// (a new start time, the same timeline), where killInLock's recovers under the same one.
func stopInLock(t *testing.T, w *implicitSetup, pid uint32) {
	mustOK(t, srv.WaitForWaitEvent(w.ctx, pid, "advisory"))
	mustOK(t, srv.StopImmediate())
	mustOK(t, srv.Restart(w.ctx))
}

// cutAfterNotice cuts the connection at the proxy once the backend pid waits for the
// ledger's lock and the client has read the notice the statement raised before it: what
// the server flushed with the notice has reached pgconn, not just the proxy, which drops
// what it holds when it cuts.
func cutAfterNotice(t *testing.T, w *implicitSetup, pid uint32) {
	mustOK(t, srv.WaitForWaitEvent(w.ctx, pid, "advisory"))
	select {
	case <-w.notices:
	case <-w.ctx.Done():
		t.Fatalf("no notice reached the client: %v", w.ctx.Err())
	}
	w.proxy.CutAll()
}

// cutInLock cuts the connection at the proxy once the backend pid waits for the ledger's
// lock, after its inner commit.
func cutInLock(t *testing.T, w *implicitSetup, pid uint32) {
	mustOK(t, srv.WaitForWaitEvent(w.ctx, pid, "advisory"))
	w.proxy.CutAll()
}

var multiCases = []multiCase{
	{name: "call: commit, then 40001 (extended)", send: execArgs(pgx.QueryExecModeCacheStatement, "call {L}_commit_fail($1, $2, '40001')", "a", "b"),
		want: indeterminate, rows: "a", frames: []string{"indeterminate"}, reason: "may_have_committed_inside"},
	{name: "call: commit, then 40001 (simple protocol)", send: execArgs(pgx.QueryExecModeSimpleProtocol, "call {L}_commit_fail($1, $2, '40001')", "a", "b"),
		want: indeterminate, rows: "a", frames: []string{"indeterminate"}, reason: "may_have_committed_inside"},
	{name: "call: commit, then 23505 (database/sql)", send: func(ctx context.Context, w *implicitSetup, l *ledger) error {
		_, err := w.db.ExecContext(ctx, "call "+l.table+"_commit_fail($1, $2, '23505')", "a", "b")
		return err
	}, want: indeterminate, rows: "a", frames: []string{"indeterminate"}, reason: "may_have_committed_inside"},
	{name: "call: commit twice, then 40001", send: execArgs(pgx.QueryExecModeExec, "call {L}_commit_twice_fail($1)", "40001"),
		want: indeterminate, rows: "a b", frames: []string{"indeterminate"}, reason: "may_have_committed_inside"},
	{name: "call: rollback, commit, then 40001", send: execArgs(pgx.QueryExecModeDescribeExec, "call {L}_rollback_commit_fail($1)", "40001"),
		want: indeterminate, rows: "a", frames: []string{"indeterminate"}, reason: "may_have_committed_inside"},
	{name: "call: fails with no commit inside", send: execArgs(pgx.QueryExecModeCacheStatement, "call {L}_fail_only($1)", "40001"),
		want: indeterminate, rows: "", frames: []string{"indeterminate"}, reason: "may_have_committed_inside", on: rolledBack},
	{name: "call: fails with no commit inside (simple protocol)", send: execArgs(pgx.QueryExecModeSimpleProtocol, "call {L}_fail_only($1)", "23505"),
		want: indeterminate, rows: "", frames: []string{"indeterminate"}, reason: "may_have_committed_inside", on: rolledBack},
	{name: "do: fails with no commit inside", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"do $$ begin insert into {L} values ('a'); raise exception using errcode = '40001'; end $$"),
		want: indeterminate, rows: "", frames: []string{"indeterminate"}, reason: "may_have_committed_inside", on: rolledBack},
	{name: "call: fails with no commit inside (database/sql)", send: func(ctx context.Context, w *implicitSetup, l *ledger) error {
		_, err := w.db.ExecContext(ctx, "call "+l.table+"_fail_only($1)", "40001")
		return err
	}, want: indeterminate, rows: "", frames: []string{"indeterminate"}, reason: "may_have_committed_inside", on: rolledBack},
	{name: "call: no such procedure (its prepare fails)", send: execArgs(pgx.QueryExecModeCacheStatement, "call {L}_no_such($1)", "40001"),
		want: rolledBack, rows: "", frames: []string{"rolled_back"}},
	{name: "call: commits inside and succeeds", send: execArgs(pgx.QueryExecModeCacheStatement, "call {L}_commit_ok($1)", "x"),
		want: committed, rows: "a b", frames: []string{"committed"}},
	{name: "do: commit, then 40001", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"do $$ begin insert into {L} values ('a'); commit; insert into {L} values ('b'); raise exception using errcode = '40001'; end $$"),
		want: indeterminate, rows: "a", frames: []string{"indeterminate"}, reason: "may_have_committed_inside"},
	{name: "call: terminated after its commit", send: execArgs(pgx.QueryExecModeCacheStatement, "call {L}_commit_wait($1)", "x"), fault: terminateInLock,
		want: indeterminate, rows: "a", frames: []string{"indeterminate"}},
	{name: "call: SIGKILLed after its commit", send: execArgs(pgx.QueryExecModeCacheStatement, "call {L}_commit_wait($1)", "x"), fault: killInLock,
		want: indeterminate, rows: "a", frames: []string{"indeterminate"}},
	{name: "call: server stopped immediately after its commit", send: execArgs(pgx.QueryExecModeCacheStatement, "call {L}_commit_wait($1)", "x"), fault: stopInLock,
		want: indeterminate, rows: "a", frames: []string{"indeterminate"}},
	{name: "call: cut after its commit", send: execArgs(pgx.QueryExecModeCacheStatement, "call {L}_commit_wait($1)", "x"), fault: cutInLock,
		want: indeterminate, rows: "a b", frames: []string{"indeterminate"}},
	{name: "string: nine commits, then 1/0", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		strings.Repeat("insert into {L} values ('a'); commit; ", 9)+"select 1/0"),
		want: indeterminate, rows: strings.TrimSpace(strings.Repeat("a ", 9)),
		frames: append(slices.Repeat([]string{"committed"}, 8), "indeterminate"), reason: "may_have_committed_inside"}, // more than a reply's splits
	{name: "string: insert, commit, insert, 1/0", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"insert into {L} values ('a'); commit; insert into {L} values ('b'); select 1/0"),
		want: cwpcf, rows: "a", frames: []string{"committed", "rolled_back"}},
	{name: "string: begin, insert, commit, insert, commit, insert, 40001", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"begin; insert into {L} values ('a'); commit; insert into {L} values ('b'); commit; insert into {L} values ('c');"+
			" do $$ begin raise exception using errcode = '40001'; end $$"),
		want: cwpcf, rows: "a b", frames: []string{"committed", "committed", "rolled_back"}},
	{name: "string: insert, commit, then cut", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"insert into {L} values ('a'); commit; select pg_advisory_xact_lock({LOCK}); insert into {L} values ('b')"), fault: cutInLock,
		want: indeterminate, rows: "a b", frames: []string{"indeterminate"}}, // the server flushed nothing before the lock
	{name: "string: insert, commit, then server stopped immediately", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"insert into {L} values ('a'); commit; select pg_advisory_xact_lock({LOCK}); insert into {L} values ('b')"), fault: stopInLock,
		want: indeterminate, rows: "a", frames: []string{"committed", "indeterminate"}}, // the backend's last words (quickdie) flush COMMIT's reply
	{name: "batch: insert, commit, then server stopped immediately", send: batch("insert into {L} values ('a')", "commit", "select pg_advisory_xact_lock({LOCK})", "insert into {L} values ('b')"),
		fault: stopInLock, want: indeterminate, rows: "a", frames: []string{"committed", "indeterminate"}},
	{name: "batch: insert, commit, then SIGKILLed", send: batch("insert into {L} values ('a')", "commit", "select pg_advisory_xact_lock({LOCK})", "insert into {L} values ('b')"),
		fault: killInLock, want: indeterminate, rows: "a", frames: []string{"indeterminate"}}, // nothing flushed: no reply of COMMIT
	{name: "batch: insert, commit, cut, then 1/0", send: batch("insert into {L} values ('a')", "commit", "select pg_advisory_xact_lock({LOCK})", "select 1/0"),
		fault: cutInLock, want: indeterminate, rows: "a", frames: []string{"indeterminate"}},
	{name: "string: insert, commit, insert, cut before the server read it", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"insert into {L} values ('a'); commit; insert into {L} values ('b')"),
		arm: func(w *implicitSetup) { w.proxy.CutBeforeCommit() }, want: indeterminate, rows: "", frames: []string{"indeterminate"}},
	{name: "batch: insert, commit, insert, cut before the server read COMMIT", send: batch("insert into {L} values ('a')", "commit", "insert into {L} values ('b')"),
		arm: func(w *implicitSetup) { w.proxy.CutBeforeCommit() }, want: indeterminate, rows: "", frames: []string{"indeterminate"}},
	{name: "call: cut before the server read it", send: execArgs(pgx.QueryExecModeCacheStatement, "call {L}_commit_ok($1) "+implicitText, "x"),
		arm: func(w *implicitSetup) { w.proxy.CutBeforeCommit() }, want: indeterminate, rows: "", frames: []string{"indeterminate"}},
	{name: "do: cut before the server read it", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"do $$ begin insert into {L} values ('a'); commit; insert into {L} values ('b'); end $$ "+implicitText),
		arm: func(w *implicitSetup) { w.proxy.CutBeforeCommit() }, want: indeterminate, rows: "", frames: []string{"indeterminate"}},
	{name: "string: insert, commit, a notice, then cut", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"insert into {L} values ('a'); commit; do $$ begin raise notice 'flushed'; end $$; select pg_advisory_xact_lock({LOCK}); insert into {L} values ('b')"),
		fault: cutAfterNotice, want: indeterminate, rows: "a b", frames: []string{"committed", "indeterminate"}}, // a notice flushes what came before it
	{name: "string: insert, commit, then terminated", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"insert into {L} values ('a'); commit; select pg_advisory_xact_lock({LOCK}); insert into {L} values ('b')"), fault: terminateInLock,
		want: indeterminate, rows: "a", frames: []string{"committed", "indeterminate"}}, // the FATAL flushes COMMIT's reply before it
	{name: "batch: insert, commit, then terminated", send: batch("insert into {L} values ('a')", "commit", "select pg_advisory_xact_lock({LOCK})", "insert into {L} values ('b')"),
		fault: terminateInLock, want: indeterminate, rows: "a", frames: []string{"committed", "indeterminate"}},
	{name: "string: begin, insert, commit, then terminated", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"begin; insert into {L} values ('a'); commit; select pg_advisory_xact_lock({LOCK}); insert into {L} values ('b')"), fault: terminateInLock,
		want: indeterminate, rows: "a", frames: []string{"committed", "indeterminate"}},
	{name: "string: begin, insert, commit, then cut", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"begin; insert into {L} values ('a'); commit; select pg_advisory_xact_lock({LOCK}); insert into {L} values ('b')"), fault: cutInLock,
		want: indeterminate, rows: "a b", frames: []string{"indeterminate"}},
	{name: "batch: begin, insert, commit, then SIGKILLed", send: batch("begin", "insert into {L} values ('a')", "commit", "select pg_advisory_xact_lock({LOCK})", "insert into {L} values ('b')"),
		fault: killInLock, want: indeterminate, rows: "a", frames: []string{"indeterminate"}},
	{name: "batch: begin, insert, commit, then terminated", send: batch("begin", "insert into {L} values ('a')", "commit", "select pg_advisory_xact_lock({LOCK})", "insert into {L} values ('b')"),
		fault: terminateInLock, want: indeterminate, rows: "a", frames: []string{"committed", "indeterminate"}},
	{name: "batch: begin, insert, commit, then cut", send: batch("begin", "insert into {L} values ('a')", "commit", "select pg_advisory_xact_lock({LOCK})", "insert into {L} values ('b')"),
		fault: cutInLock, want: indeterminate, rows: "a b", frames: []string{"indeterminate"}},
	{name: "batch: begin, insert, commit, then server stopped immediately", send: batch("begin", "insert into {L} values ('a')", "commit", "select pg_advisory_xact_lock({LOCK})", "insert into {L} values ('b')"),
		fault: stopInLock, want: indeterminate, rows: "a", frames: []string{"committed", "indeterminate"}},
	{name: "do: commit, then terminated", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"do $$ begin insert into {L} values ('a'); commit; perform pg_advisory_xact_lock({LOCK}); insert into {L} values ('b'); end $$"),
		fault: terminateInLock, want: indeterminate, rows: "a", frames: []string{"indeterminate"}},
	{name: "do: commit, then SIGKILLed", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"do $$ begin insert into {L} values ('a'); commit; perform pg_advisory_xact_lock({LOCK}); insert into {L} values ('b'); end $$"),
		fault: killInLock, want: indeterminate, rows: "a", frames: []string{"indeterminate"}},
	{name: "do: commit, then server stopped immediately", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"do $$ begin insert into {L} values ('a'); commit; perform pg_advisory_xact_lock({LOCK}); insert into {L} values ('b'); end $$"),
		fault: stopInLock, want: indeterminate, rows: "a", frames: []string{"indeterminate"}},
	{name: "do: commit, then cut", send: execArgs(pgx.QueryExecModeSimpleProtocol,
		"do $$ begin insert into {L} values ('a'); commit; perform pg_advisory_xact_lock({LOCK}); insert into {L} values ('b'); end $$"),
		fault: cutInLock, want: indeterminate, rows: "a b", frames: []string{"indeterminate"}},
	{name: "batch: begin, insert, commit, insert, 1/0", send: batch("begin", "insert into {L} values ('a')", "commit", "insert into {L} values ('b')", "select 1/0"),
		want: cwpcf, rows: "a", frames: []string{"committed", "rolled_back"}},
	{name: "batch: insert, commit, insert, 1/0", send: batch("insert into {L} values ('a')", "commit", "insert into {L} values ('b')", "select 1/0"),
		want: cwpcf, rows: "a", frames: []string{"committed", "rolled_back"}},
	{name: "batch: begin, insert, commit, begin, insert (left open)", send: func(ctx context.Context, w *implicitSetup, l *ledger) error {
		return w.h.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
			b := &pgx.Batch{}
			for _, s := range []string{"begin", "insert into {L} values ('a')", "commit", "begin", "insert into {L} values ('b')"} {
				b.Queue(l.sql(s))
			}
			if err := c.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			_, err := c.Exec(ctx, "rollback")
			return err
		})
	}, want: cwpcf, rows: "a", frames: []string{"committed", "rolled_back"}},
}

// TestCommitsMoreThanOnce: for each case, with the references off, the xid and the marker,
// one attempt's Verdict, the frames' outcomes and the ledger agree: a frame ends at each
// COMMIT the server reported, what followed is a frame of its own, and a statement that
// may commit inside is a proven rollback only where nothing of it ran. Then Retry around
// the same case, on a fresh ledger, applies the committed part once.
func TestCommitsMoreThanOnce(t *testing.T) {
	seen := map[string]int{}
	for _, c := range multiCases {
		for _, mode := range refModes {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				w := newImplicit(t, mode)
				l := newLedger(t, w)
				w.h.exp.Reset()
				if c.on != 0 && mode != "off" {
					c.want, c.frames, c.reason = c.on, []string{c.on.String()}, ""
				}
				res, err := l.attempt(t, w, c, w.ctx)
				rows := l.rows(t, w)
				if rows != c.rows {
					t.Fatalf("ledger %q, want %q (call: %v)", rows, c.rows, err)
				}
				if res.Outcome() != c.want {
					t.Fatalf("verdict %s (%v), want %s; call: %v", res.Outcome(), res, c.want, err)
				}
				wantAgrees(t, res.Outcome(), rows, err)
				got := spanOutcomes(w.h)
				if !slices.Equal(got, c.frames) {
					t.Fatalf("frames %v, want %v", got, c.frames)
				}
				if c.reason != "" {
					fs := outcomeSpans(w.h)
					wantAttr(t, fs[len(fs)-1], "error.type", c.reason)
				}
				refs := wantRefsAgree(t, w.ctx, w.rec, outcomeSpans(w.h), rows)
				if c.want == indeterminate {
					if n := strings.Count(w.logs.String(), MessageIndeterminate); n != 1 {
						t.Fatalf("%d log records, want 1: %s", n, w.logs)
					}
				}
				seen[fmt.Sprintf("%s/%s: %s, rows %q, %d references", c.name, mode, res.Outcome(), rows, refs)]++

				// Retry, with the reconciler, on a fresh ledger: the committed part once.
				mustOK(t, srv.Exec(w.ctx, "truncate "+l.table))
				attempts := 0
				rres, rerr := Retry(w.ctx, 3, func(ctx context.Context) error {
					attempts++
					_, err := l.attempt(t, w, c, ctx)
					return err
				}, WithReconciler(w.rec), WithReconcileWait(time.Second))
				rows = l.rows(t, w)
				if rows != c.rows {
					t.Fatalf("after Retry (%d attempts, %v %v): ledger %q, want %q", attempts, rres, rerr, rows, c.rows)
				}
				if rres == nil {
					t.Fatalf("Retry: no result: %v", rerr)
				}
				wantAgrees(t, rres.Outcome(), rows, rerr)
			})
		}
	}
	for k, n := range seen {
		t.Logf("%s: %d", k, n)
	}
}

// attempt runs c once on w's pool with a Verdict in ctx, its fault (if any) while it is
// on its way, and returns the Verdict's answer and the call's error.
func (l *ledger) attempt(t *testing.T, w *implicitSetup, c multiCase, ctx context.Context) (outcome.Result[struct{}], error) {
	t.Helper()
	ctx, root := rootSpan(ctx, w.h)
	defer root.End()
	vctx, nv := NewVerdict(ctx)
	answer := nv.Result
	if st := verdict.From(ctx); st != nil {
		vctx, answer = ctx, st.Answer // Retry's attempt: its own Verdict
	}
	pid := w.pid(t)
	var release func()
	if c.fault != nil {
		release = l.holdLock(t, w)
	}
	if c.arm != nil {
		c.arm(w)
	}
	send := c.send
	done := make(chan error, 1)
	go func() {
		lc := *l
		done <- send(vctx, w, &lc)
	}()
	if c.fault != nil {
		c.fault(t, w, pid)
		release()
		mustOK(t, srv.WaitBackendGone(w.ctx, pid))
	}
	err := <-done
	res, verr := answer()
	if verr != nil {
		t.Fatalf("verdict: %v (call: %v)", verr, err)
	}
	return res, err
}

// wantAgrees fails unless the outcome o agrees with the ledger's rows after a call that
// returned err: nothing there is never committed, something there is never a rollback,
// and a call that failed after committing is never plain committed.
func wantAgrees(t *testing.T, o outcome.Outcome, rows string, err error) {
	t.Helper()
	switch {
	case rows == "" && (o == committed || o == cwpcf):
		t.Fatalf("%s, and the ledger is empty", o)
	case rows != "" && o == rolledBack && !strings.Contains(fmt.Sprint(err), "rollback"):
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || err == nil {
			t.Fatalf("%s, and the ledger holds %q", o, rows)
		}
		t.Fatalf("%s (%v), and the ledger holds %q", o, err, rows)
	case err != nil && o == committed:
		t.Fatalf("committed, and the call failed: %v", err)
	}
}

// wantRefsAgree fails unless what rec answers for each reference the frames of one call
// carry (spans, in start order) agrees with the ledger's rows after it: a frame answered
// aborted is no committed one, nor the first (whose transaction holds the call's first
// write, so that rows are empty), and a frame answered committed leaves rows. It returns
// how many frames carried one.
func wantRefsAgree(t *testing.T, ctx context.Context, rec *reconcile.Reconciler, spans []tracetest.SpanStub, rows string) int {
	t.Helper()
	n := 0
	for i, s := range spans {
		ref, ok := refOf(t, s)
		if !ok {
			continue
		}
		n++
		o, _ := attr(s, OutcomeKey)
		got, err := rec.Resolve(ctx, ref, trace.SpanContext{})
		mustOK(t, err)
		switch {
		case got.Status() == reconcile.Aborted && (o.AsString() == "committed" || o.AsString() == cwpcf.String()):
			t.Fatalf("frame %d (%s) reconciled aborted", i, o.AsString())
		case got.Status() == reconcile.Aborted && i == 0 && rows != "":
			t.Fatalf("the first frame (%s) reconciled aborted, and the ledger holds %q", o.AsString(), rows)
		case got.Status() == reconcile.Committed && rows == "":
			t.Fatalf("frame %d (%s) reconciled committed, and the ledger is empty", i, o.AsString())
		}
	}
	return n
}

// outcomeSpans are the spans that carry a frame's tx.outcome (frame spans, and the
// statement spans of implicit frames), in start order.
func outcomeSpans(h *harness) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range h.exp.GetSpans() {
		if _, ok := attr(s, OutcomeKey); ok {
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].StartTime.Before(out[j].StartTime) })
	return out
}

// spanOutcomes are the tx.outcome of outcomeSpans.
func spanOutcomes(h *harness) []string {
	var out []string
	for _, s := range outcomeSpans(h) {
		v, _ := attr(s, OutcomeKey)
		out = append(out, v.AsString())
	}
	return out
}

// TestRunRefusesCommitInside: Run's transaction is a block, in which a procedure cannot
// COMMIT: PostgreSQL answers 2D000 (invalid transaction termination), the transaction
// rolls back whole, and the ledger holds nothing — Run's answer is one transaction's.
func TestRunRefusesCommitInside(t *testing.T) {
	w := newImplicit(t, "off")
	l := newLedger(t, w)
	res := Run(w.ctx, w.h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
		_, err := tx.Exec(ctx, "call "+l.table+"_commit_ok($1)", "x")
		return struct{}{}, err
	})
	r, ok := res.(outcome.DeterminateRollback[struct{}])
	var pgErr *pgconn.PgError
	if !ok || !errors.As(r.Cause(), &pgErr) || pgErr.Code != "2D000" || r.Retryable() {
		t.Fatalf("%T %v, want a rollback for 2D000, not retryable", res, res)
	}
	if rows := l.rows(t, w); rows != "" {
		t.Fatalf("ledger %q, want nothing", rows)
	}
}

// TestCommitsMoreThanOnceFailover: a procedure, a simple-protocol string and a batch
// that COMMIT inside, then wait for a lock, while the primary crashes and its synchronous
// standby is promoted (pgtest's Cluster). The inner commit was replicated before it
// answered, so the new primary has a and never b; the call is indeterminate, with the
// references off, the xid and the marker; a frame whose COMMIT the client saw answered
// (the string's and the batch's: the crashing backend flushes what it had buffered) is
// committed, the rest indeterminate, and no reference a frame carries is reconciled
// committed (b is not there) — nor anything the call's frames say contradicted by a.
func TestCommitsMoreThanOnceFailover(t *testing.T) {
	const proc = "create procedure ledger_commit_wait() language plpgsql as $$ begin insert into ledger values ('a'); commit; perform pg_advisory_xact_lock(42); insert into ledger values ('b'); end $$"
	cases := []struct {
		name   string
		send   func(ctx context.Context, h *harness) error
		frames []string
	}{
		{"call", func(ctx context.Context, h *harness) error {
			_, err := h.pool.Exec(ctx, "call ledger_commit_wait()", pgx.QueryExecModeCacheStatement)
			return err
		}, []string{"indeterminate"}},
		{"string", func(ctx context.Context, h *harness) error {
			_, err := h.pool.Exec(ctx, "insert into ledger values ('a'); commit; select pg_advisory_xact_lock(42); insert into ledger values ('b')", pgx.QueryExecModeSimpleProtocol)
			return err
		}, []string{"committed", "indeterminate"}},
		{"batch", func(ctx context.Context, h *harness) error {
			b := &pgx.Batch{}
			for _, s := range []string{"insert into ledger values ('a')", "commit", "select pg_advisory_xact_lock(42)", "insert into ledger values ('b')"} {
				b.Queue(s)
			}
			return h.pool.SendBatch(ctx, b).Close()
		}, []string{"committed", "indeterminate"}},
		{"do", func(ctx context.Context, h *harness) error {
			_, err := h.pool.Exec(ctx, "do $$ begin insert into ledger values ('a'); commit; perform pg_advisory_xact_lock(42); insert into ledger values ('b'); end $$",
				pgx.QueryExecModeSimpleProtocol)
			return err
		}, []string{"indeterminate"}},
		{"string with BEGIN", func(ctx context.Context, h *harness) error {
			_, err := h.pool.Exec(ctx, "begin; insert into ledger values ('a'); commit; select pg_advisory_xact_lock(42); insert into ledger values ('b')", pgx.QueryExecModeSimpleProtocol)
			return err
		}, []string{"committed", "indeterminate"}},
	}
	for _, mode := range refModes {
		t.Run(mode, func(t *testing.T) {
			ctx := pgtest.ContextFor(t)
			c := startCluster(t, ctx)
			mustOK(t, c.Primary().Exec(ctx, "create table ledger (tag text not null)"))
			mustOK(t, c.Primary().Exec(ctx, proc))
			var opts []Option
			switch mode {
			case "xid":
				opts = append(opts, WithCommitReference())
			case "marker":
				marker := pgx.Identifier{"public", "multicommit_failover_marker"}
				ddl, err := reconcile.MarkerTableDDL(marker)
				mustOK(t, err)
				mustOK(t, c.Primary().Exec(ctx, ddl))
				opts = append(opts, WithCommitMarker(marker))
			}
			for i, tc := range cases {
				if i > 0 { // the old primary back, as the new one's synchronous standby
					mustOK(t, c.Rejoin(ctx))
					mustOK(t, c.Primary().Exec(ctx, "truncate ledger"))
				}
				h := newHarness(t, c.ConnString(), 1, opts...)
				if _, err := h.pool.Exec(ctx, "update ledger set tag = tag where tag = $1", "-"); err != nil { // the connection's check of what references need
					t.Fatal(err)
				}
				holder, err := c.Primary().Conn(ctx)
				mustOK(t, err)
				_, err = holder.Exec(ctx, "select pg_advisory_lock(42)")
				mustOK(t, err)
				var pid uint32
				withConn(t, ctx, h, func(c *pgx.Conn) { pid = c.PgConn().PID() })
				h.exp.Reset()
				rctx, root := rootSpan(ctx, h)
				vctx, v := NewVerdict(rctx)
				done := make(chan error, 1)
				go func() { done <- tc.send(vctx, h) }()
				mustOK(t, c.Primary().WaitForWaitEvent(ctx, pid, "advisory"))
				mustOK(t, c.Promote(ctx))
				_ = holder.Close(context.WithoutCancel(ctx))
				err = <-done
				root.End()
				if err == nil {
					t.Fatalf("%s: answered though its primary crashed", tc.name)
				}
				res, verr := v.Result()
				mustOK(t, verr)
				if res.Outcome() != indeterminate {
					t.Fatalf("%s: verdict %s, want indeterminate (call: %v)", tc.name, res.Outcome(), err)
				}
				conn, err := pgx.Connect(ctx, c.ConnString())
				mustOK(t, err)
				var rows string
				mustOK(t, conn.QueryRow(ctx, "select coalesce(string_agg(tag, ' ' order by tag), '') from ledger").Scan(&rows))
				_ = conn.Close(ctx)
				if rows != "a" {
					t.Fatalf("%s: the new primary's ledger %q, want %q", tc.name, rows, "a")
				}
				wantAgrees(t, res.Outcome(), rows, err)
				if got := spanOutcomes(h); !slices.Equal(got, tc.frames) {
					t.Fatalf("%s: frames %v, want %v", tc.name, got, tc.frames)
				}
				refs := wantRefsAgree(t, ctx, clusterReconciler(t, ctx, c), outcomeSpans(h), rows)
				t.Logf("%s/%s: indeterminate, rows %q, frames %v, %d with a reference", tc.name, mode, rows, tc.frames, refs)
			}
		})
	}
}
