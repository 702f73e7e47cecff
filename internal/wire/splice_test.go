package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// scriptConn is a net.Conn whose writes and reads follow a script: each write takes the
// next of writes (how many bytes the kernel accepts, and the error), or all of it; each
// read the next of reads (bytes, or an error).
type scriptConn struct {
	net.Conn // nil: only what the wrapper calls is implemented
	writes   []scriptWrite
	written  []byte
	reads    []scriptRead
	closed   int
}

type scriptWrite struct {
	n   int // bytes accepted; -1: all
	err error
}

type scriptRead struct {
	b   []byte
	err error
}

func (c *scriptConn) Write(b []byte) (int, error) {
	w := scriptWrite{n: -1}
	if len(c.writes) > 0 {
		w, c.writes = c.writes[0], c.writes[1:]
	}
	if w.n < 0 || w.n > len(b) {
		w.n = len(b)
	}
	c.written = append(c.written, b[:w.n]...)
	return w.n, w.err
}

func (c *scriptConn) Read(p []byte) (int, error) {
	if len(c.reads) == 0 {
		return 0, io.EOF
	}
	r := &c.reads[0]
	if len(r.b) == 0 {
		c.reads = c.reads[1:]
		return 0, r.err
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	if len(r.b) == 0 && r.err == nil {
		c.reads = c.reads[1:]
	}
	return n, nil
}

// Close records the close: a reply the filter cannot account for closes the connection.
func (c *scriptConn) Close() error                     { c.closed++; return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }

// additionFixture is a wrapper over a script, armed with a marker call ahead of COMMIT.
func additionFixture(t *testing.T, sc *scriptConn) (*Conn, *Addition, []byte, []byte) {
	t.Helper()
	nc := NewConn(sc, nil, true)
	commit := frontendMsg(t, &pgproto3.Query{String: "commit"})
	call := frontendMsg(t, &pgproto3.FunctionCall{Function: 16400, ArgFormatCodes: []uint16{1}, Arguments: [][]byte{make([]byte, 16)}})
	a := &Addition{Kind: LibraryCall, Match: "commit", Msg: call, Commit: true}
	if !nc.Arm(a) || a.state != additionArmed {
		t.Fatalf("arm refused or state %d", a.state)
	}
	return nc, a, commit, call
}

// frontendMsg encodes m.
func frontendMsg(t *testing.T, m pgproto3.FrontendMessage) []byte {
	t.Helper()
	b, err := m.Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readAll reads what pgconn would get until the script's reads end with err (or io.EOF).
func readAll(nc *Conn) ([]byte, error) {
	var got []byte
	buf := make([]byte, 7) // small: pgconn's reads need not line up with messages
	for {
		n, err := nc.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got, err
		}
	}
}

// TestAdditionLife drives an addition through its states on a scripted connection,
// directly: the write it was armed for, every split of the reply, a write that fails
// before or after a byte left, short writes, a deadline and a broken connection while
// its reply is in flight.
func TestAdditionLife(t *testing.T) {
	callReply := append(msg(t, &pgproto3.FunctionCallResponse{Result: []byte("m731")}), msg(t, &pgproto3.ReadyForQuery{TxStatus: 'T'})...)
	commitReply := append(msg(t, &pgproto3.CommandComplete{CommandTag: []byte("COMMIT")}), msg(t, &pgproto3.ReadyForQuery{TxStatus: 'I'})...)
	reply := append(append([]byte{}, callReply...), commitReply...)

	t.Run("another write", func(t *testing.T) {
		sc := &scriptConn{}
		nc, a, _, _ := additionFixture(t, sc)
		other := frontendMsg(t, &pgproto3.Query{String: "select 1"})
		if n, err := nc.Write(other); n != len(other) || err != nil || !bytes.Equal(sc.written, other) {
			t.Fatalf("Write = %d, %v; wrote %q", n, err, sc.written)
		}
		if a.state != additionArmed || a.Sent() {
			t.Fatalf("state %d after a write it was not armed for", a.state)
		}
		if got := collected(nc); got != nil {
			t.Fatalf("collected %+v: it never went out", got)
		}
	})

	t.Run("reply split anywhere", func(t *testing.T) {
		for split := 0; split <= len(reply); split++ {
			sc := &scriptConn{reads: []scriptRead{{b: reply[:split]}, {b: reply[split:]}}}
			nc, a, commit, call := additionFixture(t, sc)
			if n, err := nc.Write(commit); n != len(commit) || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
			if !bytes.Equal(sc.written, append(append([]byte{}, call...), commit...)) || a.state != additionWritten {
				t.Fatalf("wrote %q, state %d", sc.written, a.state)
			}
			got, err := readAll(nc)
			if !errors.Is(err, io.EOF) || !bytes.Equal(got, commitReply) {
				t.Fatalf("split %d: pgconn got %q, %v; want COMMIT's reply alone", split, got, err)
			}
			if a.state != additionReplied {
				t.Fatalf("split %d: state %d, want replied", split, a.state)
			}
			if c := collected(nc); c != a || string(c.reply.Value) != "m731" || !c.reply.Done {
				t.Fatalf("split %d: collected %+v", split, c)
			}
		}
	})

	t.Run("write fails before a byte left", func(t *testing.T) {
		sc := &scriptConn{writes: []scriptWrite{{0, os.ErrDeadlineExceeded}}}
		nc, a, commit, _ := additionFixture(t, sc)
		if n, err := nc.Write(commit); n != 0 || err == nil {
			t.Fatalf("Write = %d, %v; want 0 and the error", n, err)
		}
		if a.state != additionUnsent || a.Sent() {
			t.Fatalf("state %d", a.state)
		}
	})

	for _, k := range []int{1, 10} { // inside the call's bytes: none of pgconn's left
		t.Run("short write inside the call", func(t *testing.T) {
			sc := &scriptConn{writes: []scriptWrite{{k, io.ErrClosedPipe}}}
			nc, a, commit, _ := additionFixture(t, sc)
			if n, err := nc.Write(commit); n != 0 || !errors.Is(err, io.ErrClosedPipe) {
				t.Fatalf("Write = %d, %v; want 0 of pgconn's bytes and the error", n, err)
			}
			if a.state != additionWritten || !a.Sent() {
				t.Fatalf("state %d: some of the call left, the server may have read it", a.state)
			}
		})
	}

	t.Run("short write into COMMIT", func(t *testing.T) {
		_, _, commit, call := additionFixture(t, &scriptConn{})
		for k := len(call) + 1; k < len(call)+len(commit); k++ {
			sc := &scriptConn{writes: []scriptWrite{{k, io.ErrClosedPipe}}}
			nc, a, _, _ := additionFixture(t, sc)
			n, err := nc.Write(commit)
			if want := min(max(k-len(call), 1), len(commit)-1); n != want || err == nil {
				t.Fatalf("%d bytes accepted: Write = %d, %v; want %d of pgconn's and the error", k, n, err, want)
			}
			if a.state != additionWritten {
				t.Fatalf("state %d", a.state)
			}
		}
	})

	t.Run("deadline while the reply is in flight", func(t *testing.T) {
		half := len(callReply) / 2
		sc := &scriptConn{reads: []scriptRead{{b: reply[:half]}, {err: os.ErrDeadlineExceeded}, {b: reply[half:]}}}
		nc, a, commit, _ := additionFixture(t, sc)
		if _, err := nc.Write(commit); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		n, err := nc.Read(buf)
		if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) || a.state != additionWritten {
			t.Fatalf("Read at the deadline = %d, %v, state %d; want the timeout, nothing of the call's", n, err, a.state)
		}
		got, err := readAll(nc)
		if !errors.Is(err, io.EOF) || !bytes.Equal(got, commitReply) || a.state != additionReplied {
			t.Fatalf("after the deadline: %q, %v, state %d", got, err, a.state)
		}
	})

	t.Run("connection broken while the reply is in flight", func(t *testing.T) {
		sc := &scriptConn{reads: []scriptRead{{b: callReply[:3]}, {err: io.ErrUnexpectedEOF}}}
		nc, a, commit, _ := additionFixture(t, sc)
		if _, err := nc.Write(commit); err != nil {
			t.Fatal(err)
		}
		if got, err := readAll(nc); len(got) != 0 || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("pgconn got %q, %v; want the error alone", got, err)
		}
		c := collected(nc)
		if c != a || a.state != additionWritten || c.reply.Done || c.reply.GotValue {
			t.Fatalf("collected %+v", c)
		}
		// What the reference makes of a reply that never came whole is TestCallRef's (the
		// root package): the marker's stands without it, the xid read's does not.
	})
}

