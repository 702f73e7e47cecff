package outcome_test

import (
	"errors"
	"fmt"

	"github.com/txevidence/otelpgxtx/outcome"
)

// describe is what a caller of a transactional function does with its result: one case
// per variant, and each case does only what that outcome allows.
func describe[T any](r outcome.Result[T]) string {
	switch r := r.(type) {
	case outcome.Committed[T]:
		return fmt.Sprintf("committed: continue with %v", r.Value())
	case outcome.Participating[T]:
		return "participating: joined an outer transaction, confirms nothing"
	case outcome.DeterminateRollback[T]:
		if r.Retryable() {
			return fmt.Sprintf("rolled back in %s (%v): retry", r.Phase(), r.Cause())
		}
		return fmt.Sprintf("rolled back in %s (%v): report failure", r.Phase(), r.Cause())
	case outcome.Indeterminate[T]:
		if ref, ok := r.Reference(); ok {
			return fmt.Sprintf("indeterminate (%v): reconcile %s, never replay", r.Cause(), ref)
		}
		return fmt.Sprintf("indeterminate (%v): reconcile by operation id, never replay", r.Cause())
	case outcome.CommittedWithPostCommitFailure[T]:
		return fmt.Sprintf("committed %v, but after the commit: %v", r.Value(), r.Failure())
	}
	return "unreachable: Result is sealed"
}

// ExampleResult shows the type switch over the five variants of a sealed Result.
func ExampleResult() {
	id, _ := outcome.ParseOperationID("4f1c2a9e0b7d4e3f8a6b5c4d3e2f1a0b")
	ref, _ := outcome.NewReconciliationRef(748, 7350493852390428123, 1)

	serialization := errors.New("ERROR: could not serialize access (SQLSTATE 40001)")
	eof := errors.New("unexpected EOF")

	rollback, _ := outcome.NewDeterminateRollback[int](id, outcome.PhaseCommitting, serialization, true)
	unknown, _ := outcome.NewIndeterminate[int](id, eof, &ref, false)
	post, _ := outcome.NewCommittedWithPostCommitFailure(id, 7, errors.New("publish event: broker down"))

	for _, r := range []outcome.Result[int]{
		outcome.NewCommitted(id, 7, false),
		outcome.NewParticipating(id, 7),
		rollback,
		unknown,
		post,
	} {
		fmt.Printf("%-34s %s\n", r.Outcome(), describe(r))
	}

	// A contradiction cannot be built: nothing is rolled back for certain after its commit.
	_, err := outcome.NewDeterminateRollback[int](id, outcome.PhaseCommitted, serialization, false)
	fmt.Println(err)

	// Output:
	// committed                          committed: continue with 7
	// participating                      participating: joined an outer transaction, confirms nothing
	// rolled_back                        rolled back in committing (ERROR: could not serialize access (SQLSTATE 40001)): retry
	// indeterminate                      indeterminate (unexpected EOF): reconcile pg:7350493852390428123/1/748, never replay
	// committed_with_post_commit_failure committed 7, but after the commit: publish event: broker down
	// outcome: invalid argument: a determinate rollback cannot be observed in phase committed
}
