package reconcile

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/outcome"
)

// serverView is what one reconciliation query saw of the server and of the xid.
type serverView struct {
	status   *string // pg_xact_status; nil when the commit log no longer covers the xid
	inFuture bool    // pg_xact_status refused: the server has not assigned the xid yet
	sys      uint64
	// incarnation: the timeline the server writes WAL on (on a standby, inRecovery, its
	// last restartpoint's), its start and its statistics' reset time.
	incarnation
	inRecovery bool
	// The latest checkpoint's timeline and next full xid (pg_control_checkpoint()), its
	// position, and whether it is shutdown-type (pg.ShutdownCheckpointSQL).
	checkpointTimeline uint32
	checkpointNextXID  uint64
	checkpointLSN      uint64
	checkpointShutdown bool
	// recoveries are the ends of crash recoveries of the reference's postmaster that the
	// reconciler was told of (Reconciler.Remember): a later checkpoint overwrites them in
	// pg_control.
	recoveries []Recovery
	// syncStandbys: synchronous replication is configured (synchronous_standby_names).
	syncStandbys bool
	// prepared: a prepared transaction (pg_prepared_xacts) holds the xid's low 32 bits.
	prepared bool
}

// running reports whether the server's postmaster is the one that assigned ref's xid
// (same timeline, same start), whether or not it went through crash recovery since.
func (v serverView) running(ref outcome.ReconciliationRef) bool {
	return v.timeline == ref.Timeline && ref.ServerStart != 0 && v.start == ref.ServerStart
}

// assigned reports whether the server is the incarnation that assigned ref's xid: the
// same postmaster, and no crash recovery since the reference's connection was checked
// (the same statistics reset time, see pg.StatsResetSQL). Only there does pg_xact_status
// describe the reference's transaction whatever it says.
func (v serverView) assigned(ref outcome.ReconciliationRef) bool {
	return v.running(ref) && ref.StatsReset != 0 && v.statsReset == ref.StatsReset
}

// decide resolves ref from v, or asks to look again (the xid is in progress).
//
// An xid names the reference's transaction only in the server incarnation that assigned
// it: PostgreSQL does not WAL-log xid assignment, so after a crash restart or a failover
// an xid whose records never reached the surviving WAL is handed out again. What the
// server proves about a later incarnation is a boundary, the next xid of a checkpoint
// made after the reference's incarnation ended:
//
//   - crash recovery replays every WAL record and advances the next xid past each
//     record's xid (xlogrecovery.c, ApplyWalRecord: AdvanceNextFullTransactionIdPastXid),
//     then writes the end-of-recovery checkpoint and waits for it before it accepts
//     connections (xlog.c, PerformRecoveryXLogAction: CHECKPOINT_END_OF_RECOVERY |
//     CHECKPOINT_WAIT); after a clean restart the latest checkpoint is the shutdown one.
//     So, in a later incarnation on the same timeline, the latest checkpoint was made
//     after the reference's incarnation ended;
//   - a promoted standby replays the same way, and a checkpoint on the new timeline was
//     made after the switch.
//
// Such a checkpoint's next xid is above every xid with a WAL record in the history before
// it, so an xid at or above it never wrote its commit record there: the transaction did
// not commit in this server's history, whatever pg_xact_status says now (it may describe
// a reuser). TestReconcileXIDReusedAfterCrash and TestReconcileAfterFailover show both.
// Below the boundary a "committed" status stays unknown: an intermediate incarnation the
// server keeps no record of may have reused the xid and committed it.
//
// A backend that dies hard (SIGKILL, the OOM killer) makes the postmaster replay WAL in
// place: the start time and the timeline stay, and the xids whose records were lost are
// handed out again, as after a crash restart. Only the statistics' reset time tells that
// incarnation from the last (pg.StatsResetSQL), and it also moves without a crash, so it
// proves no boundary: the same postmaster with another reset time answers "committed" as
// unknown, ReasonCrashRecovered, and never "aborted" by the checkpoint. Two answers stay
// sound there: "aborted" (above), and an xid not assigned yet, since within one
// postmaster the next xid only falls below an xid it handed out when crash recovery lost
// that xid's records, commit record included (TestReconcileBackendKilled).
//
// A pooled reference (PgBouncer) read its identity on a server connection other than the
// transaction's, perhaps of an earlier incarnation than the one that assigned the xid:
// the checkpoint after the identity's incarnation may precede the xid's, so it is no
// boundary there. The rest holds: an identity the server still shows was the one the
// transaction ran in, and "not assigned yet" and "aborted" say what they say of any xid.
func decide(ref outcome.ReconciliationRef, v serverView) (res Status, reason string, again bool) {
	if v.sys != ref.SystemIdentifier {
		return Unknown, ReasonOtherSystem, false
	}
	sameTimeline := v.timeline == ref.Timeline
	running, assigned := v.running(ref), v.assigned(ref)
	// later: the server is a later incarnation of the reference's history (a primary on a
	// higher timeline, or restarted since on the same one), so the rules above apply.
	later := !v.inRecovery && (v.timeline > ref.Timeline ||
		sameTimeline && ref.ServerStart != 0 && v.start > ref.ServerStart)
	// A pooled reference's identity may predate the incarnation that assigned the xid,
	// whose end the boundary would then not follow.
	boundary := !ref.Pooled && v.checkpointTimeline == v.timeline && ref.XID >= v.checkpointNextXID
	if later && (v.inFuture || boundary) {
		// Not yet assigned now means not assigned before the restart or fork either: the
		// next xid only grows from the boundary.
		return Aborted, "", false
	}
	if running && v.lostInRecovery(ref) {
		return Aborted, "", false
	}
	switch {
	case v.inFuture && running && !assigned:
		// The same postmaster's next xid is below the reference's: crash recovery lost it.
		return Aborted, "", false
	case v.inFuture:
		return Unknown, ReasonInTheFuture, false
	case !sameTimeline && !later:
		return Unknown, ReasonOtherTimeline, false
	case v.status == nil:
		return Unknown, ReasonTooOld, false
	case *v.status == "aborted":
		// A reuser's status means the original's records were lost: it never committed.
		return Aborted, "", false
	case *v.status == "committed" && assigned:
		return Committed, "", false
	case *v.status == "committed" && running:
		return Unknown, ReasonCrashRecovered, false
	case *v.status == "committed" && !sameTimeline:
		return Unknown, ReasonOtherTimeline, false
	case *v.status == "committed":
		return Unknown, ReasonServerRestarted, false
	case v.prepared:
		// In progress, and prepared: no backend holds it, and only its coordinator's
		// COMMIT PREPARED or ROLLBACK PREPARED ends it; waiting or ending a backend
		// changes nothing. In progress, the full xid is a live one, so the prepared
		// transaction with its low 32 bits is the reference's.
		return Unknown, ReasonPrepared, false
	}
	return Unknown, "", true
}

