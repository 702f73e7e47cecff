package reconcile

import (
	"testing"

	"github.com/txevidence/otelpgxtx/outcome"
)

// TestDecide checks the reconciliation rules on fabricated server views, in addition to
// the real-server tests that produce them (TestReconcileAfterCrashRestart,
// TestReconcileXIDReusedAfterCrash, TestReconcileAfterFailover, TestAsyncCommitLostInFailover).
func TestDecide(t *testing.T) {
	ref := outcome.ReconciliationRef{XID: 1000, SystemIdentifier: 7, Timeline: 1, ServerStart: 500, StatsReset: 450}
	noReset := ref
	noReset.StatsReset = 0
	pooled := ref // its identity may predate the xid's incarnation
	pooled.Pooled = true
	noStart := ref
	noStart.ServerStart = 0
	newerTimeline := ref
	newerTimeline.Timeline = 3
	// flushed: the reference knows how far the server had flushed its WAL at its check.
	flushed := ref
	flushed.FlushLSN = 5000
	flushedPooled := flushed
	flushedPooled.Pooled = true
	committed, aborted, inProgress := "committed", "aborted", "in progress"
	same := serverView{sys: 7, incarnation: incarnation{timeline: 1, start: 500, statsReset: 450}, checkpointTimeline: 1, checkpointNextXID: 900}
	// recovered: a backend died hard and the postmaster replayed WAL in place.
	recovered := same
	recovered.statsReset = 700
	restarted := same
	restarted.start = 600
	promoted := restarted
	promoted.timeline, promoted.checkpointTimeline = 2, 2
	view := func(v serverView, status *string, next uint64, change func(*serverView)) serverView {
		v.status, v.checkpointNextXID = status, next
		if change != nil {
			change(&v)
		}
		return v
	}
	future := func(v *serverView) { v.inFuture = true }
	// endOfRecovery: the latest checkpoint is shutdown-type at lsn.
	endOfRecovery := func(lsn uint64) func(*serverView) {
		return func(v *serverView) { v.checkpointShutdown, v.checkpointLSN = true, lsn }
	}
	told := func(lsn, next uint64) func(*serverView) {
		return func(v *serverView) {
			v.recoveries = []Recovery{{SystemIdentifier: 7, Timeline: 1, ServerStart: 500, CheckpointLSN: lsn, NextXID: next}}
		}
	}
	for _, tc := range []struct {
		name   string
		ref    outcome.ReconciliationRef
		v      serverView
		want   Status
		reason string
		again  bool
	}{
		{"same incarnation, committed", ref, view(same, &committed, 900, nil), Committed, "", false},
		{"same incarnation, aborted", ref, view(same, &aborted, 900, nil), Aborted, "", false},
		{"same incarnation, in progress", ref, view(same, &inProgress, 900, nil), Unknown, "", true},
		{"same incarnation, too old", ref, view(same, nil, 900, nil), Unknown, ReasonTooOld, false},
		{"same incarnation, in the future", ref, view(same, nil, 900, future), Unknown, ReasonInTheFuture, false},
		{"crash recovered, committed", ref, view(recovered, &committed, 1001, nil), Unknown, ReasonCrashRecovered, false},
		{"crash recovered, committed at the boundary", ref, view(recovered, &committed, 1000, nil), Unknown, ReasonCrashRecovered, false},
		{"crash recovered, aborted", ref, view(recovered, &aborted, 1000, nil), Aborted, "", false},
		{"crash recovered, in progress", ref, view(recovered, &inProgress, 1000, nil), Unknown, "", true},
		{"crash recovered, in the future", ref, view(recovered, nil, 990, future), Aborted, "", false},
		{"crash recovered, too old", ref, view(recovered, nil, 1001, nil), Unknown, ReasonTooOld, false},
		{"no reset time, committed", noReset, view(same, &committed, 900, nil), Unknown, ReasonCrashRecovered, false},
		{"no reset time, aborted", noReset, view(same, &aborted, 900, nil), Aborted, "", false},
		{"pooled, same incarnation, committed", pooled, view(same, &committed, 900, nil), Committed, "", false},
		{"pooled, restarted, committed at the boundary", pooled, view(restarted, &committed, 1000, nil), Unknown, ReasonServerRestarted, false},
		{"pooled, restarted, in progress above the boundary", pooled, view(restarted, &inProgress, 990, nil), Unknown, "", true},
		{"pooled, restarted, in the future", pooled, view(restarted, nil, 990, future), Aborted, "", false},
		{"pooled, promoted, committed at the boundary", pooled, view(promoted, &committed, 1000, nil), Unknown, ReasonOtherTimeline, false},
		{"pooled, promoted, aborted", pooled, view(promoted, &aborted, 1000, nil), Aborted, "", false},
		{"other system", ref, view(same, &committed, 900, func(v *serverView) { v.sys = 8 }), Unknown, ReasonOtherSystem, false},
		{"restarted, committed below the boundary", ref, view(restarted, &committed, 1001, nil), Unknown, ReasonServerRestarted, false},
		{"restarted, committed at the boundary", ref, view(restarted, &committed, 1000, nil), Aborted, "", false},
		{"restarted, in progress above the boundary", ref, view(restarted, &inProgress, 990, nil), Aborted, "", false},
		{"restarted, in the future", ref, view(restarted, nil, 990, future), Aborted, "", false},
		{"restarted, asked on a standby", ref, view(restarted, &committed, 990, func(v *serverView) { v.inRecovery = true }), Unknown, ReasonServerRestarted, false},
		{"start unknown, committed at the boundary", noStart, view(restarted, &committed, 1000, nil), Unknown, ReasonServerRestarted, false},
		{"earlier start: not a later incarnation", ref, view(restarted, &committed, 10, func(v *serverView) { v.start = 400 }), Unknown, ReasonServerRestarted, false},
		{"promoted, committed below the boundary", ref, view(promoted, &committed, 1001, nil), Unknown, ReasonOtherTimeline, false},
		{"promoted, committed at the boundary", ref, view(promoted, &committed, 1000, nil), Aborted, "", false},
		{"promoted, checkpoint still on the old timeline", ref, view(promoted, &committed, 10, func(v *serverView) { v.checkpointTimeline = 1 }), Unknown, ReasonOtherTimeline, false},
		{"promoted, aborted", ref, view(promoted, &aborted, 1001, nil), Aborted, "", false},
		{"asked a server on an older timeline", newerTimeline, view(promoted, &aborted, 10, nil), Unknown, ReasonOtherTimeline, false},
		// The end of a crash recovery after the reference: its checkpoint at or beyond the
		// reference's flush position (TestReconcileBackendKilled).
		{"recovery after the reference, reused at the boundary", flushed, view(recovered, &committed, 1000, endOfRecovery(5000)), Aborted, "", false},
		{"recovery after the reference, in progress above it", flushed, view(recovered, &inProgress, 990, endOfRecovery(6000)), Aborted, "", false},
		{"recovery after the reference, committed below it", flushed, view(recovered, &committed, 1001, endOfRecovery(6000)), Unknown, ReasonCrashRecovered, false},
		{"the reference's own incarnation's recovery", flushed, view(recovered, &committed, 1000, endOfRecovery(4999)), Unknown, ReasonCrashRecovered, false},
		{"an online checkpoint after the reference", flushed, view(recovered, &committed, 1000, func(v *serverView) { v.checkpointLSN = 6000 }), Unknown, ReasonCrashRecovered, false},
		{"a recovery on another timeline's checkpoint", flushed, view(recovered, &committed, 1000, func(v *serverView) {
			endOfRecovery(6000)(v)
			v.checkpointTimeline = 2
		}), Unknown, ReasonCrashRecovered, false},
		{"recovery after a pooled reference", flushedPooled, view(recovered, &committed, 1000, endOfRecovery(6000)), Unknown, ReasonCrashRecovered, false},
		{"recovery, a reference without a flush position", ref, view(recovered, &committed, 1000, endOfRecovery(6000)), Unknown, ReasonCrashRecovered, false},
		{"a recovery the reconciler was told of", flushed, view(recovered, &committed, 10, told(5000, 1000)), Aborted, "", false},
		{"a recovery it was told of, before the reference", flushed, view(recovered, &committed, 10, told(4000, 1000)), Unknown, ReasonCrashRecovered, false},
		{"a recovery it was told of, below the xid's", flushed, view(recovered, &committed, 10, told(6000, 1001)), Unknown, ReasonCrashRecovered, false},
		{"the end of a recovery after the reference, the statistics not moved: the checkpoint decides", flushed, view(same, &committed, 1000, endOfRecovery(6000)), Aborted, "", false},
	} {
		res, reason, again := decide(tc.ref, tc.v)
		if res != tc.want || reason != tc.reason || again != tc.again {
			t.Errorf("%s: decide = %s %q %v, want %s %q %v", tc.name, res, reason, again, tc.want, tc.reason, tc.again)
		}
	}
}
