package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/outcome"
)

// MarkerTableDDL returns the statements that create a commit-marker table named table,
// schema and table (pgx.Identifier{"app", "tx_marker"}; an unqualified name is refused:
// the marker must not depend on a session's search_path), run once by a role that may
// create in that database (the table's owner to be):
//
//   - the schema, if missing, with USAGE for PUBLIC;
//   - the table: operation_id uuid primary key, fenced boolean (the reconciler's rows),
//     created_at timestamptz (what [PruneMarkers] prunes by);
//   - the marker function of the same name, taking the operation id: SECURITY DEFINER,
//     EXECUTE for PUBLIC. Every name in it is schema-qualified, operators included, so that
//     no search_path of a caller's can change what it runs as its owner; it sets none of
//     its own, which would cost every commit a configuration change and back (a tenth of
//     the function's cost, measured with callgrind). It inserts the operation id and returns 'm'
//     and the xid; in a transaction without an xid (nothing written) it returns 'n', and in
//     a read-only one 'r' and the xid, inserting nothing: the only cases where a marker
//     cannot be written, and ones that leave nothing durable behind.
//
// otelpgxtx.WithCommitMarker and otelpgxtx.Policy.CommitMarker call the function by its
// schema-qualified name (so that one dropped and created again is found) in the same
// write as COMMIT, ahead of it, so the application's roles need no privilege on the table, and neither a SET ROLE, a
// search_path nor row security of theirs changes what it does. The reconciler's role
// needs INSERT and SELECT on the table, [PruneMarkers]' DELETE, INSERT and UPDATE.
func MarkerTableDDL(table pgx.Identifier) (string, error) {
	name, err := markertable.Quote(table...)
	if err != nil {
		return "", invalid("MarkerTableDDL: %w", err)
	}
	schema := pgx.Identifier{table[0]}.Sanitize()
	const tag = "$otelpgxtx_marker$"
	if strings.Contains(name, tag) {
		return "", invalid("MarkerTableDDL: the name %s holds %s", name, tag)
	}
	return "create schema if not exists " + schema + ";\n" +
		"grant usage on schema " + schema + " to public;\n" +
		"create table if not exists " + name + " (" +
		"operation_id uuid primary key, " +
		"fenced boolean not null default false, " +
		"created_at timestamptz not null default now());\n" +
		"create or replace function " + name + "(operation_id uuid) returns text\n" +
		"language plpgsql security definer as " + tag + "\n" +
		"declare\n" +
		"  x pg_catalog.xid8 := pg_catalog.pg_current_xact_id_if_assigned();\n" +
		"begin\n" +
		"  if x is null then\n" +
		"    return 'n';\n" +
		"  end if;\n" +
		"  if pg_catalog.current_setting('transaction_read_only') operator(pg_catalog.=) 'on' then\n" +
		"    return 'r' operator(pg_catalog.||) x::pg_catalog.text;\n" +
		"  end if;\n" +
		"  insert into " + name + " (operation_id) values ($1);\n" +
		"  return 'm' operator(pg_catalog.||) x::pg_catalog.text;\n" +
		"end " + tag + ";\n" +
		"grant execute on function " + name + "(uuid) to public", nil
}

// PruneMarkers deletes the marker rows of table (schema and table) older than retention
// and returns how many. It records what it removed — a horizon, the row of the zero
// operation id, whose created_at is the cut-off — in the same statement, so that a
// reconciler never reads a pruned marker as absence: a reference that may predate the
// horizon is answered unknown ([ReasonMarkerPruned]), not aborted. A row must outlive
// every reconciliation that may still look for it, and a fence every COMMIT that may
// still be on its way to the server: keep retention well above the longest time an
// operation can stay indeterminate.
func PruneMarkers(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, table pgx.Identifier, retention time.Duration) (int64, error) {
	name, err := markertable.Quote(table...)
	if err != nil {
		return 0, invalid("PruneMarkers: %v", err)
	}
	if ctx == nil || db == nil || pg.IsNilHandle(db) || retention <= 0 {
		return 0, invalid("PruneMarkers: nil context or db, or non-positive retention")
	}
	tag, err := db.Exec(ctx, "with h as (insert into "+name+" as m (operation_id, fenced, created_at) "+
		"values ('"+horizonID+"', true, now() - $1::bigint * interval '1 microsecond') "+
		"on conflict (operation_id) do update set created_at = greatest(m.created_at, excluded.created_at)) "+
		"delete from "+name+" where operation_id <> '"+horizonID+"' and created_at < now() - $1::bigint * interval '1 microsecond'",
		retention.Microseconds())
	return tag.RowsAffected(), err
}

