package reconcile

import (
	"errors"
	"fmt"
)

// ScopeName is the instrumentation scope name of the reconciler's tracer.
const ScopeName = "github.com/txevidence/otelpgxtx/reconcile"

// ErrInvalidArgument is wrapped by every error that reports bad input (a nil db, a
// malformed reference or table name, a refused option): the caller's to fix, where any
// other error is the database's. otelpgxtx.ErrInvalidArgument is this same error.
var ErrInvalidArgument = errors.New("otelpgxtx: invalid argument")

// invalid is an error wrapping ErrInvalidArgument.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}
