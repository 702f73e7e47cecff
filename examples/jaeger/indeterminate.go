package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// runIndeterminate: the transaction sets synchronous_commit = on, so its COMMIT waits
// for the phantom synchronous standby after the commit record is in local WAL. A
// watcher waits until pg_stat_activity shows that backend in wait_event SyncRep and
// terminates it: the client loses the connection inside COMMIT and cannot know. Then
// automatic reconciliation asks PostgreSQL's commit log.
func runIndeterminate(ctx context.Context, a *app, s *scenarioRun) error {
	res, calls, werr := a.commitIndeterminately(ctx, a.insert(13, 113, "order 13"))
	s.result("run", res)
	ind, ok := res.(outcome.Indeterminate[int])
	if !ok {
		return errors.Join(unexpected("run", res, "indeterminate"), werr)
	}
	if calls != 1 {
		return fmt.Errorf("the function ran %d times: an indeterminate commit must never be replayed", calls)
	}
	ref, hasRef := ind.Reference()
	if !hasRef || ref.NoWrites() {
		return fmt.Errorf("indeterminate without a reconciliation reference (%v, %v)", ref, hasRef)
	}
	if !ind.CommittedLocally() {
		s.note("committed_locally=false")
	}
	// Automatic reconciliation (WithAutoReconcile) asks the commit log in the background;
	// its callback hands the answer here.
	rec, err := a.reconciled.wait(ctx, ind.OperationID())
	if err != nil {
		return err
	}
	got := rec.Answer
	s.note("reconciled=" + got.Status().String())
	if got.Status() != reconcile.Committed {
		return fmt.Errorf("reconciled %s (%s), want committed", got.Status(), got.Reason())
	}
	// Ground truth: the row is there.
	return a.wantRows(ctx, map[int]bool{13: true})
}

// commitIndeterminately runs fn in a transaction whose COMMIT waits for the phantom
// synchronous standby; a watcher terminates the backend as soon as pg_stat_activity shows
// it in wait_event SyncRep. It returns Run's result, how often fn ran, and the watcher's
// error.
func (a *app) commitIndeterminately(ctx context.Context, fn func(context.Context, pgx.Tx) (int, error)) (outcome.Result[int], int32, error) {
	wctx, stopWatcher := context.WithCancel(ctx)
	pids := make(chan uint32, 1)
	watched := make(chan error, 1)
	go func() {
		select {
		case pid := <-pids:
			err := a.ctl.WaitForWaitEvent(wctx, pid, "SyncRep")
			if err == nil {
				err = a.ctl.Terminate(wctx, pid)
			}
			watched <- err
		case <-wctx.Done():
			watched <- fmt.Errorf("the transaction function never ran: %w", wctx.Err())
		}
	}()
	var calls atomic.Int32
	res := otelpgxtx.Run(ctx, a.pool, otelpgxtx.DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		calls.Add(1)
		if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
			return 0, err
		}
		select {
		case pids <- tx.Conn().PgConn().PID():
		default: // a second attempt: the watcher is busy with the first
		}
		return fn(ctx, tx)
	})
	stopWatcher()
	return res, calls.Load(), <-watched
}
