package wire

import (
	"bytes"
	"encoding/binary"
	"slices"
	"sync/atomic"
)

// Addition is a message the library adds to one write of the application's. Ahead of it
// (After false), the write must be exactly one simple Query of the text Match; after it
// (After true), the write must be whole frontend messages that run a statement and end
// at a point where the server answers and reads on (see syncedWrite). Writes that are
// neither go out alone, and the addition waits for one that is.
type Addition struct {
	Kind  LibraryMessage
	Match string
	// Msg is the library's message, sent in the same write as the application's.
	Msg []byte
	// After: Msg follows the application's messages, and its reply follows theirs.
	After bool
	// Commit: Msg goes ahead of the application's COMMIT, in its transaction: an ERROR in
	// reply to it aborts the transaction, and COMMIT answers ROLLBACK; pgconn is given that
	// error in place of the ROLLBACK tag, then COMMIT's ReadyForQuery, which is what COMMIT
	// itself answers when it fails, and leaves the session idle as that would — unless it
	// only says that the transaction had already failed (25P02), when the ROLLBACK is
	// COMMIT's own answer. This is the one place that rule is written.
	Commit bool
	// Extended: Msg goes with a write that is one extended-protocol Sync group of the
	// application's (extendedGroup), in place of a Query of the text Match: ahead of it,
	// as a Query of its own (LibraryQuery, answered up to its ReadyForQuery), or, for
	// LibraryPortal, inside the implicit transaction the group runs in, after the
	// application's messages and before their Sync, where the server runs it only if
	// none of theirs failed, and answers it after their last Execute's completion.
	Extended bool
	// Ahead, with LibraryPortal: a Query of the library's (LibraryQuery) that goes ahead of
	// the group too, as a Query of its own, answered up to its ReadyForQuery before the
	// group's first reply (AheadReply): the connection's check, riding with its first
	// implicit transaction beside that transaction's own call.
	Ahead []byte
	ahead Reply
	// OrCall, with LibraryPortal: for a write that is no extended-protocol Sync group,
	// this FunctionCall after it instead (LibraryCall, After): the addition becomes that.
	OrCall []byte
	// AnyQuery: ahead of a write that is exactly one simple Query, whatever its text (pgx's
	// simple protocol writes the arguments into the text), or, with Extended, of one
	// extended-protocol Sync group that executes (not a prepare's).
	AnyQuery bool
	state    additionState
	// execs is how many Executes of the application's the group holds (LibraryPortal).
	execs int
	// syncs is how many replies, each ended by a ReadyForQuery, the application's
	// messages get before Msg's (After).
	syncs int
	// reply is what the server answered to it, as far as it was read.
	reply Reply
}

// additionState is where an addition is in its life. Each connection has at most one
// in flight: armed by the tracer before a BEGIN or COMMIT is handed to pgconn, taken by
// that write, its reply filtered out of what pgconn reads, collected by the tracer when
// the statement ends (Conn.Collect), in whichever state it reached.
type additionState uint8

const (
	// additionArmed: waiting for the write it was armed for (splice.next); a write that
	// is not that one leaves it, and Collect withdraws it when the statement ends.
	additionArmed additionState = iota + 1
	// additionUnsent: the write carrying it failed before any of its bytes left: the
	// server has seen nothing of it, and no reply will come.
	additionUnsent
	// additionWritten: some of its bytes left; the reply filter is taking its part of the
	// reply out of what pgconn reads.
	additionWritten
	// additionReplied: its part of the reply was read whole (reply.Done).
	additionReplied
)

// Sent reports whether any of a's bytes left: the server may have read it.
func (a *Addition) Sent() bool { return a.state >= additionWritten }

// Reply returns what the server answered to a, as far as it was read when a was
// collected.
func (a *Addition) Reply() Reply { return a.reply }

// AheadReply returns what the server answered to a's Query ahead of the group (Ahead), as
// far as it was read.
func (a *Addition) AheadReply() Reply { return a.ahead }