// horizonID is the operation id of a marker table's horizon row (see PruneMarkers): the
// zero id, which no operation has.
const horizonID = "00000000-0000-0000-0000-000000000000"

// prunedMargin is how much later than a reference's check a pruning horizon must be
// before the reference's marker row can have been pruned: the row is never older than the
// check by the same server's clock, and this allows for that clock stepping back, or
// another server's after a failover.
const prunedMargin = 10 * time.Minute

// ResolveAssertedMarker settles an operation by its row in the commit-marker table (schema
// and table) of the database the reconciler is connected to alone, without a reference:
// for an operator who has only the tx.operation_id of an operation that was committed
// with a marker (otelpgxtx.Run with otelpgxtx.Policy.CommitMarker set to table, in that
// database), its reference lost. link, if valid, is the span that observed it.
//
// Calling it asserts that the operation's COMMIT was sent with a marker call for table in
// this database: the answer aborted rests on that, for it means that no marker row with
// the id committed (a fence now stops one from ever committing) — and so that nothing of
// the transaction is in the database: the function writes no row only for a transaction
// that had no xid or was read-only, which leave nothing durable either. Only the operation's
// reference proves that a marker was written; a frame without one (a plain pgx
// transaction, otelpgxtx.Run without a marker) stays unknown with [ReasonNoReference] —
// never give its id here, or a commit that wrote no marker would be answered aborted, and
// redone. [Reconciler.Resolve] of a reference that names a marker is the way to settle
// one. Without a reference the time of the operation is unknown too: once the table has
// been pruned, absence is unknown, [ReasonMarkerPruned].
func (r *Reconciler) ResolveAssertedMarker(ctx context.Context, table pgx.Identifier, op outcome.OperationID, link trace.SpanContext) (Answer, error) {
	if err := r.check("ResolveAssertedMarker", ctx); err != nil {
		return Answer{}, err
	}
	name, err := markertable.Quote(table...)
	if err != nil {
		return Answer{}, invalid("ResolveAssertedMarker: %v", err)
	}
	if op.IsZero() {
		return Answer{}, invalid("ResolveAssertedMarker: zero operation id")
	}
	return r.trace(ctx, link, op, outcome.ReconciliationRef{}, func(ctx context.Context) (Answer, error) {
		var res Answer
		res.status, res.reason, err = r.resolveMarker(ctx, markerQuestion{relation: name, op: op})
		if err != nil {
			err = fmt.Errorf("reconcile: reconciling operation %s by its marker: %w", op, err)
		}
		return res, err
	})
}

// beginner is what marker reconciliation needs of the reconciler's db.
type beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// markerQuestion is what a marker lookup asks: operation op's row in relation (quoted,
// schema-qualified), with what a reference adds — the database and cluster it was written
// in (empty, 0: the reconciler's own, asserted), the connection's check time (0: unknown),
// and what the reference's xid proves on the server asked (Unknown: nothing).
type markerQuestion struct {
	relation  string
	op        outcome.OperationID
	database  string
	sys       uint64
	checkedAt int64
	xid       Status
}

