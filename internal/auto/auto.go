package auto

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/record"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// pendingOutcome is one indeterminate frame waiting for its reconciliation.
type pendingOutcome struct {
	id   outcome.OperationID
	ref  *outcome.ReconciliationRef // nil: the frame has none
	link trace.SpanContext
	// parent is the span the frame was begun under: the attempts' parent, so that they
	// join the frame's trace, as a follow-up of the work that began it. When the frame
	// was begun under none, the attempts are children of the frame span (see
	// reconcile.Reconciler.ResolveOperation).
	parent   trace.SpanContext
	at       time.Time
	local    bool // the frame's committedLocally
	due      time.Time
	attempts int
	inFlight bool
	// final is the answer of an outcome dropped from the queue, settled without asking.
	final *reconcile.Answer
	// waiter is told every answer, for a Retry that waits for it (the frame's awaited).
	waiter *record.Awaited
}

// Reconciler is the tracer's background reconciliation: a bounded set of pending
// outcomes and a fixed number of workers.
type Reconciler struct {
	cfg     Config
	R       *reconcile.Reconciler
	log     func() *slog.Logger // the tracer's logger (config.logger)
	metrics *metrics.ReconcileMetrics

	mu      sync.Mutex
	pending map[*pendingOutcome]struct{}
	// ready are settled by a worker without asking the database: frames without a
	// reference, and those over the queue's bound (unknown, queue_full).
	ready   []*pendingOutcome
	closed  bool
	Started bool // the workers run (startLocked)
	wake    chan struct{}
	stop    chan struct{}
	ctx     context.Context // cancelled when Close gives up waiting for an attempt
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closing sync.Once
}

// New makes the automatic reconciliation a of the tracer configured tc,
// whose workers start with the first indeterminate frame and run until Tracer.Close.
func New(a *Config, log func() *slog.Logger, mp metric.MeterProvider, meterAttributes []attribute.KeyValue) *Reconciler {
	ar := &Reconciler{cfg: *a, R: a.R, log: log, pending: make(map[*pendingOutcome]struct{}),
		wake: make(chan struct{}, a.Workers), stop: make(chan struct{})}
	ar.ctx, ar.cancel = context.WithCancel(context.Background())
	ar.metrics = metrics.NewReconcile(mp, meterAttributes, ar.Oldest)
	return ar
}

// startLocked starts the workers, the first time an outcome is enqueued: a tracer whose
// frames never end indeterminate runs no goroutine, so that one never closed leaves none
// behind. a.mu is held, and the reconciler is not closed: the workers are counted before
// Close waits for them.
func (a *Reconciler) startLocked() {
	if a.Started {
		return
	}
	a.Started = true
	a.wg.Add(a.cfg.Workers)
	for range a.cfg.Workers {
		go a.work()
	}
}

// Enqueue hands an indeterminate frame, ended e, to the workers; it never blocks.
func (a *Reconciler) Enqueue(e *record.Ending) {
	p := &pendingOutcome{id: e.ID, ref: e.Ref, link: e.Span, parent: e.ParentSpan, at: e.ConcludedAt, local: e.CommittedLocally,
		waiter: e.Awaited}
	if p.at.IsZero() {
		p.at = time.Now()
	}
	a.mu.Lock()
	switch {
	case a.closed:
		a.mu.Unlock()
		// No worker is left to hand it to, and this goroutine may hold its connection's
		// lock: the callback runs on a goroutine of its own (see settle).
		a.leave(p, true)
		return
	case p.ref == nil:
		// Nothing to ask; settled by a worker all the same, not here: the frame's goroutine
		// may hold its connection's lock, and the callback is the application's.
		a.ready = append(a.ready, p)
	case len(a.pending) >= a.cfg.Queue:
		final := reconcile.UnknownAnswer(reconcile.ReasonQueueFull, p.refValue())
		p.final = &final
		a.ready = append(a.ready, p)
	default:
		a.pending[p] = struct{}{}
	}
	a.startLocked()
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default: // every worker has a wake-up waiting already
	}
}

// work runs attempts until the reconciler is closed.
func (a *Reconciler) work() {
	defer a.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p, wait, closed := a.next()
		if closed {
			return
		}
		if p != nil {
			a.ask(p)
			continue
		}
		timer.Reset(wait) // since Go 1.23 no stale tick survives a Reset
		select {
		case <-a.stop:
			return
		case <-a.wake:
		case <-timer.C:
		}
	}
}

// next takes the pending outcome that is due first, or says how long to wait for one.
func (a *Reconciler) next() (p *pendingOutcome, wait time.Duration, closed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, 0, true
	}
	if n := len(a.ready); n > 0 {
		p, a.ready = a.ready[n-1], a.ready[:n-1]
		return p, 0, false
	}
	now := time.Now()
	wait = time.Hour
	var first *pendingOutcome
	for q := range a.pending {
		if !q.inFlight && (first == nil || q.due.Before(first.due)) {
			first = q
		}
	}
	if first == nil {
		return nil, wait, false
	}
	if d := first.due.Sub(now); d > 0 {
		return nil, d, false
	}
	first.inFlight = true
	return first, 0, false
}