// addTo returns b with a's message added, appended to buf (empty, its room reused), and
// how many of its first bytes are the library's alone (ahead of b); ok is false, and
// nothing is added, unless b is a write a was armed for: ahead, exactly one simple Query of
// the text Match — a batch, a pipeline, the extended protocol or any other statement is
// left exactly as it is —; after, see syncedWrite.
func (a *Addition) addTo(b, buf []byte) (out []byte, cut int, ok bool) {
	if a.After {
		if a.syncs, ok = syncedWrite(b); !ok {
			return nil, 0, false
		}
		return append(append(slices.Grow(buf, len(b)+len(a.Msg)), b...), a.Msg...), 0, true
	}
	if a.Extended {
		group, execs := extendedGroup(b)
		switch {
		case !group && a.OrCall != nil:
			if _, ok := syncedWrite(b); !ok {
				return nil, 0, false // not the statement's write yet: a waits for it
			}
			a.Kind, a.Extended, a.After, a.Msg, a.OrCall = LibraryCall, false, true, a.OrCall, nil
			return a.addTo(b, buf)
		case !group && a.AnyQuery:
			return a.aheadOfQuery(b, buf)
		case !group, a.AnyQuery && execs == 0:
			// AnyQuery goes right ahead of the group that executes: a prepare's group
			// runs a transaction of its own (inside.go in package reference counts them).
			return nil, 0, false
		case a.Kind == LibraryPortal:
			if execs == 0 || len(a.Ahead) > 0 && bindsEarlierUnnamed(b) {
				return nil, 0, false
			}
			a.execs = execs
			sync := len(b) - 5
			out = append(append(append(append(slices.Grow(buf, len(a.Ahead)+len(a.Msg)+len(b)), a.Ahead...), b[:sync]...), a.Msg...), b[sync:]...)
			return out, len(a.Ahead), true
		case bindsEarlierUnnamed(b):
			return nil, 0, false
		}
		out = append(append(slices.Grow(buf, len(a.Msg)+len(b)), a.Msg...), b...)
		return out, len(a.Msg), true
	}
	if a.AnyQuery {
		return a.aheadOfQuery(b, buf)
	}
	if typ, n, _ := msgHeader(b); typ != 'Q' || n != len(b)-1 || len(b) != 1+4+len(a.Match)+1 ||
		string(b[5:len(b)-1]) != a.Match || b[len(b)-1] != 0 {
		return nil, 0, false
	}
	out = append(append(slices.Grow(buf, len(a.Msg)+len(b)), a.Msg...), b...)
	return out, len(a.Msg), true
}

// aheadOfQuery returns b with a's message ahead of it, appended to buf, when b is exactly
// one simple Query, whatever its text (AnyQuery).
func (a *Addition) aheadOfQuery(b, buf []byte) (out []byte, cut int, ok bool) {
	if typ, n, _ := msgHeader(b); typ != 'Q' || n != len(b)-1 || b[len(b)-1] != 0 {
		return nil, 0, false
	}
	out = append(append(slices.Grow(buf, len(a.Msg)+len(b)), a.Msg...), b...)
	return out, len(a.Msg), true
}

// syncedWrite reports whether b, a write of pgconn's, is whole frontend messages of the
// kinds that run statements — Parse, Bind, Describe, Execute, Close, Flush, Sync, Query —
// at least one of them executing (Execute or Query) and the last a Sync or a Query, and
// how many Syncs and Queries it holds: the server answers each of them with a
// ReadyForQuery and then reads the next message as a new one, so a message added after
// b is read as its own, and its reply follows those. A write that prepares only (pgx's
// Parse, Describe, Sync before a first execution), a pipeline's write that ends
// mid-sequence (where an error would make the server skip the added message), COPY's
// data, a FunctionCall or a Terminate is not one.
func syncedWrite(b []byte) (syncs int, ok bool) {
	executes := false
	var last byte
	for len(b) > 0 {
		_, n, ok := msgHeader(b)
		if !ok || len(b) < 1+n {
			return 0, false
		}
		switch last = b[0]; last {
		case 'S', 'Q':
			syncs++
			executes = executes || last == 'Q'
		case 'E':
			executes = true
		case 'P', 'B', 'D', 'C', 'H':
		default:
			return 0, false
		}
		b = b[1+n:]
	}
	return syncs, executes && (last == 'S' || last == 'Q')
}

