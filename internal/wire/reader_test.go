package wire

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// heldConn is a net.Conn whose reads wait for the test: each Read announces itself on
// started, with the read deadline it meets, then returns the next chunk sent on feed, or
// a timeout when the test sends on expire (only where a deadline is set: the test, not
// the clock, says when it has passed). It counts the reads at it at once.
type heldConn struct {
	net.Conn // nil: only what the wrapper calls is implemented
	started  chan time.Time
	feed     chan []byte
	expire   chan struct{}

	mu       sync.Mutex
	deadline time.Time
	inFlight int
	most     int // the most reads ever at it at once
}

func newHeldConn() *heldConn {
	return &heldConn{started: make(chan time.Time, 16), feed: make(chan []byte), expire: make(chan struct{})}
}

func (c *heldConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	c.inFlight++
	c.most = max(c.most, c.inFlight)
	d := c.deadline
	c.mu.Unlock()
	defer func() { c.mu.Lock(); c.inFlight--; c.mu.Unlock() }()
	c.started <- d
	for {
		select {
		case b := <-c.feed:
			return copy(p, b), nil
		case <-c.expire:
			c.mu.Lock()
			set := !c.deadline.IsZero()
			c.mu.Unlock()
			if set {
				return 0, os.ErrDeadlineExceeded
			}
		}
	}
}

func (c *heldConn) Write(b []byte) (int, error) { return len(b), nil }
func (c *heldConn) SetReadDeadline(d time.Time) error {
	c.mu.Lock()
	c.deadline = d
	c.mu.Unlock()
	return nil
}
func (c *heldConn) SetWriteDeadline(time.Time) error { return nil }
func (c *heldConn) SetDeadline(d time.Time) error    { return c.SetReadDeadline(d) }

// readDeadline is the deadline a read would meet now.
func (c *heldConn) readDeadline() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline
}

// mostAtOnce is the most reads that were at c at once.
func (c *heldConn) mostAtOnce() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.most
}

// encode is the server's messages as they go on the wire.
func encode(ms ...pgproto3.BackendMessage) []byte {
	var b []byte
	for _, m := range ms {
		b, _ = m.Encode(b)
	}
	return b
}

// awaitFixture is a wrapper over a heldConn with a library call added after an INSERT:
// its reply, the library's, and a notice of pgconn's that follows both.
func awaitFixture(t *testing.T) (nc *Conn, hc *heldConn, app, lib, later []byte) {
	t.Helper()
	hc = newHeldConn()
	nc = NewConn(hc, nil, true)
	if !nc.Arm(&Addition{Kind: LibraryCall, Msg: frontendMsg(t, &pgproto3.FunctionCall{Function: 1}), After: true}) {
		t.Fatal("refused")
	}
	if _, err := nc.Write(frontendMsg(t, &pgproto3.Query{String: "insert"})); err != nil {
		t.Fatal(err)
	}
	app = encode(&pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})
	lib = encode(&pgproto3.FunctionCallResponse{Result: []byte("42")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})
	later = encode(&pgproto3.NoticeResponse{Message: "later"})
	return nc, hc, app, lib, later
}

// pgconnReads reads nc as pgconn does, until it has want bytes or an error, and sends
// what it got.
func pgconnReads(nc *Conn, want int) <-chan readResult {
	out := make(chan readResult, 1)
	go func() {
		var r readResult
		for len(r.b) < want && r.err == nil {
			p := make([]byte, 256)
			n, err := nc.Read(p)
			r.b, r.err = append(r.b, p[:n]...), err
		}
		out <- r
	}()
	return out
}

type readResult struct {
	b   []byte
	err error
}

// waitFor waits until cond, read under nc.mu, holds: the state it names comes without
// the test's help, so this is a condition, not a guess at timing.
func waitFor(t *testing.T, nc *Conn, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		nc.mu.Lock()
		ok := cond()
		nc.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		runtime.Gosched()
	}
}

// TestAwaitWithReaderInFlight: with a read of pgconn's at the connection first (its
// background reader outlives a slow write by one read), Await does not read beside it: it
// waits for that read to bring the library's reply through the filter, and pgconn gets
// exactly its bytes.
func TestAwaitWithReaderInFlight(t *testing.T) {
	nc, hc, app, lib, later := awaitFixture(t)
	got := pgconnReads(nc, len(app)+len(later))
	if d := <-hc.started; !d.IsZero() {
		t.Fatalf("pgconn's read met a deadline it did not set: %v", d)
	}
	done := make(chan bool)
	go func() { done <- nc.Await(time.Now().Add(time.Hour)) }()
	waitFor(t, nc, "Await waiting for pgconn's read", func() bool { return nc.rd.reading && nc.rd.wake != nil })
	hc.feed <- bytes.Join([][]byte{app, lib, later}, nil)
	if !<-done {
		t.Fatal("Await gave up on the reply the reader brought")
	}
	if r := <-got; !bytes.Equal(r.b, append(append([]byte{}, app...), later...)) || r.err != nil {
		t.Fatalf("pgconn got %q, %v; want its reply and the notice, without the library's", r.b, r.err)
	}
	if a, pending := nc.Collect(false); a == nil || pending || string(a.Reply().Value) != "42" {
		t.Fatalf("collected %+v, pending %v", a, pending)
	}
	if n := hc.mostAtOnce(); n != 1 {
		t.Fatalf("%d reads at the connection at once", n)
	}
}

