package otelpgxtx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
)

// TestDecide checks the reconciliation rules on fabricated server views, in addition to
// the real-server tests that produce them (TestReconcileAfterCrashRestart,
// TestReconcileXIDReusedAfterCrash, TestReconcileAfterFailover, TestAsyncCommitLostInFailover).
func TestDecide(t *testing.T) {
	ref := outcome.ReconciliationRef{XID: 1000, SystemIdentifier: 7, Timeline: 1, ServerStart: 500}
	noStart := ref
	noStart.ServerStart = 0
	newerTimeline := ref
	newerTimeline.Timeline = 3
	committed, aborted, inProgress := "committed", "aborted", "in progress"
	same := serverView{sys: 7, timeline: 1, start: 500, checkpointTimeline: 1, checkpointNextXID: 900}
	restarted := same
	restarted.start = 600
	promoted := restarted
	promoted.timeline, promoted.checkpointTimeline = 2, 2
	view := func(v serverView, status *string, next uint64, change func(*serverView)) serverView {
		v.status, v.checkpointNextXID = status, next
		if change != nil {
			change(&v)
		}
		return v
	}
	future := func(v *serverView) { v.inFuture = true }
	for _, tc := range []struct {
		name   string
		ref    outcome.ReconciliationRef
		v      serverView
		want   Resolved
		reason string
		again  bool
	}{
		{"same incarnation, committed", ref, view(same, &committed, 900, nil), ResolvedCommitted, "", false},
		{"same incarnation, aborted", ref, view(same, &aborted, 900, nil), ResolvedAborted, "", false},
		{"same incarnation, in progress", ref, view(same, &inProgress, 900, nil), ResolvedUnknown, "", true},
		{"same incarnation, too old", ref, view(same, nil, 900, nil), ResolvedUnknown, UnknownTooOld, false},
		{"same incarnation, in the future", ref, view(same, nil, 900, future), ResolvedUnknown, UnknownInTheFuture, false},
		{"other system", ref, view(same, &committed, 900, func(v *serverView) { v.sys = 8 }), ResolvedUnknown, UnknownOtherSystem, false},
		{"restarted, committed below the boundary", ref, view(restarted, &committed, 1001, nil), ResolvedUnknown, UnknownServerRestarted, false},
		{"restarted, committed at the boundary", ref, view(restarted, &committed, 1000, nil), ResolvedAborted, "", false},
		{"restarted, in progress above the boundary", ref, view(restarted, &inProgress, 990, nil), ResolvedAborted, "", false},
		{"restarted, in the future", ref, view(restarted, nil, 990, future), ResolvedAborted, "", false},
		{"restarted, asked on a standby", ref, view(restarted, &committed, 990, func(v *serverView) { v.inRecovery = true }), ResolvedUnknown, UnknownServerRestarted, false},
		{"start unknown, committed at the boundary", noStart, view(restarted, &committed, 1000, nil), ResolvedUnknown, UnknownServerRestarted, false},
		{"earlier start: not a later incarnation", ref, view(restarted, &committed, 10, func(v *serverView) { v.start = 400 }), ResolvedUnknown, UnknownServerRestarted, false},
		{"promoted, committed below the boundary", ref, view(promoted, &committed, 1001, nil), ResolvedUnknown, UnknownOtherTimeline, false},
		{"promoted, committed at the boundary", ref, view(promoted, &committed, 1000, nil), ResolvedAborted, "", false},
		{"promoted, checkpoint still on the old timeline", ref, view(promoted, &committed, 10, func(v *serverView) { v.checkpointTimeline = 1 }), ResolvedUnknown, UnknownOtherTimeline, false},
		{"promoted, aborted", ref, view(promoted, &aborted, 1001, nil), ResolvedAborted, "", false},
		{"asked a server on an older timeline", newerTimeline, view(promoted, &aborted, 10, nil), ResolvedUnknown, UnknownOtherTimeline, false},
	} {
		res, reason, again := decide(tc.ref, tc.v)
		if res != tc.want || reason != tc.reason || again != tc.again {
			t.Errorf("%s: decide = %s %q %v, want %s %q %v", tc.name, res, reason, again, tc.want, tc.reason, tc.again)
		}
	}
}

