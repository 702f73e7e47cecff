package outcome_test

import (
	"strings"
	"testing"

	"github.com/txevidence/otelpgxtx/outcome"
)

var allPhases = []outcome.Phase{
	outcome.PhaseNotStarted,
	outcome.PhaseActive,
	outcome.PhaseCommitting,
	outcome.PhaseCommitted,
	outcome.PhaseRolledBack,
	outcome.PhaseUnknown,
}

func TestPhaseStringAndParseRoundTrip(t *testing.T) {
	tests := []struct {
		phase    outcome.Phase
		name     string
		terminal bool
	}{
		{outcome.PhaseNotStarted, "not_started", false},
		{outcome.PhaseActive, "active", false},
		{outcome.PhaseCommitting, "committing", false},
		{outcome.PhaseCommitted, "committed", true},
		{outcome.PhaseRolledBack, "rolled_back", true},
		{outcome.PhaseUnknown, "unknown", true},
	}
	if len(tests) != len(allPhases) {
		t.Fatalf("table covers %d phases, want %d", len(tests), len(allPhases))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.phase.String(); got != tt.name {
				t.Errorf("String() = %q, want %q", got, tt.name)
			}
			if !tt.phase.Valid() {
				t.Errorf("Valid() = false, want true")
			}
			if got := tt.phase.Terminal(); got != tt.terminal {
				t.Errorf("Terminal() = %v, want %v", got, tt.terminal)
			}
			got, err := outcome.ParsePhase(tt.name)
			if err != nil {
				t.Fatalf("ParsePhase(%q) error: %v", tt.name, err)
			}
			if got != tt.phase {
				t.Errorf("ParsePhase(%q) = %v, want %v", tt.name, got, tt.phase)
			}
		})
	}
}

func TestPhaseZeroValueIsNotStarted(t *testing.T) {
	var p outcome.Phase
	if p != outcome.PhaseNotStarted {
		t.Fatalf("zero Phase = %v, want not_started", p)
	}
}

func TestPhaseInvalidValues(t *testing.T) {
	for _, p := range []outcome.Phase{6, 7, 200, 255} {
		if p.Valid() {
			t.Errorf("Phase(%d).Valid() = true, want false", uint8(p))
		}
		if p.Terminal() {
			t.Errorf("Phase(%d).Terminal() = true, want false", uint8(p))
		}
		if !strings.HasPrefix(p.String(), "phase(") {
			t.Errorf("Phase(%d).String() = %q, want phase(N)", uint8(p), p.String())
		}
	}
	if got, want := outcome.Phase(6).String(), "phase(6)"; got != want {
		t.Errorf("Phase(6).String() = %q, want %q", got, want)
	}
}

func TestParsePhaseUnknownString(t *testing.T) {
	for _, s := range []string{
		"", "Committed", "COMMITTED", "committed ", " active", "rolled-back",
		"rolledback", "notstarted", "indeterminate", "phase(6)", "phase(0)",
	} {
		t.Run(s, func(t *testing.T) {
			p, err := outcome.ParsePhase(s)
			if err == nil {
				t.Fatalf("ParsePhase(%q) = %v, nil; want error", s, p)
			}
			if !strings.Contains(err.Error(), "unknown phase") {
				t.Errorf("error %q does not say unknown phase", err)
			}
		})
	}
}
