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

// TestTransient: what happened to a statement is transient; the server's answer to what
// it asked (a privilege, a missing object, a feature a server lacks) is not.
func TestTransient(t *testing.T) {
	for code, want := range map[string]bool{
		"57014": true,  // query_canceled: a cancel, statement_timeout
		"57P01": true,  // admin_shutdown
		"55P03": true,  // lock_not_available: lock_timeout
		"55006": true,  // object_in_use
		"40001": true,  // serialization_failure
		"40P01": true,  // deadlock_detected
		"53200": true,  // out_of_memory
		"58030": true,  // io_error
		"08006": true,  // connection_failure
		"42501": false, // insufficient_privilege
		"42883": false, // undefined_function
		"42P01": false, // undefined_table
		"3F000": false, // invalid_schema_name
		"0A000": false, // feature_not_supported (a server that is not PostgreSQL)
		"55000": false, // object_not_in_prerequisite_state
		"XX000": false, // internal_error
		"":      false,
		"570":   false,
	} {
		if got := Transient(code); got != want {
			t.Errorf("Transient(%q) = %v, want %v", code, got, want)
		}
	}
}

// TestParseFullXID: pg_control_checkpoint()'s next_xid, epoch and xid.
func TestParseFullXID(t *testing.T) {
	for in, want := range map[string]uint64{"0:724": 724, "2:5": 2<<32 | 5} {
		if got, err := ParseFullXID(in); err != nil || got != want {
			t.Errorf("ParseFullXID(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "724", "a:1", "1:", "0:4294967296"} {
		if _, err := ParseFullXID(in); err == nil {
			t.Errorf("ParseFullXID(%q) succeeded", in)
		}
	}
}