// extendedGroup reports whether b is one extended-protocol Sync group — whole Parse,
// Bind, Describe, Close, Flush and Execute messages and exactly one Sync, its last — and
// how many Executes it holds: pgx's Bind/Describe/Execute/Sync, with a Parse ahead in the
// modes that parse each time, a batch's pipeline; or none, its Parse/Describe/Sync that
// prepares a statement before it first runs. The server runs an executing group in one
// implicit transaction, committed at that Sync.
func extendedGroup(b []byte) (group bool, execs int) {
	syncs := 0
	for len(b) > 0 {
		_, n, ok := msgHeader(b)
		if !ok || len(b) < 1+n {
			return false, 0
		}
		switch b[0] {
		case 'S':
			syncs++
		case 'E':
			execs++
		case 'P', 'B', 'D', 'C', 'H':
		default:
			return false, 0
		}
		if syncs > 0 && len(b) > 1+n {
			return false, 0 // something after the Sync
		}
		b = b[1+n:]
	}
	return syncs == 1, execs
}

// bindsEarlierUnnamed reports whether the group b binds the unnamed statement without
// parsing it first (pgx's describe-exec mode parses it in a write of its own): a Query
// ahead of b would destroy that statement (PostgreSQL drops the unnamed statement at
// every simple Query).
func bindsEarlierUnnamed(b []byte) bool {
	parsed := false
	for len(b) > 0 {
		_, n, _ := msgHeader(b)
		body := b[5 : 1+n]
		switch b[0] {
		case 'P':
			parsed = parsed || len(body) > 0 && body[0] == 0 // the unnamed statement
		case 'B':
			if i := bytes.IndexByte(body, 0); i >= 0 && i+1 < len(body) && body[i+1] == 0 && !parsed {
				return true // portal, then the statement's name: ""
			}
		}
		b = b[1+n:]
	}
	return false
}

// splice is the library's part in the stream: the addition armed for the next write
// (next), the reply filter that takes its part of the reply out of what pgconn reads
// (filter), the addition last written, for the tracer to collect (added), and where
// pgconn is in the server's messages (pos, when track). Conn.mu guards all but next,
// which Write takes without the lock.
type splice struct {
	// track: follow message boundaries in what pgconn is given (commit references on).
	track bool
	next  atomic.Pointer[Addition]
	pos   streamPos
	// ends watches what pgconn is given for the end of a transaction (end_watch.go);
	// endsFrom, set by WatchEnds, begins it afresh with the next bytes given.
	ends     endWatch
	endsFrom atomic.Bool
	// ran: pgconn wrote a message that runs a statement since WatchEnds (end_watch.go's
	// WroteStatement). Write sets it, on the connection's user's goroutine or pgconn's
	// asynchronous close, hence atomic.
	ran    atomic.Bool
	filter *replyFilter
	added  *Addition
	// filterMem is the filter start puts in place, and the messages it decodes into: one
	// per connection, reused, so that an addition allocates no filter. Only one is at work
	// at a time (Arm and startAddition wait for the last to end), and whoever holds filter
	// (Await, across a read) holds it while it is at work.
	filterMem replyFilter
	// wbuf is the buffer of a write carrying an addition (Addition.addTo), reused while
	// nobody is writing with it (wbufBusy).
	wbuf     []byte
	wbufBusy atomic.Bool
}

// delivered follows b, bytes given to pgconn: their message boundaries and, where they
// are followed (track), the transaction ends they show.
func (s *splice) delivered(b []byte) {
	if s.track {
		if s.endsFrom.Load() {
			s.endsFrom.Store(false)
			s.ends = endWatch{}
		}
		s.pos.advanceWatching(b, &s.ends)
		return
	}
	s.pos.advance(b)
}