// resolveMarker settles q from its marker row. A row the original transaction inserted
// is invisible until it commits, so a lookup alone cannot tell "never will" from "not
// yet". Instead the reconciler inserts a fenced row with the same operation id under the
// primary key: PostgreSQL's unique check waits for an in-progress inserter of the key
// (nbtinsert.c _bt_check_unique → XactLockTableWait), bounded here by lock_timeout
// (in_progress; a synchronous-replication wait holds it too). If the original committed,
// the key exists (its row, fenced = false: committed); if the key is free, the fence is
// committed, and the original's insert, should it still arrive, fails on the key and
// rolls its transaction back: aborted, for good. The reconciler's role needs INSERT and
// SELECT on the table.
//
// It fences nothing, and answers unknown, where the row cannot be the evidence: on
// another cluster ([ReasonOtherSystem]: a copy restored from a logical dump proves
// nothing of the original) or another database ([ReasonOtherDatabase]), where the row may
// have been pruned ([ReasonMarkerPruned]), and where the reference's xid already proves
// the opposite of what the row says ([ReasonEvidenceConflict], logged).
func (r *Reconciler) resolveMarker(ctx context.Context, q markerQuestion) (Status, string, error) {
	deadline := time.Now().Add(r.wait)
	res, reason, seen, err := r.lookupMarker(ctx, q)
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
func (r *Reconciler) lookupMarker(ctx context.Context, q markerQuestion) (res Status, reason string, seen markerView, err error) {
	b, ok := r.db.(beginner)
	if !ok {
		return Unknown, "", seen, invalid("reconciling a marker needs a db that can Begin (a *pgxpool.Pool or *pgx.Conn), not %T", r.db)
	}
	// Read committed, whatever the server's default: a statement after the fence must see
	// the row that took the key.
	tx, err := b.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadWrite})
	if err != nil {
		return Unknown, "", seen, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	sysText, database, err := r.prepareFence(ctx, tx, &seen)
	if err != nil {
		return Unknown, "", seen, err
	}
	switch {
	case q.sys != 0 && sysText != strconv.FormatUint(q.sys, 10):
		return Unknown, ReasonOtherSystem, seen, nil
	case q.database != "" && database != q.database:
		return Unknown, ReasonOtherDatabase, seen, nil
	}
	id := q.op.String()
	if q.xid == Committed || q.xid == Aborted {
		res, reason, err = r.checkMarker(ctx, tx, q, id)
		return res, reason, seen, err
	}
	res, reason, err = r.fenceMarker(ctx, tx, q, id)
	return res, reason, seen, err
}

// prepareFence bounds the fence's wait in tx and has it commit locally (the comment
// below says why), and reads in the same statement what the lookup must know of the
// server: seen gets its incarnation and whether it has synchronous standbys; the
// cluster's system identifier and the database are returned, since they tell whether the
// row can be the evidence at all.
func (r *Reconciler) prepareFence(ctx context.Context, tx pgx.Tx, seen *markerView) (sysText, database string, err error) {
	// lock_timeout 0 would wait forever. The fence commits locally, without waiting for
	// a synchronous standby that may be gone after a failover: the original can only
	// commit on the server it runs on, so a fence lost with this server in a later
	// failover fenced nothing that survives there either.
	wait := max(r.wait, time.Millisecond)
	var lockTimeout, syncCommit, tli, start, reset string
	if err := tx.QueryRow(ctx, "select set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'local', true), "+incarnationSQL+", "+syncStandbysSQL+
		", (select system_identifier::text from pg_control_system()), current_database()",
		strconv.FormatInt(wait.Milliseconds()+1, 10)).Scan(&lockTimeout, &syncCommit, &tli, &start, &reset, &seen.syncStandbys, &sysText, &database); err != nil {
		return sysText, database, err
	}
	if seen.incarnation, err = parseIncarnation(tli, start, reset); err != nil {
		return sysText, database, err
	}
	return sysText, database, nil
}

// checkMarker answers q, whose xid is already committed or aborted, from the marker row
// of id, which may only agree with the xid: a row that contradicts it is logged and
// answered unknown, since one of the two pieces of evidence is wrong.
func (r *Reconciler) checkMarker(ctx context.Context, tx pgx.Tx, q markerQuestion, id string) (Status, string, error) {
	// The xid decides; the row may only agree with it. Nothing is fenced: an aborted
	// xid never commits, and a committed one has.
	row, err := r.readMarker(ctx, tx, q, id)
	if err != nil {
		return Unknown, "", err
	}
	switch {
	case q.xid == Committed && row.present && !row.fenced, q.xid == Aborted && (!row.present || row.fenced):
		return q.xid, "", nil
	case q.xid == Committed && !row.present && row.mayBePruned:
		return Committed, "", nil // pruned since: no contradiction
	}
	r.logConflict(ctx, q, row)
	return Unknown, ReasonEvidenceConflict, nil
}

