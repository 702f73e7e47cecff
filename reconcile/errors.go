package reconcile

import "github.com/txevidence/otelpgxtx/internal/errs"

// ErrInvalidArgument is wrapped by every error that reports bad input (a nil db, a
// malformed reference or table name, a refused option): the caller's to fix, where any
// other error is the database's. otelpgxtx.ErrInvalidArgument is this same error.
var ErrInvalidArgument = errs.ErrInvalidArgument

// invalid is an error of this package wrapping ErrInvalidArgument.
var invalid = errs.Package("reconcile").Invalid