// collected is Collect(true)'s addition: what the tests read of one that is over.
func collected(c *Conn) *Addition {
	a, _ := c.Collect(true)
	return a
}

// TestSpliceAfter adds the xid read after an application's extended-protocol write, with
// the server's reply — the application's rows, a notice, its ReadyForQuery, then the
// library's — split at every byte: pgconn reads exactly its own reply, and the library's is
// whole. Writes that are not whole messages ending where the server reads on are left
// alone, and the addition waits for the write that executes.
func TestSpliceAfter(t *testing.T) {
	call := frontendMsg(t, &pgproto3.FunctionCall{Function: 5000})
	var write []byte
	for _, m := range []pgproto3.FrontendMessage{&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}} {
		write = append(write, frontendMsg(t, m)...)
	}
	var appReply []byte
	for _, m := range []pgproto3.BackendMessage{&pgproto3.BindComplete{}, &pgproto3.DataRow{Values: [][]byte{[]byte("7")}},
		&pgproto3.NoticeResponse{Message: "n"}, &pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}, &pgproto3.ReadyForQuery{TxStatus: 'T'}} {
		b, err := m.Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		appReply = append(appReply, b...)
	}
	var libReply []byte
	for _, m := range []pgproto3.BackendMessage{&pgproto3.FunctionCallResponse{Result: []byte("731")}, &pgproto3.ReadyForQuery{TxStatus: 'T'}} {
		b, _ := m.Encode(nil)
		libReply = append(libReply, b...)
	}
	reply := append(append([]byte{}, appReply...), libReply...)
	for split := 0; split <= len(reply); split++ {
		sc := &scriptConn{reads: []scriptRead{{b: reply[:split]}, {b: reply[split:]}}}
		nc := NewConn(sc, nil, true)
		a := &Addition{Kind: LibraryCall, Msg: call, After: true}
		if !nc.Arm(a) {
			t.Fatal("refused")
		}
		prepare := append(frontendMsg(t, &pgproto3.Parse{}), frontendMsg(t, &pgproto3.Sync{})...)
		if _, err := nc.Write(prepare); err != nil || !bytes.Equal(sc.written, prepare) {
			t.Fatalf("the prepare-only write: %q, %v", sc.written, err)
		}
		if n, err := nc.Write(write); n != len(write) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		if !bytes.Equal(sc.written[len(prepare):], append(append([]byte{}, write...), call...)) {
			t.Fatalf("wrote %q", sc.written)
		}
		got := make([]byte, 0, len(appReply))
		for len(got) < len(appReply) {
			p := make([]byte, 64)
			n, err := nc.Read(p)
			if err != nil {
				t.Fatalf("split %d: read: %v after %q", split, err, got)
			}
			got = append(got, p[:n]...)
		}
		if !bytes.Equal(got, appReply) {
			t.Fatalf("split %d: pgconn got %q, want its own reply", split, got)
		}
		if !nc.Await(time.Now().Add(time.Second)) {
			t.Fatalf("split %d: the library's reply never came whole", split)
		}
		if c, pending := nc.Collect(false); c != a || pending || string(c.reply.Value) != "731" || !c.reply.Done {
			t.Fatalf("split %d: collected %+v, pending %v", split, c, pending)
		}
	}

	for name, b := range map[string][]byte{
		"prepare only":    append(frontendMsg(t, &pgproto3.Parse{}), frontendMsg(t, &pgproto3.Sync{})...),
		"no sync":         append(frontendMsg(t, &pgproto3.Bind{}), frontendMsg(t, &pgproto3.Execute{})...),
		"copy data":       append(frontendMsg(t, &pgproto3.CopyData{Data: []byte("x")}), frontendMsg(t, &pgproto3.Sync{})...),
		"a function call": append(frontendMsg(t, &pgproto3.FunctionCall{Function: 1}), frontendMsg(t, &pgproto3.Sync{})...),
		"a cut message":   write[:len(write)-1],
		"a terminate":     frontendMsg(t, &pgproto3.Terminate{}),
	} {
		if _, ok := syncedWrite(b); ok {
			t.Errorf("%s: taken as a write the library may add after", name)
		}
	}
	if n, ok := syncedWrite(append(append([]byte{}, write...), frontendMsg(t, &pgproto3.Query{String: "select 1"})...)); !ok || n != 2 {
		t.Errorf("a pipeline's two syncs: %d, %v", n, ok)
	}
}