func TestParseFullXID(t *testing.T) {
	for in, want := range map[string]uint64{"0:724": 724, "2:5": 2<<32 | 5} {
		if got, err := parseFullXID(in); err != nil || got != want {
			t.Errorf("parseFullXID(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "724", "a:1", "1:", "0:4294967296"} {
		if _, err := parseFullXID(in); err == nil {
			t.Errorf("parseFullXID(%q) succeeded", in)
		}
	}
}

func TestReconcilerAbortedNoWritesAndUnknowns(t *testing.T) {
	ctx := testCtx(t)
	h := newHarness(t, "", 2)
	table := newTable(t, ctx)
	rec, err := NewReconciler(h.pool, WithReconcileWait(0, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// A real transaction's reference, then rolled back: aborted.
	var ref outcome.ReconciliationRef
	res := Run(ctx, h.pool, DefaultPolicy(), insertThen(table, func(ctx context.Context, tx pgx.Tx) (int, error) {
		var xid uint64
		if err := tx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
			return 0, err
		}
		st := stateOf(tx.Conn().PgConn())
		if err := readIdentity(ctx, tx.Conn().PgConn(), st); err != nil {
			return 0, err
		}
		ref = outcome.ReconciliationRef{XID: xid, SystemIdentifier: st.systemID, Timeline: st.timeline}
		return 0, errors.New("roll it back")
	}))
	if _, ok := res.(outcome.DeterminateRollback[int]); !ok {
		t.Fatalf("result = %T", res)
	}
	// A real committed transaction's reference, with the server start it was read under.
	var committed outcome.ReconciliationRef
	res = Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		if _, err := insertFn(table, 2)(ctx, tx); err != nil {
			return 0, err
		}
		var xid uint64
		err := tx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&xid)
		st := stateOf(tx.Conn().PgConn())
		committed = outcome.ReconciliationRef{XID: xid, SystemIdentifier: st.systemID, Timeline: st.timeline, ServerStart: st.serverStart}
		return 0, err
	})
	if res.Outcome() != outcome.OutcomeCommitted || committed.ServerStart == 0 {
		t.Fatalf("result = %T, server start %d", res, committed.ServerStart)
	}
	restarted, unknownStart := committed, committed
	restarted.ServerStart++
	unknownStart.ServerStart = 0
	cases := []struct {
		name   string
		ref    outcome.ReconciliationRef
		want   Resolved
		reason string
	}{
		{"aborted", ref, ResolvedAborted, ""},
		{"committed", committed, ResolvedCommitted, ""},
		// A crash restart hands out again xids whose records had not reached the WAL:
		// "committed" after a restart may be another transaction's.
		{"committed, server restarted since", restarted, ResolvedUnknown, UnknownServerRestarted},
		{"committed, start unknown", unknownStart, ResolvedUnknown, UnknownServerRestarted},
		{"no writes", outcome.ReconciliationRef{XID: 0, SystemIdentifier: ref.SystemIdentifier, Timeline: ref.Timeline}, ResolvedNoWrites, ""},
		{"other system", outcome.ReconciliationRef{XID: ref.XID, SystemIdentifier: ref.SystemIdentifier + 1, Timeline: ref.Timeline}, ResolvedUnknown, UnknownOtherSystem},
		{"other timeline", outcome.ReconciliationRef{XID: ref.XID, SystemIdentifier: ref.SystemIdentifier, Timeline: ref.Timeline + 1}, ResolvedUnknown, UnknownOtherTimeline},
		{"in the future", outcome.ReconciliationRef{XID: ref.XID + 1_000_000, SystemIdentifier: ref.SystemIdentifier, Timeline: ref.Timeline}, ResolvedUnknown, UnknownInTheFuture},
		{"too old", outcome.ReconciliationRef{XID: 3, SystemIdentifier: ref.SystemIdentifier, Timeline: ref.Timeline}, ResolvedUnknown, UnknownTooOld},
	}
	for _, tc := range cases {
		got, err := rec.Resolve(ctx, tc.ref, trace.SpanContext{})
		if err != nil || got.Resolved() != tc.want || got.Reason() != tc.reason {
			t.Errorf("%s: %v %q %v; want %v %q", tc.name, got.Resolved(), got.Reason(), err, tc.want, tc.reason)
		}
	}
	// In progress: a transaction that stays open past the bounded wait.
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var open uint64
	mustExec(t, ctx, conn, "begin")
	if err := conn.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&open); err != nil {
		t.Fatal(err)
	}
	got, err := rec.Resolve(ctx, outcome.ReconciliationRef{XID: open, SystemIdentifier: ref.SystemIdentifier, Timeline: ref.Timeline}, trace.SpanContext{})
	if err != nil || got.Resolved() != ResolvedUnknown || got.Reason() != UnknownInProgress {
		t.Fatalf("open transaction: %v %q %v", got.Resolved(), got.Reason(), err)
	}
	mustExec(t, ctx, conn, "rollback")
	// Malformed references are errors, not guesses.
	if _, err := rec.Resolve(ctx, outcome.ReconciliationRef{XID: 5}, trace.SpanContext{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("malformed reference: %v", err)
	}
	if _, err := outcome.ParseReconciliationRef("pg:1/x/3"); err == nil {
		t.Fatal("malformed reference text parsed")
	}
}
