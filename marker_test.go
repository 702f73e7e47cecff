package otelpgxtx

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/executor"
	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// markerProxied is the setup of the marker tests through the proxy: a harness of
// maxConns connections behind it, a table and a marker table.
func markerProxied(t *testing.T, base string, maxConns int32) (context.Context, *pgtest.Proxy, *harness, string, pgx.Identifier) {
	t.Helper()
	ctx := pgtest.ContextFor(t)
	proxy := pgtest.ProxyFor(t, srv)
	h := newHarness(t, proxy.ConnString(base), maxConns)
	return ctx, proxy, h, srv.NewTable(t, ctx, tableColumns), reconciletest.NewMarkerTable(t, ctx, srv.Exec)
}

func markerPolicy(table pgx.Identifier) Policy {
	p := DefaultPolicy()
	p.CommitMarker = table
	return p
}

func TestMarkerTableDDL(t *testing.T) {
	ddl, err := reconcile.MarkerTableDDL(pgx.Identifier{"app", `tx "marker"`})
	if err != nil || !strings.HasPrefix(ddl, `create schema if not exists "app";`) ||
		!strings.Contains(ddl, `create table if not exists "app"."tx ""marker""" (`) {
		t.Fatalf("%q %v", ddl, err)
	}
	for _, bad := range []pgx.Identifier{nil, {""}, {"tx_marker"}, {"a", "b\x00"}, {"a", "b", "c"}} {
		if _, err := reconcile.MarkerTableDDL(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("reconcile.MarkerTableDDL(%q) = %v, want ErrInvalidArgument", bad, err)
		}
		p := DefaultPolicy()
		p.CommitMarker = bad
		if err := p.validate(); bad != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Policy.CommitMarker %q: %v, want ErrInvalidArgument", bad, err)
		}
	}
	p := DefaultPolicy()
	p.CommitMarker, p.CommitReference = pgx.Identifier{"m"}, false
	if err := p.validate(); err == nil {
		t.Error("a marker without references validated")
	}
}

// TestMarkerAddsNoRoundTrip: with the marker, a Run takes as many round trips as without
// references at all, and the marker row is there.
func TestMarkerAddsNoRoundTrip(t *testing.T) {
	overTransports(t, overMarkerAddsNoRoundTrip)
}

func overMarkerAddsNoRoundTrip(t *testing.T, base string) {
	ctx, proxy, h, table, marker := markerProxied(t, base, 1)
	count := func(p Policy, id int) int64 {
		proxy.ResetRoundTrips()
		if r := Run(ctx, h.pool, p, insertFn(table, id)); r.Outcome() != outcome.OutcomeCommitted {
			t.Fatalf("%T", r)
		}
		return proxy.RoundTrips()
	}
	count(markerPolicy(marker), 1) // warm up: connect and read the identity
	plain := DefaultPolicy()
	plain.CommitReference = false
	with, without := count(markerPolicy(marker), 2), count(plain, 3)
	t.Logf("round trips: with the marker %d, without references %d", with, without)
	if with != without {
		t.Fatalf("round trips with the marker %d, without references %d", with, without)
	}
	var n int
	if err := h.pool.QueryRow(ctx, "select count(*) from "+marker.Sanitize()+" where not fenced").Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d marker rows, %v; want 2", n, err)
	}
	if got, err := reconcile.PruneMarkers(ctx, h.pool, marker, time.Microsecond); err != nil || got != 2 {
		t.Fatalf("PruneMarkers = %d, %v; want 2", got, err)
	}
}

// TestMarkerMissingTable: a marker table that does not exist changes no commit: Run
// commits with the xid read alone, and its reference says so.
func TestMarkerMissingTable(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	table := srv.NewTable(t, ctx, tableColumns)
	res := Run(ctx, h.pool, markerPolicy(pgx.Identifier{"public", "no_such_marker"}), insertFn(table, 1))
	if res.Outcome() != outcome.OutcomeCommitted || !srv.RowExists(t, ctx, table, 1) {
		t.Fatalf("result %T %v", res, res)
	}
	if ref := frameRef(t, h, "committed"); ref.HasMarker() || ref.XID == 0 {
		t.Fatalf("reference %s, want the xid alone", ref)
	}
}

// TestMarkerReconcile settles indeterminate commits by their marker: the proxy cuts after
// COMMIT (committed), before COMMIT with the xid never arriving (aborted, and fenced: the
// reference is nothing but the marker), and a commit waiting for synchronous replication
// is in progress until its wait ends, then committed.
func TestMarkerReconcile(t *testing.T) {
	overTransports(t, overMarkerReconcile)
}

