package otelpgxtx

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// TestRunNestedDeadlineKeepsOuter gives a Nested call a deadline that expires between
// two of its statements: the call returns DeterminateRollback, its work is rolled back
// to the savepoint, and the outer transaction, whose function returns nil, commits.
// When the savepoint was rolled back with the expired context, nothing was sent and the
// outer transaction was rolled back.
func TestRunNestedDeadlineKeepsOuter(t *testing.T) {
	for _, fnIgnoresErr := range []bool{false, true} {
		name := "fn returns the error"
		if fnIgnoresErr {
			name = "fn returns nil"
		}
		t.Run(name, func(t *testing.T) {
			ctx := pgtest.ContextFor(t)
			h := newHarness(t, "", 1)
			table := srv.NewTable(t, ctx, tableColumns)
			var nested outcome.Result[int]
			res := Run(ctx, h.pool, DefaultPolicy(), insertThen(table, func(ctx context.Context, tx pgx.Tx) (int, error) {
				p := policyWith(Nested)
				ictx, cancel := context.WithCancel(ctx) // expires when the test says, not by the clock
				defer cancel()
				nested = Run(ictx, h.pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
					if _, err := insertFn(table, 2)(ctx, tx); err != nil {
						return 0, err
					}
					cancel()
					<-ctx.Done()
					_, err := insertFn(table, 3)(ctx, tx)
					if !errors.Is(err, context.Canceled) {
						t.Errorf("statement after the deadline: %v", err)
					}
					if fnIgnoresErr {
						return 0, nil
					}
					return 0, err
				})
				return 1, nil
			}))
			if _, ok := res.(outcome.Committed[int]); !ok {
				t.Fatalf("outer = %T %+v, want Committed", res, res)
			}
			rb, ok := nested.(outcome.DeterminateRollback[int])
			if !ok || !errors.Is(rb.Cause(), context.Canceled) {
				t.Fatalf("nested = %T %+v, want a rollback caused by the cancellation", nested, nested)
			}
			if !srv.RowExists(t, ctx, table, 1) || srv.RowExists(t, ctx, table, 2) || srv.RowExists(t, ctx, table, 3) {
				t.Fatal("want the outer row committed and the nested rows rolled back")
			}
			wantEvents(t, onlyFrame(t, h), "tx.phase.active", "tx.savepoint.created", "tx.savepoint.rolled_back",
				"tx.participant", "tx.phase.committing", "tx.phase.committed")
		})
	}
}

// TestRunNestedAlreadyExpired calls Nested with a context that has already expired: the
// SAVEPOINT is never sent, the call is a rollback, and the outer transaction commits.
func TestRunNestedAlreadyExpired(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	table := srv.NewTable(t, ctx, tableColumns)
	var nested outcome.Result[int]
	res := Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		p := policyWith(Nested)
		ictx, cancel := context.WithCancel(ctx)
		cancel()
		nested = Run(ictx, h.pool, p, insertFn(table, 2))
		return insertFn(table, 1)(ctx, tx)
	})
	if _, ok := res.(outcome.Committed[int]); !ok {
		t.Fatalf("outer = %T %+v, want Committed", res, res)
	}
	if _, ok := nested.(outcome.DeterminateRollback[int]); !ok {
		t.Fatalf("nested = %T", nested)
	}
	if !srv.RowExists(t, ctx, table, 1) || srv.RowExists(t, ctx, table, 2) {
		t.Fatal("want only the outer row")
	}
}

// TestRunRequiresNewOtherPoolOfOne runs RequiresNew on a second pool with one connection
// inside a Run on the first: the suspended transaction holds no connection of the
// second pool, so the call is not refused, and both commit.
func TestRunRequiresNewOtherPoolOfOne(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h1, h2 := newHarness(t, "", 1), newHarness(t, "", 1)
	table := srv.NewTable(t, ctx, tableColumns)
	var inner outcome.Result[int]
	res := Run(ctx, h1.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		p := policyWith(RequiresNew)
		inner = Run(ctx, h2.pool, p, insertFn(table, 2))
		// And a second level back on the first pool: its one connection is held.
		if _, err := requiresNewOn(ctx, h1.pool); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("RequiresNew on the held pool of one: %v", err)
		}
		return insertFn(table, 1)(ctx, tx)
	})
	if _, ok := inner.(outcome.Committed[int]); !ok {
		t.Fatalf("inner = %T %+v, want Committed", inner, inner)
	}
	if _, ok := res.(outcome.Committed[int]); !ok {
		t.Fatalf("outer = %T %+v", res, res)
	}
	if !srv.RowExists(t, ctx, table, 1) || !srv.RowExists(t, ctx, table, 2) {
		t.Fatal("rows missing")
	}
}
