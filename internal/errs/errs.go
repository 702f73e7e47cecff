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
var ErrInvalidArgument = errors.New("invalid argument")

// invalidError is bad input reported by package pkg: its text begins with pkg's name and
// no other's ("reconcile: invalid argument: New: nil db").
type invalidError struct {
	pkg string
	err error // what is wrong, as format said it; it may wrap a cause
}

func (e *invalidError) Error() string { return e.pkg + ": invalid argument: " + e.err.Error() }

// Unwrap returns what is wrong, so that errors.Is and errors.As find a cause it wraps.
func (e *invalidError) Unwrap() error { return e.err }

// Is reports that e is ErrInvalidArgument.
func (e *invalidError) Is(target error) bool { return target == ErrInvalidArgument }

// Package is one package of the module, by its name, as its errors begin.
type Package string

// Invalid returns an error of package p wrapping ErrInvalidArgument, with the message
// format gives.
func (p Package) Invalid(format string, args ...any) error {
	return &invalidError{pkg: string(p), err: fmt.Errorf(format, args...)}
}
