package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

var _ net.Conn = (*Conn)(nil)

// countingListener counts the close notices it is given.
type countingListener struct{ n atomic.Int32 }

func (l *countingListener) NetConnClosed() { l.n.Add(1) }

// TestConnPassThrough: with nothing armed the wrapper is the connection, both ways, over
// net.Pipe: the bytes as they were, a read deadline met as the pipe meets it, with and
// without message tracking.
func TestConnPassThrough(t *testing.T) {
	for _, track := range []bool{false, true} {
		client, server := net.Pipe()
		c := NewConn(client, nil, track)
		go func() {
			b := make([]byte, 64)
			n, _ := server.Read(b)
			_, _ = server.Write(b[:n]) // echoed
		}()
		sent := frontendMsg(t, &pgproto3.Query{String: "select 1"})
		if n, err := c.Write(sent); n != len(sent) || err != nil {
			t.Fatalf("track %v: Write = %d, %v", track, n, err)
		}
		got := make([]byte, len(sent))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, sent) {
			t.Fatalf("track %v: read %q, %v", track, got, err)
		}
		if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
		if n, err := c.Read(got); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("track %v: Read past the deadline = %d, %v", track, n, err)
		}
		if held(c) || c.CommitNotSent() {
			t.Fatalf("track %v: state left behind", track)
		}
		_ = c.Close()
		_ = server.Close()
	}
}

// held reports whether c holds anything for pgconn: a reply filter at work, or bytes or an
// error read ahead.
func held(c *Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.splice.filter != nil || c.ahead.state() != aheadEmpty
}

// nopConn is a net.Conn whose reads and writes take everything and allocate nothing.
type nopConn struct{ net.Conn }

func (nopConn) Read(p []byte) (int, error)  { return len(p), nil }
func (nopConn) Write(b []byte) (int, error) { return len(b), nil }

// TestConnNothingArmedAllocs: a read and a write with nothing armed allocate nothing,
// with message tracking on or off, and with a COMMIT marked.
func TestConnNothingArmedAllocs(t *testing.T) {
	for _, track := range []bool{false, true} {
		c := NewConn(nopConn{}, nil, track)
		b := make([]byte, 16)
		b[0], b[4] = 'Z', 15 // one whole message of 16 bytes: the stream stays at a boundary
		if n := testing.AllocsPerRun(100, func() {
			c.commit.mark()
			_, _ = c.Write(b)
			_, _ = c.Read(b)
			_ = c.CommitNotSent()
		}); n != 0 {
			t.Errorf("track %v: %v allocations per write and read", track, n)
		}
		if !c.splice.pos.atBoundary() {
			t.Errorf("track %v: whole messages read, yet not at a boundary", track)
		}
	}
}

// TestCloseNotice: the listener is told once, whoever closes and however often — here
// two goroutines racing a read blocked in the filter's path on a net.Pipe, with the
// reply to an addition in flight; the read ends with the pipe's error.
func TestCloseNotice(t *testing.T) {
	for range 20 {
		client, server := net.Pipe()
		l := &countingListener{}
		c := NewConn(client, l, true)
		call := frontendMsg(t, &pgproto3.FunctionCall{Function: 1})
		commit := frontendMsg(t, &pgproto3.Query{String: "commit"})
		if !c.Arm(&Addition{Kind: LibraryCall, Match: "commit", Msg: call, Commit: true}) {
			t.Fatal("Arm refused on a fresh connection")
		}
		go func() { _, _ = io.Copy(io.Discard, server) }()
		if _, err := c.Write(commit); err != nil {
			t.Fatal(err)
		}
		read := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 16))
			read <- err
		}()
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = c.Close()
			}()
		}
		wg.Wait()
		if err := <-read; !errors.Is(err, io.ErrClosedPipe) {
			t.Fatalf("Read after Close: %v", err)
		}
		_ = c.Close()
		if n := l.n.Load(); n != 1 {
			t.Fatalf("listener told %d times", n)
		}
		_ = server.Close()
	}
	if err := NewConn(&scriptConn{}, nil, false).Close(); err != nil { // nobody to tell
		t.Fatal(err)
	}
}

// TestCommitWrite drives the COMMIT write accounting directly: only the first write after
// mark counts, the reading returns it to idle, and under TLS the socket's count decides,
// not the plaintext write's n.
func TestCommitWrite(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mark   bool
		writes []bool // what each write's n said: some bytes reached the kernel
		want   bool   // notSent
	}{
		{"nothing marked", false, []bool{false}, false},
		{"marked, sent", true, []bool{true}, false},
		{"marked, failed before a byte", true, []bool{false}, true},
		{"only the first write after mark counts", true, []bool{false, true}, true},
		{"marked, no write at all: COMMIT never left", true, nil, true},
	} {
		var w commitWrite
		if tc.mark {
			w.mark()
		}
		for _, s := range tc.writes {
			w.wrote(s)
		}
		if got := w.notSent(); got != tc.want || w.state.Load() != commitIdle {
			t.Errorf("%s: notSent %v, want %v; state %d after", tc.name, got, tc.want, w.state.Load())
		}
	}

	// Under TLS: the record layer's n says nothing of the socket; its count does.
	sc := &scriptConn{writes: []scriptWrite{{0, io.ErrClosedPipe}, {1, io.ErrClosedPipe}}}
	w := commitWrite{dialed: &Dialed{Conn: sc}}
	w.mark()
	_, _ = w.dialed.Write([]byte("record"))
	w.wrote(true)
	if !w.notSent() {
		t.Error("TLS: no byte reached the socket, yet counted sent")
	}
	w.mark()
	_, _ = w.dialed.Write([]byte("record"))
	w.wrote(false)
	if w.notSent() {
		t.Error("TLS: a byte reached the socket, yet counted unsent")
	}
}

