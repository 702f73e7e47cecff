package otelpgxtx

import (
	"testing"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestSeenRecoveries: a recovery is logged once; one made in the second the postmaster
// started only once a check before it showed a flush position at or below it; never an
// online checkpoint.
func TestSeenRecoveries(t *testing.T) {
	rec := func(lsn uint64, next uint64, ended bool) reference.Checkpoint {
		return reference.Checkpoint{Recovery: reconcile.Recovery{SystemIdentifier: 9, Timeline: 1, ServerStart: 5, CheckpointLSN: lsn, NextXID: next}, Ended: ended}
	}
	var s frame.SeenRecoveries
	for i, step := range []struct {
		ck      reference.Checkpoint
		flushed uint64
		logged  bool
	}{
		{rec(100, 700, false), 150, false}, // the shutdown before the start, in its second
		{rec(100, 700, false), 160, false}, // again: 100 is below the flush seen (150)
		{rec(100, 0, false), 170, false},   // an online checkpoint
		{rec(200, 750, false), 210, true},  // a recovery in the start's second, past 170
		{rec(200, 750, false), 220, false}, // logged already
		{rec(300, 800, true), 310, true},   // a recovery in a later second
		{rec(300, 800, true), 310, false},
	} {
		got, ok := s.Saw(step.ck, step.flushed)
		if ok != step.logged || ok && got != step.ck.Recovery {
			t.Errorf("step %d: %v %v, want logged %v", i, got, ok, step.logged)
		}
	}
	// A first check of another postmaster, within its start's second, proves nothing.
	other := rec(100, 700, false)
	other.ServerStart = 6
	if _, ok := s.Saw(other, 400); ok {
		t.Error("a first check's checkpoint in the start's second logged")
	}
}
