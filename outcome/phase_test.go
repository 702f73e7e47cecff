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

func TestCanTransitionAllPairs(t *testing.T) {
	const (
		N  = outcome.PhaseNotStarted
		A  = outcome.PhaseActive
		C  = outcome.PhaseCommitting
		OK = outcome.PhaseCommitted
		RB = outcome.PhaseRolledBack
		U  = outcome.PhaseUnknown
	)
	// want[from][to]; rows and columns in the order N, A, C, OK, RB, U.
	want := [6][6]bool{
		N:  {N: false, A: true, C: false, OK: false, RB: true, U: false},
		A:  {N: false, A: false, C: true, OK: false, RB: true, U: false},
		C:  {N: false, A: false, C: false, OK: true, RB: true, U: true},
		OK: {N: false, A: false, C: false, OK: false, RB: false, U: false},
		RB: {N: false, A: false, C: false, OK: false, RB: false, U: false},
		U:  {N: false, A: false, C: false, OK: false, RB: false, U: false},
	}
	pairs, legal := 0, 0
	for _, from := range allPhases {
		for _, to := range allPhases {
			pairs++
			w := want[from][to]
			if w {
				legal++
			}
			t.Run(from.String()+"->"+to.String(), func(t *testing.T) {
				if got := outcome.CanTransition(from, to); got != w {
					t.Errorf("CanTransition(%v, %v) = %v, want %v", from, to, got, w)
				}
			})
		}
	}
	if pairs != 36 || legal != 7 {
		t.Fatalf("covered %d pairs with %d legal, want 36 and 7", pairs, legal)
	}
}

func TestOnlyCommittingMayBecomeUnknown(t *testing.T) {
	for _, from := range allPhases {
		if got := outcome.CanTransition(from, outcome.PhaseUnknown); got != (from == outcome.PhaseCommitting) {
			t.Errorf("CanTransition(%v, unknown) = %v", from, got)
		}
	}
}

func TestCanTransitionInvalidPhases(t *testing.T) {
	bad := []outcome.Phase{6, 255}
	for _, b := range bad {
		for _, p := range allPhases {
			if outcome.CanTransition(b, p) {
				t.Errorf("CanTransition(%v, %v) = true, want false", b, p)
			}
			if outcome.CanTransition(p, b) {
				t.Errorf("CanTransition(%v, %v) = true, want false", p, b)
			}
		}
	}
}
