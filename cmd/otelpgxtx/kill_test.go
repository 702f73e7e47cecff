package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// gatedDB is a pool whose queries wait until open is closed, so that automatic
// reconciliation asks nothing before the test has had the lost xids handed out again.
type gatedDB struct {
	*pgxpool.Pool
	open chan struct{}
}

func (g gatedDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	select {
	case <-g.open:
	case <-ctx.Done():
	}
	return g.Pool.QueryRow(ctx, sql, args...)
}

func (g gatedDB) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Pool.BeginTx(ctx, o)
}

// killVictim is one transaction caught by the backend's SIGKILL, and how it ended for
// the application.
type killVictim struct {
	id          int
	marker, run bool
	mode        string // "sync" (in COMMIT's synchronous-replication wait), "trigger" (in a deferred trigger of COMMIT), "idle"
	done        chan killEnded
	finishIdle  func()
	ended       killEnded
}

// killEnded is a victim's result as the application saw it: Run's, or the Verdict's of a
// plain pgx transaction.
type killEnded struct {
	outcome   outcome.Outcome
	op        outcome.OperationID
	retryable bool
	ref       *outcome.ReconciliationRef
	settle    func(context.Context, *reconcile.Reconciler) (reconcile.Answer, error) // nil unless indeterminate
}

func (v *killVictim) name() string {
	how, ref := "plain pgx", "xid"
	if v.run {
		how = "Run"
	}
	if v.marker {
		ref = "marker"
	}
	return fmt.Sprintf("%d %s, %s, %s", v.id, v.mode, how, ref)
}

// endedOf is what a result tells the application.
func endedOf[T any](res outcome.Result[T], err error) killEnded {
	if res == nil {
		return killEnded{outcome: outcome.Outcome(255)}
	}
	e := killEnded{outcome: res.Outcome(), op: res.OperationID()}
	switch r := res.(type) {
	case outcome.DeterminateRollback[T]:
		e.retryable = r.Retryable()
	case outcome.Indeterminate[T]:
		if ref, ok := r.Reference(); ok {
			e.ref = &ref
		}
		e.settle = func(ctx context.Context, rec *reconcile.Reconciler) (reconcile.Answer, error) {
			return reconcile.Indeterminate(ctx, rec, r)
		}
	}
	return e
}

