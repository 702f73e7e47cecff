package wire

import (
	"fmt"
	"slices"
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

// TestEndWatchClean: an implicit transaction's reply is clean when the last ReadyForQuery
// says idle with no ErrorResponse since the one before it — notices and rows aside; an
// implicit prepare's reply before it does not count —, the stream split at every byte.
func TestEndWatchClean(t *testing.T) {
	tag := &pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}
	row := &pgproto3.DataRow{Values: [][]byte{[]byte("1")}}
	idle := &pgproto3.ReadyForQuery{TxStatus: 'I'}
	failure := &pgproto3.ErrorResponse{Severity: "ERROR", Code: "23505"}
	warning := &pgproto3.NoticeResponse{Severity: "WARNING", Code: "01000", Message: "canceling wait for synchronous replication"}
	for _, tc := range []struct {
		name string
		msgs []pgproto3.BackendMessage
		want bool
	}{
		{"a write", []pgproto3.BackendMessage{&pgproto3.BindComplete{}, tag, idle}, true},
		{"rows, a warning", []pgproto3.BackendMessage{row, tag, warning, idle}, true},
		{"an error", []pgproto3.BackendMessage{failure, idle}, false},
		{"an error after the tag (the commit failed)", []pgproto3.BackendMessage{tag, failure, idle}, false},
		{"no ReadyForQuery yet", []pgproto3.BackendMessage{tag}, false},
		{"a prepare's clean reply, then the execution's error", []pgproto3.BackendMessage{&pgproto3.ParseComplete{}, idle, failure, idle}, false},
		{"a prepare's clean reply, then the execution's", []pgproto3.BackendMessage{&pgproto3.ParseComplete{}, idle, tag, idle}, true},
		{"an error, then a clean reply", []pgproto3.BackendMessage{failure, idle, tag, idle}, true},
		{"in a transaction block", []pgproto3.BackendMessage{tag, &pgproto3.ReadyForQuery{TxStatus: 'T'}}, false},
	} {
		stream := encode(tc.msgs...)
		for cut := 0; cut <= len(stream); cut++ {
			var p streamPos
			var w endWatch
			p.advanceWatching(stream[:cut], &w)
			p.advanceWatching(stream[cut:], &w)
			if got := w.clean(); got != tc.want {
				t.Fatalf("%s, split at %d: clean %v, want %v", tc.name, cut, got, tc.want)
			}
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

// TestEndWatchSplits: the ending tags inside one reply that more of it followed, in order,
// the stream split at every byte; a tag right before the ReadyForQuery is the reply's own
// end; a notice or notification follows nothing; a reply cut off keeps its last tag.
func TestEndWatchSplits(t *testing.T) {
	tag := func(s string) pgproto3.BackendMessage { return &pgproto3.CommandComplete{CommandTag: []byte(s)} }
	ready := func(s byte) pgproto3.BackendMessage { return &pgproto3.ReadyForQuery{TxStatus: s} }
	failure := &pgproto3.ErrorResponse{Severity: "ERROR", Code: "22012"}
	notice := &pgproto3.NoticeResponse{Severity: "NOTICE", Message: "flushed"}
	note := &pgproto3.NotificationResponse{Channel: "c"}
	for _, tc := range []struct {
		name string
		msgs []pgproto3.BackendMessage
		want []EndSeen
		cut  bool
	}{
		{"one commit, nothing after", []pgproto3.BackendMessage{tag("COMMIT"), ready('I')}, nil, false},
		{"insert; commit; insert; 1/0", []pgproto3.BackendMessage{tag("INSERT 0 1"), tag("COMMIT"), tag("INSERT 0 1"), failure, ready('I')}, []EndSeen{EndCommit}, false},
		{"commit; error", []pgproto3.BackendMessage{tag("COMMIT"), failure, ready('I')}, []EndSeen{EndCommit}, false},
		{"commit, rollback, prepare, each followed",
			[]pgproto3.BackendMessage{tag("BEGIN"), tag("COMMIT"), tag("BEGIN"), tag("ROLLBACK"), tag("BEGIN"), tag("PREPARE TRANSACTION"), &pgproto3.DataRow{}, tag("SELECT 1"), ready('I')},
			[]EndSeen{EndCommit, EndRollback, EndPrepare}, false},
		{"commit; commit", []pgproto3.BackendMessage{tag("COMMIT"), tag("COMMIT"), ready('I')}, []EndSeen{EndCommit}, false},
		{"a notice after the commit is no statement", []pgproto3.BackendMessage{tag("INSERT 0 1"), tag("COMMIT"), notice, note, ready('I')}, nil, false},
		{"the prepare's reply, then the execution's", []pgproto3.BackendMessage{&pgproto3.ParseComplete{}, ready('I'), tag("COMMIT"), tag("INSERT 0 1"), ready('I')}, []EndSeen{EndCommit}, false},
		{"a reply cut off after a commit", []pgproto3.BackendMessage{tag("INSERT 0 1"), tag("COMMIT"), notice}, []EndSeen{EndCommit}, true},
		{"a reply cut off after a commit and more", []pgproto3.BackendMessage{tag("COMMIT"), tag("INSERT 0 1")}, []EndSeen{EndCommit}, true},
		{"a whole reply, then a notification", []pgproto3.BackendMessage{tag("COMMIT"), failure, ready('I'), note}, []EndSeen{EndCommit}, false},
		{"commit prepared is no end of the session's transaction", []pgproto3.BackendMessage{tag("COMMIT PREPARED"), failure, ready('I')}, nil, false},
		{"more than fit", append(slices.Repeat([]pgproto3.BackendMessage{tag("COMMIT")}, maxSplits+3), ready('I')), slices.Repeat([]EndSeen{EndCommit}, maxSplits), false},
	} {
		stream := encode(tc.msgs...)
		check := func(how string, w *endWatch) {
			t.Helper()
			s := w.splits()
			var got []EndSeen
			for i := range s.Len() {
				got = append(got, s.At(i))
			}
			if !slices.Equal(got, tc.want) || s.Cut != tc.cut || s.Over != (tc.name == "more than fit") {
				t.Fatalf("%s, %s: %v cut %v over %v, want %v cut %v", tc.name, how, got, s.Cut, s.Over, tc.want, tc.cut)
			}
		}
		for cut := 0; cut <= len(stream); cut++ {
			var p streamPos
			var w endWatch
			p.advanceWatching(stream[:cut], &w)
			p.advanceWatching(stream[cut:], &w)
			check(fmt.Sprintf("split at %d", cut), &w)
		}
		var p streamPos
		var w endWatch
		for i := range stream {
			p.advanceWatching(stream[i:i+1], &w)
		}
		check("byte by byte", &w)
	}
}

// TestWroteStatement: a write that runs a statement — a Query, an Execute, a
// FunctionCall, or bytes not read as whole messages — is noted until WatchEnds; one that
// runs nothing (Terminate, a prepared statement's Close and Sync, Parse and Describe) is
// not.
func TestWroteStatement(t *testing.T) {
	fe := func(ms ...pgproto3.FrontendMessage) []byte {
		var b []byte
		for _, m := range ms {
			b = append(b, frontendMsg(t, m)...)
		}
		return b
	}
	query := fe(&pgproto3.Query{String: "commit"})
	for _, tc := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"query", query, true},
		{"parse, bind, describe, execute, sync", fe(&pgproto3.Parse{Query: "commit"}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{}), true},
		{"function call", fe(&pgproto3.FunctionCall{Function: 1}), true},
		{"a message cut short", query[:len(query)-1], true},
		{"a header cut short", query[:3], true},
		{"terminate", fe(&pgproto3.Terminate{}), false},
		{"close, sync (Deallocate)", fe(&pgproto3.Close{ObjectType: 'S', Name: "s"}, &pgproto3.Sync{}), false},
		{"parse, describe, sync (Prepare)", fe(&pgproto3.Parse{Name: "s", Query: "commit"}, &pgproto3.Describe{ObjectType: 'S', Name: "s"}, &pgproto3.Sync{}), false},
		{"nothing", nil, false},
	} {
		c := NewConn(nopConn{}, nil, true)
		c.WatchEnds()
		if _, err := c.Write(tc.b); err != nil {
			t.Fatal(err)
		}
		if got := c.WroteStatement(); got != tc.want {
			t.Fatalf("%s: WroteStatement %v, want %v", tc.name, got, tc.want)
		}
		if _, err := c.Write(fe(&pgproto3.Terminate{})); err != nil || c.WroteStatement() != tc.want {
			t.Fatalf("%s: a Terminate after changed it", tc.name)
		}
		c.WatchEnds()
		if c.WroteStatement() {
			t.Fatalf("%s: WatchEnds left it noted", tc.name)
		}
	}
}
