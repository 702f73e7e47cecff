package executor

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/internal/errs"
)

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

// runTx must stay a complete pgx.Tx, or Run could not hand it to fn.
var _ pgx.Tx = (*runTx)(nil)

// ended reports whether Run has ended the transaction t belongs to.
func (t *runTx) ended() bool {
	if t.root != nil {
		return t.root.done.Load()
	}
	return t.done.Load()
}

// end makes t and every savepoint begun on it refuse everything; Run calls it on its own
// handle when it ends the transaction.
func (t *runTx) end() { t.done.Store(true) }

// Begin starts a savepoint (pgx's pseudo nested transaction); prefer Run with Nested,
// which traces it and scopes its post-commit hooks. The savepoint is the caller's to
// commit or roll back, and ends with the transaction at the latest.
func (t *runTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.ended() {
		return nil, errs.ErrTxEnded
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
	if err := t.endRefused(); err != nil {
		return err
	}
	return t.tx.Commit(ctx)
}

// Rollback is refused on Run's handle: Run rolls back when the function returns an
// error. On a savepoint it rolls back to the savepoint.
func (t *runTx) Rollback(ctx context.Context) error {
	if err := t.endRefused(); err != nil {
		return err
	}
	return t.tx.Rollback(ctx)
}

// endRefused is why Commit and Rollback may not run on t: its transaction has ended, or
// t is Run's own handle, which only Run ends. It is nil on a live savepoint.
func (t *runTx) endRefused() error {
	switch {
	case t.ended():
		return errs.ErrTxEnded
	case t.root == nil:
		return errs.ErrTxOwnedByRun
	}
	return nil
}

// CopyFrom delegates to the transaction.
func (t *runTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if t.ended() {
		return 0, errs.ErrTxEnded
	}
	return t.tx.CopyFrom(ctx, table, cols, src)
}

// SendBatch delegates to the transaction.
func (t *runTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.ended() {
		return pgx.FailedBatchResults(b, errs.ErrTxEnded)
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
		return nil, errs.ErrTxEnded
	}
	return t.tx.Prepare(ctx, name, sql)
}

// Exec delegates to the transaction.
func (t *runTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.ended() {
		return pgconn.CommandTag{}, errs.ErrTxEnded
	}
	return t.tx.Exec(ctx, sql, args...)
}

// Query delegates to the transaction.
func (t *runTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.ended() {
		return nil, errs.ErrTxEnded
	}
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow delegates to the transaction.
func (t *runTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.ended() {
		return errRow{errs.ErrTxEnded}
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

// errRow is the pgx.Row of a QueryRow on an ended transaction: pgx.Row has no
// constructor for an error.
type errRow struct{ err error }

// Scan returns the error that refused the query.
func (r errRow) Scan(...any) error { return r.err }