// arm has the write a was armed for carry a (Conn.Arm says when it may).
func (s *splice) arm(a *Addition) {
	s.added = nil
	a.state = additionArmed
	s.next.Store(a)
}

// start puts a's reply filter in place, before a byte of its write leaves: the reply may
// come, and pgconn's background reader read it whole and move a on to replied, before
// Write returns.
func (s *splice) start(a *Addition) {
	s.filterMem = replyFilter{kind: a.Kind, after: a.After, commit: a.Commit, syncs: a.syncs, execs: a.execs}
	s.filter = &s.filterMem
	switch {
	case len(a.Ahead) > 0:
		// The Query ahead first, then the group's replies and the portal's among them.
		s.filter.kind, s.filter.then = LibraryQuery, true
	case a.After || a.execs > 0:
		s.filter.state = filterApplication
	}
	s.added = a
	a.state = additionWritten
}

// end keeps what the filter read of the library's reply and goes back to passing bytes
// through.
func (s *splice) end() {
	if s.added != nil {
		s.added.reply, s.added.ahead = s.filter.lib, s.filter.ahead
		s.added.state = additionReplied
	}
	s.filter = nil
}

// collect returns what became of the last addition written, once: nil if none was. An
// addition made after the application's messages whose reply is still on its way stays
// on the connection unless final: nil is returned, and pending says so.
func (s *splice) collect(final bool) (a *Addition, pending bool) {
	a = s.added
	if a == nil {
		return nil, false
	}
	if s.filter != nil {
		a.reply, a.ahead = s.filter.lib, s.filter.ahead // as far as it was read
	}
	if a.After && a.state == additionWritten && !a.reply.Done && !final {
		return nil, true
	}
	s.added = nil
	return a, false
}

// streamPos follows message boundaries in the bytes pgconn is given, so that the library
// adds to a write only when the server's stream is at a boundary: a reply reader that
// started in the middle of a message would misread it.
type streamPos struct {
	hdr  [5]byte
	hdrN int // bytes of the current message's header seen
	skip int // bytes of the current message's body still to come
}

// advance moves past b: from one whole message to the next where they lie whole in b, and
// byte by byte through one cut by the end of b.
func (p *streamPos) advance(b []byte) {
	for len(b) > 0 {
		if p.atBoundary() {
			if _, n, ok := msgHeader(b); ok && len(b) >= 1+n {
				b = b[1+n:]
				continue
			}
		}
		n, _, _ := p.step(b)
		b = b[n:]
	}
}

// step moves past b up to the end of the current message at most, and returns how many
// bytes that took, the message's type, and whether it ended there.
func (p *streamPos) step(b []byte) (n int, typ byte, whole bool) {
	if p.skip == 0 || p.hdrN > 0 {
		k := copy(p.hdr[p.hdrN:], b)
		p.hdrN += k
		n = k
		if p.hdrN < 5 {
			return n, 0, false
		}
		p.hdrN = 0
		_, length, _ := msgHeader(p.hdr[:])
		p.skip = max(length-4, 0)
	}
	k := min(p.skip, len(b)-n)
	p.skip -= k
	return n + k, p.hdr[0], p.skip == 0
}

// atBoundary reports whether the bytes so far end with a whole message.
func (p *streamPos) atBoundary() bool { return p.hdrN == 0 && p.skip == 0 }

// msgHeader reads the header that begins every protocol message after the startup, at
// the start of b: its type byte and its length, which counts itself and the body, not the
// type. ok is false when b is shorter than a header or the length is less than its own
// four bytes. It is the package's one reading of a header.
func msgHeader(b []byte) (typ byte, length int, ok bool) {
	if len(b) < 5 {
		return 0, 0, false
	}
	length = int(binary.BigEndian.Uint32(b[1:5]))
	return b[0], length, length >= 4
}
