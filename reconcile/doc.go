// Package reconcile settles commits whose outcome is indeterminate from PostgreSQL's own
// records, so that "we don't know" becomes committed, aborted or no_writes when the
// database can prove it, and stays unknown, with the reason, when it cannot. It needs a
// reference and a database, not the instrumentation: the otelpgxtx tracer and executor
// take references ([outcome.ReconciliationRef]) before COMMIT, and
// otelpgxtx.WithAutoReconcile hands every indeterminate frame to a [Reconciler] in the
// background; the operator's command (cmd/otelpgxtx) asks one from the command line.
//
// # What proves what
//
// A reference names a transaction by its xid8, read before COMMIT was sent, and the
// incarnation that assigned it: the cluster's system identifier, the timeline the server
// wrote WAL on, the server's start time, and the time its cumulative statistics were last
// reset (pg_stat_archiver.stats_reset), which crash recovery moves. pg_xact_status
// decides, and never guesses:
//
//   - committed, in the same server incarnation that assigned the xid (same timeline,
//     start and statistics reset time): [Committed];
//     aborted: [Aborted]; no xid when COMMIT was sent: [NoWrites];
//   - in progress (a backend can sit in a synchronous-replication wait): polled within
//     the wait ([WithWait]), then [ReasonInProgress];
//   - another cluster: [ReasonOtherSystem]; the commit log no longer covers the xid:
//     [ReasonTooOld];
//   - after a crash restart or a failover, PostgreSQL hands out again the xids whose
//     records never reached the surviving WAL. What the server proves, to an ordinary
//     role, is a boundary: the next xid of its latest checkpoint, made after the
//     reference's incarnation ended. An xid at or above it never wrote its commit record
//     in this history: [Aborted]. Below it, a status of aborted is [Aborted] (a reuser's
//     status means the original's records were lost); committed stays unknown,
//     [ReasonServerRestarted] or [ReasonOtherTimeline], since an intermediate incarnation
//     may have reused the xid. A pooled reference (outcome.ReconciliationRef.Pooled: its
//     identity was read through PgBouncer, perhaps before the incarnation that assigned
//     the xid) gets no answer from the boundary.
//   - after a backend died hard (SIGKILL, the OOM killer, a segfault), the postmaster
//     ends every backend and replays WAL in place, keeping its start time and timeline,
//     and hands out again the xids whose records were lost, as after a crash restart.
//     Only the statistics' reset time tells that incarnation from the last, and since
//     pg_stat_reset_shared moves it too, it proves no boundary: committed stays unknown,
//     [ReasonCrashRecovered]; aborted, and an xid the server has not assigned yet (its
//     next xid fell below it: the records were lost), are [Aborted].
//
// Ask the surviving primary: the answer is about the history of the server asked.
//
// # Durable answers: the replication barrier
//
// Where synchronous replication is configured, a committed answer waits for a barrier:
// a tiny transaction of the reconciler's own that writes WAL (a transactional logical
// decoding message, prefix "otelpgxtx.barrier") and commits at the synchronous_commit of
// the reconciler's connection, so that the synchronous standbys have confirmed the
// commit before it is answered; otherwise the answer is [ReasonNotReplicated].
//
// # The commit marker
//
// With a commit marker (otelpgxtx.Policy.CommitMarker, otelpgxtx.WithCommitMarker), the
// transaction called the marker function of a table of yours ([MarkerTableDDL]) in the
// write that carried COMMIT, which inserted its operation id unless the transaction could
// leave nothing durable (no xid, or read-only): the row exists in the surviving history
// exactly when the transaction committed there with writes, across crash restarts,
// failovers and xid wraparound. A row not yet committed is invisible, so the reconciler
// fences: it inserts the same id itself, under a lock_timeout; an original still in
// progress makes it wait ([ReasonInProgress]), a committed original's key answers
// [Committed], and a fence that commits makes the original fail for good: [Aborted]. It
// fences nothing, and answers unknown, where the table cannot be the evidence: another
// cluster ([ReasonOtherSystem]) or database ([ReasonOtherDatabase]), a row
// [PruneMarkers] may have removed ([ReasonMarkerPruned]), a reference whose conclusive
// xid says otherwise ([ReasonEvidenceConflict]). Only a reference proves that a marker
// was written: an operation without one is never answered from the table (see
// [Reconciler.ResolveAssertedMarker], the assertion made in code).
//
// Every answer is a tx.reconcile span, linked to the frame that observed the
// indeterminate outcome and, when the context has no span, a child of that frame, so that
// it is in the frame's trace.
package reconcile
