package reference

import (
	"encoding/hex"
	"strconv"

	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
)

// ArmCall has the write of f's COMMIT (the statement s) carry the call of the marker
// function, or the xid read, when f's transaction can have a reference: it wrote something
// the tracer saw (or its references go with every commit, Run's), did not begin read-only,
// has not failed, and commits with a lone COMMIT Query. When the xid read after a
// statement found the xid, COMMIT carries nothing for it, and the reference is that xid's.
// A COMMIT among other statements of one string carries nothing (the call would have to
// go between the application's statements): without a found xid the frame has no
// reference, for that reason (Frame.Missing).
func (c *Conn) ArmCall(f *Frame, s Statement) {
	if f == nil {
		return
	}
	f.multiCommit = s.Commit && !s.Single && c.on(f.refs)
	if !c.on(f.refs) || !c.Known() || !f.life.Wrote() && !f.refs.Every || f.life.ReadOnly() || !s.InTx {
		return
	}
	f.marker = c.markerOf(f.refs)
	if f.xid != 0 && f.marker == nil {
		f.ref = c.ref(f.xid)
		return
	}
	if c.adding || !s.Single || !s.Commit {
		return
	}
	msg, kind := c.callMsg(f.marker, f.id)
	if c.nc.Arm(&wire.Addition{Kind: kind, Match: s.SQL, Msg: msg, Commit: true}) {
		c.adding = true
	}
}

// callMsg returns the call to send ahead of a COMMIT of operation id, and its kind: m's
// marker function (a Query) when m is usable, else the xid read (a fast-path call). The
// bytes are the connection's, valid until the next call: both Run and the tracer write them out
// before that.
func (c *Conn) callMsg(m *markerFn, id outcome.OperationID) ([]byte, wire.LibraryMessage) {
	if m != nil && m.msg != nil {
		hex.Encode(m.msg[m.argAt:], id[:])
		return m.msg, wire.LibraryQuery
	}
	return c.xidCall, wire.LibraryCall
}

// callRef is the reference of a COMMIT sent right after the call of m (nil: the xid read)
// for operation id, from the call's reply r, which is whole (done) when it was read,
// empty when no reply came. With a marker the reference stands without a reply: the
// function inserts the marker unless the transaction had no xid or was read-only, and
// neither can leave anything durable behind (PostgreSQL refuses a read-only
// transaction every write to a permanent relation, 25006; one without an xid wrote none),
// so the marker's absence still proves that none of the transaction's work is there.
// A reply says exactly what the call did: 'm' and the xid (the marker was inserted),
// 'r' and the xid (read-only: the xid alone), 'n' (no xid: nothing written).
func (c *Conn) callRef(m *markerFn, id outcome.OperationID, r wire.Reply) *outcome.ReconciliationRef {
	if r.ErrCode != "" {
		return nil // the call failed: the transaction was aborted, COMMIT rolls it back
	}
	if m == nil || m.msg == nil {
		if !r.GotValue {
			return nil // the xid never arrived
		}
		xid, err := strconv.ParseUint(string(r.Value), 10, 64) // NULL: 0, it wrote nothing
		if r.Value != nil && err != nil {
			return nil
		}
		return c.ref(xid)
	}
	v := string(r.Value)
	var xid uint64
	var err error
	if len(v) > 1 {
		xid, err = strconv.ParseUint(v[1:], 10, 64)
	}
	switch {
	case !r.GotValue, len(v) > 1 && v[0] == 'm' && err == nil:
		ref := c.ref(xid) // 0: no reply came
		ref.MarkerTable, ref.Operation, ref.CheckedAt = m.ref, id, c.identity.checkedAt
		return ref
	case v == "n":
		return c.ref(0)
	case len(v) > 1 && v[0] == 'r' && err == nil:
		return c.ref(xid)
	}
	return nil // not the function MarkerTableDDL makes
}
