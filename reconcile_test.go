package otelpgxtx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

func TestReconcilerAbortedNoWritesAndUnknowns(t *testing.T) {
	ctx := testCtx(t)
	h := newHarness(t, "", 2)
	table := newTable(t, ctx)
	rec, err := reconcile.New(h.pool, reconcile.WithWait(0, time.Millisecond))
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
		want   reconcile.Status
		reason string
	}{
		{"aborted", ref, reconcile.Aborted, ""},
		{"committed", committed, reconcile.Committed, ""},
		// A crash restart hands out again xids whose records had not reached the WAL:
		// "committed" after a restart may be another transaction's.
		{"committed, server restarted since", restarted, reconcile.Unknown, reconcile.ReasonServerRestarted},
		{"committed, start unknown", unknownStart, reconcile.Unknown, reconcile.ReasonServerRestarted},
		{"no writes", outcome.ReconciliationRef{XID: 0, SystemIdentifier: ref.SystemIdentifier, Timeline: ref.Timeline}, reconcile.NoWrites, ""},
		{"other system", outcome.ReconciliationRef{XID: ref.XID, SystemIdentifier: ref.SystemIdentifier + 1, Timeline: ref.Timeline}, reconcile.Unknown, reconcile.ReasonOtherSystem},
		{"other timeline", outcome.ReconciliationRef{XID: ref.XID, SystemIdentifier: ref.SystemIdentifier, Timeline: ref.Timeline + 1}, reconcile.Unknown, reconcile.ReasonOtherTimeline},
		{"in the future", outcome.ReconciliationRef{XID: ref.XID + 1_000_000, SystemIdentifier: ref.SystemIdentifier, Timeline: ref.Timeline}, reconcile.Unknown, reconcile.ReasonInTheFuture},
		{"too old", outcome.ReconciliationRef{XID: 3, SystemIdentifier: ref.SystemIdentifier, Timeline: ref.Timeline}, reconcile.Unknown, reconcile.ReasonTooOld},
	}
	for _, tc := range cases {
		got, err := rec.Resolve(ctx, tc.ref, trace.SpanContext{})
		if err != nil || got.Status() != tc.want || got.Reason() != tc.reason {
			t.Errorf("%s: %v %q %v; want %v %q", tc.name, got.Status(), got.Reason(), err, tc.want, tc.reason)
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
	if err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonInProgress {
		t.Fatalf("open transaction: %v %q %v", got.Status(), got.Reason(), err)
	}
	mustExec(t, ctx, conn, "rollback")
	// Malformed references are errors, not guesses.
	if _, err := rec.Resolve(ctx, outcome.ReconciliationRef{XID: 5}, trace.SpanContext{}); !errors.Is(err, reconcile.ErrInvalidArgument) {
		t.Fatalf("malformed reference: %v", err)
	}
	if _, err := outcome.ParseReconciliationRef("pg:1/x/3"); err == nil {
		t.Fatal("malformed reference text parsed")
	}
}
