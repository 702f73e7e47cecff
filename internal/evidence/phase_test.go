package evidence

import (
	"testing"

	"github.com/txevidence/otelpgxtx/outcome"
)

// transitionPhases are the six phases, in declaration order: every valid one.
var transitionPhases = func() (ps []outcome.Phase) {
	for p := outcome.PhaseNotStarted; p.Valid(); p++ {
		ps = append(ps, p)
	}
	return ps
}()

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
	for _, from := range transitionPhases {
		for _, to := range transitionPhases {
			pairs++
			w := want[from][to]
			if w {
				legal++
			}
			t.Run(from.String()+"->"+to.String(), func(t *testing.T) {
				if got := CanTransition(from, to); got != w {
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
	for _, from := range transitionPhases {
		if got := CanTransition(from, outcome.PhaseUnknown); got != (from == outcome.PhaseCommitting) {
			t.Errorf("CanTransition(%v, unknown) = %v", from, got)
		}
	}
}

func TestCanTransitionInvalidPhases(t *testing.T) {
	bad := []outcome.Phase{6, 255}
	for _, b := range bad {
		for _, p := range transitionPhases {
			if CanTransition(b, p) {
				t.Errorf("CanTransition(%v, %v) = true, want false", b, p)
			}
			if CanTransition(p, b) {
				t.Errorf("CanTransition(%v, %v) = true, want false", p, b)
			}
		}
	}
}
