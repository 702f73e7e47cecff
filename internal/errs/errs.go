// Package errs holds the one error that every package of the module wraps for bad input,
// and its one constructor: otelpgxtx.ErrInvalidArgument and reconcile.ErrInvalidArgument
// are both this error, so that one errors.Is tells bad input from a database failure
// whichever package reported it.
package errs

import (
	"errors"
	"fmt"
)

// ErrInvalidArgument is wrapped by every error that reports bad input.
var ErrInvalidArgument = errors.New("otelpgxtx: invalid argument")

// Invalid returns an error wrapping ErrInvalidArgument, with the message format gives.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}
