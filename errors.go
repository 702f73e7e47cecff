package otelpgxtx

// The package's errors, in one place: the exported ones a caller tells apart with
// errors.Is, and the causes the library gives a verdict.

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/errs"
)

// ErrInvalidArgument is wrapped by every error about a bad argument to [InstrumentPool],
// [InstrumentConnConfig], [Run], [Retry], [Begin], [AfterCommit], [Tracer.Check],
// [Tracer.Close], [NewVerdict] (through [Verdict.Result]) or an option: a nil config, db,
// context or function (a typed nil pool, connection or provider too), a config
// instrumented already, an invalid policy, an option value refused. No bad argument makes
// the library panic. It
// is reconcile.ErrInvalidArgument, the same error, so that one errors.Is tells bad input
// from a database failure whichever package reported it.
var ErrInvalidArgument = errs.ErrInvalidArgument

// ErrUnreadResult is the cause of the rollback of a [Run] whose function returned nil
// with a result it had not read (a pgx.Rows not closed): the connection is still busy
// with it, so COMMIT cannot be sent. Run rolls back instead; close rows before returning.
var ErrUnreadResult = errUnreadResult

// errUnreadResult is ErrUnreadResult, defined where the layers below use it.
var errUnreadResult = errors.New("otelpgxtx: the transaction function returned with an unread result (a pgx.Rows not closed); rolled back")

// errCommitUnobserved is the cause of an unknown commit whose end no statement showed
// (the frame was abandoned while committing).
var errCommitUnobserved = errors.New("otelpgxtx: the COMMIT's reply was never observed")

// ErrTxOwnedByRun is returned by Commit and Rollback of the transaction handed to a
// [Run] function: Run ends the transaction itself, from the function's result.
var ErrTxOwnedByRun = errTxOwnedByRun

// errTxOwnedByRun is ErrTxOwnedByRun, defined where the layers below use it.
var errTxOwnedByRun = errors.New("otelpgxtx: the transaction belongs to Run: return nil to commit, an error to roll back")

// errTxEnded is what every handle derived from a Run transaction returns once Run has
// ended that transaction.
var errTxEnded = fmt.Errorf("otelpgxtx: the transaction of Run has ended: %w", pgx.ErrTxClosed)

// ErrNoVerdict is wrapped by the error of [Verdict.Result] when the tracer cannot say how
// the transaction ended: no instrumented transaction was begun or ended with the
// Verdict's context, nor did an instrumented pool or connection fail to connect with it
// (the connection is not instrumented, or the calls were made with another context), or
// the transaction begun with it has not ended yet. Nothing can be
// concluded from it: treat it as you would an error without the library, and never as
// a rollback.
var ErrNoVerdict = errNoVerdict

// errNoVerdict is ErrNoVerdict, defined where the layers below use it.
var errNoVerdict = errors.New("otelpgxtx: no verdict")

// errRolledBack is the cause of a deliberate rollback: the application's own ROLLBACK,
// with nothing gone wrong.
var errRolledBack = errors.New("otelpgxtx: the transaction was rolled back by the application (ROLLBACK)")

// errSavepointRolledBack is the cause of the verdict of a ROLLBACK TO SAVEPOINT: the
// savepoint's work is undone, the transaction goes on.
var errSavepointRolledBack = errors.New("otelpgxtx: rolled back to the savepoint; the transaction goes on")

// invalid is an error of this package wrapping ErrInvalidArgument.
var invalid = errs.Package("otelpgxtx").Invalid
