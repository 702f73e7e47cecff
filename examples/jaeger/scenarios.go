package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
)

// scenario is one trace of the demo: a piece of application code that ends, for real,
// in the outcome it is named for.
type scenario struct {
	name  string // the root span is "demo.<name>"
	title string
	// frames are the tx.outcome values of the frame spans its trace must hold (any order).
	frames []string
	run    func(ctx context.Context, a *app, s *scenarioRun) error
}

// scenarioRun collects what one run of a scenario returned, for its root span and the report.
type scenarioRun struct {
	mu      sync.Mutex
	results []string
}

// result records a Run result under a label: "outer=committed".
func (s *scenarioRun) result(label string, r interface{ Outcome() outcome.Outcome }) {
	if r == nil {
		s.note(label + "=none")
		return
	}
	s.note(label + "=" + r.Outcome().String())
}

func (s *scenarioRun) note(n string) {
	s.mu.Lock()
	s.results = append(s.results, n)
	s.mu.Unlock()
}

// scenarios are run in this order, each in a trace of its own.
var scenarios = []*scenario{
	{
		name:   "committed",
		title:  "Run commits an order",
		frames: []string{"committed"},
		run: func(ctx context.Context, a *app, s *scenarioRun) error {
			res := otelpgxtx.Run(ctx, a.pool, otelpgxtx.DefaultPolicy(), a.insert(1, 101, "order 1"))
			s.result("run", res)
			if _, ok := res.(outcome.Committed[int]); !ok {
				return unexpected("run", res, "committed")
			}
			return a.wantRows(ctx, map[int]bool{1: true})
		},
	},
	{
		name:   "rolled_back",
		title:  "the function returns an error: Run rolls back (a failure, not retryable)",
		frames: []string{"rolled_back"},
		run: func(ctx context.Context, a *app, s *scenarioRun) error {
			res := otelpgxtx.Run(ctx, a.pool, otelpgxtx.DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
				if _, err := a.insert(2, 102, "order 2")(ctx, tx); err != nil {
					return 0, err
				}
				return 0, errors.New("order rejected: out of stock")
			})
			s.result("run", res)
			rb, ok := res.(outcome.DeterminateRollback[int])
			if !ok || rb.Retryable() || rb.Phase() != outcome.PhaseActive {
				return unexpected("run", res, "rolled_back in phase active, not retryable")
			}
			return a.wantRows(ctx, map[int]bool{2: false})
		},
	},
	{
		name:   "read_only",
		title:  "a read-only report ends with Rollback(), the usual Go way: rolled_back, tx.rollback=deliberate, not an error",
		frames: []string{"rolled_back"},
		run: func(ctx context.Context, a *app, s *scenarioRun) error {
			tx, err := a.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
			if err != nil {
				return err
			}
			var n int
			err = tx.QueryRow(ctx, fmt.Sprintf("select count(*) from %s", a.table)).Scan(&n)
			s.note(fmt.Sprintf("orders=%d", n))
			return errors.Join(err, tx.Rollback(ctx))
		},
	},
	{
		name:   "rolled_back_at_commit",
		title:  "a deferred unique constraint fails at COMMIT (SQLSTATE 23505): rolled back for certain",
		frames: []string{"rolled_back"},
		run: func(ctx context.Context, a *app, s *scenarioRun) error {
			p := otelpgxtx.DefaultPolicy()
			// k = 7 is taken; the constraint is checked only at COMMIT.
			res := otelpgxtx.Run(ctx, a.pool, p, a.insert(3, 7, "order 3, duplicate key"))
			s.result("run", res)
			rb, ok := res.(outcome.DeterminateRollback[int])
			var pgErr *pgconn.PgError
			if !ok || rb.Retryable() || rb.Phase() != outcome.PhaseCommitting || !errors.As(rb.Cause(), &pgErr) || pgErr.Code != "23505" {
				return unexpected("run", res, "rolled_back in phase committing with SQLSTATE 23505")
			}
			return a.wantRows(ctx, map[int]bool{3: false})
		},
	},
	{
		name:   "serialization_retry",
		title:  "write skew under SERIALIZABLE: one of two workers fails with 40001 and is retried to success",
		frames: []string{"committed", "committed", "rolled_back"},
		run:    runWriteSkew,
	},
	{
		name:   "participating",
		title:  "Required inside Required: the inner call joins the outer transaction and reports participating",
		frames: []string{"committed"}, // a participant has no frame of its own: it claims nothing
		run: func(ctx context.Context, a *app, s *scenarioRun) error {
			var inner outcome.Result[int]
			res := otelpgxtx.Run(ctx, a.pool, otelpgxtx.DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
				if _, err := a.insert(5, 105, "order 5")(ctx, tx); err != nil {
					return 0, err
				}
				inner = otelpgxtx.Run(ctx, a.pool, otelpgxtx.DefaultPolicy(), a.insert(6, 106, "order 5, line 1"))
				return 5, nil
			})
			s.result("outer", res)
			s.result("inner", inner)
			if _, ok := inner.(outcome.Participating[int]); !ok || inner.OperationID() != res.OperationID() {
				return unexpected("inner", inner, "participating, naming the outer operation")
			}
			if _, ok := res.(outcome.Committed[int]); !ok {
				return unexpected("outer", res, "committed")
			}
			return a.wantRows(ctx, map[int]bool{5: true, 6: true})
		},
	},
	{
		name:   "nested_frames",
		title:  "RequiresNew inside Required: the inner transaction commits, the outer rolls back",
		frames: []string{"rolled_back", "committed"},
		run: func(ctx context.Context, a *app, s *scenarioRun) error {
			var inner outcome.Result[int]
			res := otelpgxtx.Run(ctx, a.pool, otelpgxtx.DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
				if _, err := a.insert(7, 107, "order 7")(ctx, tx); err != nil {
					return 0, err
				}
				p := otelpgxtx.DefaultPolicy()
				p.Propagation = otelpgxtx.RequiresNew
				inner = otelpgxtx.Run(ctx, a.pool, p, a.insert(8, 108, "audit: order 7 attempted"))
				return 0, errors.New("payment declined")
			})
			s.result("outer", res)
			s.result("inner", inner)
			if _, ok := inner.(outcome.Committed[int]); !ok {
				return unexpected("inner", inner, "committed")
			}
			if _, ok := res.(outcome.DeterminateRollback[int]); !ok {
				return unexpected("outer", res, "rolled_back")
			}
			return a.wantRows(ctx, map[int]bool{7: false, 8: true})
		},
	},
	{
		name:   "savepoint",
		title:  "Nested: one savepoint rolled back, another released; the transaction commits",
		frames: []string{"committed"},
		run: func(ctx context.Context, a *app, s *scenarioRun) error {
			var failed, released outcome.Result[int]
			res := otelpgxtx.Run(ctx, a.pool, otelpgxtx.DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
				if _, err := a.insert(9, 109, "order 9")(ctx, tx); err != nil {
					return 0, err
				}
				p := otelpgxtx.DefaultPolicy()
				p.Propagation = otelpgxtx.Nested
				failed = otelpgxtx.Run(ctx, a.pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
					if _, err := a.insert(10, 110, "gift wrap")(ctx, tx); err != nil {
						return 0, err
					}
					return 0, errors.New("gift wrap unavailable")
				})
				released = otelpgxtx.Run(ctx, a.pool, p, a.insert(11, 111, "standard wrap"))
				return 9, nil
			})
			s.result("outer", res)
			s.result("savepoint1", failed)
			s.result("savepoint2", released)
			if _, ok := failed.(outcome.DeterminateRollback[int]); !ok {
				return unexpected("savepoint1", failed, "rolled_back (to its savepoint)")
			}
			if _, ok := released.(outcome.Participating[int]); !ok {
				return unexpected("savepoint2", released, "participating")
			}
			if _, ok := res.(outcome.Committed[int]); !ok {
				return unexpected("outer", res, "committed")
			}
			return a.wantRows(ctx, map[int]bool{9: true, 10: false, 11: true})
		},
	},
	{
		name:   "post_commit_failure",
		title:  "the commit succeeds, then an AfterCommit hook fails: committed_with_post_commit_failure",
		frames: []string{"committed_with_post_commit_failure"},
		run: func(ctx context.Context, a *app, s *scenarioRun) error {
			res := otelpgxtx.Run(ctx, a.pool, otelpgxtx.DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
				if err := otelpgxtx.AfterCommit(ctx, func(context.Context) error {
					return errors.New("publishing order-created event: broker unavailable")
				}); err != nil {
					return 0, err
				}
				return a.insert(12, 112, "order 12")(ctx, tx)
			})
			s.result("run", res)
			if _, ok := res.(outcome.CommittedWithPostCommitFailure[int]); !ok {
				return unexpected("run", res, "committed_with_post_commit_failure")
			}
			return a.wantRows(ctx, map[int]bool{12: true})
		},
	},
	{
		name: "autocommit",
		title: "two autocommit INSERTs on the pool, no BEGIN (as sqlc calls them): each is an implicit transaction, " +
			"its frame the statement's own span; the second breaks the primary key: rolled_back",
		frames: []string{"committed", "rolled_back"},
		run: func(ctx context.Context, a *app, s *scenarioRun) error {
			insert := fmt.Sprintf("insert into %s (id, k, note) values ($1, $2, $3)", a.table)
			for _, w := range []struct {
				label, note string
				want        outcome.Outcome
			}{{"first", "order 14", outcome.OutcomeCommitted}, {"second", "order 14 again", outcome.OutcomeRolledBack}} {
				vctx, v := otelpgxtx.NewVerdict(ctx) // what the library made of the writes made with vctx
				_, werr := a.pool.Exec(vctx, insert, 14, len(w.note), w.note)
				res, err := v.Result()
				if err != nil {
					return fmt.Errorf("%s: %w (write: %v)", w.label, err, werr)
				}
				s.note(w.label + "=" + res.Outcome().String())
				if res.Outcome() != w.want {
					return fmt.Errorf("%s: got %s, want %s (write: %v)", w.label, res.Outcome(), w.want, werr)
				}
			}
			return a.wantRows(ctx, map[int]bool{14: true})
		},
	},
	{
		name:   "indeterminate",
		title:  "the backend is terminated while COMMIT waits for synchronous replication: indeterminate, then reconciled",
		frames: []string{"indeterminate"},
		run:    runIndeterminate,
	},
}

