package wire

import "bytes"

// EndSeen is what the server's replies that pgconn read showed of the end of the
// transaction that was open when the tracer last looked (Conn.WatchEnds): the first
// ReadyForQuery that said the session is idle, and the one transaction-ending command tag
// before it. Only a connection that follows message boundaries (commit references on)
// sees it.
type EndSeen uint8

const (
	// EndNotSeen: no ReadyForQuery said idle since the tracer last looked (or the
	// connection does not follow its messages).
	EndNotSeen EndSeen = iota
	// EndCommit, EndRollback, EndPrepare: idle, after exactly one COMMIT, ROLLBACK or
	// PREPARE TRANSACTION command tag — the server's word on how the transaction ended.
	EndCommit
	EndRollback
	EndPrepare
	// EndUnknown: idle, but no such tag before it, or several (a ROLLBACK TO SAVEPOINT
	// also answers ROLLBACK, and a string may end one transaction and begin another): the
	// replies do not say how it ended.
	EndUnknown
)

// endTags are the command tags that end a transaction, NUL included, by EndSeen.
var endTags = [...][]byte{EndCommit: []byte("COMMIT\x00"), EndRollback: []byte("ROLLBACK\x00"), EndPrepare: []byte("PREPARE TRANSACTION\x00")}

// maxSplits is how many Splits one reply records; a reply with more says so (Over).
const maxSplits = 8

// Splits are the transaction ends inside one reply — the messages up to a ReadyForQuery,
// the answer to one simple Query or one Sync — that more of the same reply followed: the
// COMMIT, ROLLBACK or PREPARE TRANSACTION command tags, in order, each followed by
// another statement's messages (its completion, its rows, its error). A string
// "insert …; commit; insert …; select 1/0" or a batch with BEGIN … COMMIT and more after
// it has one, the COMMIT: the transaction before it ended there, as the tag says, and what
// came after it ran in another. An ending tag right before the ReadyForQuery is the
// reply's own end, no split. A reply cut off before its ReadyForQuery (Cut) ends with the
// last ending tag read, which nothing was seen to follow.
type Splits struct {
	ends [maxSplits]EndSeen
	n    uint8
	// Over: the reply had more splits than maxSplits; the first are kept.
	Over bool
	// Cut: the reply was not read to its ReadyForQuery: the connection ended in it.
	Cut bool
}

// Len is how many splits s holds.
func (s *Splits) Len() int { return int(s.n) }

// At is the i-th split, in the order the server sent them.
func (s *Splits) At(i int) EndSeen { return s.ends[i] }

// push adds e.
func (s *Splits) push(e EndSeen) {
	if int(s.n) == maxSplits {
		s.Over = true
		return
	}
	s.ends[s.n] = e
	s.n++
}

// endWatch follows the messages pgconn reads for the end of a transaction (EndSeen): it
// keeps the first bytes of each CommandComplete and ReadyForQuery body. It allocates
// nothing.
type endWatch struct {
	typ   byte
	body  [20]byte // the longest tag of endTags
	bodyN int
	tag   EndSeen // the ending tag seen since the reset
	tags  int     // how many
	idle  bool    // a ReadyForQuery said idle since the reset: the watch is done
	// lastClean: the last ReadyForQuery said idle, with no ErrorResponse since the one
	// before it (failedSince), whatever came before: the reply of the last Sync.
	lastClean, failedSince bool
	// cur are the splits of the reply under way, pending its last ending tag not yet
	// followed by anything, began whether any of it came; last are those of the last
	// reply read whole.
	cur, last Splits
	pending   EndSeen
	began     bool
}

// start begins a message of type typ.
func (w *endWatch) start(typ byte) { w.typ, w.bodyN = typ, 0 }

// add takes the next bytes of the message's body.
func (w *endWatch) add(b []byte) {
	if w.typ == 'C' || w.typ == 'Z' {
		w.bodyN += copy(w.body[w.bodyN:], b)
	}
}

// end ends the message, whose body's first bytes add kept.
func (w *endWatch) end() { w.ended(w.body[:w.bodyN]) }

// message watches a whole message of type typ whose body lies in the bytes given to
// pgconn, where it lies: what start, add and end do, without copying a byte. Only the
// body's first len(w.body) bytes are read, as add keeps them.
func (w *endWatch) message(typ byte, body []byte) {
	w.typ = typ
	w.ended(body[:min(len(body), len(w.body))])
}

// ended ends the message of type w.typ whose body begins with body (its first
// len(w.body) bytes at most).
func (w *endWatch) ended(body []byte) {
	var ending EndSeen
	idle := w.typ == 'Z' && len(body) == 1 && body[0] == 'I'
	switch w.typ {
	case 'E':
		w.failedSince = true
	case 'C':
		ending = endTag(body)
	case 'Z':
		w.lastClean = idle && !w.failedSince
		w.failedSince = false
	}
	w.split(ending)
	if w.idle {
		return
	}
	switch w.typ {
	case 'C':
		if ending != EndNotSeen {
			w.tag, w.tags = ending, w.tags+1
		}
	case 'Z':
		w.idle = idle
	}
}

// endTag is the ending a CommandComplete's tag says (body: the tag, NUL included, or its
// first bytes), or EndNotSeen.
func endTag(body []byte) EndSeen {
	for k := EndCommit; k <= EndPrepare; k++ {
		if bytes.Equal(body, endTags[k]) {
			return k
		}
	}
	return EndNotSeen
}

