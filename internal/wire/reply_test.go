package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// msg encodes one backend message.
func msg(t testing.TB, m pgproto3.BackendMessage) []byte {
	t.Helper()
	b, err := m.Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// replyCase is a server reply to a write the library added to: the library's part and the
// application's, as message lists, and what the library must read of its part.
type replyCase struct {
	name      string
	kind      LibraryMessage
	library   [][]byte // taken out
	passed    [][]byte // of the library's part, but pgconn's (an error that ends the Query)
	app       [][]byte // pgconn's
	wantValue string   // the xid read's value or the DataRow's first column; "" for none
	wantErr   string   // the SQLSTATE of an error to the library's message
	wantFatal bool
}

func replyCases(t testing.TB) []replyCase {
	rfq := func(s byte) []byte { return msg(t, &pgproto3.ReadyForQuery{TxStatus: s}) }
	cc := func(tag string) []byte { return msg(t, &pgproto3.CommandComplete{CommandTag: []byte(tag)}) }
	errMsg := func(sev, code string) []byte {
		return msg(t, &pgproto3.ErrorResponse{Severity: sev, SeverityUnlocalized: sev, Code: code, Message: "m"})
	}
	rowDesc := msg(t, &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("c"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}})
	row := func(v string) []byte { return msg(t, &pgproto3.DataRow{Values: [][]byte{[]byte(v)}}) }
	return []replyCase{
		{name: "xid", kind: LibraryCall, library: [][]byte{msg(t, &pgproto3.FunctionCallResponse{Result: []byte("725")}), rfq('T')},
			app: [][]byte{cc("COMMIT"), rfq('I')}, wantValue: "725"},
		{name: "xid NULL", kind: LibraryCall, library: [][]byte{msg(t, &pgproto3.FunctionCallResponse{}), rfq('T')},
			app: [][]byte{cc("COMMIT"), rfq('I')}},
		{name: "xid FATAL", kind: LibraryCall, passed: [][]byte{errMsg("FATAL", "57P01")}, wantErr: "57P01", wantFatal: true},
		{name: "COMMIT fails after xid", kind: LibraryCall, library: [][]byte{msg(t, &pgproto3.FunctionCallResponse{Result: []byte("9")}), rfq('T')},
			app: [][]byte{errMsg("ERROR", "23505"), rfq('I')}, wantValue: "9"},
		{name: "identity", kind: LibraryQuery, library: [][]byte{rowDesc, row("7713899101641277397"), cc("SELECT 1"), rfq('I')},
			app: [][]byte{cc("BEGIN"), rfq('T')}, wantValue: "7713899101641277397"},
		{name: "identity refused", kind: LibraryQuery, library: [][]byte{errMsg("ERROR", "42501"), rfq('I')},
			app: [][]byte{cc("BEGIN"), rfq('T')}, wantErr: "42501"},
		{name: "marker", kind: LibraryCall, library: [][]byte{msg(t, &pgproto3.FunctionCallResponse{Result: []byte("m731")}), rfq('T')},
			app: [][]byte{cc("COMMIT"), rfq('I')}, wantValue: "m731"},
	}
}

// asyncMessages are the messages a server may send at any time; pgconn's wherever they come.
func asyncMessages(t testing.TB) [][]byte {
	return [][]byte{
		msg(t, &pgproto3.NoticeResponse{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "01000", Message: "canceling wait for synchronous replication",
			Detail: "The transaction has already committed locally, but might not have been replicated to the standby."}),
		msg(t, &pgproto3.ParameterStatus{Name: "application_name", Value: "x"}),
		msg(t, &pgproto3.NotificationResponse{PID: 1, Channel: "ch", Payload: "p"}),
	}
}

