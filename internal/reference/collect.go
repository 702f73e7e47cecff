package reference

import (
	"strconv"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Collected is what an addition's reply brought that the caller records: the server
// answered the call ahead of COMMIT with a FATAL, after which it read nothing more (COMMIT
// never ran), or with an ERROR (COMMIT rolls back); a check turned references or a marker off (its notice, for one log record).
type Collected struct {
	FatalBeforeCommit bool
	// AbortedBefore is the ERROR the server answered the call ahead of COMMIT with, on
	// a connection to the server itself (a pooler in between could send one of its own
	// after the server committed): the transaction was aborted before COMMIT was read.
	AbortedBefore error
	Off           *Off
	// Checked: the connection's check answered now (Conn.Recovery says whether it saw the
	// end of a crash recovery).
	Checked bool
	// ReadFailed is the failure of the frame's xid read, classified ReadFailedAs, which
	// pgconn never saw: the transaction is aborted, and it is the cause of the rollback
	// to come (the caller feeds it to the frame's evidence). Nil unless it is the first.
	ReadFailed   error
	ReadFailedAs classifier.Classification
}

// Collect collects, after the query it was armed for, what became of the library's
// addition: the cluster identity after a BEGIN; f's reference after its COMMIT; the xid
// after a statement, once its reply is in or final. A failure of the xid read of f is
// returned (ReadFailed): the transaction is aborted, and that failure, which pgconn never
// saw, is the cause of the rollback to come.
func (c *Conn) Collect(f *Frame, final bool) Collected {
	if !c.adding {
		return Collected{}
	}
	a, pending := c.nc.Collect(final) // withdrawn if its write never came
	if pending {
		return Collected{} // the xid read's reply is still on its way
	}
	c.adding = false
	reading, preparing, implicit, inside := c.reading, c.preparing, c.implicit, c.inside
	c.reading, c.preparing, c.implicit, c.inside = nil, nil, nil, nil
	if a == nil && implicit != nil {
		// No write of the implicit transaction took what was armed (its call, or the check
		// ahead of any Sync group): it went as a simple Query.
		implicit.simple, implicit.marker = true, nil
	}
	if a == nil || !a.Sent() {
		return Collected{} // tried again at the next BEGIN, statement or COMMIT
	}
	r := a.Reply()
	switch {
	case inside != nil:
		c.collectInside(inside, r)
		return Collected{}
	case a.After || reading != nil:
		// The xid read after a statement: after its Sync (a FunctionCall), or inside its
		// Sync group, whose ERROR the filter keeps from pgconn as it keeps the call's.
		if reading == nil || !reading.life.Open() {
			return Collected{}
		}
		switch {
		case r.ErrCode != "" && r.ErrCode != pg.InFailedTransaction && !reading.life.Failed():
			// The read itself failed (a cancel landed on it, a privilege revoked since the
			// check). The references are on only where the server is PostgreSQL. The
			// reading frame is f: the one open on the connection, as when it read.
			if reading == f {
				return Collected{ReadFailed: r.Err,
					ReadFailedAs: classifier.Classify(outcome.PhaseActive, r.Err, classifier.Facts{Server: classifier.ServerPostgreSQL})}
			}
		case r.Done && r.GotValue:
			// The xid, if the read found one: a later statement's read is tried when it
			// found none (NULL), never once it found one.
			if xid, err := strconv.ParseUint(string(r.Value), 10, 64); err == nil {
				reading.xid = xid
			}
		}
		return Collected{}
	case !a.Commit:
		if !r.Done || r.Fatal {
			// The connection ended before the check was answered: nothing was checked, and
			// the connection is gone with whatever BEGIN it carried.
			return Collected{}
		}
		if pg.Transient(r.ErrCode) {
			// A cancel or a timeout hit the check, not an answer to it: asked again at the
			// next BEGIN.
			return Collected{}
		}
		out := Collected{Off: c.checked(r), Checked: true}
		if xid := c.preparedXID; xid != 0 && preparing != nil && preparing == f && c.Known() {
			f.ref = c.ref(xid)
		}
		c.preparedXID = 0
		return out
	}
	var out Collected
	if len(a.Ahead) > 0 {
		// The check rode ahead of the implicit transaction's xid read: the reference is
		// that xid only if the check answered and the connection's references are on.
		ahead := a.AheadReply()
		if ahead.Fatal {
			// The server ended the session at the check: it read nothing after it, so the
			// implicit transaction never ran.
			return Collected{FatalBeforeCommit: true}
		}
		if !ahead.Done || pg.Transient(ahead.ErrCode) {
			return Collected{}
		}
		out = Collected{Off: c.checked(ahead), Checked: true}
		if !c.Known() {
			return out
		}
	}
	if f != nil && !r.Fatal {
		f.ref = c.callRef(f.marker, f.id, r)
		if f.ref == nil && f.implicit && f.marker == nil && !r.GotValue && r.ErrCode == "" {
			f.implicitWhy = MissingXIDLost
		}
	}
	out.FatalBeforeCommit = r.Fatal
	if r.ErrCode != "" && !r.Fatal && !c.identity.pooled {
		out.AbortedBefore = r.Err
	}
	return out
}
