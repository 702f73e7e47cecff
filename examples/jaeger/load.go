package main

// The load generator: many transactions, each in a trace of its own, ending in every
// outcome in a fixed mix. It feeds the tail-sampling pipeline (tail-sampling.yaml) and its
// end-to-end test: the application samples every trace, the collector decides.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
)

// loadKind is what one generated transaction is built to end in.
type loadKind uint8

const (
	loadCommitted loadKind = iota
	loadParticipating
	loadRolledBack
	loadPostCommitFailure
	loadIndeterminate
	numLoadKinds
)

var loadKindNames = [numLoadKinds]string{"committed", "participating", "rolled_back", "committed_with_post_commit_failure", "indeterminate"}

func (k loadKind) String() string { return loadKindNames[k] }

// loadKindOf is the fixed mix: of every 200 transactions, 20 roll back, 8 fail after
// their commit, 1 is indeterminate, 10 hold a participating inner call, the rest commit.
func loadKindOf(i int) loadKind {
	switch {
	case i%200 == 199:
		return loadIndeterminate
	case i%10 == 3:
		return loadRolledBack
	case i%25 == 7:
		return loadPostCommitFailure
	case i%20 == 11:
		return loadParticipating
	}
	return loadCommitted
}

// outcome is the frame outcome a transaction of kind k is built to end in (the owner's,
// for a participating one).
func (k loadKind) outcome() outcome.Outcome {
	switch k {
	case loadRolledBack:
		return outcome.OutcomeRolledBack
	case loadPostCommitFailure:
		return outcome.OutcomeCommittedWithPostCommitFailure
	case loadIndeterminate:
		return outcome.OutcomeIndeterminate
	}
	return outcome.OutcomeCommitted
}

// loadReport is what the generator produced: the trace of every transaction, by kind.
type loadReport struct {
	traces  [numLoadKinds][]trace.TraceID
	started map[trace.TraceID]time.Time // when each transaction (or request) was begun
	errs    []error                     // transactions that did not end as built
}

func (r *loadReport) count(k loadKind) int { return len(r.traces[k]) }

// first is when the first transaction began.
func (r *loadReport) first() time.Time {
	var t time.Time
	for _, at := range r.started {
		if t.IsZero() || at.Before(t) {
			t = at
		}
	}
	return t
}

// loadFunc runs transaction i, of kind k, and returns the trace it is in.
type loadFunc func(ctx context.Context, i int, k loadKind) (trace.TraceID, error)

// runLoad runs n transactions on workers goroutines, each under a root span
// "load.<kind>", and checks that each ended in the outcome it was built for.
func (a *app) runLoad(ctx context.Context, n, workers int) *loadReport {
	return runLoadWith(ctx, 0, n, workers, func(ctx context.Context, i int, k loadKind) (trace.TraceID, error) {
		ctx, span := a.tracer.Start(ctx, "load."+k.String(), trace.WithAttributes(
			attribute.String("load.kind", k.String()), attribute.Int("load.index", i)))
		defer span.End()
		err := a.loadOne(ctx, k, loadRowID(i))
		if err != nil {
			span.SetStatus(codes.Error, "load: unexpected outcome")
		}
		return span.SpanContext().TraceID(), err
	})
}

// runLoadWith runs transactions from to to (exclusive) of the mix through one, on
// workers goroutines.
func runLoadWith(ctx context.Context, from, to, workers int, one loadFunc) *loadReport {
	rep := &loadReport{started: map[trace.TraceID]time.Time{}}
	var mu sync.Mutex
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				k := loadKindOf(i)
				start := time.Now()
				id, err := one(ctx, i, k)
				mu.Lock()
				if id.IsValid() {
					rep.traces[k] = append(rep.traces[k], id)
					rep.started[id] = start
				}
				if err != nil {
					rep.errs = append(rep.errs, fmt.Errorf("transaction %d (%s): %w", i, k, err))
				}
				mu.Unlock()
			}
		})
	}
	for i := from; i < to; i++ {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return rep
}

// loadRowID is the row transaction i of the mix inserts.
func loadRowID(i int) int { return 1_000_000 + i }

// loadOne runs one transaction of kind k that inserts row id.
func (a *app) loadOne(ctx context.Context, k loadKind, id int) error {
	ins := a.insert(id, id, "load")
	p := otelpgxtx.DefaultPolicy()
	var res outcome.Result[int]
	switch k {
	case loadCommitted:
		res = otelpgxtx.Run(ctx, a.pool, p, ins)
	case loadParticipating:
		var inner outcome.Result[int]
		res = otelpgxtx.Run(ctx, a.pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
			inner = otelpgxtx.Run(ctx, a.pool, p, ins)
			return 0, nil
		})
		if _, ok := inner.(outcome.Participating[int]); !ok {
			return unexpected("inner", inner, "participating")
		}
	case loadRolledBack:
		res = otelpgxtx.Run(ctx, a.pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
			if _, err := ins(ctx, tx); err != nil {
				return 0, err
			}
			return 0, errors.New("order rejected")
		})
	case loadPostCommitFailure:
		res = otelpgxtx.Run(ctx, a.pool, p, func(ctx context.Context, tx pgx.Tx) (int, error) {
			if err := otelpgxtx.AfterCommit(ctx, func(context.Context) error { return errors.New("broker unavailable") }); err != nil {
				return 0, err
			}
			return ins(ctx, tx)
		})
	case loadIndeterminate:
		var werr error
		res, _, werr = a.commitIndeterminately(ctx, ins)
		if _, ok := res.(outcome.Indeterminate[int]); !ok {
			return errors.Join(unexpected("run", res, "indeterminate"), werr)
		}
	}
	if want := k.outcome(); res == nil || res.Outcome() != want {
		return unexpected("run", res, want.String())
	}
	return nil
}

// printLoad prints what runLoad produced.
func printLoad(out io.Writer, rep *loadReport) {
	fmt.Fprintln(out, "Load: transactions by the outcome they were built for:")
	for k := range numLoadKinds {
		fmt.Fprintf(out, "  %-36s %6d\n", k, rep.count(k))
	}
	for _, err := range rep.errs {
		fmt.Fprintln(out, "  UNEXPECTED:", err)
	}
}
