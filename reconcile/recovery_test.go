package reconcile

import (
	"errors"
	"testing"

	"github.com/txevidence/otelpgxtx/outcome"
)

// TestRecoveryText: a Recovery reads back what it writes; malformed text is refused as bad
// input, and names what is wrong.
func TestRecoveryText(t *testing.T) {
	rec := Recovery{SystemIdentifier: 7715069699929698889, Timeline: 1, ServerStart: 1796304657764276, CheckpointLSN: 0x1516598, NextXID: 4294967296 + 751}
	s := rec.String()
	if s != "pgrecovery:7715069699929698889/1/1796304657764276/0/1516598/4294968047" {
		t.Errorf("String() = %q", s)
	}
	if got, err := ParseRecovery(s); err != nil || got != rec {
		t.Errorf("ParseRecovery(%q) = %+v, %v", s, got, err)
	}
	for _, bad := range []string{"", "pgrecovery:", "pg:1/1/1", "pgrecovery:1/1/1/0/1", "pgrecovery:1/1/1/0/1/2/3",
		"pgrecovery:0/1/1/0/1/2", "pgrecovery:1/0/1/0/1/2", "pgrecovery:1/1/0/0/1/2", "pgrecovery:1/1/1/0/0/2", "pgrecovery:1/1/1/0/1/0",
		"pgrecovery:1/1/1/x/1/2", "pgrecovery:a/1/1/0/1/2"} {
		if _, err := ParseRecovery(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseRecovery(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}

// TestRememberKeepsEachOnce: a recovery told twice is kept once, the oldest go first past
// the bound, and only a postmaster's own are given for its references.
func TestRememberKeepsEachOnce(t *testing.T) {
	var r Reconciler
	rec := Recovery{SystemIdentifier: 7, Timeline: 1, ServerStart: 500, CheckpointLSN: 100, NextXID: 10}
	r.Remember(rec)
	r.Remember(rec)
	r.Remember(Recovery{}) // nothing to keep
	other := rec
	other.ServerStart = 600
	r.Remember(other)
	ref := outcome.ReconciliationRef{SystemIdentifier: 7, Timeline: 1, ServerStart: 500}
	if got := r.recoveries.of(ref); len(got) != 1 || got[0] != rec {
		t.Fatalf("of = %+v, want the one recovery of start 500", got)
	}
	for i := range maxRecoveries {
		r.Remember(Recovery{SystemIdentifier: 7, Timeline: 1, ServerStart: 500, CheckpointLSN: uint64(200 + i), NextXID: 10})
	}
	if n := len(r.recoveries.list); n != maxRecoveries {
		t.Fatalf("%d kept, want %d", n, maxRecoveries)
	}
	for _, have := range r.recoveries.of(ref) {
		if have == rec {
			t.Fatal("the oldest recovery was kept past the bound")
		}
	}
	var nilRec *Reconciler
	nilRec.Remember(rec) // a nil Reconciler keeps nothing, and does not panic
}