// fenceMarker inserts the fenced row of id and commits it if the key was free: then the
// original can never commit, and the answer is aborted. An insert that waits out
// lock_timeout behind the original's, still in progress, is answered unknown
// (in_progress); a key that a committed row has taken is answered from that row
// (takenMarker).
func (r *Reconciler) fenceMarker(ctx context.Context, tx pgx.Tx, q markerQuestion, id string) (Status, string, error) {
	var fenced bool
	err := tx.QueryRow(ctx, "insert into "+q.relation+" (operation_id, fenced) values ($1, true) "+
		"on conflict (operation_id) do nothing returning true", id).Scan(&fenced)
	switch {
	case err == nil:
		// The key was free. Read the horizon after the insert: a prune that removed the
		// original's row committed before the insert could take the key.
		row, err := r.readMarker(ctx, tx, q, id)
		if err != nil {
			return Unknown, "", err
		}
		if row.mayBePruned {
			return Unknown, ReasonMarkerPruned, nil // rolled back: nothing fenced
		}
		if err := tx.Commit(ctx); err != nil {
			return Unknown, "", err
		}
		return Aborted, "", nil
	case isLockTimeout(err):
		return Unknown, ReasonInProgress, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return Unknown, "", err
	}
	return r.takenMarker(ctx, tx, q, id)
}

// takenMarker answers q from the committed row that took the key id before the fence
// could: the original's (committed), or an earlier reconciliation's fence (aborted). A
// row pruned between the fence and this read proves neither, so it is answered unknown.
func (r *Reconciler) takenMarker(ctx context.Context, tx pgx.Tx, q markerQuestion, id string) (Status, string, error) {
	// The key was taken by a committed row: a new statement's snapshot sees it.
	row, err := r.readMarker(ctx, tx, q, id)
	if err != nil {
		return Unknown, "", err
	}
	switch {
	case !row.present:
		return Unknown, ReasonMarkerGone, nil
	case row.fenced:
		return Aborted, "", nil // an earlier reconciliation fenced it
	}
	return Committed, "", nil
}

// markerRow is what readMarker found.
type markerRow struct {
	present, fenced bool
	// mayBePruned: PruneMarkers' horizon is later than the reference's check (less
	// prunedMargin), or there is a horizon and no check time.
	mayBePruned bool
}

// readMarker reads op's row and the table's pruning horizon, in one statement.
func (r *Reconciler) readMarker(ctx context.Context, tx pgx.Tx, q markerQuestion, id string) (markerRow, error) {
	var row markerRow
	var fenced *bool
	var horizon *int64
	err := tx.QueryRow(ctx, "select (select fenced from "+q.relation+" where operation_id = $1), "+
		"(select (extract(epoch from created_at) * 1000000)::bigint from "+q.relation+" where operation_id = '"+horizonID+"')", id).Scan(&fenced, &horizon)
	if err != nil {
		return row, err
	}
	row.present = fenced != nil
	row.fenced = fenced != nil && *fenced
	row.mayBePruned = horizon != nil && (q.checkedAt == 0 || *horizon > q.checkedAt-prunedMargin.Microseconds())
	return row, nil
}

// logConflict records a marker that contradicts the reference's conclusive xid: the
// evidence itself is wrong somewhere (a marker table altered by hand, a reference taken
// from another operation), which an operator must see.
func (r *Reconciler) logConflict(ctx context.Context, q markerQuestion, row markerRow) {
	r.logger.LogAttrs(ctx, slog.LevelError, "otelpgxtx: the commit marker contradicts the reference's xid; answered unknown, nothing fenced",
		slog.String("operation", q.op.String()), slog.String("marker_table", q.relation),
		slog.String("xid_status", q.xid.String()), slog.Bool("marker_present", row.present), slog.Bool("marker_fenced", row.fenced))
}

// isLockTimeout reports the server's lock_not_available (55P03), which a lock_timeout ends
// a wait with.
func isLockTimeout(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == "55P03"
}
