package otelpgxtx

import (
	"context"
	"errors"
)

// AfterCommit registers hook to run after the physical commit of the transaction that
// [Run] put in ctx. From a participant (Required, Mandatory) it runs after the owner's
// commit; from a Nested call, only if its savepoint was released and the owner commits.
// A rollback discards it. A failing hook turns the owner's result into
// CommittedWithPostCommitFailure: the commit is not undone.
func AfterCommit(ctx context.Context, hook func(context.Context) error) error {
	if ctx == nil {
		return invalid("AfterCommit: nil context")
	}
	if hook == nil {
		return invalid("AfterCommit: nil hook")
	}
	sc := scopeFromContext(ctx)
	if sc == nil {
		return invalid("AfterCommit: no transaction of Run in the context")
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closed {
		return errors.New("otelpgxtx: AfterCommit: the transaction has already ended")
	}
	sc.hooks = append(sc.hooks, hook)
	return nil
}
