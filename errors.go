package otelpgxtx

import (
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
var ErrUnreadResult = errs.ErrUnreadResult

// ErrTxOwnedByRun is returned by Commit and Rollback of the transaction handed to a
// [Run] function: Run ends the transaction itself, from the function's result.
var ErrTxOwnedByRun = errs.ErrTxOwnedByRun

// ErrNoVerdict is wrapped by the error of [Verdict.Result] when the tracer cannot say how
// the transaction ended: no instrumented transaction was begun or ended with the
// Verdict's context, nor did an instrumented pool or connection fail to connect with it
// (the connection is not instrumented, or the calls were made with another context), or
// the transaction begun with it has not ended yet. Nothing can be
// concluded from it: treat it as you would an error without the library, and never as
// a rollback.
var ErrNoVerdict = errs.ErrNoVerdict

// invalid is an error of this package wrapping ErrInvalidArgument.
var invalid = errs.Package("otelpgxtx").Invalid