// TestBackendKilled is the report as a test: a backend killed with SIGKILL, as the
// OOM killer does, makes the postmaster replay WAL in place, keeping its start time and
// timeline, and hand out again the xids whose records were lost. One kill catches twelve
// transactions: plain pgx (asked through the Verdict) and Run, with the xid alone and with
// the commit marker, in COMMIT's synchronous-replication wait (committed), in a deferred
// trigger of COMMIT (not committed) and idle in the transaction (not committed). Then
// transactions commit until every lost xid was taken again. Automatic reconciliation,
// reconcile.Indeterminate and this command fed the log records must never answer
// committed for a row that is not there nor aborted for one that is, and with the marker
// each one is settled.
func TestBackendKilled(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	marker := pgx.Identifier{"public", "cli_kill_marker"}
	ddl, err := reconcile.MarkerTableDDL(marker)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Exec(ctx, "drop table if exists cli_kill_marker, cli_kill, cli_kill_reuse; "+ddl+`;
		create table cli_kill (id int primary key); create table cli_kill_reuse (id int primary key);
		create or replace function cli_kill_hold() returns trigger language plpgsql as $$
		begin perform pg_advisory_lock(4244); perform pg_advisory_unlock(4244); return null; end $$;
		create constraint trigger cli_kill_hold after insert on cli_kill deferrable initially deferred
		for each row when (new.id between 100 and 199) execute function cli_kill_hold()`); err != nil {
		t.Fatal(err)
	}
	direct := srv.Pool(t, ctx)
	gate := gatedDB{Pool: direct, open: make(chan struct{})}
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(gate.open) }) }
	defer openGate() // before the tracers close, on a failure too: they wait for their reconcilers
	reconciled := make(chan otelpgxtx.Reconciliation, 16)
	var logs [2]bytes.Buffer
	pools := [2]*pgxpool.Pool{}
	for i, ref := range []otelpgxtx.Option{otelpgxtx.WithCommitReference(), otelpgxtx.WithCommitMarker(marker)} {
		rec, err := reconcile.New(gate, reconcile.WithWait(time.Second, 10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pgxpool.ParseConfig(srv.ConnString())
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 8 // six victims at once
		tracer, err := otelpgxtx.InstrumentPool(cfg, ref, otelpgxtx.WithLogger(slog.New(slog.NewJSONHandler(&logs[i], nil))),
			otelpgxtx.WithAutoReconcile(rec, otelpgxtx.WithRetryBackoff(time.Millisecond, 50*time.Millisecond),
				otelpgxtx.WithOnReconciled(func(r otelpgxtx.Reconciliation) { reconciled <- r })))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tracer.Close(context.Background()) })
		if pools[i], err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pools[i].Close)
	}
	holder, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	if _, err := holder.Exec(ctx, "select pg_advisory_lock(4244)"); err != nil {
		t.Fatal(err)
	}

	// No WAL reaches the disk but by the victims' own commits: the others' records stay in
	// WAL buffers, and the kill loses them.
	release, err := srv.HoldBackgroundWriters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	// The synchronous-replication waits first: flushing their commit records flushes
	// every record before them, and the others' must stay unflushed.
	var victims []*killVictim
	var killed uint32
	for _, mode := range []string{"sync", "trigger", "idle"} {
		base := map[string]int{"sync": 0, "trigger": 100, "idle": 200}[mode]
		for i, kind := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			v := &killVictim{id: base + i + 1, marker: kind[0], run: kind[1], mode: mode, done: make(chan killEnded, 1)}
			victims = append(victims, v)
			pid := startVictim(t, ctx, pools, marker, v)
			switch mode {
			case "sync":
				err = srv.WaitForWaitEvent(ctx, pid, "SyncRep")
			case "trigger":
				err = srv.WaitForWaitEvent(ctx, pid, "advisory")
				killed = pid
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := srv.KillBackend(ctx, killed); err != nil {
		t.Fatal(err)
	}
	lastXID := uint64(0)
	for _, v := range victims {
		if v.finishIdle != nil {
			v.finishIdle()
		}
		v.ended = <-v.done
		if v.ended.ref != nil {
			lastXID = max(lastXID, v.ended.ref.XID)
		}
		t.Logf("%s: %s, reference %v, retryable %v", v.name(), v.ended.outcome, v.ended.ref, v.ended.retryable)
	}
	// Transactions after the recovery take the lost xids again, and commit.
	reuser, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reuser.Close(context.Background())
	for n, xid := 0, uint64(0); xid < lastXID; n++ {
		if n > len(victims) {
			t.Fatalf("%d transactions after the recovery reached xid %d, short of %d", n, xid, lastXID)
		}
		if err := reuser.QueryRow(ctx, "insert into cli_kill_reuse values ($1) returning pg_current_xact_id()::text::bigint", n).Scan(&xid); err != nil {
			t.Fatal(err)
		}
	}
	// A transaction on each tracer after the recovery: its check sees the end-of-recovery
	// checkpoint, logs it once and tells automatic reconciliation. Then a checkpoint
	// overwrites it on the server, and what settles the lost xids is what was kept.
	var recovery reconcile.Recovery
	for i := range pools {
		for range 2 {
			if err := pgx.BeginFunc(ctx, pools[i], func(tx pgx.Tx) error { _, err := tx.Exec(ctx, "select 1"); return err }); err != nil {
				t.Fatal(err)
			}
		}
		seen := recoveryRecords(t, logs[i].String())
		if len(seen) != 1 {
			t.Fatalf("tracer %d logged %d crash recoveries, want 1:\n%s", i, len(seen), logs[i].String())
		}
		recovery = seen[0]
	}
	if err := srv.Exec(ctx, "checkpoint"); err != nil {
		t.Fatal(err)
	}
	blind, err := reconcile.New(direct, reconcile.WithWait(time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range victims {
		if v.ended.ref == nil || v.marker || v.mode == "sync" {
			continue
		}
		// Told nothing, after the checkpoint, a reconciler has the reuser's commit only.
		got, err := blind.Resolve(ctx, *v.ended.ref, trace.SpanContext{})
		if err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonCrashRecovered {
			t.Errorf("%s: told nothing, after the checkpoint: %s %q %v, want unknown/crash_recovered", v.name(), got.Status(), got.Reason(), err)
		}
	}
	openGate()

	// Each answer, from each route, against the rows; the reconciler of
	// reconcile.Indeterminate told of the recovery by the log record.
	rec, err := reconcile.New(direct, reconcile.WithWait(time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rec.Remember(recovery)
	answers := map[outcome.OperationID][]string{} // route: answer
	var indeterminate int
	for _, v := range victims {
		n, err := srv.Count(ctx, "select count(*) from cli_kill where id = $1", v.id)
		if err != nil {
			t.Fatal(err)
		}
		present := n == 1
		if present != (v.mode == "sync") {
			t.Errorf("%s: row present %v", v.name(), present)
		}
		switch {
		case v.mode == "idle" && v.ended.outcome == outcome.OutcomeRolledBack:
			if !v.ended.retryable {
				t.Errorf("%s: a rollback for want of a server that is not retryable", v.name())
			}
			continue
		case v.ended.outcome != outcome.OutcomeIndeterminate:
			t.Errorf("%s: %s, want indeterminate", v.name(), v.ended.outcome)
			continue
		}
		indeterminate++
		if v.mode != "idle" && v.ended.ref == nil {
			t.Errorf("%s: no reference, though the call's reply came before COMMIT stalled", v.name())
		}
		ans, err := v.ended.settle(ctx, rec)
		if err != nil {
			t.Fatalf("%s: %v", v.name(), err)
		}
		answers[v.ended.op] = append(answers[v.ended.op], "reconcile.Indeterminate "+answerText(ans.Status().String(), ans.Reason()))
	}
	for range indeterminate {
		r := <-reconciled
		answers[r.OperationID] = append(answers[r.OperationID], "automatic "+answerText(r.Answer.Status().String(), r.Answer.Reason()))
	}
	var records []string
	for i := range logs {
		for _, line := range strings.Split(logs[i].String(), "\n") {
			if strings.Contains(line, `"tx.phase":"unknown"`) || strings.Contains(line, string(schema.RecoveryKey)) {
				records = append(records, line)
			}
		}
	}
	_, out, _ := cli(t, ctx, strings.Join(records, "\n")+"\n", "reconcile")
	for _, m := range regexp.MustCompile(`operation=([0-9a-f]{32}) resolved=(\w+)(?: reason=(\w+))?`).FindAllStringSubmatch(out, -1) {
		op, err := outcome.ParseOperationID(m[1])
		if err != nil {
			t.Fatal(err)
		}
		answers[op] = append(answers[op], "command "+answerText(m[2], m[3]))
	}
	for _, v := range victims {
		if v.ended.outcome != outcome.OutcomeIndeterminate {
			continue
		}
		want := wantAfterKill(v)
		got := answers[v.ended.op]
		if len(got) != 3 {
			t.Errorf("%s: answers %q, want one from each route", v.name(), got)
		}
		for _, a := range got {
			_, answer, _ := strings.Cut(a, " ")
			if !strings.Contains(" "+want+" ", " "+answer+" ") {
				t.Errorf("%s: %s, want %s", v.name(), a, want)
			}
		}
	}
}

// answerText is a reconciliation answer as one word: the status, and the reason after a
// slash.
func answerText(status, reason string) string {
	if reason == "" {
		return status
	}
	return status + "/" + reason
}

// wantAfterKill is the answers allowed for v after the kill, space-separated: the marker
// settles each; the xid alone, told of the recovery, settles the transactions whose commit
// record it lost (above its next xid) and not the committed ones (their xid's status may be
// a reuser's, after another crash); a COMMIT sent to a killed backend (idle) may bring no
// xid back.
func wantAfterKill(v *killVictim) string {
	switch {
	case v.marker && v.mode == "sync":
		return "committed"
	case v.marker || v.mode == "trigger":
		return "aborted"
	case v.mode == "idle":
		return "aborted unknown/" + reconcile.ReasonNoReference
	}
	return "unknown/" + reconcile.ReasonCrashRecovered
}

// recoveryRecords are the crash recoveries in log, a JSON log's records.
func recoveryRecords(t *testing.T, log string) []reconcile.Recovery {
	t.Helper()
	var out []reconcile.Recovery
	for _, line := range strings.Split(log, "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) != nil || r["msg"] != otelpgxtx.MessageCrashRecovered {
			continue
		}
		s, _ := r[string(schema.RecoveryKey)].(string)
		rec, err := reconcile.ParseRecovery(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rec)
	}
	return out
}

// startVictim begins v on its pool (pools[0] the xid alone, pools[1] the marker),
// inserts its row and, unless it is to stay idle, commits it in the background; it
// returns the backend's PID. An idle one commits when finishIdle is called.
func startVictim(t *testing.T, ctx context.Context, pools [2]*pgxpool.Pool, marker pgx.Identifier, v *killVictim) uint32 {
	t.Helper()
	pool := pools[0]
	if v.marker {
		pool = pools[1]
	}
	setup := "select 1"
	if v.mode == "sync" {
		setup = "set local synchronous_commit = on"
	}
	if v.run {
		p := otelpgxtx.DefaultPolicy()
		p.MaxAttempts = 1
		if v.marker {
			p.CommitMarker = marker
		}
		pids, release := make(chan uint32, 1), make(chan struct{})
		if v.mode == "idle" {
			v.finishIdle = func() { close(release) }
		} else {
			close(release)
		}
		go func() {
			v.done <- endedOf(otelpgxtx.Run(ctx, pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
				_, err := tx.Exec(ctx, setup)
				if err == nil {
					_, err = tx.Exec(ctx, "insert into cli_kill values ($1)", v.id)
				}
				pids <- tx.Conn().PgConn().PID()
				<-release
				return v.id, err
			}), nil)
		}()
		return <-pids
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	vctx, verdict := otelpgxtx.NewVerdict(ctx)
	tx, err := conn.Begin(vctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(vctx, setup); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(vctx, "insert into cli_kill values ($1)", v.id); err != nil {
		t.Fatal(err)
	}
	commit := func() {
		_ = tx.Commit(vctx)
		conn.Release()
		v.done <- endedOf(verdict.Result())
	}
	if v.mode == "idle" {
		v.finishIdle = commit
	} else {
		go commit()
	}
	return conn.Conn().PgConn().PID()
}