func overMarkerReconcile(t *testing.T, base string) {
	ctx, proxy, h, table, marker := markerProxied(t, base, 2)
	rec, err := reconcile.New(h.pool, reconcile.WithWait(20*time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cut := func(arm func(), id int) outcome.Indeterminate[int] { return cutRun(t, ctx, h, marker, table, arm, id) }
	after := cut(proxy.CutAfterCommit, 1)
	before := cut(proxy.CutBeforeCommit, 2)
	for _, ind := range []outcome.Indeterminate[int]{after, before} {
		// The proxy drops every reply after the cut: the call's reply never arrived either,
		// and the reference stands on the marker alone, with the connection's check time.
		if ref, ok := ind.Reference(); !ok || ref.XID != 0 || !ref.HasMarker() || ref.Operation != ind.OperationID() || ref.CheckedAt == 0 {
			t.Fatalf("cut before the reply arrived: reference %v %v, want the marker alone", ref, ok)
		}
	}
	// The backend the proxy cut after COMMIT may not have run it yet; a reconciliation
	// asked before that would fence the marker and rightly say aborted.
	if err := srv.WaitQuiet(ctx); err != nil {
		t.Fatal(err)
	}
	// The same marker asked of another cluster (here: a reference naming another system
	// identifier) proves nothing there, and must not be fenced: a fence would answer
	// aborted for a commit that stands where it was made.
	for _, ind := range []outcome.Indeterminate[int]{after, before} {
		other, _ := ind.Reference()
		other.SystemIdentifier++
		got, err := rec.Resolve(ctx, other, trace.SpanContext{})
		if err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonOtherSystem {
			t.Fatalf("%s: %s %q %v, want unknown other_system", other, got.Status(), got.Reason(), err)
		}
	}
	if n := srv.CountOf(t, ctx, "select count(*) from "+marker.Sanitize()); n != 1 {
		t.Fatalf("%d marker rows after asking another system, want only the committed one", n)
	}
	for _, tc := range []struct {
		ind  outcome.Indeterminate[int]
		want reconcile.Status
		id   int
		row  bool
	}{{after, reconcile.Committed, 1, true}, {before, reconcile.Aborted, 2, false}} {
		ref, _ := tc.ind.Reference()
		parsed, err := outcome.ParseReconciliationRef(ref.String())
		if err != nil || parsed != ref {
			t.Fatalf("reference %q round trip: %+v %v", ref, parsed, err)
		}
		// The server may still be finishing: the reconciler waits for it, so ask until settled.
		var got reconcile.Answer
		for got.Status() == reconcile.Unknown {
			if got, err = reconcile.Indeterminate(ctx, rec, tc.ind); err != nil {
				t.Fatal(err)
			}
			if got.Status() == reconcile.Unknown && got.Reason() != reconcile.ReasonInProgress {
				t.Fatalf("%s: unknown %q", ref, got.Reason())
			}
		}
		if got.Status() != tc.want || srv.RowExists(t, ctx, table, tc.id) != tc.row {
			t.Fatalf("%s: %s, want %s", ref, got.Status(), tc.want)
		}
		// A second reconciliation gives the same answer (the fence is durable).
		if again, err := reconcile.Indeterminate(ctx, rec, tc.ind); err != nil || again.Status() != tc.want {
			t.Fatalf("again: %s %v", again.Status(), err)
		}
	}

	// In a synchronous-replication wait: in progress, then committed once it ends.
	type started struct {
		pid uint32
		ref outcome.ReconciliationRef
	}
	began := make(chan started, 1)
	done := make(chan outcome.Result[int], 1)
	go func() {
		done <- Run(ctx, h.pool, markerPolicy(marker), func(ctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := insertFn(table, 3)(ctx, tx); err != nil {
				return 0, err
			}
			if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
				return 0, err
			}
			sys, timeline, database, checkedAt := frame.State(tx.Conn().PgConn()).Refs.Identity()
			q, _ := markertable.Quote(marker...)
			q, _ = markertable.RefTable(database, q)
			began <- started{tx.Conn().PgConn().PID(), outcome.ReconciliationRef{SystemIdentifier: sys,
				Timeline: timeline, MarkerTable: q, Operation: executor.ScopeFromContext(ctx).ID, CheckedAt: checkedAt}}
			return 3, nil
		})
	}()
	s := <-began
	if err := srv.WaitForWaitEvent(ctx, s.pid, "SyncRep"); err != nil {
		t.Fatal(err)
	}
	if got, err := rec.Resolve(ctx, s.ref, trace.SpanContext{}); err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonInProgress {
		t.Fatalf("during the wait: %s %q %v", got.Status(), got.Reason(), err)
	}
	if err := srv.Terminate(ctx, s.pid); err != nil {
		t.Fatal(err)
	}
	ind, ok := (<-done).(outcome.Indeterminate[int])
	if !ok || !ind.CommittedLocally() {
		t.Fatal("the terminated sync-rep wait is not indeterminate, committed locally")
	}
	if got, err := reconcile.Indeterminate(ctx, rec, ind); err != nil || got.Status() != reconcile.Committed {
		t.Fatalf("after the wait: %s %q %v", got.Status(), got.Reason(), err)
	}
}

// cutRun runs a Run with marker that inserts row id of table, arming a proxy fault with
// arm in its transaction, and returns its indeterminate result.
func cutRun(t *testing.T, ctx context.Context, h *harness, marker pgx.Identifier, table string, arm func(), id int) outcome.Indeterminate[int] {
	t.Helper()
	res := Run(ctx, h.pool, markerPolicy(marker), func(ctx context.Context, tx pgx.Tx) (int, error) {
		arm()
		return insertFn(table, id)(ctx, tx)
	})
	ind, ok := res.(outcome.Indeterminate[int])
	if !ok {
		t.Fatalf("result %T", res)
	}
	return ind
}

// TestMarkerAfterFailover settles by marker on the promoted standby what the xid cannot:
// a commit replicated before the failover is committed (the xid says other_timeline), and
// a commit lost in the failover while it waited for synchronous replication is aborted,
// its reference fenced on the new primary.
func TestMarkerAfterFailover(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	c := startCluster(t, ctx)
	marker := reconciletest.NewMarkerTable(t, ctx, c.Primary().Exec)
	h := newHarness(t, c.ConnString(), 3)
	insert := func(id int) func(context.Context, pgx.Tx) (int, error) {
		return func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, "insert into t values ($1)", id)
			return id, err
		}
	}
	replicated := Run(ctx, h.pool, markerPolicy(marker), insert(1))
	if replicated.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("result = %T", replicated)
	}
	replicatedRef := frameRef(t, h, "committed")
	lost, ok := loseInFailover(t, ctx, c, h.pool, markerPolicy(marker), insert(2))
	if !ok || !lost.HasMarker() {
		t.Fatalf("reference %v %v, want a marker", lost, ok)
	}
	// The promoted standby has no synchronous standby of its own until the old primary
	// rejoins: nothing confirms its WAL, so the replication barrier gives up.
	rec := clusterReconciler(t, ctx, c)
	checkResolutions(t, ctx, rec, []resolveCase{
		{"lost in the failover", lost, reconcile.Aborted, ""},
		{"replicated commit, no standby yet", replicatedRef, reconcile.Unknown, reconcile.ReasonNotReplicated},
	})
	if err := c.Rejoin(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rec, err = reconcile.New(conn, reconcile.WithWait(30*time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	checkResolutions(t, ctx, rec, []resolveCase{
		{"lost in the failover", lost, reconcile.Aborted, ""},
		{"replicated commit", replicatedRef, reconcile.Committed, ""},
	})
	byID, err := rec.ResolveAssertedMarker(ctx, marker, replicated.OperationID(), trace.SpanContext{})
	if err != nil || byID.Status() != reconcile.Committed {
		t.Fatalf("ResolveMarker of the replicated commit: %s %v", byID.Status(), err)
	}
	if clusterRowExists(t, ctx, c, 2) || !clusterRowExists(t, ctx, c, 1) {
		t.Error("the table does not match: want row 1 only")
	}
}

// TestCommitSpanSameWithReference: the statement spans under a Run's frame, and its
// statements' events, are the same with commit references (and the marker) on and off,
// COMMIT's included — its span, or with the default its event on the frame.
func TestCommitSpanSameWithReference(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		table := srv.NewTable(t, ctx, tableColumns)
		marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
		plain := DefaultPolicy()
		plain.CommitReference = false
		var want string
		for i, p := range []Policy{plain, DefaultPolicy(), markerPolicy(marker)} {
			h := newHarness(t, "", 1, opts...)
			if r := Run(ctx, h.pool, p, insertFn(table, i+1)); r.Outcome() != outcome.OutcomeCommitted {
				t.Fatalf("%T", r)
			}
			f := onlyFrame(t, h)
			var got []string
			for _, c := range h.children(f) {
				got = append(got, c.Name+" "+fmt.Sprint(c.Status.Code))
			}
			for _, e := range statementEvents(f) {
				op, _ := eventAttr(e, schema.DBOperationNameKey)
				got = append(got, e.Name+" "+op.AsString())
			}
			slices.Sort(got)
			if i == 0 {
				want = strings.Join(got, "|")
				if !strings.Contains(want, "COMMIT") {
					t.Fatalf("no COMMIT statement span or event without references: %q", want)
				}
			} else if g := strings.Join(got, "|"); g != want {
				t.Errorf("policy %d: statement spans and events %q, want %q", i, g, want)
			}
		}
	})
}

