package outcome_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/txevidence/otelpgxtx/outcome"
)

var (
	testID    = outcome.OperationID{0x0a, 0x0b, 0x0c, 15: 0x01}
	errCause  = errors.New("cause")
	validRef  = outcome.ReconciliationRef{XID: 748, SystemIdentifier: 7350493852390428123, Timeline: 1}
	noWritesR = outcome.ReconciliationRef{XID: 0, SystemIdentifier: 7350493852390428123, Timeline: 1}
)

// Compile-time: the five variants are Results.
var (
	_ outcome.Result[int] = outcome.Committed[int]{}
	_ outcome.Result[int] = outcome.Participating[int]{}
	_ outcome.Result[int] = outcome.DeterminateRollback[int]{}
	_ outcome.Result[int] = outcome.Indeterminate[int]{}
	_ outcome.Result[int] = outcome.CommittedWithPostCommitFailure[int]{}
)

func TestCommitted(t *testing.T) {
	for _, local := range []bool{false, true} {
		r := outcome.NewCommitted(testID, "v", local)
		if r.Outcome() != outcome.OutcomeCommitted {
			t.Errorf("Outcome() = %v", r.Outcome())
		}
		if r.OperationID() != testID {
			t.Errorf("OperationID() = %v", r.OperationID())
		}
		if r.Value() != "v" {
			t.Errorf("Value() = %q", r.Value())
		}
		if r.CommittedLocally() != local {
			t.Errorf("CommittedLocally() = %v, want %v", r.CommittedLocally(), local)
		}
	}
}

func TestParticipating(t *testing.T) {
	r := outcome.NewParticipating(testID, 42)
	if r.Outcome() != outcome.OutcomeParticipating {
		t.Errorf("Outcome() = %v", r.Outcome())
	}
	if r.OperationID() != testID {
		t.Errorf("OperationID() = %v", r.OperationID())
	}
	if r.Value() != 42 {
		t.Errorf("Value() = %d", r.Value())
	}
	// A participant never claims commit: its Outcome is not committed, whatever it carries.
	var res outcome.Result[int] = r
	if _, ok := res.(outcome.Committed[int]); ok {
		t.Error("a Participating result is a Committed")
	}
}

func TestNewDeterminateRollback(t *testing.T) {
	tests := []struct {
		name      string
		phase     outcome.Phase
		cause     error
		retryable bool
		wantErr   string // "" means accepted
	}{
		{"not_started", outcome.PhaseNotStarted, errCause, true, ""},
		{"not_started not retryable", outcome.PhaseNotStarted, errCause, false, ""},
		{"active", outcome.PhaseActive, errCause, true, ""},
		{"active not retryable", outcome.PhaseActive, errCause, false, ""},
		{"committing", outcome.PhaseCommitting, errCause, false, ""},
		{"committing retryable", outcome.PhaseCommitting, errCause, true, ""},
		{"from committed", outcome.PhaseCommitted, errCause, false, "phase committed"},
		{"from unknown", outcome.PhaseUnknown, errCause, false, "phase unknown"},
		{"from rolled_back", outcome.PhaseRolledBack, errCause, false, "phase rolled_back"},
		{"from invalid phase", outcome.Phase(6), errCause, false, "phase(6)"},
		{"nil cause not_started", outcome.PhaseNotStarted, nil, false, "cause"},
		{"nil cause active", outcome.PhaseActive, nil, true, "cause"},
		{"nil cause committing", outcome.PhaseCommitting, nil, false, "cause"},
		{"nil cause and bad phase", outcome.PhaseCommitted, nil, false, "rollback"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := outcome.NewDeterminateRollback[string](testID, tt.phase, tt.cause, tt.retryable)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("NewDeterminateRollback(%v, %v) = %+v, nil; want error", tt.phase, tt.cause, r)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q does not contain %q", err, tt.wantErr)
				}
				if r != (outcome.DeterminateRollback[string]{}) {
					t.Errorf("refused constructor returned non-zero result %+v", r)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewDeterminateRollback(%v) error: %v", tt.phase, err)
			}
			if r.Outcome() != outcome.OutcomeRolledBack {
				t.Errorf("Outcome() = %v", r.Outcome())
			}
			if r.OperationID() != testID {
				t.Errorf("OperationID() = %v", r.OperationID())
			}
			if r.Phase() != tt.phase {
				t.Errorf("Phase() = %v, want %v", r.Phase(), tt.phase)
			}
			if r.Cause() != tt.cause {
				t.Errorf("Cause() = %v, want %v", r.Cause(), tt.cause)
			}
			if r.Retryable() != tt.retryable {
				t.Errorf("Retryable() = %v, want %v", r.Retryable(), tt.retryable)
			}
		})
	}
}

