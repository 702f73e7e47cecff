package otelpgxtx

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/internal/reference"
)

// Propagation says how [Run] relates to a transaction already in its context.
type Propagation uint8

const (
	// Required joins the transaction in ctx (the result is Participating) or, without
	// one, begins its own.
	Required Propagation = iota + 1
	// RequiresNew suspends the transaction in ctx, if any, and runs an independent
	// physical transaction on another connection: a nested frame.
	RequiresNew
	// Nested runs inside a savepoint of the transaction in ctx (the result is
	// Participating, or a rollback of the savepoint alone); without one, like Required.
	// A call whose context expires before it returns is rolled back to its savepoint
	// (with a context of its own, so the outer transaction can still commit).
	Nested
	// Mandatory joins the transaction in ctx and is an error without one.
	Mandatory
)

// propagationNames are the tx.propagation values, indexed by Propagation.
var propagationNames = [...]string{Required: "required", RequiresNew: "requires_new", Nested: "nested", Mandatory: "mandatory"}

// String returns the tx.propagation value.
func (p Propagation) String() string {
	if p >= Required && int(p) < len(propagationNames) {
		return propagationNames[p]
	}
	return fmt.Sprintf("propagation(%d)", uint8(p))
}

// Policy says how [Run] runs a transaction. Start from [DefaultPolicy].
type Policy struct {
	// Propagation; the zero value is invalid, so a forgotten field is an error rather
	// than a silent choice.
	Propagation Propagation
	// IsoLevel, AccessMode and DeferrableMode are passed to BEGIN; empty means the
	// server's default.
	IsoLevel       pgx.TxIsoLevel
	AccessMode     pgx.TxAccessMode
	DeferrableMode pgx.TxDeferrableMode
	// MaxAttempts bounds the attempts of a transaction whose rollback is retryable
	// (serialization failure, deadlock, connection lost before COMMIT was sent). It
	// must be at least 1. An indeterminate outcome is never retried.
	MaxAttempts int
	// BackoffBase and BackoffMax bound the exponential backoff between attempts; each
	// wait is drawn uniformly from [0, min(BackoffMax, BackoffBase·2^(attempt-1))]
	// ("full jitter"), so that conflicting retries spread out.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// CommitReference gives Run's transactions a commit reference, by the mechanism of
	// WithCommitReference (the tracer's option need not be set: the Policy decides for
	// Run's transactions): the xid read after the first statement that may write, in its
	// write, or ahead of COMMIT in COMMIT's, with no extra round trip, so that an
	// indeterminate outcome carries a reconciliation reference. Every COMMIT of Run's
	// carries one, also of a transaction that seemed only to read (a no_writes answer).
	CommitReference bool
	// CommitMarker, if set, names a commit-marker table, schema and table
	// (pgx.Identifier{"app", "tx_marker"}; create it with reconcile.MarkerTableDDL): Run
	// calls its marker function, which inserts the operation id, in place of the xid read
	// (no extra round trip), so that an indeterminate commit's reference settles by a
	// lookup that survives crash restarts, failovers and xid wraparound, even when the
	// connection broke before any reply. It needs CommitReference. The function is
	// checked once per connection ahead of BEGIN, in its write, and called by name ahead
	// of COMMIT, in COMMIT's write; where it is missing or not callable by
	// every role, commits carry the xid read alone, and the marker never changes what a
	// commit does (docs/reconciliation.md, "The commit marker").
	CommitMarker pgx.Identifier
}

// DefaultPolicy returns Required, the server's isolation level, 3 attempts, backoff
// between 5 ms and 1 s, and commit references on.
func DefaultPolicy() Policy {
	return Policy{
		Propagation:     Required,
		MaxAttempts:     3,
		BackoffBase:     5 * time.Millisecond,
		BackoffMax:      time.Second,
		CommitReference: true,
	}
}

// references is what the commits of Run's transactions carry: nothing without
// CommitReference, the marker of CommitMarker, else the xid read.
func (p Policy) references() reference.Refs {
	switch {
	case !p.CommitReference:
		return reference.Refs{}
	case p.CommitMarker != nil:
		return reference.Refs{Mode: reference.Marker, Marker: p.markerTable(), Every: true}
	}
	return reference.Refs{Mode: reference.XID, Every: true}
}

// markerTable is CommitMarker quoted, "" when unset or malformed (validate refuses that).
func (p Policy) markerTable() string {
	if p.CommitMarker == nil {
		return ""
	}
	name, _ := markertable.Quote(p.CommitMarker...)
	return name
}

// validate refuses a policy that cannot be run, naming the field.
func (p Policy) validate() error {
	switch {
	case p.Propagation == 0 && p.MaxAttempts == 0:
		return invalid("a zero Policy; start from DefaultPolicy() and change the fields you need")
	case p.Propagation < Required || p.Propagation > Mandatory:
		return invalid("unknown propagation %s; use Required, RequiresNew, Nested or Mandatory (DefaultPolicy() has Required)", p.Propagation)
	case p.MaxAttempts < 1:
		return invalid("MaxAttempts is %d; it must be at least 1 (DefaultPolicy() has 3)", p.MaxAttempts)
	case p.BackoffBase < 0 || p.BackoffMax < 0:
		return invalid("negative backoff")
	case p.CommitMarker != nil && !p.CommitReference:
		return invalid("CommitMarker needs CommitReference")
	}
	if p.CommitMarker != nil {
		if _, err := markertable.Quote(p.CommitMarker...); err != nil {
			return invalid("CommitMarker: %w", err)
		}
	}
	for _, ok := range []bool{
		p.IsoLevel == "" || p.IsoLevel == pgx.Serializable || p.IsoLevel == pgx.RepeatableRead || p.IsoLevel == pgx.ReadCommitted || p.IsoLevel == pgx.ReadUncommitted,
		p.AccessMode == "" || p.AccessMode == pgx.ReadWrite || p.AccessMode == pgx.ReadOnly,
		p.DeferrableMode == "" || p.DeferrableMode == pgx.Deferrable || p.DeferrableMode == pgx.NotDeferrable,
	} {
		if !ok {
			return invalid("unknown isolation level, access mode or deferrable mode in %+v", p)
		}
	}
	return nil
}

// txOptions is the BEGIN the policy asks for.
func (p Policy) txOptions() pgx.TxOptions {
	return pgx.TxOptions{IsoLevel: p.IsoLevel, AccessMode: p.AccessMode, DeferrableMode: p.DeferrableMode}
}

// waitBackoff waits the backoff before attempt n+1, and reports false if ctx ended first.
func waitBackoff(ctx context.Context, p Policy, n int) bool {
	timer := time.NewTimer(backoff(p, n))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// backoff draws the wait before try n+1 uniformly from [0, min(max, base·2^(n-1))].
func backoff(p Policy, n int) time.Duration {
	d := p.BackoffBase << min(n-1, 30)
	if d <= 0 || (p.BackoffMax > 0 && d > p.BackoffMax) {
		d = p.BackoffMax
	}
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}
