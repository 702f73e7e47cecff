package otelpgxtx

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// identitySQL is the identity check alone, as a connection's first check ahead of BEGIN
// sends it when no marker is asked for.
var identitySQL, _ = reference.CheckQuery("")

// checkReferences has the tracer check, ahead of a BEGIN on conn, what refs need, as it
// does ahead of the first BEGIN of a frame with those references: it begins a
// transaction with them and rolls it back.
func checkReferences(ctx context.Context, conn *pgx.Conn, refs reference.Refs) error {
	st := frame.State(conn.PgConn())
	st.Refs.Running(refs)
	tx, err := conn.Begin(ctx)
	st.Refs.Ran()
	if err != nil {
		return err
	}
	return tx.Rollback(ctx)
}

// cancelWhileLocked runs fn while an admin transaction holds pg_proc in ACCESS EXCLUSIVE
// mode, so that the first statement of backend pid that reads pg_proc — the library's
// identity read or marker check, which read pg_proc through their function lookups and
// the check's join — waits for that lock; cancels it there with pg_cancel_backend (a real
// 57014, as an operator's or a nemesis's cancel), releases the lock and returns fn's
// error. The admin connection polls pg_stat_activity itself: a new connection could wait
// for the same lock.
func cancelWhileLocked(t *testing.T, ctx context.Context, pid uint32, fn func() error) error {
	t.Helper()
	admin, err := pgx.Connect(ctx, srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "lock table pg_catalog.pg_proc in access exclusive mode"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fn() }()
	for waiting := ""; waiting != "Lock"; {
		select {
		case err := <-done:
			t.Fatalf("returned before it waited for the lock: %v", err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
		// A transaction sees one snapshot of the backends' status until it is cleared.
		if _, err := tx.Exec(ctx, "select pg_catalog.pg_stat_clear_snapshot()"); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, "select coalesce((select wait_event_type from pg_catalog.pg_stat_activity where pid = $1), '')",
			int64(pid)).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	var cancelled bool
	if err := tx.QueryRow(ctx, "select pg_catalog.pg_cancel_backend($1)", int64(pid)).Scan(&cancelled); err != nil || !cancelled {
		t.Fatalf("pg_cancel_backend: %v %v", cancelled, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	return <-done
}

// TestReferenceCheckCancelled: a cancel that hits the library's own check (the cluster
// identity, the marker function) is something that happened to the statement, not the
// server's answer (pg.Transient): the check is asked again, by Run before its next BEGIN
// and by the tracer at the connection's next BEGIN, and the commits after it carry their
// reference with the marker. Before, the cancel's 57014 was kept as the answer, and the
// connection committed without a reference (or without the marker) for the rest of its
// life: the soak's failover run showed two marker-mode Run results without a reference.
func TestReferenceCheckCancelled(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	quoted := marker.Sanitize()

	t.Run("Run", func(t *testing.T) {
		table := srv.NewTable(t, ctx, tableColumns)
		conn := instrumentedConn(t, ctx, srv.ConnString())
		st := frame.State(conn.PgConn())
		run := func(id int, p Policy) error {
			if r := Run(ctx, conn, p, insertFn(table, id)); r.Outcome() != outcome.OutcomeCommitted {
				return fmt.Errorf("Run: %T", r)
			}
			return nil
		}
		// The identity check, with the marker's, cancelled ahead of Run's BEGIN.
		if err := cancelWhileLocked(t, ctx, conn.PgConn().PID(), func() error { return run(1, markerPolicy(marker)) }); err != nil {
			t.Fatalf("%v (the cancel hit the library's check, not Run's transaction)", err)
		}
		if st.Refs.Checked() {
			t.Fatal("the cancelled identity check was kept as the answer")
		}
		if err := run(2, DefaultPolicy()); err != nil || !st.Refs.Known() {
			t.Fatalf("asked again: identity %v, %v", st.Refs.Known(), err)
		}
		// The marker check alone, cancelled ahead of the next BEGIN.
		if err := cancelWhileLocked(t, ctx, conn.PgConn().PID(), func() error { return run(3, markerPolicy(marker)) }); err != nil {
			t.Fatal(err)
		}
		if ok, problem := st.Refs.MarkerChecked(quoted); ok {
			t.Fatalf("the cancelled marker check was kept as the answer: %q", problem)
		}
		if err := run(4, markerPolicy(marker)); err != nil {
			t.Fatal(err)
		}
		if ok, problem := st.Refs.MarkerChecked(quoted); !ok || problem != "" {
			t.Fatalf("asked again: marker %v %q", ok, problem)
		}
		if n := srv.CountOf(t, ctx, "select count(*) from "+quoted); n != 1 {
			t.Fatalf("%d marker rows, want 1 (Run's last transaction)", n)
		}
	})

	t.Run("tracer identity check", func(t *testing.T) {
		table := srv.NewTable(t, ctx, tableColumns)
		h := newRefHarness(t, srv.ConnString(), WithCommitMarker(marker))
		c, err := h.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pid := c.Conn().PgConn().PID()
		c.Release()
		if err := cancelWhileLocked(t, ctx, pid, func() error { return plainInsert(ctx, h.pool, table, 1, nil) }); err != nil {
			t.Fatalf("the application's transaction: %v (the cancel hit the library's check, not the application)", err)
		}
		if !srv.RowExists(t, ctx, table, 1) {
			t.Fatal("row 1 missing")
		}
		if _, ok := refOf(t, lastFrame(t, h.harness)); ok {
			t.Fatal("a reference though the identity check was cancelled")
		}
		if err := plainInsert(ctx, h.pool, table, 2, nil); err != nil {
			t.Fatal(err)
		}
		ref, ok := refOf(t, lastFrame(t, h.harness))
		if !ok || !ref.HasMarker() || ref.XID == 0 {
			t.Fatalf("the next transaction's reference %v %v, want the marker and the xid", ref, ok)
		}
		if logs := h.logs.String(); strings.Contains(logs, "are off for this connection") {
			t.Errorf("references turned off by a cancel:\n%s", logs)
		}
	})
}

// TestTooOld: the major version is read from server_version as servers report it; below
// 13, references are off, with why.
func TestTooOld(t *testing.T) {
	for v, off := range map[string]bool{"12.22": true, "9.6.24": true, "10": true, "13.0": false, "13.23": false,
		"16beta1": false, "15.4 (Debian 15.4-1.pgdg120+1)": false, "": false, "CockroachDB": false, "1234.5": false} {
		if why := reference.TooOld(v); (why != "") != off {
			t.Errorf("TooOld(%q) = %q, want off %v", v, why, off)
		}
	}
}

// TestReferencesOffBelowOldestServer: through a proxy that has a real server report
// server_version 12.22, the references are off from the first BEGIN, with one log record
// saying why, and nothing of the library's is sent — no check, no xid read: plain pgx and
// Run commit as without the option, without a reference.
func TestReferencesOffBelowOldestServer(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	proxy := pgtest.ProxyFor(t, srv)
	proxy.ReportVersion("12.22")
	rec := proxy.Record()
	logs := &lockedBuffer{}
	h := newHarness(t, proxy.ConnString(srv.ConnString()), 1, WithCommitReference(), WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
	for id := 1; id <= 2; id++ {
		if err := plainInsert(ctx, h.pool, table, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	p := DefaultPolicy()
	p.CommitReference = true
	res := Run(ctx, h.pool, p, func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
		_, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id) values (3)", table))
		return struct{}{}, err
	})
	if _, ok := res.(outcome.Committed[struct{}]); !ok {
		t.Fatalf("Run: %v", res.Outcome())
	}
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := conn.Conn().PgConn().ParameterStatus("server_version"); v != "12.22" {
		t.Fatalf("the connection saw server_version %q, want the proxy's 12.22", v)
	}
	conn.Release()
	for i, f := range h.frames() {
		if _, ok := refOf(t, f); ok {
			t.Errorf("frame %d has a reference", i)
		}
	}
	if n := strings.Count(logs.String(), "PostgreSQL 12 is older than 13"); n != 1 {
		t.Errorf("%d log records say the server is too old, want 1:\n%s", n, logs.String())
	}
	client := rec.Conversations()[0].ClientBytes()
	if bytes.Contains(client, []byte("pg_control_system")) || bytes.Contains(client, xidReadCall(t, ctx)) {
		t.Error("the library sent its check or its xid read to a server too old for them")
	}
}