// TestWriteAdded calls startAddition and writeAdded directly for every count of bytes the kernel takes of
// the call and COMMIT, with and without an error: what pgconn is told of its own bytes,
// the addition's state, and the COMMIT accounting.
func TestWriteAdded(t *testing.T) {
	_, _, commit, call := additionFixture(t, &scriptConn{})
	out := append(append([]byte{}, call...), commit...)
	for k := 0; k <= len(out); k++ {
		for _, werr := range []error{nil, io.ErrClosedPipe} {
			if werr == nil && k < len(out) {
				continue // a write without an error takes everything
			}
			sc := &scriptConn{writes: []scriptWrite{{k, werr}}}
			c, a, _, _ := additionFixture(t, sc)
			c.MarkCommit(true)
			if !c.startAddition(a) {
				t.Fatal("startAddition refused on a fresh connection")
			}
			n, err := c.writeAdded(a, commit, out, len(call))
			mine := k > len(call)
			switch {
			case werr == nil:
				if n != len(commit) || err != nil {
					t.Fatalf("whole write: %d, %v", n, err)
				}
			case !mine:
				if n != 0 || err == nil {
					t.Fatalf("%d bytes, none of COMMIT's: pgconn told %d, %v", k, n, err)
				}
			default:
				if n < 1 || n >= len(commit) || err == nil {
					t.Fatalf("%d bytes: pgconn told %d, %v; want some of its bytes, not all", k, n, err)
				}
			}
			if wantState := map[bool]additionState{true: additionUnsent, false: additionWritten}[k == 0]; a.state != wantState {
				t.Fatalf("%d bytes: state %d, want %d", k, a.state, wantState)
			}
			if got, want := c.CommitNotSent(), !mine && werr != nil; got != want {
				t.Fatalf("%d bytes, error %v: CommitNotSent %v, want %v", k, werr, got, want)
			}
			if !held(c) || c.splice.filter == nil {
				t.Fatalf("%d bytes: the reply filter is not in place", k)
			}
		}
	}
}

// TestArm: an addition is refused unless the stream pgconn reads is at a message
// boundary, no reply filter is at work and nothing read ahead is still held.
func TestArm(t *testing.T) {
	a := func() *Addition { return &Addition{Kind: LibraryCall, Match: "commit", Commit: true} }
	for _, tc := range []struct {
		name  string
		setup func(c *Conn)
		want  bool
	}{
		{"clean", func(*Conn) {}, true},
		{"in the middle of a message", func(c *Conn) { c.splice.pos.advance([]byte{'Z', 0, 0, 0, 5}) }, false},
		{"a filter at work", func(c *Conn) { c.splice.filter = &replyFilter{kind: LibraryCall, commit: true} }, false},
		{"bytes read ahead", func(c *Conn) { c.ahead.buf = []byte{'Z'} }, false},
		{"an error read ahead", func(c *Conn) { c.ahead.err = io.EOF }, false},
	} {
		c := NewConn(&scriptConn{}, nil, true)
		tc.setup(c)
		x := a()
		if got := c.Arm(x); got != tc.want || (c.splice.next.Load() == x) != tc.want {
			t.Errorf("%s: Arm %v, want %v", tc.name, got, tc.want)
		}
		if collected(c) != nil || c.splice.next.Load() != nil {
			t.Errorf("%s: Collect left an addition behind", tc.name)
		}
	}
}

