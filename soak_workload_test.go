//go:build soak

package otelpgxtx

// The soak's workload (see soak_test.go): each worker draws operations (plan) and runs
// them through plain pgx with the tracer or through Run, recording what the caller saw for
// the checker.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/executor"
	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// soakCommitControl says how an operation's COMMIT may be interrupted from the client side.
type soakCommitControl uint8

const (
	soakCommitPlain    soakCommitControl = iota
	soakCommitCancel                     // the SyncRep watcher may cancel the context during COMMIT
	soakCommitDeadline                   // the COMMIT's context has a short deadline
)

// soakOp is one logical operation: one row id, one worker, one or more physical
// transactions (Run retries). Only its worker writes it; the checker reads it after the
// workers are done.
type soakOp struct {
	ran  bool // a worker ran it (an id handed out after the time bound is not run)
	id   int64
	run  bool   // through Run; otherwise plain pgx
	via  string // "direct" or "proxy"
	span trace.SpanID

	syncRep        bool
	control        soakCommitControl
	dup            bool // inserts a duplicate into the deferred unique column
	serial         bool // SERIALIZABLE, updates a shared row
	appRollback    bool
	pause          bool // think time before COMMIT: idle in transaction
	postCommitFail bool // Run: a post-commit hook fails
	participant    bool // Run: a Required call joins and inserts a second row
	marker         bool // Run: with the commit marker (Policy.CommitMarker)
	// ref: plain pgx: the commit references of its pool ("", "xid": WithCommitReference,
	// "marker": WithCommitMarker).
	ref string
	// incr: plain pgx, not idempotent: increments the operation's counter row, through a
	// retry loop (runIncrement): a plain retry on error, or, with verdict, Retry and
	// reconciliation.
	incr, verdict bool

	// Plain pgx: what the caller saw.
	failedAt  string // "", "begin", "statement"
	err       error
	committed bool // Commit was called
	commitErr error

	// incr with verdict: the verdict of each Retry call, and the answers of the
	// reconciliations of its indeterminate ones.
	verdicts []outcome.Result[struct{}]
	answers  []reconcile.Answer
	// noVerdict: Retry calls that returned no verdict (ErrNoVerdict), which an
	// instrumented pool never should: a transaction that never reached the server is a
	// retryable rollback.
	noVerdict int

	// Run.
	res   outcome.Result[int64]
	inner outcome.Result[int64] // the participant's result, of the last attempt
	calls int
}

func (o *soakOp) path() string {
	if o.run {
		return "run"
	}
	return "pgx"
}

// soakWaiter is a COMMIT that may sit in the SyncRep wait, as its worker registered it.
type soakWaiter struct {
	cancel   context.CancelFunc // nil for a deadline: the deadline will end the wait
	deadline bool
}

func (s *soak) worker(ctx context.Context, w int, deadline time.Time) {
	rng := rand.New(rand.NewPCG(s.cfg.seed, uint64(w)))
	for {
		id := s.next.Add(1)
		if id > int64(s.cfg.tx) || (s.cfg.duration > 0 && time.Now().After(deadline)) || ctx.Err() != nil {
			return
		}
		op := &s.ops[id-1]
		s.plan(op, id, rng)
		s.runOp(ctx, op, rng)
		s.done.Add(1)
		if op.failedAt == "begin" || soakNotStarted(op.res) {
			// The server is down or unreachable: give it a moment rather than spin.
			soakThink(ctx, time.Duration(2+rng.IntN(10))*time.Millisecond)
		}
	}
}

func soakNotStarted(r outcome.Result[int64]) bool {
	rb, ok := r.(outcome.DeterminateRollback[int64])
	return ok && rb.Phase() == outcome.PhaseNotStarted
}

