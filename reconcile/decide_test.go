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
	} {
		res, reason, again := decide(tc.ref, tc.v)
		if res != tc.want || reason != tc.reason || again != tc.again {
			t.Errorf("%s: decide = %s %q %v, want %s %q %v", tc.name, res, reason, again, tc.want, tc.reason, tc.again)
		}
	}
}

func TestParseFullXID(t *testing.T) {
	for in, want := range map[string]uint64{"0:724": 724, "2:5": 2<<32 | 5} {
		if got, err := parseFullXID(in); err != nil || got != want {
			t.Errorf("parseFullXID(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "724", "a:1", "1:", "0:4294967296"} {
		if _, err := parseFullXID(in); err == nil {
			t.Errorf("parseFullXID(%q) succeeded", in)
		}
	}
}
