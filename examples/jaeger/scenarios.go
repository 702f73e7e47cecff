package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
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
		name:   "indeterminate",
		title:  "the backend is terminated while COMMIT waits for synchronous replication: indeterminate, then reconciled",
		frames: []string{"indeterminate"},
		run:    runIndeterminate,
	},
}

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

// scenarioReport is one scenario's run: its trace, what Run returned, and whether that
// was what the scenario is for.
type scenarioReport struct {
	sc      *scenario
	traceID trace.TraceID
	results []string
	err     error
	spans   []sdktrace.ReadOnlySpan // of its trace, in end order
}

type roundReport struct {
	n           int
	scenarios   []scenarioReport
	err         error // the round could not run
	interrupted bool
}

func (r roundReport) ok() bool {
	if r.interrupted {
		return true
	}
	if r.err != nil {
		return false
	}
	for _, s := range r.scenarios {
		if s.err != nil {
			return false
		}
	}
	return true
}

// round runs every scenario once, each under a root span of its own, and checks its
// results and its frame spans.
func (a *app) round(ctx context.Context, n int) roundReport {
	rep := roundReport{n: n}
	a.tel.collector.take() // only this round's spans from here on
	if err := a.resetTables(ctx); err != nil {
		rep.err = err
		rep.interrupted = ctx.Err() != nil
		return rep
	}
	for _, sc := range scenarios {
		sctx, cancel := context.WithTimeout(ctx, a.cfg.scenarioTimeout)
		sctx, span := a.tracer.Start(sctx, "demo."+sc.name, trace.WithAttributes(
			attribute.String("demo.scenario", sc.name),
			attribute.String("demo.title", sc.title),
			attribute.Int("demo.round", n),
		))
		run := &scenarioRun{}
		err := sc.run(sctx, a, run)
		// demo.results are the Result variants the application code got back: the
		// demo's own record, not the library's (a participant has no span to carry it).
		span.SetAttributes(attribute.StringSlice("demo.results", run.results))
		if err != nil {
			span.SetStatus(codes.Error, "demo: unexpected outcome")
		}
		span.End()
		cancel()
		rep.scenarios = append(rep.scenarios, scenarioReport{sc: sc, traceID: span.SpanContext().TraceID(), results: run.results, err: err})
		if ctx.Err() != nil {
			rep.interrupted = true
			return rep
		}
	}
	byTrace := map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	for _, s := range a.tel.collector.take() {
		byTrace[s.SpanContext().TraceID()] = append(byTrace[s.SpanContext().TraceID()], s)
	}
	for i := range rep.scenarios {
		sr := &rep.scenarios[i]
		sr.spans = byTrace[sr.traceID]
		if sr.err == nil {
			sr.err = checkFrames(sr.sc, sr.spans)
		}
	}
	return rep
}

// isFrame reports whether s is a transaction frame span of the library.
func isFrame(s sdktrace.ReadOnlySpan) bool {
	if s.InstrumentationScope().Name != otelpgxtx.ScopeName {
		return false
	}
	_, ok := spanAttr(s, otelpgxtx.FrameDepthKey)
	return ok
}

func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// checkFrames compares the tx.outcome of the trace's frame spans with the scenario's.
func checkFrames(sc *scenario, spans []sdktrace.ReadOnlySpan) error {
	var got []string
	for _, s := range spans {
		if isFrame(s) {
			v, _ := spanAttr(s, otelpgxtx.OutcomeKey)
			got = append(got, v.AsString())
		}
	}
	want := slices.Clone(sc.frames)
	slices.Sort(got)
	slices.Sort(want)
	if sc.name == "serialization_retry" && len(got) > len(want) {
		// More than one conflict is possible in principle; every extra frame must be a
		// retried rollback.
		want = append(want, slices.Repeat([]string{"rolled_back"}, len(got)-len(want))...)
		slices.Sort(want)
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("frame spans carry tx.outcome %s, want %s", strings.Join(got, ","), strings.Join(want, ","))
	}
	return nil
}