// TestReplyFilter feeds every reply case, with each asynchronous message put in every
// gap between messages, split at every byte and one byte at a time: pgconn always gets
// the application's messages and the asynchronous ones, whole and in order, and the
// library reads its own part the same.
func TestReplyFilter(t *testing.T) {
	asyncs := asyncMessages(t)
	for _, rc := range replyCases(t) {
		var base []part
		for _, m := range rc.library {
			base = append(base, part{m, true})
		}
		for _, m := range append(append([][]byte{}, rc.passed...), rc.app...) {
			base = append(base, part{m, false})
		}
		for gap := 0; gap <= len(base); gap++ {
			for ai, async := range asyncs {
				stream := append(append(append([]part{}, base[:gap]...), part{async, false}), base[gap:]...)
				input, want := streamBytes(stream)
				for _, split := range splitsOf(len(input)) {
					name := fmt.Sprintf("%s/async %d at %d/split %v", rc.name, ai, gap, split)
					f := &replyFilter{kind: rc.kind, commit: rc.kind == LibraryCall}
					out := feedSplit(t, f, input, split)
					if f.err != nil {
						t.Fatalf("%s: %v", name, f.err)
					}
					if !bytes.Equal(out, want) {
						t.Fatalf("%s: pgconn got\n%q\nwant\n%q", name, out, want)
					}
					checkLibraryReply(t, name, rc, f.lib)
				}
			}
		}
	}
}

// feedSplit feeds input to f cut at split (see splitsOf), and returns what pgconn got.
// A twin of f is fed the same pieces in place, each read into a buffer of pgconn's, as
// Conn.Read feeds it (feedInPlace): what pgconn gets from it (the buffer's first n bytes,
// then what the filter kept), what the library reads and where the filter ends must be
// the same, or feedSplit fails t.
func feedSplit(t testing.TB, f *replyFilter, input []byte, split int) []byte {
	t.Helper()
	twin := *f
	var out, inPlace []byte
	for _, piece := range pieces(input, split) {
		f.feed(piece)
		out = append(out, f.out...)
		f.out = f.out[:0]
		buf := append([]byte(nil), piece...)
		n := twin.feedInPlace(buf)
		inPlace = append(append(inPlace, buf[:n]...), twin.out...)
		twin.out = twin.out[:0]
	}
	if !bytes.Equal(inPlace, out) || twin.state != f.state || (twin.err == nil) != (f.err == nil) ||
		!reflect.DeepEqual(twin.lib, f.lib) || !reflect.DeepEqual(twin.ahead, f.ahead) {
		t.Fatalf("split %d: in place, pgconn got\n%q\nlibrary %+v, state %d, err %v; copied, pgconn got\n%q\nlibrary %+v, state %d, err %v",
			split, inPlace, twin.lib, twin.state, twin.err, out, f.lib, f.state, f.err)
	}
	return out
}

// splitsOf returns the ways a stream of n bytes is cut: whole, at every byte once, and
// into single bytes (-1).
func splitsOf(n int) []int {
	s := []int{0, -1}
	for i := 1; i < n; i++ {
		s = append(s, i)
	}
	return s
}

// pieces cuts b at split (see splitsOf).
func pieces(b []byte, split int) [][]byte {
	switch {
	case split == 0:
		return [][]byte{b}
	case split < 0:
		out := make([][]byte, len(b))
		for i := range b {
			out[i] = b[i : i+1]
		}
		return out
	}
	return [][]byte{b[:split], b[split:]}
}

func checkLibraryReply(t *testing.T, name string, rc replyCase, r Reply) {
	t.Helper()
	got := ""
	switch {
	case rc.kind == LibraryCall:
		got = string(r.Value)
	case len(r.Row) > 0:
		got = string(r.Row[0])
	}
	if !r.Done || got != rc.wantValue || r.ErrCode != rc.wantErr || r.Fatal != rc.wantFatal {
		t.Fatalf("%s: library read %+v (value %q), want value %q, error %q, fatal %v", name, r, got, rc.wantValue, rc.wantErr, rc.wantFatal)
	}
	if rc.kind == LibraryCall && rc.wantErr == "" && !r.GotValue {
		t.Fatalf("%s: no FunctionCallResponse read", name)
	}
}