// TestOneReference: Run and the tracer send the same bytes ahead of COMMIT for the same kind
// of reference — the marker function's call (a Query), the xid read's (a FunctionCall,
// when no statement's write carried it: Run without the tracer option) — but for the
// operation id, recorded at the proxy.
func TestOneReference(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	commit := []byte("Q\x00\x00\x00\x0bcommit\x00")
	for _, tc := range []struct {
		name   string
		opt    Option
		policy Policy
	}{{"marker", WithCommitMarker(marker), markerPolicy(marker)}, {"xid", WithCommitReference(), DefaultPolicy()}} {
		id := 2 * len(tc.name) // distinct rows for each kind, two each
		t.Run(tc.name, func(t *testing.T) {
			proxy := pgtest.ProxyFor(t, srv)
			rec := proxy.Record()
			// The call ahead of the last COMMIT of conversation i, its 16-byte argument (if
			// any) zeroed.
			callOf := func(i int) []byte {
				t.Helper()
				sent := rec.Conversations()[i].ClientBytes()
				end := bytes.LastIndex(sent, commit)
				start := end - 5
				for start >= 0 && (sent[start] != 'F' && sent[start] != 'Q' || int(binary.BigEndian.Uint32(sent[start+1:]))+1 != end-start) {
					start--
				}
				if end < 0 || start < 0 {
					t.Fatalf("no call ahead of COMMIT in %q", sent)
				}
				call := bytes.Clone(sent[start:end])
				if tc.name == "marker" { // the operation id, between the quotes
					i := bytes.IndexByte(call, '\'')
					clear(call[i+1 : i+33])
				}
				return call
			}
			h := newHarness(t, proxy.ConnString(srv.ConnString()), 1, tc.opt)
			tx := mustBegin(t, ctx, h.pool)
			defer func() { _ = tx.Rollback(ctx) }() // a failed test leaves no connection held
			mustExec(t, ctx, tx, fmt.Sprintf("insert into %s values (%d)", table, id))
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			h.pool.Close()
			plain := newHarness(t, proxy.ConnString(srv.ConnString()), 1)
			if r := Run(ctx, plain.pool, tc.policy, insertFn(table, id+1)); r.Outcome() != outcome.OutcomeCommitted {
				t.Fatalf("%T", r)
			}
			plain.pool.Close()
			if a, b := callOf(0), callOf(1); !bytes.Equal(a, b) || len(a) < 10 {
				t.Fatalf("the tracer sent %q ahead of COMMIT, Run %q", a, b)
			}
		})
	}
}

