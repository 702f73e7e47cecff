package wire

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestEndWatch: what the replies pgconn reads show of a transaction's end, the stream
// split at every byte, twice: the server's tag before its first idle ReadyForQuery when
// there is exactly one, unknown when there are none or several, nothing before idle.
func TestEndWatch(t *testing.T) {
	tag := func(s string) pgproto3.BackendMessage { return &pgproto3.CommandComplete{CommandTag: []byte(s)} }
	ready := func(s byte) pgproto3.BackendMessage { return &pgproto3.ReadyForQuery{TxStatus: s} }
	notice := &pgproto3.NoticeResponse{Severity: "WARNING", Message: "there is no transaction in progress"}
	for _, tc := range []struct {
		name string
		msgs []pgproto3.BackendMessage
		want EndSeen
	}{
		{"commit", []pgproto3.BackendMessage{tag("COMMIT"), ready('I')}, EndCommit},
		{"rollback", []pgproto3.BackendMessage{tag("ROLLBACK"), ready('I')}, EndRollback},
		{"prepare", []pgproto3.BackendMessage{tag("PREPARE TRANSACTION"), ready('I')}, EndPrepare},
		{"a write, then commit", []pgproto3.BackendMessage{tag("INSERT 0 1"), ready('T'), tag("COMMIT"), ready('I')}, EndCommit},
		{"still in the transaction", []pgproto3.BackendMessage{tag("INSERT 0 1"), ready('T')}, EndNotSeen},
		{"rollback to savepoint, then commit", []pgproto3.BackendMessage{tag("ROLLBACK"), ready('T'), tag("COMMIT"), ready('I')}, EndUnknown},
		{"a failed COMMIT", []pgproto3.BackendMessage{&pgproto3.ErrorResponse{Severity: "ERROR", Code: "40001"}, ready('I')}, EndUnknown},
		{"commit and chain", []pgproto3.BackendMessage{tag("COMMIT"), ready('T')}, EndNotSeen},
		{"what follows the first idle is not the frame's", []pgproto3.BackendMessage{tag("COMMIT"), ready('I'), tag("BEGIN"), ready('T'), tag("ROLLBACK"), ready('I')}, EndCommit},
		{"commit prepared is no end of the open transaction", []pgproto3.BackendMessage{tag("COMMIT PREPARED"), ready('I')}, EndUnknown},
		{"a notice between", []pgproto3.BackendMessage{tag("COMMIT"), notice, ready('I')}, EndCommit},
	} {
		stream := encode(tc.msgs...)
		for cut := 0; cut <= len(stream); cut++ {
			var p streamPos
			var w endWatch
			p.advanceWatching(stream[:cut], &w)
			p.advanceWatching(stream[cut:], &w)
			if got := w.seen(); got != tc.want || !p.atBoundary() {
				t.Fatalf("%s, split at %d: %d (at a boundary: %v), want %d", tc.name, cut, got, p.atBoundary(), tc.want)
			}
		}
		var p streamPos
		var w endWatch
		for i := range stream {
			p.advanceWatching(stream[i:i+1], &w)
		}
		if got := w.seen(); got != tc.want {
			t.Fatalf("%s, byte by byte: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestEndWatchAllocs: watching allocates nothing.
func TestEndWatchAllocs(t *testing.T) {
	stream := encode(&pgproto3.CommandComplete{CommandTag: []byte("COMMIT")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	var p streamPos
	var w endWatch
	if n := testing.AllocsPerRun(100, func() { w = endWatch{}; p.advanceWatching(stream, &w) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