// TestReplyFilterCallFails: when the call ahead of COMMIT fails with an ERROR (the xid
// read or the marker function, cancelled, say), COMMIT answers ROLLBACK; pgconn gets the
// call's error in its place, and COMMIT's ReadyForQuery: the
// reply of a COMMIT that failed, with the session idle. Asynchronous messages anywhere
// still pass, in order, whatever the split.
func TestReplyFilterCallFails(t *testing.T) {
	e := msg(t, &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "40001", Message: "could not serialize access"})
	rollback := msg(t, &pgproto3.CommandComplete{CommandTag: []byte("ROLLBACK")})
	idle, failed := msg(t, &pgproto3.ReadyForQuery{TxStatus: 'I'}), msg(t, &pgproto3.ReadyForQuery{TxStatus: 'E'})
	async := asyncMessages(t)[0]
	reply := [][]byte{e, failed, rollback, idle}
	for gap := 0; gap <= len(reply); gap++ {
		stream := append(append(append([][]byte{}, reply[:gap]...), async), reply[gap:]...)
		input := bytes.Join(stream, nil)
		// pgconn gets the error and ReadyForQuery; the asynchronous message comes out where
		// it came, relative to them: before the error when it came before the ROLLBACK tag,
		// else after it.
		var want []byte
		switch {
		case gap <= 2:
			want = bytes.Join([][]byte{async, e, idle}, nil)
		case gap == 3:
			want = bytes.Join([][]byte{e, async, idle}, nil)
		default:
			want = bytes.Join([][]byte{e, idle, async}, nil)
		}
		for _, split := range splitsOf(len(input)) {
			f := &replyFilter{kind: LibraryCall, commit: true}
			out := feedSplit(t, f, input, split)
			if f.err != nil || !bytes.Equal(out, want) || f.lib.ErrCode != "40001" || f.lib.Fatal {
				t.Fatalf("gap %d, split %d: err %v, pgconn got %q, want %q; library read %+v", gap, split, f.err, out, want, f.lib)
			}
		}
	}
	f := &replyFilter{kind: LibraryCall, commit: true}
	f.feed(bytes.Join([][]byte{e, failed, msg(t, &pgproto3.CommandComplete{CommandTag: []byte("COMMIT")})}, nil))
	if f.err == nil {
		t.Fatal("COMMIT answered with its tag after the call failed: accounted for")
	}
}

// TestReplyFilterUnaccounted: a message the protocol does not allow in the library's part
// is an error, and nothing more is given to pgconn.
func TestReplyFilterUnaccounted(t *testing.T) {
	for _, tc := range []struct {
		kind LibraryMessage
		m    pgproto3.BackendMessage
	}{
		{LibraryCall, &pgproto3.DataRow{}},
		{LibraryCall, &pgproto3.CommandComplete{CommandTag: []byte("COMMIT")}},
		{LibraryQuery, &pgproto3.FunctionCallResponse{}},
		{LibraryCall, &pgproto3.CopyInResponse{}},
		{LibraryQuery, &pgproto3.CopyInResponse{}},
	} {
		f := &replyFilter{kind: tc.kind}
		f.feed(msg(t, tc.m))
		if f.err == nil || len(f.out) != 0 {
			t.Errorf("%d, %T: err %v, out %q; want an error and nothing for pgconn", tc.kind, tc.m, f.err, f.out)
		}
	}
	f := &replyFilter{kind: LibraryCall, commit: true}
	f.feed([]byte{'V', 0, 0, 0, 2})
	if f.err == nil {
		t.Error("a message length below 4 was taken")
	}
}

// TestStreamPos: message boundaries are followed across any split.
func TestStreamPos(t *testing.T) {
	var stream []byte
	var ends []int
	for _, m := range asyncMessages(t) {
		stream = append(stream, m...)
		ends = append(ends, len(stream))
	}
	for split := 1; split < len(stream); split++ {
		var p streamPos
		p.advance(stream[:split])
		atEnd := false
		for _, e := range ends {
			atEnd = atEnd || e == split
		}
		if p.atBoundary() != atEnd {
			t.Fatalf("after %d bytes: at a boundary %v, want %v", split, p.atBoundary(), atEnd)
		}
		p.advance(stream[split:])
		if !p.atBoundary() {
			t.Fatalf("split at %d: not at a boundary at the end", split)
		}
	}
}

