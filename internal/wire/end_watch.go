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
}

// start begins a message of type typ.
func (w *endWatch) start(typ byte) { w.typ, w.bodyN = typ, 0 }

// add takes the next bytes of the message's body.
func (w *endWatch) add(b []byte) {
	if w.typ == 'C' || w.typ == 'Z' {
		w.bodyN += copy(w.body[w.bodyN:], b)
	}
}

// end ends the message.
func (w *endWatch) end() {
	switch w.typ {
	case 'E':
		w.failedSince = true
	case 'Z':
		w.lastClean = w.bodyN == 1 && w.body[0] == 'I' && !w.failedSince
		w.failedSince = false
	}
	if w.idle {
		return
	}
	body := w.body[:w.bodyN]
	switch w.typ {
	case 'C':
		for k := EndCommit; k <= EndPrepare; k++ {
			if bytes.Equal(body, endTags[k]) {
				w.tag, w.tags = k, w.tags+1
			}
		}
	case 'Z':
		w.idle = len(body) == 1 && body[0] == 'I'
	}
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

// advanceWatching moves p past b, as advance does, and gives w the messages it passes.
func (p *streamPos) advanceWatching(b []byte, w *endWatch) {
	for len(b) > 0 {
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
func (c *Conn) WatchEnds() { c.splice.endsFrom.Store(true) }

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
