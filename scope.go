package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
)

// scope is one transaction as [Run] owns it: its handle, its frame (nil when the
// connection is not instrumented), and the work to do after its commit. A Nested call
// has a scope of its own whose hooks join the parent's only if its savepoint is released.
type scope struct {
	tx     *runTx
	frame  *frame
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

type scopeKey struct{}

// runAlloc is what Run allocates per attempt, in one allocation: the scope, the Tx
// handle given to fn, and fn's context.
type runAlloc struct {
	sc  scope
	tx  runTx
	ctx runContext
}

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

func (sc *scope) open() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return !sc.closed
}

func (sc *scope) markRollbackOnly(err error) {
	sc = sc.owner()
	sc.mu.Lock()
	if sc.rollbackOnly == nil {
		sc.rollbackOnly = err
	}
	sc.mu.Unlock()
}

func (sc *scope) rollbackCause() error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.rollbackOnly
}

// participated records a participant's call on the owner's frame: a participant has no
// frame of its own, so its outcome is an event there, and a count.
func (sc *scope) participated(p Policy, o outcome.Outcome) {
	f := sc.frame
	if f == nil {
		return
	}
	if o == outcome.OutcomeParticipating {
		f.t.metrics.participant()
	}
	if f.span.IsRecording() {
		f.span.AddEvent(EventParticipant, trace.WithAttributes(
			ParticipantOutcomeKey.String(o.String()), PropagationKey.String(p.Propagation.String())))
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

// AfterCommit registers hook to run after the physical commit of the transaction that
// [Run] put in ctx. From a participant (Required, Mandatory) it runs after the owner's
// commit; from a Nested call, only if its savepoint was released and the owner commits.
// A rollback discards it. A failing hook turns the owner's result into
// CommittedWithPostCommitFailure: the commit is not undone.
func AfterCommit(ctx context.Context, hook func(context.Context) error) error {
	if hook == nil {
		return invalid("AfterCommit: nil hook")
	}
	sc := scopeFromContext(ctx)
	if sc == nil {
		return invalid("AfterCommit: no transaction of Run in the context")
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closed {
		return errors.New("otelpgxtx: AfterCommit: the transaction has already ended")
	}
	sc.hooks = append(sc.hooks, hook)
	return nil
}

// ErrUnreadResult is the cause of the rollback of a [Run] whose function returned nil
// with a result it had not read (a pgx.Rows not closed): the connection is still busy
// with it, so COMMIT cannot be sent. Run rolls back instead; close rows before returning.
var ErrUnreadResult = errors.New("otelpgxtx: the transaction function returned with an unread result (a pgx.Rows not closed); rolled back")

// ErrTxOwnedByRun is returned by Commit and Rollback of the transaction handed to a
// [Run] function: Run ends the transaction itself, from the function's result.
var ErrTxOwnedByRun = errors.New("otelpgxtx: the transaction belongs to Run: return nil to commit, an error to roll back")

// errTxEnded is what every handle derived from a Run transaction returns once Run has
// ended that transaction.
var errTxEnded = fmt.Errorf("otelpgxtx: the transaction of Run has ended: %w", pgx.ErrTxClosed)

// runTx is the pgx.Tx handed to a Run function, and each savepoint begun on it. Run's
// own handle refuses Commit and Rollback; every one refuses everything once Run has
// ended the transaction, so a handle that escapes the function cannot run statements
// on a connection that is no longer the transaction's.
type runTx struct {
	tx pgx.Tx
	// root is the handle Run gave the function, whose end ends this savepoint's too;
	// nil for that handle itself.
	root *runTx
	// done is set when Run ends the transaction; read on every statement, hence atomic.
	done atomic.Bool
}

var _ pgx.Tx = (*runTx)(nil)

func (t *runTx) ended() bool {
	if t.root != nil {
		return t.root.done.Load()
	}
	return t.done.Load()
}

func (t *runTx) end() { t.done.Store(true) }

// Begin starts a savepoint (pgx's pseudo nested transaction); prefer Run with Nested,
// which traces it and scopes its post-commit hooks. The savepoint is the caller's to
// commit or roll back, and ends with the transaction at the latest.
func (t *runTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.ended() {
		return nil, errTxEnded
	}
	sp, err := t.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	root := t
	if t.root != nil {
		root = t.root
	}
	return &runTx{tx: sp, root: root}, nil
}

// Commit is refused on Run's handle: Run commits when the function returns nil. On a
// savepoint it releases the savepoint.
func (t *runTx) Commit(ctx context.Context) error {
	switch {
	case t.ended():
		return errTxEnded
	case t.root == nil:
		return ErrTxOwnedByRun
	}
	return t.tx.Commit(ctx)
}

// Rollback is refused on Run's handle: Run rolls back when the function returns an
// error. On a savepoint it rolls back to the savepoint.
func (t *runTx) Rollback(ctx context.Context) error {
	switch {
	case t.ended():
		return errTxEnded
	case t.root == nil:
		return ErrTxOwnedByRun
	}
	return t.tx.Rollback(ctx)
}

// CopyFrom delegates to the transaction.
func (t *runTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if t.ended() {
		return 0, errTxEnded
	}
	return t.tx.CopyFrom(ctx, table, cols, src)
}

// SendBatch delegates to the transaction.
func (t *runTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.ended() {
		return pgx.FailedBatchResults(b, errTxEnded)
	}
	return t.tx.SendBatch(ctx, b)
}

// LargeObjects delegates to the transaction. The value is bound to pgx's transaction
// object, which Run closes when it ends the transaction, whatever the path: its
// operations then fail with pgx.ErrTxClosed.
func (t *runTx) LargeObjects() pgx.LargeObjects { return t.tx.LargeObjects() }

// Prepare delegates to the transaction.
func (t *runTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.ended() {
		return nil, errTxEnded
	}
	return t.tx.Prepare(ctx, name, sql)
}

// Exec delegates to the transaction.
func (t *runTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.ended() {
		return pgconn.CommandTag{}, errTxEnded
	}
	return t.tx.Exec(ctx, sql, args...)
}

// Query delegates to the transaction.
func (t *runTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.ended() {
		return nil, errTxEnded
	}
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow delegates to the transaction.
func (t *runTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.ended() {
		return errRow{errTxEnded}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

// Conn returns the transaction's connection while the transaction lasts, and nil once
// Run has ended it: the connection then belongs to its pool (or its owner) again.
func (t *runTx) Conn() *pgx.Conn {
	if t.ended() {
		return nil
	}
	return t.tx.Conn()
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