// FuzzReplyFilter: any bytes, cut anywhere, never panic, and what pgconn gets is the
// input with some whole messages of the library's taken out, none of them asynchronous,
// in the order the server sent them.
func FuzzReplyFilter(f *testing.F) {
	for _, rc := range replyCases(f) {
		var in []byte
		for _, m := range append(append(append([][]byte{}, rc.library...), rc.passed...), rc.app...) {
			in = append(in, m...)
		}
		f.Add(byte(rc.kind), in, uint16(len(in)/2))
	}
	f.Fuzz(func(t *testing.T, kind byte, in []byte, cut uint16) {
		fl := &replyFilter{kind: LibraryMessage(kind%3 + 1), commit: kind%3 != 0}
		if fl.kind == LibraryPortal {
			fl.state, fl.execs = filterApplication, int(cut%3)+1
		}
		c := int(cut) % (len(in) + 1)
		out := feedSplit(t, fl, in, c)
		if fl.err != nil {
			return // the connection is closed: nothing more reaches pgconn
		}
		// Walk the input's whole messages: each is in out, in order, or was the library's.
		j := 0
		rest := in
		for len(rest) >= 5 {
			// A length below its own four bytes passes as a header alone, as streamPos reads it.
			n := max(int(binary.BigEndian.Uint32(rest[1:5])), 4)
			if len(rest) < 1+n {
				break
			}
			m := rest[:1+n]
			rest = rest[1+n:]
			if bytes.HasPrefix(out[j:], m) {
				j += len(m)
				continue
			}
			if m[0] == 'N' || m[0] == 'S' || m[0] == 'A' {
				t.Fatalf("message %q was taken from pgconn (out %q)", m, out)
			}
		}
		if !bytes.Equal(out[j:], rest) && len(out[j:]) != 0 {
			t.Fatalf("pgconn got %q after the whole messages, want the rest %q", out[j:], rest)
		}
	})
}

// TestReplyFilterBeforeSync: the library's call after an implicit transaction's statement,
// before its Sync (LibraryPortal): its reply comes after the application's Executes'
// completions and before their ReadyForQuery; pgconn gets the application's messages, and
// the call's ERROR (in the place of a failed commit's), and never the call's other
// messages; an error to the application's statement makes the server skip the call.
// Asynchronous messages in every gap, split at every byte.
func TestReplyFilterBeforeSync(t *testing.T) {
	rfq := msg(t, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	cc := func(tag string) []byte { return msg(t, &pgproto3.CommandComplete{CommandTag: []byte(tag)}) }
	errMsg := func(sev, code string) []byte {
		return msg(t, &pgproto3.ErrorResponse{Severity: sev, SeverityUnlocalized: sev, Code: code, Message: "m"})
	}
	parsed, bound := msg(t, &pgproto3.ParseComplete{}), msg(t, &pgproto3.BindComplete{})
	row := func(v string) []byte { return msg(t, &pgproto3.DataRow{Values: [][]byte{[]byte(v)}}) }
	rowDesc := msg(t, &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("id"), DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1}}})
	lib := func(ms ...[]byte) []part {
		var ps []part
		for _, m := range ms {
			ps = append(ps, part{m, true})
		}
		return ps
	}
	app := func(ms ...[]byte) []part {
		var ps []part
		for _, m := range ms {
			ps = append(ps, part{m, false})
		}
		return ps
	}
	cat := func(pss ...[]part) []part {
		var out []part
		for _, ps := range pss {
			out = append(out, ps...)
		}
		return out
	}
	checkRow := msg(t, &pgproto3.DataRow{Values: [][]byte{[]byte("7713899101641277397"), []byte("1")}})
	checked := lib(rowDesc, checkRow, cc("SELECT 1"), rfq) // the check ahead of the group (Addition.Ahead)
	for _, tc := range []struct {
		name    string
		execs   int
		stream  []part
		value   string
		errCode string
		skipped bool
		// ahead: the stream starts with the check's reply; aheadErr is its SQLSTATE.
		ahead    bool
		aheadErr string
	}{
		{name: "the check ahead, an insert, then the xid", execs: 1, ahead: true,
			stream: cat(checked, app(bound, cc("INSERT 0 1")), lib(parsed, bound, row("744"), cc("SELECT 1")), app(rfq)), value: "744"},
		{name: "the check refused, then the insert and the xid", execs: 1, ahead: true, aheadErr: "42501",
			stream: cat(lib(errMsg("ERROR", "42501"), rfq), app(bound, cc("INSERT 0 1")), lib(parsed, bound, row("745"), cc("SELECT 1")), app(rfq)), value: "745"},
		{name: "the check ahead, the statement fails: the call is skipped", execs: 1, ahead: true,
			stream: cat(checked, app(bound, errMsg("ERROR", "23505"), rfq)), skipped: true},
		{name: "FATAL to the check ahead", execs: 1, ahead: true, aheadErr: "57P01", errCode: "57P01",
			stream: cat(app(errMsg("FATAL", "57P01")))},
		{"an insert, then the xid", 1, cat(app(bound, cc("INSERT 0 1")), lib(parsed, bound, row("741"), cc("SELECT 1")), app(rfq)), "741", "", false, false, ""},
		{"insert … returning, then the marker", 1, cat(app(parsed, bound, rowDesc, row("7"), cc("INSERT 0 1")), lib(parsed, bound, row("m742"), cc("SELECT 1")), app(rfq)), "m742", "", false, false, ""},
		{"a batch of two", 2, cat(app(bound, cc("INSERT 0 1"), bound, cc("UPDATE 1")), lib(parsed, bound, row("743"), cc("SELECT 1")), app(rfq)), "743", "", false, false, ""},
		{"the statement fails: the call is skipped", 1, cat(app(bound, errMsg("ERROR", "23505"), rfq)), "", "", true, false, ""},
		{"the second of a batch fails", 2, cat(app(bound, cc("INSERT 0 1"), bound, errMsg("ERROR", "23505"), rfq)), "", "", true, false, ""},
		{"the call fails: its error is the transaction's", 1, cat(app(bound, cc("INSERT 0 1")), lib(parsed), app(errMsg("ERROR", "57014"), rfq)), "", "57014", false, false, ""},
		{"FATAL during the call", 1, cat(app(bound, cc("INSERT 0 1")), lib(parsed, bound), app(errMsg("FATAL", "57P01"))), "", "57P01", false, false, ""},
	} {
		for gap := 0; gap <= len(tc.stream); gap++ {
			for ai, async := range asyncMessages(t) {
				stream := cat(tc.stream[:gap], app(async), tc.stream[gap:])
				input, want := streamBytes(stream)
				for _, split := range splitsOf(len(input)) {
					name := fmt.Sprintf("%s/async %d at %d/split %v", tc.name, ai, gap, split)
					f := &replyFilter{kind: LibraryPortal, commit: true, execs: tc.execs, state: filterApplication}
					if tc.ahead {
						f.kind, f.then, f.state = LibraryQuery, true, filterLibrary
					}
					out := feedSplit(t, f, input, split)
					if f.err != nil {
						t.Fatalf("%s: %v", name, f.err)
					}
					if !bytes.Equal(out, want) {
						t.Fatalf("%s: pgconn got\n%q\nwant\n%q", name, out, want)
					}
					r := f.lib
					if !r.Done || string(r.Value) != tc.value || r.ErrCode != tc.errCode || r.Skipped != tc.skipped || !f.finished() {
						t.Fatalf("%s: library read %+v, state %d; want value %q, error %q, skipped %v", name, r, f.state, tc.value, tc.errCode, tc.skipped)
					}
					if a := f.ahead; tc.ahead && (!a.Done || a.ErrCode != tc.aheadErr || tc.aheadErr == "" && len(a.Row) != 2) {
						t.Fatalf("%s: the check ahead read %+v, want error %q", name, a, tc.aheadErr)
					}
				}
			}
		}
	}
}