func TestNewIndeterminate(t *testing.T) {
	zeroSys := outcome.ReconciliationRef{XID: 1, SystemIdentifier: 0, Timeline: 1}
	zeroTLI := outcome.ReconciliationRef{XID: 1, SystemIdentifier: 1, Timeline: 0}
	zeroRef := outcome.ReconciliationRef{}
	tests := []struct {
		name    string
		id      outcome.OperationID
		cause   error
		ref     *outcome.ReconciliationRef
		local   bool
		wantErr string // "" means accepted
	}{
		{"committing without ref", testID, errCause, nil, false, ""},
		{"committing with ref", testID, errCause, &validRef, false, ""},
		{"committing with no-writes ref", testID, errCause, &noWritesR, false, ""},
		{"committing committed locally", testID, errCause, &validRef, true, ""},
		{"nil cause", testID, nil, nil, false, "failure"},
		{"nil cause with ref", testID, nil, &validRef, true, "failure"},
		{"zero id", outcome.OperationID{}, errCause, nil, false, "operation id"},
		{"zero id with ref", outcome.OperationID{}, errCause, &validRef, false, "operation id"},
		{"ref with zero system identifier", testID, errCause, &zeroSys, false, "zero system identifier"},
		{"ref with zero timeline", testID, errCause, &zeroTLI, false, "zero timeline"},
		{"zero ref", testID, errCause, &zeroRef, false, "malformed reconciliation reference"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := outcome.NewIndeterminate[int](tt.id, tt.cause, tt.ref, tt.local)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("NewIndeterminate = %+v, nil; want error containing %q", r, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q does not contain %q", err, tt.wantErr)
				}
				if r != (outcome.Indeterminate[int]{}) {
					t.Errorf("refused constructor returned non-zero result %+v", r)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewIndeterminate error: %v", err)
			}
			if r.Outcome() != outcome.OutcomeIndeterminate {
				t.Errorf("Outcome() = %v", r.Outcome())
			}
			if r.OperationID() != tt.id {
				t.Errorf("OperationID() = %v", r.OperationID())
			}
			if r.Cause() != tt.cause {
				t.Errorf("Cause() = %v", r.Cause())
			}
			if r.CommittedLocally() != tt.local {
				t.Errorf("CommittedLocally() = %v, want %v", r.CommittedLocally(), tt.local)
			}
			ref, ok := r.Reference()
			if ok != (tt.ref != nil) {
				t.Fatalf("Reference() ok = %v, want %v", ok, tt.ref != nil)
			}
			if tt.ref != nil && ref != *tt.ref {
				t.Errorf("Reference() = %+v, want %+v", ref, *tt.ref)
			}
			if tt.ref == nil && ref != (outcome.ReconciliationRef{}) {
				t.Errorf("Reference() without ref = %+v, want zero", ref)
			}
		})
	}
}

func TestIndeterminateRefIsCopied(t *testing.T) {
	ref := validRef
	r, err := outcome.NewIndeterminate[int](testID, errCause, &ref, false)
	if err != nil {
		t.Fatal(err)
	}
	ref.XID = 1 // the caller's variable changes after construction
	got, _ := r.Reference()
	if got != validRef {
		t.Errorf("Reference() = %+v after the caller changed its ref, want %+v", got, validRef)
	}
}

func TestIndeterminateHasNoRetryField(t *testing.T) {
	// The type must offer no way to ask for a retry: there is no Retryable method.
	var r any = outcome.Indeterminate[int]{}
	if _, ok := r.(interface{ Retryable() bool }); ok {
		t.Error("Indeterminate has a Retryable method")
	}
	if _, ok := r.(interface{ Value() int }); ok {
		t.Error("Indeterminate exposes a Value as if it had committed")
	}
}

