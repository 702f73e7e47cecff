package otelpgxtx

import (
	"time"

	"github.com/txevidence/otelpgxtx/internal/auto"
	"github.com/txevidence/otelpgxtx/internal/settings"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// Automatic reconciliation's options: WithAutoReconcile, its AutoReconcileOptions, and
// the Reconciliation its callback gets.

// AutoReconcileOption configures [WithAutoReconcile].
type AutoReconcileOption interface {
	applyAuto(*auto.Config)
}

// autoOptionFunc is an AutoReconcileOption that sets one field of autoConfig.
type autoOptionFunc func(*auto.Config)

// applyAuto calls f.
func (f autoOptionFunc) applyAuto(c *auto.Config) { f(c) }

// WithAutoReconcile reconciles every indeterminate frame of the tracer — those of [Run]
// and plain pgx transactions alike — in the background, asking r (give it a pool of its
// own: it must not wait behind the application for a connection; its options — the wait
// for a transaction still in progress, the tracer provider of its tx.reconcile spans —
// are its own, see package reconcile). A frame without a reference (a plain pgx COMMIT
// without [WithCommitReference], [Run] without Policy.CommitReference, or one whose xid
// never arrived) has nothing to ask and ends unknown with reason no_reference at once.
// The frame's goroutine only enqueues, without blocking: when the queue is full the frame
// is counted unknown with reason queue_full. An attempt that cannot reach the database,
// or finds the transaction still in progress after the reconciler's wait, is retried with
// exponential backoff until it settles or the tracer is closed; each attempt is a
// tx.reconcile span linked to the frame, in the frame's trace (a child of the span the
// frame was begun under, or of the frame span when it was begun under none). The
// workers start with the first indeterminate frame and run until [Tracer.Close]: close it
// when the pool is done, or outcomes still pending are neither logged nor settled.
func WithAutoReconcile(r *reconcile.Reconciler, opts ...AutoReconcileOption) Option {
	return optionFunc(func(c *settings.Config) {
		a := auto.Config{R: r, Queue: 1024, Workers: 2, RetryMin: 100 * time.Millisecond, RetryMax: 30 * time.Second}
		if r == nil {
			refuse(&a.Err, invalid("WithAutoReconcile: nil reconciler (make one with reconcile.New)"))
		}
		for _, o := range opts {
			if o != nil {
				o.applyAuto(&a)
			}
		}
		if a.Err != nil {
			refuse(&c.Err, a.Err)
			return
		}
		c.Auto = &a
	})
}

// WithQueue bounds the outcomes waiting for reconciliation (1024 by default) and the
// attempts made at once (2 by default).
func WithQueue(size, workers int) AutoReconcileOption {
	return autoOptionFunc(func(c *auto.Config) {
		if size <= 0 || workers <= 0 {
			refuse(&c.Err, invalid("WithQueue: size and workers must be > 0, got %d, %d", size, workers))
			return
		}
		c.Queue, c.Workers = size, workers
	})
}

// WithRetryBackoff sets the delay before an attempt is retried: first, doubling up to
// most; 100 ms and 30 s by default.
func WithRetryBackoff(first, most time.Duration) AutoReconcileOption {
	return autoOptionFunc(func(c *auto.Config) {
		if first <= 0 || most < first {
			refuse(&c.Err, invalid("WithRetryBackoff: want 0 < first <= most, got %v, %v", first, most))
			return
		}
		c.RetryMin, c.RetryMax = first, most
	})
}

// Reconciliation is what automatic reconciliation ([WithAutoReconcile]) learned of one
// indeterminate frame, handed to the [WithOnReconciled] callback exactly once per frame.
type Reconciliation struct {
	// OperationID is the frame's tx.operation_id.
	OperationID outcome.OperationID
	// Answer is the final answer: committed, aborted or no_writes, or unknown with its
	// reason (including [reconcile.ReasonQueueFull] and [reconcile.ReasonStopped]).
	Answer reconcile.Answer
	// TraceParent names the frame span (W3C traceparent), "" when it had none.
	TraceParent string
	// IndeterminateAt is when the frame ended indeterminate.
	IndeterminateAt time.Time
	// Attempts is the number of tx.reconcile attempts made (0 when none was).
	Attempts int
	// CommittedLocally: the server had warned that the commit was already committed
	// locally (its synchronous-replication wait was cancelled or ended): a committed
	// answer then describes the server asked, and a failover to a standby that never
	// received the commit can still lose it (the frame's tx.commit.committed_locally).
	CommittedLocally bool
}

// WithOnReconciled registers fn to receive the final [Reconciliation] of every frame
// given to automatic reconciliation, exactly once per frame: to resume follow-up work of
// a commit that turned out committed, say. It never runs where a lock of the library's
// is held: on a reconciliation worker; for an outcome pending at [Tracer.Close], on
// Close's goroutine; for a frame ending after Close, on a goroutine of its own, started
// as the frame ends, so it may use any connection, the frame's too. It should not block
// for long, nor call [Tracer.Close] (which waits for the workers). A nil fn is an error.
func WithOnReconciled(fn func(Reconciliation)) AutoReconcileOption {
	return autoOptionFunc(func(c *auto.Config) {
		if fn == nil {
			refuse(&c.Err, invalid("WithOnReconciled: nil function"))
			return
		}
		c.OnReconciled = func(r auto.Settled) { fn(Reconciliation(r)) }
	})
}
