package otelpgxtx

import (
	"context"
	"errors"

	"github.com/txevidence/otelpgxtx/internal/executor"
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
	sc := executor.ScopeFromContext(ctx)
	if sc == nil {
		return invalid("AfterCommit: no transaction of Run in the context")
	}
	sc.Mu.Lock()
	defer sc.Mu.Unlock()
	if sc.Closed {
		return errors.New("otelpgxtx: AfterCommit: the transaction has already ended")
	}
	sc.Hooks = append(sc.Hooks, hook)
	return nil
}
