package errs

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrUnreadResult is ErrUnreadResult, defined where the layers below use it.
var ErrUnreadResult = errors.New("otelpgxtx: the transaction function returned with an unread result (a pgx.Rows not closed); rolled back")

// ErrCommitUnobserved is the cause of an unknown commit whose end no statement showed
// (the frame was abandoned while committing).
var ErrCommitUnobserved = errors.New("otelpgxtx: the COMMIT's reply was never observed")

// ErrTxOwnedByRun is ErrTxOwnedByRun, defined where the layers below use it.
var ErrTxOwnedByRun = errors.New("otelpgxtx: the transaction belongs to Run: return nil to commit, an error to roll back")

// ErrTxEnded is what every handle derived from a Run transaction returns once Run has
// ended that transaction.
var ErrTxEnded = fmt.Errorf("otelpgxtx: the transaction of Run has ended: %w", pgx.ErrTxClosed)

// ErrNoVerdict is ErrNoVerdict, defined where the layers below use it.
var ErrNoVerdict = errors.New("otelpgxtx: no verdict")

// ErrRolledBack is the cause of a deliberate rollback: the application's own ROLLBACK,
// with nothing gone wrong.
var ErrRolledBack = errors.New("otelpgxtx: the transaction was rolled back by the application (ROLLBACK)")

// ErrSavepointRolledBack is the cause of the verdict of a ROLLBACK TO SAVEPOINT: the
// savepoint's work is undone, the transaction goes on.
var ErrSavepointRolledBack = errors.New("otelpgxtx: rolled back to the savepoint; the transaction goes on")