// part is a message of a reply stream, the library's or the application's.
type part struct {
	b       []byte
	library bool
}

// streamBytes returns what the server sends as stream (input) and what pgconn must read
// of it: every part but the library's (want).
func streamBytes(stream []part) (input, want []byte) {
	for _, p := range stream {
		input = append(input, p.b...)
		if !p.library {
			want = append(want, p.b...)
		}
	}
	return input, want
}

// TestReplyFilterReadInBlockFails: the xid read inside a transaction block's statement's
// Sync group (Commit false) keeps its ERROR from pgconn: the statement's reply, then the
// Sync's ReadyForQuery (E: the block is aborted), are all pgconn reads, the stream split at
// every byte.
func TestReplyFilterReadInBlockFails(t *testing.T) {
	cc := msg(t, &pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")})
	bound, parsed := msg(t, &pgproto3.BindComplete{}), msg(t, &pgproto3.ParseComplete{})
	refused := msg(t, &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "42501", Message: "m"})
	failed := msg(t, &pgproto3.ReadyForQuery{TxStatus: 'E'})
	input, want := streamBytes([]part{{bound, false}, {cc, false}, {parsed, true}, {refused, true}, {failed, false}})
	for _, split := range splitsOf(len(input)) {
		f := &replyFilter{kind: LibraryPortal, execs: 1, state: filterApplication}
		out := feedSplit(t, f, input, split)
		if f.err != nil || !bytes.Equal(out, want) || f.lib.ErrCode != "42501" || !f.lib.Done || !f.finished() {
			t.Fatalf("split %v: pgconn got %q (want %q), library read %+v, err %v", split, out, want, f.lib, f.err)
		}
	}
}
