package outcome

import "fmt"

// Phase is the evidence phase of one physical transaction, as observed by its owner.
//
// The zero value is [PhaseNotStarted]. The legal transitions are
//
//	not_started → active → committing → committed | rolled_back | unknown
//	not_started → rolled_back   (BEGIN failed)
//	active      → rolled_back   (explicit ROLLBACK, or the session died before COMMIT was sent)
type Phase uint8

// The six phases. Their String values are the lower-case names used on the wire
// (tx.phase attribute, tx.phase.* events).
const (
	PhaseNotStarted Phase = iota
	PhaseActive
	PhaseCommitting
	PhaseCommitted
	PhaseRolledBack
	PhaseUnknown
)

var phaseNames = [...]string{
	PhaseNotStarted: "not_started",
	PhaseActive:     "active",
	PhaseCommitting: "committing",
	PhaseCommitted:  "committed",
	PhaseRolledBack: "rolled_back",
	PhaseUnknown:    "unknown",
}

// String returns the wire name of p, or "phase(N)" for a value outside the six.
func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// Valid reports whether p is one of the six phases.
func (p Phase) Valid() bool { return int(p) < len(phaseNames) }

// Terminal reports whether p ends the transaction: committed, rolled_back or unknown.
func (p Phase) Terminal() bool {
	return p == PhaseCommitted || p == PhaseRolledBack || p == PhaseUnknown
}

// ParsePhase returns the phase whose wire name is s.
func ParsePhase(s string) (Phase, error) {
	for i, name := range phaseNames {
		if name == s {
			return Phase(i), nil
		}
	}
	return 0, fmt.Errorf("outcome: unknown phase %q", s)
}