// TestReadWithAwaitInFlight: the other order. Await's read is at the connection first;
// pgconn's Read waits for its bytes to be accounted for rather than read beside it, and
// then gets its own, and its next read meets pgconn's deadline, not Await's.
func TestReadWithAwaitInFlight(t *testing.T) {
	nc, hc, app, lib, later := awaitFixture(t)
	awaitDeadline := time.Now().Add(time.Hour)
	done := make(chan bool)
	go func() { done <- nc.Await(awaitDeadline) }()
	if d := <-hc.started; !d.Equal(awaitDeadline) {
		t.Fatalf("Await's read met %v, want its own deadline", d)
	}
	got := pgconnReads(nc, len(app)+len(later))
	waitFor(t, nc, "pgconn's Read waiting for Await's", func() bool { return nc.rd.wake != nil })
	hc.feed <- bytes.Join([][]byte{app, lib}, nil)
	if !<-done {
		t.Fatal("Await did not read the library's reply")
	}
	if d := <-hc.started; !d.IsZero() {
		t.Fatalf("pgconn's read met %v: the library's deadline outlived its read", d)
	}
	hc.feed <- later
	if r := <-got; !bytes.Equal(r.b, append(append([]byte{}, app...), later...)) || r.err != nil {
		t.Fatalf("pgconn got %q, %v; want its reply and the notice", r.b, r.err)
	}
	if a, pending := nc.Collect(false); a == nil || pending || string(a.Reply().Value) != "42" {
		t.Fatalf("collected %+v, pending %v", a, pending)
	}
	if n := hc.mostAtOnce(); n != 1 {
		t.Fatalf("%d reads at the connection at once", n)
	}
}

// TestAwaitDeadlineNotPgconns: Await's deadline passing ends Await's read alone. pgconn's
// Read, waiting meanwhile, then reads with its own deadline (none) and gets its bytes
// and no timeout; the library's reply it brings is still taken out and collected.
func TestAwaitDeadlineNotPgconns(t *testing.T) {
	nc, hc, app, lib, _ := awaitFixture(t)
	done := make(chan bool)
	go func() { done <- nc.Await(time.Now().Add(time.Hour)) }()
	<-hc.started
	got := pgconnReads(nc, len(app))
	waitFor(t, nc, "pgconn's Read waiting for Await's", func() bool { return nc.rd.wake != nil })
	hc.expire <- struct{}{} // Await's deadline passes
	if <-done {
		t.Fatal("Await reported a reply that never came")
	}
	if d := <-hc.started; !d.IsZero() {
		t.Fatalf("pgconn's read met %v, the library's deadline", d)
	}
	hc.feed <- append(append([]byte{}, app...), lib...)
	if r := <-got; !bytes.Equal(r.b, app) || r.err != nil {
		t.Fatalf("pgconn got %q, %v; want its reply and no timeout", r.b, r.err)
	}
	if a, pending := nc.Collect(false); a == nil || pending || string(a.Reply().Value) != "42" {
		t.Fatalf("collected %+v, pending %v", a, pending)
	}
}

// TestDeadlinesKept: the connection's read deadline during a read of the library's is
// the sooner of pgconn's and the library's, follows a deadline pgconn sets meanwhile (its
// context watcher, from another goroutine), and is pgconn's again once the read ends.
func TestDeadlinesKept(t *testing.T) {
	base := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name              string
		pgconn, mid, lib  time.Time // pgconn's before, pgconn's set during the read, Await's
		during, duringMid time.Time // the connection's, before and after mid
	}{
		{"none of pgconn's", time.Time{}, time.Time{}, base, base, base},
		{"pgconn's sooner", base, base, base.Add(time.Minute), base, base},
		{"the library's sooner", base.Add(time.Minute), base.Add(time.Minute), base, base, base},
		{"pgconn cancels meanwhile", time.Time{}, base.Add(-time.Minute), base, base, base.Add(-time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, hc, app, lib, _ := awaitFixture(t)
			if err := nc.SetReadDeadline(tc.pgconn); err != nil {
				t.Fatal(err)
			}
			done := make(chan bool)
			go func() { done <- nc.Await(tc.lib) }()
			if d := <-hc.started; !d.Equal(tc.during) {
				t.Fatalf("the read met %v, want %v", d, tc.during)
			}
			if err := nc.SetDeadline(tc.mid); err != nil {
				t.Fatal(err)
			}
			if d := hc.readDeadline(); !d.Equal(tc.duringMid) {
				t.Fatalf("after pgconn set %v: %v, want %v", tc.mid, d, tc.duringMid)
			}
			hc.feed <- append(append([]byte{}, app...), lib...)
			if !<-done {
				t.Fatal("no reply")
			}
			if d := hc.readDeadline(); !d.Equal(tc.mid) {
				t.Fatalf("after the read: %v, want pgconn's %v", d, tc.mid)
			}
		})
	}
}

