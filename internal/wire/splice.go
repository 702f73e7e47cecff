package wire

import (
	"encoding/binary"
	"sync/atomic"
)

// Addition is a message the library adds to one write of the application's: the write
// must be exactly one simple Query of the text Match, else nothing is added.
type Addition struct {
	Kind  LibraryMessage
	Match string
	// Before is sent ahead of the application's message, in the same write.
	Before []byte
	state  additionState
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

// addTo returns b with a's message added, and how many of its first bytes are the
// library's alone; ok is false, and nothing is added, unless b is exactly one simple
// Query of the text a was armed for: a batch, a pipeline, the extended protocol or any
// other statement is left exactly as it is.
func (a *Addition) addTo(b []byte) (out []byte, cut int, ok bool) {
	if len(b) != 1+4+len(a.Match)+1 || b[0] != 'Q' || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-1 ||
		string(b[5:len(b)-1]) != a.Match || b[len(b)-1] != 0 {
		return nil, 0, false
	}
	out = append(append(make([]byte, 0, len(a.Before)+len(b)), a.Before...), b...)
	return out, len(a.Before), true
}

// splice is the library's part in the stream: the addition armed for the next write
// (next), the reply filter that takes its part of the reply out of what pgconn reads
// (filter), the addition last written, for the tracer to collect (added), and where
// pgconn is in the server's messages (pos, when track). Conn.mu guards all but next,
// which Write takes without the lock.
type splice struct {
	// track: follow message boundaries in what pgconn is given (commit references on).
	track  bool
	next   atomic.Pointer[Addition]
	pos    streamPos
	filter *replyFilter
	added  *Addition
}

// arm has the next write carry a. It is refused when the server's stream is not at a
// message boundary or a reply filter is still at work: a reply reader must start at the
// reply's first message.
func (s *splice) arm(a *Addition) bool {
	if s.filter != nil || !s.pos.atBoundary() {
		return false
	}
	s.added = nil
	a.state = additionArmed
	s.next.Store(a)
	return true
}

// start puts a's reply filter in place, before a byte of its write leaves: the reply may
// come, and pgconn's background reader read it whole and move a on to replied, before
// Write returns.
func (s *splice) start(a *Addition) {
	s.filter = &replyFilter{kind: a.Kind}
	s.added = a
	a.state = additionWritten
}

// end keeps what the filter read of the library's reply and goes back to passing bytes
// through.
func (s *splice) end() {
	if s.added != nil {
		s.added.reply = s.filter.lib
		s.added.state = additionReplied
	}
	s.filter = nil
}

// collect returns what became of the last addition written, once: nil if none was.
func (s *splice) collect() *Addition {
	a := s.added
	s.added = nil
	if a != nil && s.filter != nil && s.filter.kind == a.Kind {
		a.reply = s.filter.lib // as far as it was read
	}
	return a
}
