package executor

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Scope is one transaction as [Run] owns it: its handle, its frame (nil when the
// connection is not instrumented), and the work to do after its commit. A Nested call
// has a scope of its own whose hooks join the parent's only if its savepoint is released.
type Scope struct {
	Tx    *runTx
	frame *frame.Frame
	// t is the tracer of the frame, nil without one: the frame ends through it, and the
	// participants are counted in its metrics.
	t      *frame.Core
	ID     outcome.OperationID
	parent *Scope // for Nested: the scope whose savepoint this is
	// Suspended is the scope that was in the context when this one began (RequiresNew):
	// it holds a connection while this one runs.
	Suspended *Scope
	// Pool is the pool the owner's connection came from, or nil.
	Pool *pgxpool.Pool

	Mu           sync.Mutex
	Hooks        []func(context.Context) error
	rollbackOnly error // a participant failed: the owner must not commit
	Closed       bool
}

// scopeKey is the context key of the scope that Run's function and AfterCommit find.
type scopeKey struct{}

// runContext is the context Run gives fn: it carries sc and sc's frame (if any) in one
// node, where two context.WithValue would cost two allocations and two more levels for
// every lookup made under it.
type runContext struct {
	context.Context
	sc *Scope
}

// Value returns the scope for scopeKey, its frame for frameKey, and asks the parent
// context otherwise.
func (c *runContext) Value(key any) any {
	switch key.(type) {
	case scopeKey:
		return c.sc
	case frame.FrameKey:
		if c.sc.frame != nil {
			return c.sc.frame
		}
	}
	return c.Context.Value(key)
}

// ScopeFromContext returns the scope Run put in ctx, or nil.
func ScopeFromContext(ctx context.Context) *Scope {
	sc, _ := ctx.Value(scopeKey{}).(*Scope)
	return sc
}

// Owner returns the scope that will commit: a Nested scope's outermost parent.
func (sc *Scope) Owner() *Scope {
	for sc.parent != nil {
		sc = sc.parent
	}
	return sc
}

// Open reports whether sc's transaction still takes participants and hooks.
func (sc *Scope) Open() bool {
	sc.Mu.Lock()
	defer sc.Mu.Unlock()
	return !sc.Closed
}

// markRollbackOnly dooms the owner's transaction with err, the first failure wins: a
// participant cannot roll back on its own, so the owner rolls back when fn returns.
func (sc *Scope) markRollbackOnly(err error) {
	sc = sc.Owner()
	sc.Mu.Lock()
	if sc.rollbackOnly == nil {
		sc.rollbackOnly = err
	}
	sc.Mu.Unlock()
}

// rollbackCause is the failure that doomed sc's transaction, or nil.
func (sc *Scope) rollbackCause() error {
	sc.Mu.Lock()
	defer sc.Mu.Unlock()
	return sc.rollbackOnly
}

// participated records a participant's call on the owner's frame: a participant has no
// frame of its own, so its outcome is an event there, and a count of its own, whether it
// joined or failed.
func (sc *Scope) participated(propagation string, o outcome.Outcome) {
	f := sc.frame
	if f == nil {
		return
	}
	sc.t.Metrics.Participant(propagation, o)
	if f.OTel.IsRecording() {
		f.OTel.AddEvent(schema.EventParticipant, trace.WithAttributes(
			schema.ParticipantOutcomeKey.String(o.String()), schema.PropagationKey.String(propagation)))
	}
}

// takeHooks closes the scope and returns its hooks.
func (sc *Scope) takeHooks() []func(context.Context) error {
	sc.Mu.Lock()
	defer sc.Mu.Unlock()
	sc.Closed = true
	h := sc.Hooks
	sc.Hooks = nil
	return h
}