// split follows the message just ended (ending: the end its tag says) for Splits: a
// ReadyForQuery ends the reply, a notice, parameter status or notification says nothing of
// a statement, and any other message is a statement's, after the pending ending if any.
func (w *endWatch) split(ending EndSeen) {
	switch w.typ {
	case 'Z':
		w.last, w.cur, w.pending, w.began = w.cur, Splits{}, EndNotSeen, false
		return
	case 'N', 'S', 'A':
		return // may come between replies too
	}
	w.began = true
	if w.pending != EndNotSeen {
		w.cur.push(w.pending)
	}
	w.pending = ending
}

// splits are the splits of the query's reply: the last read whole, unless one was begun
// after it and not finished (the connection ended in it), whose last ending tag counts too.
func (w *endWatch) splits() Splits {
	if !w.began {
		return w.last
	}
	s := w.cur
	if w.pending != EndNotSeen {
		s.push(w.pending)
	}
	s.Cut = true
	return s
}

// clean reports whether the last ReadyForQuery since the reset said idle, with no
// ErrorResponse since the ReadyForQuery before it.
func (w *endWatch) clean() bool { return w.lastClean }

// seen is what the watch saw since its reset.
func (w *endWatch) seen() EndSeen {
	switch {
	case !w.idle:
		return EndNotSeen
	case w.tags == 1:
		return w.tag
	}
	return EndUnknown
}

// advanceWatching moves p past b, as advance does, and gives w the messages it passes. A
// message that lies whole in b is read where it lies; only one cut by the end of b is
// followed byte by byte (its header and the first bytes of its body kept).
func (p *streamPos) advanceWatching(b []byte, w *endWatch) {
	for len(b) > 0 {
		if p.atBoundary() {
			if typ, n, ok := msgHeader(b); ok && len(b) >= 1+n {
				w.message(typ, b[5:1+n])
				b = b[1+n:]
				continue
			}
		}
		inBody, hdrBefore := p.hdrN == 0 && p.skip > 0, p.hdrN
		n, typ, whole := p.step(b)
		body := b[:n]
		if !inBody {
			if p.hdrN > 0 {
				return // a header not whole yet: nothing of a body
			}
			w.start(typ)
			body = body[5-hdrBefore:]
		}
		w.add(body)
		if whole {
			w.end()
		}
		b = b[n:]
	}
}

// WatchEnds starts the watch for the end of the transaction open now: what the replies
// pgconn reads from here on show of it (SeenEnd). The tracer calls it as each query it
// sees ends, when pgconn has read that query's replies: one atomic store, the watch being
// begun afresh by the next bytes pgconn is given (splice.delivered).
func (c *Conn) WatchEnds() {
	c.splice.endsFrom.Store(true)
	c.splice.ran.Store(false)
}

// WroteStatement reports whether pgconn wrote, since WatchEnds, a message that runs a
// statement (see runsStatement). Asked where no query the tracer sees is in flight, it
// tells whether a statement went past the tracer — a COMMIT sent on the PgConn, perhaps,
// whose reply a fault then lost: the session's end no longer says the transaction rolled
// back.
func (c *Conn) WroteStatement() bool { return c.splice.ran.Load() }

// wrote notes b, bytes pgconn is about to write, for WroteStatement (before the write: a
// write that fails half way may have sent the statement). Once a statement is noted it
// costs one atomic load.
func (s *splice) wrote(b []byte) {
	if !s.ran.Load() && runsStatement(b) {
		s.ran.Store(true)
	}
}

// runsStatement reports whether b, one write of pgconn's, holds a message that runs a
// statement — a Query, an Execute, a FunctionCall — or one it cannot read whole, which
// may be one. pgconn writes whole messages; what runs nothing (Terminate, Sync, Flush,
// Close, Parse, Bind, Describe: a Close of a prepared statement, Terminate at close)
// cannot have ended a transaction.
func runsStatement(b []byte) bool {
	for len(b) > 0 {
		typ, n, ok := msgHeader(b)
		if !ok || len(b) < 1+n {
			return true
		}
		switch typ {
		case 'Q', 'E', 'F':
			return true
		}
		b = b[1+n:]
	}
	return false
}

// RepliedClean reports whether the last ReadyForQuery pgconn read since WatchEnds said
// idle, with no ErrorResponse since the ReadyForQuery before it. Read once pgconn has
// read a query's reply to its end (the connection still open), that is the reply of the
// query's last Sync: sent while the session was idle, the statements before that Sync
// ran in one implicit transaction, which the server committed before that ReadyForQuery
// (it reports a failed commit as an ERROR).
func (c *Conn) RepliedClean() bool {
	if !c.splice.track {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.splice.endsFrom.Load() && c.splice.ends.clean()
}

// Splits are the transaction ends inside the last reply pgconn read since WatchEnds, or in
// the one it was reading when the connection ended (see Splits): read when a query ends,
// it is that query's reply.
func (c *Conn) Splits() Splits {
	if !c.splice.track {
		return Splits{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.splice.endsFrom.Load() {
		return Splits{} // nothing given to pgconn since
	}
	return c.splice.ends.splits()
}

// SeenEnd is what the replies pgconn read since WatchEnds showed of the end of the
// transaction then open (see EndSeen).
func (c *Conn) SeenEnd() EndSeen {
	if !c.splice.track {
		return EndNotSeen
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.splice.endsFrom.Load() {
		return EndNotSeen // nothing given to pgconn since
	}
	return c.splice.ends.seen()
}
