package pg

import "testing"

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
