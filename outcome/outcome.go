package outcome

import "fmt"

// Outcome classifies how a transaction call ended. Its String value is the tx.outcome
// attribute value. The zero value is not an outcome; [Outcome.Valid] reports false for it.
type Outcome uint8

// The five outcomes.
const (
	// OutcomeCommitted: the physical commit was confirmed.
	OutcomeCommitted Outcome = iota + 1
	// OutcomeParticipating: the call only joined an outer transaction; it confirms nothing.
	OutcomeParticipating
	// OutcomeRolledBack: the transaction was rolled back for certain.
	OutcomeRolledBack
	// OutcomeIndeterminate: the commit was asked for and its fate is unknown. Never replay it.
	OutcomeIndeterminate
	// OutcomeCommittedWithPostCommitFailure: committed, but work after the commit failed.
	OutcomeCommittedWithPostCommitFailure
)

var outcomeNames = [...]string{
	OutcomeCommitted:                      "committed",
	OutcomeParticipating:                  "participating",
	OutcomeRolledBack:                     "rolled_back",
	OutcomeIndeterminate:                  "indeterminate",
	OutcomeCommittedWithPostCommitFailure: "committed_with_post_commit_failure",
}

// String returns the tx.outcome value of o, or "outcome(N)" for an invalid value.
func (o Outcome) String() string {
	if o.Valid() {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Valid reports whether o is one of the five outcomes.
func (o Outcome) Valid() bool { return o >= OutcomeCommitted && int(o) < len(outcomeNames) }

// ParseOutcome returns the outcome whose tx.outcome value is s.
func ParseOutcome(s string) (Outcome, error) {
	for i := OutcomeCommitted; int(i) < len(outcomeNames); i++ {
		if outcomeNames[i] == s {
			return i, nil
		}
	}
	return 0, fmt.Errorf("outcome: unknown outcome %q", s)
}

// Outcomes returns the five outcomes in declaration order, for dashboards and tests
// that must cover every one.
func Outcomes() []Outcome {
	return []Outcome{OutcomeCommitted, OutcomeParticipating, OutcomeRolledBack,
		OutcomeIndeterminate, OutcomeCommittedWithPostCommitFailure}
}
