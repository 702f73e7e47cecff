package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestReadInPlace: through Conn.Read with pgconn's large buffer, which the filter reads in
// place, the server's reply split into two reads at every byte: pgconn gets exactly its
// part, in order — the library's messages taken out of the middle of its buffer, a call's
// ERROR given in place of COMMIT's shorter ROLLBACK tag (where it does not fit in the
// buffer, the rest waits for the next Read) —, and the library reads its own.
func TestReadInPlace(t *testing.T) {
	bound, parsed := msg(t, &pgproto3.BindComplete{}), msg(t, &pgproto3.ParseComplete{})
	cc := func(tag string) []byte { return msg(t, &pgproto3.CommandComplete{CommandTag: []byte(tag)}) }
	rfq := func(s byte) []byte { return msg(t, &pgproto3.ReadyForQuery{TxStatus: s}) }
	row := msg(t, &pgproto3.DataRow{Values: [][]byte{[]byte("744")}})
	notice := asyncMessages(t)[0]
	failed := msg(t, &pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "40001", Message: "could not serialize access due to concurrent update"})
	implicit := frontendMsg(t, &pgproto3.Bind{})
	implicit = append(append(implicit, frontendMsg(t, &pgproto3.Execute{})...), frontendMsg(t, &pgproto3.Sync{})...)
	commit := frontendMsg(t, &pgproto3.Query{String: "commit"})
	for _, tc := range []struct {
		name   string
		a      func() *Addition
		write  []byte
		stream []part
		value  string
		code   string
	}{
		{"the xid inside an implicit transaction",
			func() *Addition {
				return &Addition{Kind: LibraryPortal, Extended: true, Commit: true, Msg: frontendMsg(t, &pgproto3.Flush{})}
			}, implicit,
			[]part{{bound, false}, {cc("INSERT 0 1"), false}, {parsed, true}, {notice, false}, {bound, true}, {row, true}, {cc("SELECT 1"), true}, {rfq('I'), false}},
			"744", ""},
		{"the call ahead of COMMIT fails: its ERROR in place of ROLLBACK",
			func() *Addition {
				return &Addition{Kind: LibraryCall, Match: "commit", Msg: frontendMsg(t, &pgproto3.FunctionCall{Function: 1}), Commit: true}
			}, commit,
			[]part{{failed, true}, {rfq('E'), true}, {notice, false}, {cc("ROLLBACK"), true}, {rfq('I'), false}},
			"", "40001"},
	} {
		input, _ := streamBytes(tc.stream)
		var want []byte
		for _, p := range tc.stream {
			switch {
			case !p.library:
				want = append(want, p.b...)
			case p.b[0] == 'C' && tc.code != "":
				want = append(want, failed...) // the ERROR in place of the ROLLBACK tag
			}
		}
		for split := 0; split <= len(input); split++ {
			sc := &scriptConn{reads: []scriptRead{{b: input[:split]}, {b: input[split:]}}}
			nc := NewConn(sc, nil, true)
			a := tc.a()
			if !nc.Arm(a) {
				t.Fatal("refused")
			}
			if _, err := nc.Write(tc.write); err != nil {
				t.Fatal(err)
			}
			var got []byte
			buf := make([]byte, 8192)
			for {
				n, err := nc.Read(buf)
				got = append(got, buf[:n]...)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("%s, split %d: %v", tc.name, split, err)
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s, split %d: pgconn got\n%q\nwant\n%q", tc.name, split, got, want)
			}
			r := collected(nc).Reply()
			if !r.Done || string(r.Value) != tc.value || r.ErrCode != tc.code || !nc.splice.pos.atBoundary() || held(nc) {
				t.Fatalf("%s, split %d: library read %+v; at a boundary %v, held %v", tc.name, split, r, nc.splice.pos.atBoundary(), held(nc))
			}
		}
	}
}

// TestStatementAllocs: what the wrapper allocates for one autocommit statement, warm: a
// write, its reply watched, nothing; with the xid read in its Sync group, only the xid the
// library keeps (the Addition is the caller's, reused here).
func TestStatementAllocs(t *testing.T) {
	for _, s := range benchStatements(t) {
		c := NewConn(&replayConn{reply: s.reply}, nil, true)
		write := append(append(frontendMsg(t, &pgproto3.Bind{}), frontendMsg(t, &pgproto3.Execute{})...), frontendMsg(t, &pgproto3.Sync{})...)
		a := &Addition{Kind: LibraryPortal, Extended: true, Commit: true, Msg: frontendMsg(t, &pgproto3.Flush{})}
		buf := make([]byte, 8192)
		statement := func() {
			if s.write {
				c.MarkCommit(true)
				c.WatchEnds()
			}
			if s.xid && !c.Arm(a) {
				t.Fatal("refused")
			}
			if _, err := c.Write(write); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Read(buf); n == 0 || err != nil {
				t.Fatalf("read %d, %v", n, err)
			}
			if s.xid {
				if got, _ := c.Collect(false); got != a || !got.Reply().Done {
					t.Fatalf("collected %+v", got)
				}
			}
			if s.write && (c.CommitNotSent() || !c.RepliedClean()) {
				t.Fatal("not sent, or not clean")
			}
			c.WatchEnds()
		}
		statement()
		want := 0.0
		if s.xid {
			want = 1
		}
		if n := testing.AllocsPerRun(100, statement); n > want {
			t.Errorf("%s: %v allocations per statement, want %v", s.name, n, want)
		}
	}
}