// plan draws what the operation does.
func (s *soak) plan(op *soakOp, id int64, rng *rand.Rand) {
	op.ran, op.id = true, id
	op.run = rng.IntN(2) == 0
	op.via = "direct"
	if rng.IntN(100) < 40 {
		op.via = "proxy"
	}
	switch r := rng.IntN(100); {
	case r < 15:
		op.syncRep = true
		op.control = soakCommitCancel
		if rng.IntN(100) < 30 {
			op.control = soakCommitDeadline
		}
	case r < 20:
		op.dup = true
	case r < 40:
		op.serial = true
	case r < 45:
		op.appRollback = true
	}
	op.pause = rng.IntN(100) < 15
	if op.run {
		op.postCommitFail = rng.IntN(100) < 5
		op.participant = rng.IntN(100) < 8
		op.marker = rng.IntN(2) == 0
	} else {
		op.ref = [...]string{"", "xid", "marker"}[rng.IntN(3)]
		op.incr = rng.IntN(100) < 30
		op.verdict = op.incr && rng.IntN(2) == 0
		op.dup = op.dup && !op.incr // the deferred unique column is soak_rows'
		op.appRollback = op.appRollback && !op.incr
	}
}

// mode is how an operation's indeterminate outcome can be settled: plain pgx frames have
// no reference without the tracer's option, an xid with WithCommitReference, and a marker
// row too with WithCommitMarker; Run's carry an xid, and with the marker its row too.
func (o *soakOp) mode() string {
	switch {
	case !o.run && o.ref == "xid":
		return "pgx, xid only"
	case !o.run && o.ref == "marker":
		return "pgx, xid + marker"
	case !o.run:
		return "pgx"
	case o.marker:
		return "run, xid + marker"
	}
	return "run, xid only"
}

func (s *soak) pool(op *soakOp) *pgxpool.Pool {
	i := 0
	if op.via == "proxy" {
		i = 1
	}
	if !op.run && op.ref != "" {
		return s.refPools[op.ref][i]
	}
	return [2]*pgxpool.Pool{s.direct, s.proxied}[i]
}

var errSoakAppRollback = errors.New("soak: the application rolls back")

func (s *soak) runOp(ctx context.Context, op *soakOp, rng *rand.Rand) {
	// Bounds every operation: a hang is a finding, not a reason to stall the suite.
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	ctx, span := s.tp.Tracer("soak").Start(ctx, "soak.op", trace.WithAttributes(
		attribute.Int64("soak.id", op.id), attribute.String("soak.path", op.path()), attribute.String("soak.via", op.via)))
	defer span.End()
	op.span = span.SpanContext().SpanID()
	switch {
	case op.run:
		s.runWithRun(ctx, op, rng)
	case op.incr:
		s.runIncrement(ctx, op, rng)
	default:
		s.runPlain(ctx, op, rng)
	}
}

// body is the work of one physical transaction; opID names its frame in the row.
func (s *soak) body(ctx context.Context, tx pgx.Tx, op *soakOp, opID string, rng *rand.Rand) error {
	if op.syncRep {
		if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
			return err
		}
	}
	if op.serial {
		var sum int64
		if err := tx.QueryRow(ctx, "select coalesce(sum(v), 0)::bigint from soak_shared").Scan(&sum); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "update soak_shared set v = v + 1 where id = $1", 1+rng.IntN(4)); err != nil {
			return err
		}
	}
	if op.incr {
		// Not idempotent: each commit adds one. soak_incr names the frame that did, for
		// the checker's ground truth per frame.
		if _, err := tx.Exec(ctx, "insert into soak_counter (id, n) values ($1, 1) on conflict (id) do update set n = soak_counter.n + 1", op.id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "insert into soak_incr (frame, id) values ($1, $2)", opID, op.id); err != nil {
			return err
		}
	} else {
		k := op.id
		if op.dup {
			k = 0 // the seed row's: the deferred unique check fails at COMMIT
		}
		if _, err := tx.Exec(ctx, "insert into soak_rows (id, k, op, path) values ($1, $2, $3, $4)", op.id, k, opID, op.path()); err != nil {
			return err
		}
	}
	if op.pause {
		soakThink(ctx, time.Duration(rng.IntN(4000))*time.Microsecond)
	}
	return nil
}