// TestMarkerRecreated: the marker function dropped and created again while the
// application runs — in one migration transaction, and as two statements on their own —
// fails none of its commits: every open connection, each of which had checked the old
// function, commits with the marker after it, plain pgx and Run alike, and each marker
// row is there. (Called by the OID the check read, as before, every connection's next
// COMMIT failed with 42883 and its transaction was lost.)
func TestMarkerRecreated(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	table := srv.NewTable(t, ctx, tableColumns)
	ddl, err := reconcile.MarkerTableDDL(marker)
	if err != nil {
		t.Fatal(err)
	}
	drop := "drop function " + marker.Sanitize() + "(uuid)"
	h := newHarness(t, srv.ConnString(), 3, WithCommitMarker(marker))
	conns := acquireConns(t, ctx, h.pool, 3)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	id := 0
	commitAll := func(when string) {
		t.Helper()
		for _, c := range conns {
			id++
			tx := mustBegin(t, ctx, c)
			mustExec(t, ctx, tx, fmt.Sprintf("insert into %s values (%d)", table, id))
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("%s: the commit of row %d failed: %v", when, id, err)
			}
			id++
			res := Run(ctx, c.Conn(), markerPolicy(marker), insertFn(table, id))
			if res.Outcome() != outcome.OutcomeCommitted {
				t.Fatalf("%s: Run of row %d: %T", when, id, res)
			}
		}
	}
	commitAll("before")
	if err := srv.Exec(ctx, "begin; "+drop+"; "+ddl+"; commit"); err != nil {
		t.Fatal(err)
	}
	commitAll("after a migration dropped and created it again")
	if err := srv.Exec(ctx, drop); err != nil {
		t.Fatal(err)
	}
	if err := srv.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	commitAll("after a drop and a create of their own")
	if n := srv.CountOf(t, ctx, "select count(*) from "+table); n != id {
		t.Fatalf("%d rows, want %d", n, id)
	}
	if n := srv.CountOf(t, ctx, "select count(*) from "+marker.Sanitize()); n != id {
		t.Fatalf("%d marker rows, want one per commit, %d", n, id)
	}
	for i, f := range h.frames() {
		if ref, ok := refOf(t, f); !ok || !ref.HasMarker() {
			t.Fatalf("frame %d: reference %v %v, want a marker", i, ref, ok)
		}
	}
}
