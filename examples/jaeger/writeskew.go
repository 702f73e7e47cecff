package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
)

// runWriteSkew: two workers each read one row and write the other. Both first attempts
// read before either writes, so SERIALIZABLE must fail one of them (40001); the
// executor retries it, and both commit.
func runWriteSkew(ctx context.Context, a *app, s *scenarioRun) error {
	p := otelpgxtx.DefaultPolicy()
	p.IsoLevel, p.MaxAttempts = pgx.Serializable, 5
	var reads atomic.Int32
	bothRead := make(chan struct{})
	var calls [2]atomic.Int32
	results := make([]outcome.Result[int], 2)
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			results[w] = otelpgxtx.Run(ctx, a.pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
				attempt := calls[w].Add(1)
				var sum int
				if err := tx.QueryRow(ctx, fmt.Sprintf("select coalesce(sum(v), 0) from %s where k = $1", a.skewTable), w+1).Scan(&sum); err != nil {
					return 0, err
				}
				if attempt == 1 {
					// Both first attempts read before either writes: the write skew.
					if reads.Add(1) == 2 {
						close(bothRead)
					}
					select {
					case <-bothRead:
					case <-ctx.Done():
						return 0, ctx.Err()
					}
				}
				_, err := tx.Exec(ctx, fmt.Sprintf("update %s set v = v + $1 where k = $2", a.skewTable), sum+1, 2-w)
				return int(attempt), err
			})
		})
	}
	wg.Wait()
	retried := 0
	for w, r := range results {
		label := fmt.Sprintf("worker%d", w+1)
		s.result(label, r)
		c, ok := r.(outcome.Committed[int])
		if !ok {
			return unexpected(label, r, "committed")
		}
		if c.Value() > 1 {
			retried++
			s.note(fmt.Sprintf("%s.attempts=%d", label, c.Value()))
		}
	}
	if retried == 0 {
		return errors.New("no worker was retried: the write skew did not happen")
	}
	return nil
}