// insert returns a Run function that inserts one order row.
func (a *app) insert(id, k int, note string) func(context.Context, pgx.Tx) (int, error) {
	return func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id, k, note) values ($1, $2, $3)", a.table), id, k, note)
		return id, err
	}
}

// wantRows checks the ground truth: which rows the database holds afterwards.
func (a *app) wantRows(ctx context.Context, want map[int]bool) error {
	ids := make([]int, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		got, err := a.rowExists(ctx, id)
		if err != nil {
			return err
		}
		if got != want[id] {
			return fmt.Errorf("row %d present = %v, want %v", id, got, want[id])
		}
	}
	return nil
}

func unexpected(label string, r outcome.Result[int], want string) error {
	if r == nil {
		return fmt.Errorf("%s: no result, want %s", label, want)
	}
	detail := ""
	switch r := r.(type) {
	case outcome.DeterminateRollback[int]:
		detail = fmt.Sprintf(" (phase %s, retryable %v, cause %v)", r.Phase(), r.Retryable(), r.Cause())
	case outcome.Indeterminate[int]:
		detail = fmt.Sprintf(" (cause %v)", r.Cause())
	case outcome.CommittedWithPostCommitFailure[int]:
		detail = fmt.Sprintf(" (failure %v)", r.Failure())
	}
	return fmt.Errorf("%s: got %s%s, want %s", label, r.Outcome(), detail, want)
}
