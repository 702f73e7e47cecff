package classifier

import (
	"errors"
	"fmt"
)

// Evidence is what is known of a transaction's fate.
type Evidence uint8

// The three kinds of evidence. Their String values match the terminal phase names.
const (
	EvidenceCommitted Evidence = iota + 1
	EvidenceRolledBack
	EvidenceUnknown
)

// String returns committed, rolled_back or unknown, or "evidence(N)" for an invalid value.
func (e Evidence) String() string {
	switch e {
	case EvidenceCommitted:
		return "committed"
	case EvidenceRolledBack:
		return "rolled_back"
	case EvidenceUnknown:
		return "unknown"
	}
	return fmt.Sprintf("evidence(%d)", uint8(e))
}

// Verdict is the classifier's answer. Its zero value is not a verdict; build one with
// [NewVerdict] or get one from [Classify].
type Verdict struct {
	evidence         Evidence
	retryable        bool
	committedLocally bool
	sqlstate         string
	reason           string
}

// errUnknownRetryable is the one invariant every type carrying a verdict keeps.
var errUnknownRetryable = errors.New("classifier: an unknown verdict cannot be retryable: replaying an unknown commit can apply it twice")

// NewVerdict returns a verdict, refusing contradictions: an unknown or committed verdict
// that is retryable, or evidence outside the three kinds.
func NewVerdict(evidence Evidence, retryable bool, sqlstate, reason string) (Verdict, error) {
	switch {
	case evidence != EvidenceCommitted && evidence != EvidenceRolledBack && evidence != EvidenceUnknown:
		return Verdict{}, fmt.Errorf("classifier: invalid evidence %s", evidence)
	case evidence == EvidenceUnknown && retryable:
		return Verdict{}, errUnknownRetryable
	case evidence == EvidenceCommitted && retryable:
		return Verdict{}, errors.New("classifier: a committed verdict cannot be retryable")
	}
	return Verdict{evidence: evidence, retryable: retryable, sqlstate: sqlstate, reason: reason}, nil
}

// Evidence returns committed, rolled_back or unknown.
func (v Verdict) Evidence() Evidence { return v.evidence }

// Retryable reports whether running the whole transaction again is safe and may
// succeed. It is never true for unknown evidence.
func (v Verdict) Retryable() bool { return v.retryable }

// CommittedLocally reports that the server warned the commit was in its local WAL while
// synchronous replication was unconfirmed.
func (v Verdict) CommittedLocally() bool { return v.committedLocally }

// SQLState returns the SQLSTATE of the server error behind the verdict, or "".
func (v Verdict) SQLState() string { return v.sqlstate }

// Reason returns a short, low-cardinality explanation (usable as error.type).
func (v Verdict) Reason() string { return v.reason }