// ask asks the database once (polling an in-progress transaction within the
// reconcile wait); an answer that may still change is retried after a backoff.
func (a *Reconciler) ask(p *pendingOutcome) {
	if p.final != nil {
		a.settle(p, *p.final, false)
		return
	}
	var res reconcile.Answer
	var err error
	ctx := trace.ContextWithSpanContext(a.ctx, p.parent)
	// A nil reference: nothing to ask, settled at once in a span of its own.
	res, err = a.R.ResolveOperation(ctx, p.id, p.ref, p.link)
	a.mu.Lock()
	p.attempts++
	p.inFlight = false
	if err != nil || MayChange(res) {
		backoff := a.cfg.RetryMin << min(p.attempts-1, 30)
		if backoff <= 0 || backoff > a.cfg.RetryMax {
			backoff = a.cfg.RetryMax
		}
		p.due = time.Now().Add(backoff)
		a.mu.Unlock()
		if err == nil {
			p.waiter.Attempted(res)
		}
		return
	}
	delete(a.pending, p)
	a.mu.Unlock()
	a.settle(p, res, false)
}

// settle counts the final answer and hands it to the application. The callback is the
// application's code, which may take any lock or use any connection, so it never runs
// where a lock of the library's may be held: on a worker or Close's goroutine, which hold
// none, or, when late (a frame ending after Close, on the goroutine that ended it, which
// may hold its connection's), on a goroutine of its own, which ends when the callback
// returns.
func (a *Reconciler) settle(p *pendingOutcome, res reconcile.Answer, late bool) {
	p.waiter.Settled(res)
	a.metrics.Record(res, time.Since(p.at))
	fn := a.cfg.OnReconciled
	if fn == nil {
		return
	}
	r := Settled{OperationID: p.id, Answer: res, TraceParent: schema.TraceParent(p.link),
		IndeterminateAt: p.at, Attempts: p.attempts, CommittedLocally: p.local}
	if late {
		go fn(r)
		return
	}
	fn(r)
}

// leave writes what the operator command needs to settle p later, and settles it
// unknown with reason stopped; late as settle's.
func (a *Reconciler) leave(p *pendingOutcome, late bool) {
	attrs := []slog.Attr{
		slog.String(string(schema.OperationIDKey), p.id.String()),
		slog.Time("indeterminate_at", p.at),
		slog.Int("attempts", p.attempts),
	}
	if p.ref != nil {
		attrs = append(attrs, slog.String(string(schema.ReconciliationRefKey), p.ref.String()))
	}
	if p.link.HasTraceID() {
		attrs = append(attrs, slog.String(schema.TraceIDLogKey, p.link.TraceID().String()), slog.String(schema.SpanIDLogKey, p.link.SpanID().String()))
	}
	a.log().LogAttrs(context.Background(), slog.LevelWarn, schema.MessagePendingAtShutdown, attrs...)
	a.settle(p, reconcile.UnknownAnswer(reconcile.ReasonStopped, p.refValue()), late)
}

// Close stops the workers: an attempt in flight may finish until ctx is done, then it
// is cancelled. Every outcome still pending is left to the operator (see leave).
func (a *Reconciler) Close(ctx context.Context) error {
	var err error
	a.closing.Do(func() {
		a.mu.Lock()
		a.closed = true
		a.mu.Unlock()
		close(a.stop)
		done := make(chan struct{})
		go func() { a.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			err = ctx.Err()
			a.cancel()
			<-done
		}
		a.cancel()
		a.mu.Lock()
		left := a.ready
		a.ready = nil
		for p := range a.pending {
			left = append(left, p)
		}
		clear(a.pending)
		a.mu.Unlock()
		for _, p := range left {
			if p.final != nil || p.ref == nil {
				a.ask(p) // asks nothing
			} else {
				a.leave(p, false) // Close's goroutine holds no lock of the library's
			}
		}
		a.metrics.Unregister()
	})
	return err
}

// Oldest returns how many outcomes are pending and the age of the oldest one.
func (a *Reconciler) Oldest() (n int, age time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	for p := range a.pending {
		age = max(age, now.Sub(p.at))
	}
	return len(a.pending), age
}

// MayChange reports whether asking again later may answer otherwise: the transaction was
// still in progress, prepared (its coordinator has yet to decide), or its synchronous
// standbys had not confirmed it.
func MayChange(ans reconcile.Answer) bool {
	switch ans.Reason() {
	case reconcile.ReasonInProgress, reconcile.ReasonPrepared, reconcile.ReasonNotReplicated:
		return ans.Status() == reconcile.Unknown
	}
	return false
}

// Settled is what the WithOnReconciled callback is told of one settled frame: the
// fields of the exported Reconciliation, which is made of it by conversion.
type Settled struct {
	OperationID      outcome.OperationID
	Answer           reconcile.Answer
	TraceParent      string
	IndeterminateAt  time.Time
	Attempts         int
	CommittedLocally bool
}

// Config is what the AutoReconcileOptions set; err is the first option refused.
type Config struct {
	R                  *reconcile.Reconciler
	Queue, Workers     int
	RetryMin, RetryMax time.Duration
	OnReconciled       func(Settled)
	Err                error
}

// refValue is p's reference, or the zero one for a frame without: what an answer that
// asked nothing names.
func (p *pendingOutcome) refValue() outcome.ReconciliationRef {
	if p.ref == nil {
		return outcome.ReconciliationRef{}
	}
	return *p.ref
}
