package otelpgxtx

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
)

// scope is one transaction as [Run] owns it: its handle, its frame (nil when the
// connection is not instrumented), and the work to do after its commit. A Nested call
// has a scope of its own whose hooks join the parent's only if its savepoint is released.
type scope struct {
	tx    *runTx
	frame *frame
	// t is the tracer of the frame, nil without one: the frame ends through it, and the
	// participants are counted in its metrics.
	t      *core
	id     outcome.OperationID
	parent *scope // for Nested: the scope whose savepoint this is
	// suspended is the scope that was in the context when this one began (RequiresNew):
	// it holds a connection while this one runs.
	suspended *scope
	// pool is the pool the owner's connection came from, or nil.
	pool *pgxpool.Pool

	mu           sync.Mutex
	hooks        []func(context.Context) error
	rollbackOnly error // a participant failed: the owner must not commit
	closed       bool
}

// scopeKey is the context key of the scope that Run's function and AfterCommit find.
type scopeKey struct{}

// runContext is the context Run gives fn: it carries sc and sc's frame (if any) in one
// node, where two context.WithValue would cost two allocations and two more levels for
// every lookup made under it.
type runContext struct {
	context.Context
	sc *scope
}

// Value returns the scope for scopeKey, its frame for frameKey, and asks the parent
// context otherwise.
func (c *runContext) Value(key any) any {
	switch key.(type) {
	case scopeKey:
		return c.sc
	case frameKey:
		if c.sc.frame != nil {
			return c.sc.frame
		}
	}
	return c.Context.Value(key)
}

// scopeFromContext returns the scope Run put in ctx, or nil.
func scopeFromContext(ctx context.Context) *scope {
	sc, _ := ctx.Value(scopeKey{}).(*scope)
	return sc
}

// owner returns the scope that will commit: a Nested scope's outermost parent.
func (sc *scope) owner() *scope {
	for sc.parent != nil {
		sc = sc.parent
	}
	return sc
}

// open reports whether sc's transaction still takes participants and hooks.
func (sc *scope) open() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return !sc.closed
}

// markRollbackOnly dooms the owner's transaction with err, the first failure wins: a
// participant cannot roll back on its own, so the owner rolls back when fn returns.
func (sc *scope) markRollbackOnly(err error) {
	sc = sc.owner()
	sc.mu.Lock()
	if sc.rollbackOnly == nil {
		sc.rollbackOnly = err
	}
	sc.mu.Unlock()
}

// rollbackCause is the failure that doomed sc's transaction, or nil.
func (sc *scope) rollbackCause() error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.rollbackOnly
}

// participated records a participant's call on the owner's frame: a participant has no
// frame of its own, so its outcome is an event there, and a count of its own, whether it
// joined or failed.
func (sc *scope) participated(propagation string, o outcome.Outcome) {
	f := sc.frame
	if f == nil {
		return
	}
	sc.t.metrics.participant(propagation, o)
	if f.span.IsRecording() {
		f.span.AddEvent(eventParticipant, trace.WithAttributes(
			participantOutcomeKey.String(o.String()), propagationKey.String(propagation)))
	}
}

// takeHooks closes the scope and returns its hooks.
func (sc *scope) takeHooks() []func(context.Context) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.closed = true
	h := sc.hooks
	sc.hooks = nil
	return h
}
