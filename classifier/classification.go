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

// Classification is the classifier's answer. Its zero value is not a classification; build
// one with [NewClassification] or get one from [Classify].
type Classification struct {
	evidence         Evidence
	retryable        bool
	committedLocally bool
	sqlstate         string
	reason           string
}

// errUnknownRetryable is the one invariant every type carrying a classification keeps.
var errUnknownRetryable = errors.New("classifier: an unknown classification cannot be retryable: replaying an unknown commit can apply it twice")

// NewClassification returns a classification, refusing contradictions: an unknown or
// committed classification that is retryable, or evidence outside the three kinds.
func NewClassification(evidence Evidence, retryable bool, sqlstate, reason string) (Classification, error) {
	switch {
	case evidence != EvidenceCommitted && evidence != EvidenceRolledBack && evidence != EvidenceUnknown:
		return Classification{}, fmt.Errorf("classifier: invalid evidence %s", evidence)
	case evidence == EvidenceUnknown && retryable:
		return Classification{}, errUnknownRetryable
	case evidence == EvidenceCommitted && retryable:
		return Classification{}, errors.New("classifier: a committed classification cannot be retryable")
	}
	return Classification{evidence: evidence, retryable: retryable, sqlstate: sqlstate, reason: reason}, nil
}

// Evidence returns committed, rolled_back or unknown.
func (v Classification) Evidence() Evidence { return v.evidence }

// Retryable reports whether running the whole transaction again is safe and may
// succeed. It is never true for unknown evidence.
func (v Classification) Retryable() bool { return v.retryable }

// CommittedLocally reports that the server warned the commit was in its local WAL while
// synchronous replication was unconfirmed.
func (v Classification) CommittedLocally() bool { return v.committedLocally }

// SQLState returns the SQLSTATE of the server error behind the classification, or "".
func (v Classification) SQLState() string { return v.sqlstate }

// Reason returns a short, low-cardinality explanation (usable as error.type).
func (v Classification) Reason() string { return v.reason }