// lostInRecovery reports whether a crash recovery of the reference's postmaster (the
// caller checked it is running), made after the reference's connection was checked, ended
// below its xid: every record of the xid was lost there, its commit record included, so
// the transaction did not commit, whatever pg_xact_status says now (a reuser's status).
//
// An end-of-recovery checkpoint is found by its position: crash recovery replays all the
// WAL that was flushed and writes its checkpoint after it, so one made after the
// reference's check is at or beyond the reference's FlushLSN; the reference's own
// incarnation began with one before it, and an online checkpoint is not shutdown-type (see
// pg.ShutdownCheckpointSQL). Its next xid is above every xid with a surviving record
// (xlogrecovery.c, ApplyWalRecord: AdvanceNextFullTransactionIdPastXid), and flushed WAL
// is never lost by a recovery in place, so this holds after any number of crashes
// (TestReconcileBackendKilled, TestReconcileTwoCrashes). A pooled reference's check ran on another server
// connection, perhaps of an earlier incarnation, and proves nothing here. Below the
// boundary nothing new is proven: after two crashes an xid the first lost may be reused,
// committed, and kept by the second.
func (v serverView) lostInRecovery(ref outcome.ReconciliationRef) bool {
	if ref.Pooled || ref.FlushLSN == 0 {
		return false
	}
	if v.checkpointShutdown && v.checkpointTimeline == v.timeline && v.checkpointLSN >= ref.FlushLSN && ref.XID >= v.checkpointNextXID {
		return true
	}
	for _, rec := range v.recoveries {
		if rec.proves(ref) {
			return true
		}
	}
	return false
}

// preparedSQL reads whether a prepared transaction holds the xid $1 (its low 32 bits, as
// pg_prepared_xacts shows it).
const preparedSQL = "exists(select from pg_catalog.pg_prepared_xacts p where p.transaction = pg_catalog.xid($1::text::pg_catalog.xid8))"

// reconcileIdentitySQL reads the server's identity and its latest checkpoint.
const reconcileIdentitySQL = "s.system_identifier::text, coalesce(" + pg.TimelineSQL + ", k.timeline_id::text), pg_is_in_recovery(), " +
	pg.ServerStartSQL + ", " + pg.StatsResetSQL + ", k.timeline_id::text, k.next_xid::text, k.checkpoint_lsn::text, " +
	pg.ShutdownCheckpointSQL + ", " + syncStandbysSQL + " " +
	"from pg_control_system() s, pg_control_checkpoint() k"

// query reads the xid's status together with the server's identity, in one round trip,
// so that both describe the same server; when the server refuses the xid as not yet
// assigned, a second query reads the identity alone.
func (r *Reconciler) query(ctx context.Context, xid uint64) (serverView, error) {
	var v serverView
	var sysText, tliText, startText, resetText, ckptTLIText, nextText, lsnText, shutdownText string
	dest := []any{&sysText, &tliText, &v.inRecovery, &startText, &resetText, &ckptTLIText, &nextText, &lsnText, &shutdownText, &v.syncStandbys}
	err := r.db.QueryRow(ctx, "select pg_xact_status($1::text::xid8), "+preparedSQL+", "+reconcileIdentitySQL,
		strconv.FormatUint(xid, 10)).Scan(append([]any{&v.status, &v.prepared}, dest...)...)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "22023" {
		v.inFuture = true
		err = r.db.QueryRow(ctx, "select "+reconcileIdentitySQL).Scan(dest...)
	}
	if err != nil {
		return v, err
	}
	var errs [6]error
	v.sys, errs[0] = strconv.ParseUint(sysText, 10, 64)
	v.incarnation, errs[1] = parseIncarnation(tliText, startText, resetText)
	ctli, e := strconv.ParseUint(ckptTLIText, 10, 32)
	v.checkpointNextXID, errs[3] = pg.ParseFullXID(nextText)
	v.checkpointLSN, errs[4] = outcome.ParseLSN(lsnText)
	v.checkpointShutdown, errs[5] = strconv.ParseBool(shutdownText)
	errs[2] = e
	if err := errors.Join(errs[:]...); err != nil {
		return v, err
	}
	v.checkpointTimeline = uint32(ctli)
	return v, nil
}
