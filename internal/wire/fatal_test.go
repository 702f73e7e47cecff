package wire

import "testing"

// TestFatalBeforeCommit: the parser of waiting bytes judges only complete FATAL or
// PANIC ErrorResponses.
func TestFatalBeforeCommit(t *testing.T) {
	msg := func(typ byte, fields ...string) []byte {
		var body []byte
		for _, f := range fields {
			body = append(append(body, f...), 0)
		}
		body = append(body, 0)
		n := len(body) + 4
		return append([]byte{typ, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, body...)
	}
	fatal := msg('E', "SFATAL", "VFATAL", "C57P01", "Mterminating connection due to administrator command")
	for _, tc := range []struct {
		name string
		buf  []byte
		want bool
	}{
		{"fatal", fatal, true},
		{"panic, no V", msg('E', "SPANIC", "CXX000"), true},
		{"localized S, V says FATAL", msg('E', "SSCHWERWIEGEND", "VFATAL"), true},
		{"error", msg('E', "SERROR", "VERROR", "C42601"), false},
		{"notice then fatal", append(msg('N', "SWARNING", "VWARNING"), fatal...), true},
		{"cut off", fatal[:len(fatal)-1], false},
		{"bad length", []byte{'E', 0, 0, 0, 1}, false},
		{"empty", nil, false},
	} {
		if got := fatalBeforeCommit(tc.buf); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
