package reference

import (
	"testing"
)

// TestParseCheckpoint: which latest checkpoints the check takes for the end of a crash
// recovery of the running postmaster (started at 100.5 s, timeline 2).
func TestParseCheckpoint(t *testing.T) {
	const start = 100_500_000
	for _, tc := range []struct {
		name         string
		shutdown     string
		at, timeline string
		next         uint64 // want; 0: not a recovery
		ended        bool
	}{
		{"online", "false", "200", "2", 0, false},
		{"shutdown before the start", "true", "99", "2", 0, false},
		{"shutdown, the start's second", "true", "100", "2", 7<<32 | 900, false},
		{"shutdown, a later second", "true", "101", "2", 7<<32 | 900, true},
		{"shutdown, a timeline left", "true", "101", "1", 0, false},
	} {
		row := make([][]byte, ColMarker)
		row[ColCheckpointLSN], row[ColCheckpointNextXID] = []byte("0/3000028"), []byte("7:900")
		row[ColCheckpointTimeline], row[ColCheckpointShutdown], row[ColCheckpointTime] = []byte(tc.timeline), []byte(tc.shutdown), []byte(tc.at)
		ck, err := parseCheckpoint(row, 9, 2, start)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if ck.NextXID != tc.next || ck.Ended != tc.ended || ck.CheckpointLSN != 0x3000028 || ck.ServerStart != start || ck.Timeline != 2 {
			t.Errorf("%s: %+v, want next xid %d, ended %v", tc.name, ck, tc.next, tc.ended)
		}
	}
	row := make([][]byte, ColMarker)
	for i := range row {
		row[i] = []byte("x")
	}
	if _, err := parseCheckpoint(row, 9, 2, start); err == nil {
		t.Error("garbage parsed")
	}
}

// TestPreparedXID: a prepared transaction's 32-bit xid is placed in the epoch of the
// snapshot's xmax it was read with, whether it lies below xmax or above it (older
// transactions still running), across an epoch boundary both ways.
func TestPreparedXID(t *testing.T) {
	for _, tc := range []struct {
		xid32, xmax string
		want        uint64
	}{
		{"727", "727", 727},
		{"700", "727", 700},
		{"730", "727", 730},
		{"4294967290", "4294967300", 4294967290}, // below xmax, in the epoch before
		{"5", "4294967290", 4294967301},          // above xmax, in the next epoch
		{"4294967295", "8589934600", 8589934591}, // epoch 2's xmax, epoch 1's last xid
		{"0", "727", 0}, {"2", "727", 0}, {"x", "727", 0}, {"727", "", 0},
	} {
		if got := preparedXID([]byte(tc.xid32), []byte(tc.xmax)); got != tc.want {
			t.Errorf("preparedXID(%s, %s) = %d, want %d", tc.xid32, tc.xmax, got, tc.want)
		}
	}
}
