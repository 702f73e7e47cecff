package reconcile_test

import (
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

func TestReconcilerAbortedNoWritesAndUnknowns(t *testing.T) {
	pgtest.LeakCheck(t) // registered first, so it runs after the pool's Close
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, "id int primary key")
	pool := srv.Pool(t, ctx)
	rec, err := reconcile.New(pool, reconcile.WithWait(0, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	conn := newConn(t, ctx, srv)
	// A real transaction's reference, then rolled back: aborted. Read without the server
	// start: no answer but committed depends on it.
	tx, ref := insertRef(t, ctx, conn, table, 1)
	ref.ServerStart = 0
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// A real committed transaction's reference, with the server start it was read under.
	tx, committed := insertRef(t, ctx, conn, table, 2)
	if err := tx.Commit(ctx); err != nil || committed.ServerStart == 0 {
		t.Fatalf("commit: %v, server start %d", err, committed.ServerStart)
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
	tx, err = conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var open uint64
	if err := tx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&open); err != nil {
		t.Fatal(err)
	}
	got, err := rec.Resolve(ctx, outcome.ReconciliationRef{XID: open, SystemIdentifier: ref.SystemIdentifier, Timeline: ref.Timeline}, trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonInProgress {
		t.Fatalf("open transaction: %v %q %v", got.Status(), got.Reason(), err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Malformed references are errors, not guesses.
	if _, err := rec.Resolve(ctx, outcome.ReconciliationRef{XID: 5}, trace.SpanContext{}); !errors.Is(err, reconcile.ErrInvalidArgument) {
		t.Fatalf("malformed reference: %v", err)
	}
	if _, err := outcome.ParseReconciliationRef("pg:1/x/3"); err == nil {
		t.Fatal("malformed reference text parsed")
	}
}
