package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// TestTransactionCounts holds what each counter counts, as a new user meets it: a
// deliberate Rollback() of a read-only transaction is a rolled_back frame with
// tx.rollback=deliberate (span status Unset), a failed statement's rollback one with
// tx.rollback=failure (Error), and so is a Run whose function failed; Run calls that join
// an outer transaction are counted apart, whether they joined (participating) or their
// savepoint was rolled back, and never as transactions.
func TestTransactionCounts(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 2)
	table := srv.NewTable(t, ctx, tableColumns)

	// A read-only transaction ended the usual Go way.
	tx := mustBegin(t, ctx, h.pool)
	var n int
	if err := tx.QueryRow(ctx, "select count(*) from "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// A statement failed; the application rolls back.
	tx = mustBegin(t, ctx, h.pool)
	if _, err := tx.Exec(ctx, "select 1/0"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Run: an owner whose Nested calls roll back and join, with a Required participant,
	// which commits; then one whose function fails.
	boom := errors.New("rejected")
	var inner []outcome.Result[int]
	res := Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		nested := Policy{Propagation: Nested, MaxAttempts: 1}
		inner = append(inner,
			Run(ctx, h.pool, nested, func(ctx context.Context, tx pgx.Tx) (int, error) {
				_, _ = insertFn(table, 1)(ctx, tx)
				return 0, boom
			}),
			Run(ctx, h.pool, nested, insertFn(table, 2)),
			Run(ctx, h.pool, DefaultPolicy(), insertFn(table, 3)))
		return 0, nil
	})
	if res.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("owner = %+v", res)
	}
	var got []string
	for _, r := range inner {
		got = append(got, r.Outcome().String())
	}
	if want := []string{"rolled_back", "participating", "participating"}; !slices.Equal(got, want) {
		t.Fatalf("participants = %v, want %v", got, want)
	}
	if r := Run(ctx, h.pool, Policy{Propagation: Required, MaxAttempts: 1}, func(context.Context, pgx.Tx) (int, error) { return 0, boom }); r.Outcome() != outcome.OutcomeRolledBack {
		t.Fatalf("failed Run = %+v", r)
	}

	for _, want := range []struct {
		metric string
		keys   []attribute.Key
		counts map[string]int64
	}{
		{metrics.MetricDuration, []attribute.Key{OutcomeKey, RollbackKey}, map[string]int64{
			"tx.outcome=rolled_back,tx.rollback=deliberate": 1,
			"tx.outcome=rolled_back,tx.rollback=failure":    2,
			"tx.outcome=committed":                          1,
		}},
		{metrics.MetricParticipations, []attribute.Key{schema.ParticipantOutcomeKey, PropagationKey}, map[string]int64{
			"tx.participant.outcome=rolled_back,tx.propagation=nested":     1,
			"tx.participant.outcome=participating,tx.propagation=nested":   1,
			"tx.participant.outcome=participating,tx.propagation=required": 1,
		}},
	} {
		if got := nonZero(h.sums(t, ctx, want.metric, want.keys...)); !maps.Equal(got, want.counts) {
			t.Errorf("%s = %v, want %v", want.metric, got, want.counts)
		}
	}
	// Every participation series exists from the start: each participant outcome for each
	// propagation that can join. The frames' series are the duration histogram's, each
	// born with its first frame: participating among the transactions is a prepared
	// transaction's (PREPARE TRANSACTION), never a Run call's, and none is here.
	if all := h.sums(t, ctx, metrics.MetricDuration, OutcomeKey, RollbackKey); len(all) != 3 {
		t.Errorf("%s series %v, want the three outcomes counted", metrics.MetricDuration, all)
	}
	if all := h.sums(t, ctx, metrics.MetricParticipations, schema.ParticipantOutcomeKey, PropagationKey); len(all) != 6 {
		t.Errorf("%s series %v, want 2 outcomes × 3 propagations", metrics.MetricParticipations, all)
	}

	// The spans say the same: the deliberate rollback is not an error.
	fs := h.frames()
	if len(fs) != 4 {
		t.Fatalf("%d frames, want 4: %v", len(fs), names(fs))
	}
	for i, want := range []struct {
		rollback string
		status   codes.Code
	}{{RollbackDeliberate, codes.Unset}, {RollbackFailure, codes.Error}, {"", codes.Ok}, {RollbackFailure, codes.Error}} {
		v, _ := attr(fs[i], RollbackKey)
		if v.AsString() != want.rollback || fs[i].Status.Code != want.status {
			t.Errorf("frame %d: tx.rollback=%q status %v, want %q %v", i, v.AsString(), fs[i].Status.Code, want.rollback, want.status)
		}
	}
	if got := fmt.Sprint(eventNames(fs[2])); strings.Count(got, schema.EventParticipant) != 3 {
		t.Errorf("owner's events %s: want 3 participant events", got)
	}
}