// TestDeliver calls deliver directly: what is held goes to pgconn in the order it came —
// the filter's output, then an error a read met; bytes read ahead, then their error —
// nothing is held once all is given, and a reply the filter cannot account for
// closes the connection and is the answer from then on.
func TestDeliver(t *testing.T) {
	p := make([]byte, 64)
	t.Run("read ahead, then its error", func(t *testing.T) {
		c := NewConn(&scriptConn{}, nil, true)
		c.ahead.buf, c.ahead.err = []byte("abc"), io.EOF
		if n, err, done := c.deliver(p[:2]); n != 2 || err != nil || !done || !held(c) {
			t.Fatalf("first: %d, %v, %v", n, err, done)
		}
		if n, err, done := c.deliver(p); n != 1 || err != nil || !done {
			t.Fatalf("rest: %d, %v, %v", n, err, done)
		}
		if n, err, done := c.deliver(p); n != 0 || err != io.EOF || !done || held(c) {
			t.Fatalf("error: %d, %v, %v, special %v", n, err, done, held(c))
		}
		if _, _, done := c.deliver(p); done {
			t.Fatal("nothing held, yet done")
		}
	})
	t.Run("filter output, then the error", func(t *testing.T) {
		c, a, commit, _ := additionFixture(t, &scriptConn{})
		if _, err := c.Write(commit); err != nil {
			t.Fatal(err)
		}
		rfq := msg(t, &pgproto3.ReadyForQuery{TxStatus: 'I'})
		c.splice.filter.feed(append(msg(t, &pgproto3.FunctionCallResponse{Result: []byte("m1")}), msg(t, &pgproto3.ReadyForQuery{TxStatus: 'T'})...))
		c.splice.filter.feed(rfq)
		c.ahead.keepErr(io.ErrUnexpectedEOF)
		if n, err, done := c.deliver(p); !bytes.Equal(p[:n], rfq) || err != nil || !done || a.state != additionReplied || c.splice.filter != nil {
			t.Fatalf("output: %q, %v, %v; state %d", p[:n], err, done, a.state)
		}
		if n, err, done := c.deliver(p); n != 0 || err != io.ErrUnexpectedEOF || !done || held(c) {
			t.Fatalf("error: %d, %v, %v", n, err, done)
		}
	})
	t.Run("unaccounted", func(t *testing.T) {
		sc := &scriptConn{}
		c, _, commit, _ := additionFixture(t, sc)
		if _, err := c.Write(commit); err != nil {
			t.Fatal(err)
		}
		c.splice.filter.feed(msg(t, &pgproto3.DataRow{}))
		for range 2 {
			if n, err, done := c.deliver(p); n != 0 || !errors.Is(err, ErrUnaccountedReply) || !done {
				t.Fatalf("%d, %v, %v", n, err, done)
			}
		}
		if sc.closed == 0 {
			t.Fatal("the connection was left open")
		}
	})
	t.Run("a timeout with the filter's output held", func(t *testing.T) {
		c, _, commit, _ := additionFixture(t, &scriptConn{})
		if _, err := c.Write(commit); err != nil {
			t.Fatal(err)
		}
		reply := append(msg(t, &pgproto3.FunctionCallResponse{}), msg(t, &pgproto3.ReadyForQuery{TxStatus: 'T'})...)
		notice := asyncMessages(t)[1]
		in := append(append([]byte{}, reply...), notice...)
		copy(p, in)
		// The read returned the reply and a notice, and met its deadline: the notice is
		// given now, the timeout not at all.
		if n, err, done := c.received(p[:len(in)], len(in), os.ErrDeadlineExceeded); !bytes.Equal(p[:n], notice) || err != nil || !done {
			t.Fatalf("%q, %v, %v", p[:n], err, done)
		}
		if n, err, done := c.received(p, 0, os.ErrDeadlineExceeded); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !done {
			t.Fatalf("nothing held: %d, %v, %v; want the timeout", n, err, done)
		}
	})
}

// TestArmedAcrossOtherWrites: pgx writes the closing of statements its cache evicted (and
// a statement's preparation) in a write of its own ahead of the statement's. Such a write
// goes out alone and the addition waits for the write it was armed for; but if a reply
// that pgconn has not read whole lies between, the addition is withdrawn, not started
// mid-stream.
func TestArmedAcrossOtherWrites(t *testing.T) {
	closeStmt := slices.Concat(frontendMsg(t, &pgproto3.Close{ObjectType: 'S', Name: "stmtcache_1"}), frontendMsg(t, &pgproto3.Sync{}))
	for _, tc := range []struct {
		name    string
		between []byte // what pgconn read of the reply to the write in between
		carried bool
	}{
		{"its reply read whole", slices.Concat([]byte{'3', 0, 0, 0, 4}, []byte{'Z', 0, 0, 0, 5, 'I'}), true},
		{"its reply read in part", []byte{'3', 0, 0, 0, 4, 'Z', 0, 0}, false},
	} {
		sc := &scriptConn{reads: []scriptRead{{b: tc.between}}}
		nc, a, commit, call := additionFixture(t, sc)
		if _, err := nc.Write(closeStmt); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(sc.written, closeStmt) || nc.splice.next.Load() != a {
			t.Fatalf("%s: the write in between carried the addition, or it was dropped: %q", tc.name, sc.written)
		}
		if _, err := io.ReadFull(nc, make([]byte, len(tc.between))); err != nil {
			t.Fatal(err)
		}
		if n, err := nc.Write(commit); n != len(commit) || err != nil {
			t.Fatalf("%s: Write = %d, %v", tc.name, n, err)
		}
		want := slices.Concat(closeStmt, commit)
		if tc.carried {
			want = slices.Concat(closeStmt, call, commit)
		}
		if !bytes.Equal(sc.written, want) {
			t.Fatalf("%s: written %q, want %q", tc.name, sc.written, want)
		}
		if got := collected(nc); (got == a) != tc.carried || (got != nil && !got.Sent()) {
			t.Fatalf("%s: collected %v, want carried %v", tc.name, got, tc.carried)
		}
		if nc.splice.next.Load() != nil {
			t.Fatalf("%s: an addition left armed", tc.name)
		}
	}
}
