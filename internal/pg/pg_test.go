package pg

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestFatal: the unlocalized severity decides; a server too old to send one is read by
// the localized field, which is English there.
func TestFatal(t *testing.T) {
	for _, tc := range []struct {
		s, v string
		want bool
	}{
		{"FATAL", "FATAL", true},
		{"PANIC", "", true},
		{"FATAL", "", true},
		{"SCHWERWIEGEND", "FATAL", true},
		{"FATAL", "ERROR", false}, // V is the truth
		{"ERROR", "ERROR", false},
		{"WARNING", "", false},
		{"", "", false},
	} {
		if got := Fatal(tc.s, tc.v); got != tc.want {
			t.Errorf("Fatal(%q, %q) = %v, want %v", tc.s, tc.v, got, tc.want)
		}
	}
}

// TestFatalError: a wrapped server error is read by its unlocalized severity; anything
// else is not a FATAL.
func TestFatalError(t *testing.T) {
	fatal := &pgconn.PgError{Severity: "SCHWERWIEGEND", SeverityUnlocalized: "FATAL", Code: "57P01"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fatal, true},
		{fmt.Errorf("commit: %w", fatal), true},
		{&pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "40001"}, false},
		{errors.New("FATAL"), false},
		{nil, false},
	} {
		if got := FatalError(tc.err); got != tc.want {
			t.Errorf("FatalError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