// soakThink is the workload's think time: idle in transaction, for the nemesis to find.
func soakThink(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// commitContext returns the context for a COMMIT on backend pid, registered with the
// SyncRep watcher; release unregisters it.
func (s *soak) commitContext(ctx context.Context, op *soakOp, pid uint32, rng *rand.Rand) (context.Context, func()) {
	if !op.syncRep || op.control == soakCommitPlain {
		return ctx, func() {}
	}
	var cctx context.Context
	var cancel context.CancelFunc
	w := soakWaiter{}
	if op.control == soakCommitDeadline {
		cctx, cancel = context.WithTimeout(ctx, time.Duration(10+rng.IntN(60))*time.Millisecond)
		w.deadline = true
	} else {
		cctx, cancel = context.WithCancel(ctx)
		w.cancel = cancel
	}
	s.register(pid, w)
	return cctx, func() {
		s.unregister(pid)
		cancel()
	}
}

func (s *soak) register(pid uint32, w soakWaiter) {
	s.waitersMu.Lock()
	s.waiters[pid] = w
	s.waitersMu.Unlock()
}

func (s *soak) unregister(pid uint32) {
	s.waitersMu.Lock()
	delete(s.waiters, pid)
	s.waitersMu.Unlock()
}

func (s *soak) waiter(pid uint32) (soakWaiter, bool) {
	s.waitersMu.Lock()
	defer s.waitersMu.Unlock()
	w, ok := s.waiters[pid]
	return w, ok
}

// runPlain is the plain pgx path: the caller has no Result; the outcome is the span's.
func (s *soak) runPlain(ctx context.Context, op *soakOp, rng *rand.Rand) {
	opts := pgx.TxOptions{}
	if op.serial {
		opts.IsoLevel = pgx.Serializable
	}
	tx, err := s.pool(op).BeginTx(ctx, opts)
	if err != nil {
		op.failedAt, op.err = "begin", err
		return
	}
	opID := ""
	if f, _ := frame.FrameOfTx(tx); f != nil {
		opID = f.ID.String()
	}
	if err := s.body(ctx, tx, op, opID, rng); err != nil {
		op.failedAt, op.err = "statement", err
		_ = tx.Rollback(ctx)
		return
	}
	if op.appRollback {
		op.err = tx.Rollback(ctx)
		return
	}
	cctx, release := s.commitContext(ctx, op, tx.Conn().PgConn().PID(), rng)
	op.committed = true
	op.commitErr = tx.Commit(cctx)
	release()
}

// soakIncrCalls bounds the calls of an increment's retry loop.
const soakIncrCalls = 4

// runIncrement runs an increment through the retry loop callers write: without the
// verdict, again on every error (a replay of a commit that did apply applies it twice);
// with it, Retry (again only after a retryable rollback) and, for an indeterminate
// commit with a reference, reconciliation, again only when it answers aborted.
func (s *soak) runIncrement(ctx context.Context, op *soakOp, rng *rand.Rand) {
	if !op.verdict {
		for range soakIncrCalls {
			op.calls++
			if op.err = s.incrOnce(ctx, op, rng); op.err == nil || ctx.Err() != nil {
				return
			}
			soakThink(ctx, time.Duration(1+rng.IntN(5))*time.Millisecond)
		}
		return
	}
	for op.calls < soakIncrCalls && ctx.Err() == nil {
		res, err := Retry(ctx, soakIncrCalls-op.calls, func(ctx context.Context) error {
			op.calls++
			return s.incrOnce(ctx, op, rng)
		})
		op.err = err
		if res == nil {
			if errors.Is(err, ErrNoVerdict) {
				op.noVerdict++ // a failure of the checker's: see checkIncrement
			}
			return
		}
		op.verdicts = append(op.verdicts, res)
		ind, ok := res.(outcome.Indeterminate[struct{}])
		if !ok {
			return
		}
		if _, hasRef := ind.Reference(); !hasRef {
			return // never replayed; nothing to ask the database
		}
		ans, err := reconcile.Indeterminate(ctx, s.rec, ind)
		if err != nil {
			return // unknown for now: automatic reconciliation settles it
		}
		op.answers = append(op.answers, ans)
		if ans.Status() != reconcile.Aborted && ans.Status() != reconcile.NoWrites {
			return
		}
	}
}

// incrOnce is one increment transaction, plain pgx.
func (s *soak) incrOnce(ctx context.Context, op *soakOp, rng *rand.Rand) error {
	opts := pgx.TxOptions{}
	if op.serial {
		opts.IsoLevel = pgx.Serializable
	}
	tx, err := s.pool(op).BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	opID := ""
	if f, _ := frame.FrameOfTx(tx); f != nil {
		opID = f.ID.String()
	}
	if err := s.body(ctx, tx, op, opID, rng); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	cctx, release := s.commitContext(ctx, op, tx.Conn().PgConn().PID(), rng)
	defer release()
	return tx.Commit(cctx)
}

// runWithRun is the executor path, with commit references on.
func (s *soak) runWithRun(ctx context.Context, op *soakOp, rng *rand.Rand) {
	p := DefaultPolicy()
	p.BackoffBase, p.BackoffMax = time.Millisecond, 20*time.Millisecond
	if op.marker {
		p.CommitMarker = soakMarker
	}
	if op.serial {
		p.IsoLevel = pgx.Serializable
	}
	policyCtx := ctx
	if op.syncRep && op.control != soakCommitPlain {
		// The whole call runs under the context that may end during COMMIT; fn registers
		// the backend with the SyncRep watcher once it knows it.
		var cancel context.CancelFunc
		w := soakWaiter{deadline: op.control == soakCommitDeadline}
		if w.deadline {
			// Long enough for the statements, short enough to end the SyncRep wait.
			policyCtx, cancel = context.WithTimeout(ctx, time.Duration(30+rng.IntN(60))*time.Millisecond)
		} else {
			policyCtx, cancel = context.WithCancel(ctx)
			w.cancel = cancel
		}
		defer cancel()
		var pids []uint32
		defer func() {
			for _, pid := range pids {
				s.unregister(pid)
			}
		}()
		op.res = Run(policyCtx, s.pool(op), p, func(ctx context.Context, tx pgx.Tx) (int64, error) {
			v, err := s.runBody(ctx, tx, op, rng)
			if err == nil {
				pid := tx.Conn().PgConn().PID()
				pids = append(pids, pid)
				s.register(pid, w)
			}
			return v, err
		})
		return
	}
	op.res = Run(policyCtx, s.pool(op), p, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		return s.runBody(ctx, tx, op, rng)
	})
}

// runBody is the Run function: the body, the participant, the post-commit hook.
func (s *soak) runBody(ctx context.Context, tx pgx.Tx, op *soakOp, rng *rand.Rand) (int64, error) {
	op.calls++
	sc := executor.ScopeFromContext(ctx)
	if sc == nil {
		return 0, errors.New("soak: no scope in the Run function's context")
	}
	opID := sc.ID.String()
	if err := s.body(ctx, tx, op, opID, rng); err != nil {
		return 0, err
	}
	if op.participant {
		op.inner = Run(ctx, s.pool(op), DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int64, error) {
			_, err := tx.Exec(ctx, "insert into soak_rows (id, k, op, path) values ($1, $1, $2, 'participant')", op.id+soakParticipantOffset, opID)
			return op.id, err
		})
		if op.inner.Outcome() != outcome.OutcomeParticipating {
			return 0, fmt.Errorf("soak: participant: %s", op.inner.Outcome())
		}
	}
	if op.postCommitFail {
		if err := AfterCommit(ctx, func(context.Context) error { return errors.New("soak: post-commit work failed") }); err != nil {
			return 0, err
		}
	}
	if op.appRollback {
		return 0, errSoakAppRollback
	}
	return op.id, nil
}