func TestNewCommittedWithPostCommitFailure(t *testing.T) {
	failure := errors.New("publish event")
	r, err := outcome.NewCommittedWithPostCommitFailure(testID, "v", failure)
	if err != nil {
		t.Fatalf("error: %v", err)
	}
	if r.Outcome() != outcome.OutcomeCommittedWithPostCommitFailure {
		t.Errorf("Outcome() = %v", r.Outcome())
	}
	if r.OperationID() != testID {
		t.Errorf("OperationID() = %v", r.OperationID())
	}
	if r.Value() != "v" {
		t.Errorf("Value() = %q", r.Value())
	}
	if r.Failure() != failure {
		t.Errorf("Failure() = %v", r.Failure())
	}

	r, err = outcome.NewCommittedWithPostCommitFailure(testID, "v", nil)
	if err == nil {
		t.Fatalf("nil failure accepted: %+v", r)
	}
	if !strings.Contains(err.Error(), "failure") {
		t.Errorf("error %q does not mention the failure", err)
	}
	if r != (outcome.CommittedWithPostCommitFailure[string]{}) {
		t.Errorf("refused constructor returned non-zero result %+v", r)
	}
}

func TestEachVariantOutcome(t *testing.T) {
	rb, err := outcome.NewDeterminateRollback[int](testID, outcome.PhaseActive, errCause, true)
	if err != nil {
		t.Fatal(err)
	}
	ind, err := outcome.NewIndeterminate[int](testID, errCause, &validRef, false)
	if err != nil {
		t.Fatal(err)
	}
	pcf, err := outcome.NewCommittedWithPostCommitFailure(testID, 1, errCause)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		r    outcome.Result[int]
		want outcome.Outcome
	}{
		{"committed", outcome.NewCommitted(testID, 1, false), outcome.OutcomeCommitted},
		{"participating", outcome.NewParticipating(testID, 1), outcome.OutcomeParticipating},
		{"determinate rollback", rb, outcome.OutcomeRolledBack},
		{"indeterminate", ind, outcome.OutcomeIndeterminate},
		{"post-commit failure", pcf, outcome.OutcomeCommittedWithPostCommitFailure},
		// The variant, not its construction, decides the outcome: even zero values say which.
		{"zero committed", outcome.Committed[int]{}, outcome.OutcomeCommitted},
		{"zero participating", outcome.Participating[int]{}, outcome.OutcomeParticipating},
		{"zero rollback", outcome.DeterminateRollback[int]{}, outcome.OutcomeRolledBack},
		{"zero indeterminate", outcome.Indeterminate[int]{}, outcome.OutcomeIndeterminate},
		{"zero post-commit failure", outcome.CommittedWithPostCommitFailure[int]{}, outcome.OutcomeCommittedWithPostCommitFailure},
	}
	seen := map[outcome.Outcome]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Outcome(); got != tt.want {
				t.Errorf("Outcome() = %v, want %v", got, tt.want)
			}
			if !tt.r.Outcome().Valid() {
				t.Errorf("Outcome() %v is not valid", tt.r.Outcome())
			}
		})
		seen[tt.r.Outcome()] = true
	}
	for _, o := range outcome.Outcomes() {
		if !seen[o] {
			t.Errorf("no variant reports %v", o)
		}
	}
}

func TestTypeSwitchIsExhaustive(t *testing.T) {
	rb, _ := outcome.NewDeterminateRollback[int](testID, outcome.PhaseActive, errCause, false)
	ind, _ := outcome.NewIndeterminate[int](testID, errCause, nil, false)
	pcf, _ := outcome.NewCommittedWithPostCommitFailure(testID, 1, errCause)
	results := []outcome.Result[int]{
		outcome.NewCommitted(testID, 1, false), outcome.NewParticipating(testID, 1), rb, ind, pcf,
	}
	for _, res := range results {
		var got outcome.Outcome
		switch res.(type) {
		case outcome.Committed[int]:
			got = outcome.OutcomeCommitted
		case outcome.Participating[int]:
			got = outcome.OutcomeParticipating
		case outcome.DeterminateRollback[int]:
			got = outcome.OutcomeRolledBack
		case outcome.Indeterminate[int]:
			got = outcome.OutcomeIndeterminate
		case outcome.CommittedWithPostCommitFailure[int]:
			got = outcome.OutcomeCommittedWithPostCommitFailure
		default:
			t.Fatalf("%T escaped the type switch", res)
		}
		if got != res.Outcome() {
			t.Errorf("%T: type switch says %v, Outcome() says %v", res, got, res.Outcome())
		}
	}
}
