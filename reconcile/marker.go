package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/outcome"
)

// MarkerTableDDL returns the statement that creates a commit-marker table named table
// (its parts are quoted as identifiers: pgx.Identifier{"app", "tx_marker"}). With
// otelpgxtx.Policy.CommitMarker set, otelpgxtx.Run inserts the operation id into it in the same write as
// COMMIT; fenced rows are the reconciler's (see [Reconciler.Resolve]). Run's role needs
// INSERT on it, the reconciler's INSERT and SELECT, [PruneMarkers]' DELETE.
func MarkerTableDDL(table pgx.Identifier) (string, error) {
	name, err := outcome.QuoteMarkerTable(table...)
	if err != nil {
		return "", err
	}
	return "create table if not exists " + name + " (" +
		"operation_id uuid primary key, " +
		"fenced boolean not null default false, " +
		"created_at timestamptz not null default now())", nil
}

// PruneMarkers deletes the marker rows of table older than retention and returns how
// many. A row must outlive every reconciliation that may still look for it, and a fence
// every COMMIT that may still be on its way to the server: keep retention well above the
// longest time an operation can stay indeterminate.
func PruneMarkers(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, table pgx.Identifier, retention time.Duration) (int64, error) {
	name, err := outcome.QuoteMarkerTable(table...)
	if err != nil {
		return 0, invalid("PruneMarkers: %v", err)
	}
	if db == nil || pg.IsNilHandle(db) || retention <= 0 {
		return 0, invalid("PruneMarkers: nil db or non-positive retention")
	}
	tag, err := db.Exec(ctx, "delete from "+name+" where created_at < now() - $1::bigint * interval '1 microsecond'",
		retention.Microseconds())
	return tag.RowsAffected(), err
}

// ResolveAssertedMarker settles an operation by its row in the commit-marker table alone, without
// a reference: for an operator who has only the tx.operation_id of an operation that was
// committed with a marker (otelpgxtx.Run with otelpgxtx.Policy.CommitMarker set to table), its reference
// lost. link, if valid, is the span that observed it.
//
// Calling it asserts that the operation's COMMIT was sent with a marker insert into
// table: the answer aborted rests on that, for it means that no marker row with the id
// committed (a fence now stops one from ever committing). Only the operation's reference
// proves that a marker was written; a frame without one (a plain pgx transaction, otelpgxtx.Run
// without a marker) stays unknown with [ReasonNoReference] — never give its id here, or
// a commit that wrote no marker would be answered aborted, and redone. [Reconciler.Resolve]
// of a reference that names a marker is the way to settle one.
func (r *Reconciler) ResolveAssertedMarker(ctx context.Context, table pgx.Identifier, op outcome.OperationID, link trace.SpanContext) (Answer, error) {
	name, err := outcome.QuoteMarkerTable(table...)
	if err != nil {
		return Answer{}, invalid("ResolveAssertedMarker: %v", err)
	}
	if op.IsZero() {
		return Answer{}, invalid("ResolveAssertedMarker: zero operation id")
	}
	return r.trace(ctx, link, op, outcome.ReconciliationRef{}, func(ctx context.Context) (Answer, error) {
		var res Answer
		res.status, res.reason, err = r.resolveMarker(ctx, name, op, 0)
		if err != nil {
			err = fmt.Errorf("reconcile: reconciling operation %s by its marker: %w", op, err)
		}
		return res, err
	})
}