// TestExtendedGroup: an implicit transaction's write, which the library's marker call and
// check go ahead of, is one extended-protocol Sync group; what pgx writes otherwise is not.
func TestExtendedGroup(t *testing.T) {
	f := func(ms ...pgproto3.FrontendMessage) []byte {
		var b []byte
		for _, m := range ms {
			b = append(b, frontendMsg(t, m)...)
		}
		return b
	}
	parse := func(name string) pgproto3.FrontendMessage {
		return &pgproto3.Parse{Name: name, Query: "insert into t values ($1)"}
	}
	bind := func(stmt string) pgproto3.FrontendMessage { return &pgproto3.Bind{PreparedStatement: stmt} }
	desc, exec, sync := &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{}
	for _, tc := range []struct {
		name            string
		b               []byte
		group           bool
		execs           int
		bindsEarlierUnn bool
	}{
		{"cache statement", f(bind("stmtcache_1"), desc, exec, sync), true, 1, false},
		{"exec: parse, bind, execute", f(parse(""), bind(""), desc, exec, sync), true, 1, false},
		{"describe exec, second write: binds the unnamed statement parsed before", f(bind(""), desc, exec, sync), true, 1, true},
		{"prepare only", f(parse("stmtcache_2"), &pgproto3.Describe{ObjectType: 'S', Name: "stmtcache_2"}, sync), true, 0, false},
		{"batch: two statements, one Sync", f(bind("a"), desc, exec, bind("b"), desc, exec, sync), true, 2, false},
		{"simple Query", f(&pgproto3.Query{String: "insert into t values (1)"}), false, 0, false},
		{"two simple Queries", f(&pgproto3.Query{String: "select 1"}, &pgproto3.Query{String: "select 2"}), false, 0, false},
		{"two Syncs", f(bind("a"), exec, sync, bind("b"), exec, sync), false, 0, false},
		{"no Sync", f(bind("a"), exec, &pgproto3.Flush{}), false, 0, false},
		{"COPY data", f(&pgproto3.CopyData{Data: []byte("1\n")}), false, 0, false},
	} {
		group, execs := extendedGroup(tc.b)
		if group != tc.group || group && execs != tc.execs {
			t.Errorf("%s: group %v, executes %d; want %v, %d", tc.name, group, execs, tc.group, tc.execs)
		}
		if group && bindsEarlierUnnamed(tc.b) != tc.bindsEarlierUnn {
			t.Errorf("%s: binds an earlier unnamed statement %v, want %v", tc.name, !tc.bindsEarlierUnn, tc.bindsEarlierUnn)
		}
		// The check goes ahead of the group; a call, after its messages, before its Sync.
		check := &Addition{Kind: LibraryQuery, Extended: true, Msg: []byte("LIB")}
		out, cut, ok := check.addTo(tc.b, nil)
		if want := tc.group && !tc.bindsEarlierUnn; ok != want || ok && (cut != 3 || !bytes.Equal(out, append([]byte("LIB"), tc.b...))) {
			t.Errorf("%s, check: added %v (cut %d), want %v", tc.name, ok, cut, want)
		}
		// The lxid read (AnyQuery) goes right ahead of a group that executes, or of any one
		// simple Query, whatever its text.
		lxid := &Addition{Kind: LibraryQuery, Extended: true, AnyQuery: true, Msg: []byte("LIB")}
		out, cut, ok = lxid.addTo(tc.b, nil)
		if want := tc.group && !tc.bindsEarlierUnn && tc.execs > 0 || tc.name == "simple Query"; ok != want || ok && (cut != 3 || !bytes.Equal(out, append([]byte("LIB"), tc.b...))) {
			t.Errorf("%s, lxid read: added %v (cut %d), want %v", tc.name, ok, cut, want)
		}
		call := &Addition{Kind: LibraryPortal, Extended: true, Msg: []byte("LIB")}
		out, cut, ok = call.addTo(tc.b, nil)
		if want := tc.group && tc.execs > 0; ok != want {
			t.Errorf("%s, call: added %v, want %v", tc.name, ok, want)
		} else if ok {
			sync := len(tc.b) - 5
			if wantOut := append(append(append([]byte{}, tc.b[:sync]...), "LIB"...), tc.b[sync:]...); cut != 0 || !bytes.Equal(out, wantOut) || call.execs != tc.execs {
				t.Errorf("%s, call: %q (cut %d, execs %d)", tc.name, out, cut, call.execs)
			}
		}
	}
}