// concurrentConn counts the reads at a real connection at once.
type concurrentConn struct {
	net.Conn
	now, most atomic.Int32
}

func (c *concurrentConn) Read(p []byte) (int, error) {
	n := c.now.Add(1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	defer c.now.Add(-1)
	return c.Conn.Read(p)
}

// TestOneReaderStress: over a real loopback TCP connection to a scripted server that
// writes its replies in small chunks, a reader as pgconn's reads its bytes while Await
// runs at a random point of each round, in random interleavings (seeded, replayable with
// OTELPGXTX_WIRE_SEED). pgconn gets exactly its bytes, in order, every round; the library gets
// its reply whole; never two reads at the connection at once.
func TestOneReaderStress(t *testing.T) {
	seed := seedFromEnv(t)
	rng := rand.New(rand.NewPCG(seed, seed))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const rounds = 300
	type round struct {
		reply   []byte // what the server writes: pgconn's reply, the library's, perhaps a notice
		want    []byte // pgconn's part of it
		chunks  []int  // the sizes it writes reply in
		pauses  []int  // how often it yields between chunks
		awaitAt int    // how often the client yields before Await
	}
	plan := make([]round, rounds)
	app := encode(&pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}, &pgproto3.ReadyForQuery{TxStatus: 'T'})
	later := encode(&pgproto3.NoticeResponse{Severity: "NOTICE", Message: "later"})
	for i := range plan {
		lib := encode(&pgproto3.FunctionCallResponse{Result: fmt.Appendf(nil, "%d", i)}, &pgproto3.ReadyForQuery{TxStatus: 'T'})
		r := bytes.Join([][]byte{app, lib}, nil)
		plan[i].want = app
		if rng.IntN(2) == 0 { // pgconn's reader then stays at the connection for the notice
			r = append(r, later...)
			plan[i].want = append(append([]byte{}, app...), later...)
		}
		plan[i].reply = r
		for left := len(r); left > 0; {
			k := min(left, 1+rng.IntN(12))
			plan[i].chunks = append(plan[i].chunks, k)
			plan[i].pauses = append(plan[i].pauses, rng.IntN(4))
			left -= k
		}
		plan[i].awaitAt = rng.IntN(40)
	}
	query := frontendMsg(t, &pgproto3.Query{String: "insert"})
	call := frontendMsg(t, &pgproto3.FunctionCall{Function: 1})
	serverErr := make(chan error, 1)
	go func() {
		sc, err := ln.Accept()
		if err != nil {
			serverErr <- err
			return
		}
		defer sc.Close()
		in := make([]byte, len(query)+len(call))
		for _, r := range plan {
			if _, err := io.ReadFull(sc, in); err != nil {
				serverErr <- err
				return
			}
			off := 0
			for j, k := range r.chunks {
				if _, err := sc.Write(r.reply[off : off+k]); err != nil {
					serverErr <- err
					return
				}
				off += k
				for range r.pauses[j] {
					runtime.Gosched()
				}
			}
		}
		serverErr <- nil
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc := &concurrentConn{Conn: raw}
	nc := NewConn(cc, nil, true)
	defer nc.Close()
	for i, r := range plan {
		if !nc.Arm(&Addition{Kind: LibraryCall, Msg: call, After: true}) {
			t.Fatalf("round %d: refused", i)
		}
		if _, err := nc.Write(query); err != nil {
			t.Fatal(err)
		}
		got := pgconnReads(nc, len(r.want))
		for range r.awaitAt {
			runtime.Gosched()
		}
		if !nc.Await(time.Now().Add(time.Minute)) {
			t.Fatalf("round %d (seed %d): Await without the library's reply", i, seed)
		}
		res := <-got
		if !bytes.Equal(res.b, r.want) || res.err != nil {
			t.Fatalf("round %d (seed %d): pgconn got %q, %v; want %q", i, seed, res.b, res.err, r.want)
		}
		a, pending := nc.Collect(false)
		if a == nil || pending || string(a.Reply().Value) != fmt.Sprint(i) {
			t.Fatalf("round %d (seed %d): collected %+v, pending %v", i, seed, a, pending)
		}
		if held(nc) {
			t.Fatalf("round %d (seed %d): something left held", i, seed)
		}
	}
	if err := <-serverErr; err != nil {
		t.Fatal(err)
	}
	if n := cc.most.Load(); n != 1 {
		t.Fatalf("%d reads at the connection at once (seed %d)", n, seed)
	}
}

// seedFromEnv is OTELPGXTX_WIRE_SEED, or a fresh seed, logged so that a failure can be replayed.
func seedFromEnv(t *testing.T) uint64 {
	t.Helper()
	var seed uint64
	if s := os.Getenv("OTELPGXTX_WIRE_SEED"); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("OTELPGXTX_WIRE_SEED=%q: %v", s, err)
		}
	} else {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (OTELPGXTX_WIRE_SEED replays it)", seed)
	return seed
}