// beginner is what marker reconciliation needs of the reconciler's db.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// resolveMarker settles ref from its marker row. A row the original transaction
// inserted is invisible until it commits, so a lookup alone cannot tell "never will"
// from "not yet". Instead the reconciler inserts a fenced row with the same operation id
// under the primary key: PostgreSQL's unique check waits for an in-progress inserter of
// the key (nbtinsert.c _bt_check_unique → XactLockTableWait), bounded here by
// lock_timeout (in_progress; a synchronous-replication wait holds it too). If the
// original committed, the key exists (its row, fenced = false: committed); if the key is
// free, the fence is committed, and the original's insert, should it still arrive,
// fails on the key and rolls its transaction back: aborted, for good.
// The reconciler's role needs INSERT and SELECT on the table.
//
// sys, when not 0, is the system identifier of the cluster the marker was written to: a
// marker table of another cluster (a copy restored from a logical dump, a staging
// database) proves nothing about this one, and a fence there would answer aborted for a
// commit that stands where it was made, so it is not fenced ([ReasonOtherSystem]).
func (r *Reconciler) resolveMarker(ctx context.Context, table string, op outcome.OperationID, sys uint64) (Status, string, error) {
	deadline := time.Now().Add(r.wait)
	res, reason, seen, err := r.lookupMarker(ctx, table, op, sys)
	if err != nil || res != Committed || !seen.syncStandbys {
		return res, reason, err
	}
	// After the lookup's transaction ended: on a *pgx.Conn the barrier must not run in it.
	ok, err := r.replicated(ctx, seen.incarnation, deadline)
	if err != nil || !ok {
		return Unknown, ReasonNotReplicated, err
	}
	return Committed, "", nil
}

// markerView is what the marker lookup saw of the server.
type markerView struct {
	incarnation
	syncStandbys bool
}

// lookupMarker fences or finds the marker row (see resolveMarker).
func (r *Reconciler) lookupMarker(ctx context.Context, table string, op outcome.OperationID, sys uint64) (res Status, reason string, seen markerView, err error) {
	b, ok := r.db.(beginner)
	if !ok {
		return Unknown, "", seen, invalid("reconciling a marker needs a db that can Begin (a *pgxpool.Pool or *pgx.Conn), not %T", r.db)
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return Unknown, "", seen, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// lock_timeout 0 would wait forever. The fence commits locally, without waiting for
	// a synchronous standby that may be gone after a failover: the original can only
	// commit on the server it runs on, so a fence lost with this server in a later
	// failover fenced nothing that survives there either.
	wait := max(r.wait, time.Millisecond)
	var lockTimeout, syncCommit, tli, start, sysText string
	if err := tx.QueryRow(ctx, "select set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'local', true), "+incarnationSQL+", "+syncStandbysSQL+
		", case when $2 then (select system_identifier::text from pg_control_system()) else '' end",
		strconv.FormatInt(wait.Milliseconds()+1, 10), sys != 0).Scan(&lockTimeout, &syncCommit, &tli, &start, &seen.syncStandbys, &sysText); err != nil {
		return Unknown, "", seen, err
	}
	if seen.incarnation, err = parseIncarnation(tli, start); err != nil {
		return Unknown, "", seen, err
	}
	if sys != 0 && sysText != strconv.FormatUint(sys, 10) {
		return Unknown, ReasonOtherSystem, seen, nil
	}
	id := op.String()
	var fenced bool
	err = tx.QueryRow(ctx, "insert into "+table+" (operation_id, fenced) values ($1, true) "+
		"on conflict (operation_id) do nothing returning true", id).Scan(&fenced)
	switch {
	case err == nil:
		if err := tx.Commit(ctx); err != nil {
			return Unknown, "", seen, err
		}
		return Aborted, "", seen, nil
	case isLockTimeout(err):
		return Unknown, ReasonInProgress, seen, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return Unknown, "", seen, err
	}
	// The key was taken by a committed row: a new statement's snapshot sees it.
	err = tx.QueryRow(ctx, "select fenced from "+table+" where operation_id = $1", id).Scan(&fenced)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Unknown, ReasonMarkerGone, seen, nil
	case err != nil:
		return Unknown, "", seen, err
	case fenced:
		return Aborted, "", seen, nil // an earlier reconciliation fenced it
	}
	return Committed, "", seen, nil
}

// isLockTimeout reports the server's lock_not_available (55P03), which a lock_timeout ends
// a wait with.
func isLockTimeout(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == "55P03"
}
