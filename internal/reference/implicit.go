package reference

import (
	"bytes"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txevidence/otelpgxtx/internal/sqltext"
	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
)

// The references of an implicit transaction: a write sent outside a transaction block,
// which the server commits at the Sync after it. Its one write is its COMMIT: what the
// reference needs rides in the same Sync group, after the statement and before the Sync.

// MissingSimpleProtocol is Frame.Missing's word for an implicit transaction sent as a
// simple Query (pgx's simple protocol — pgx's Exec without arguments too —, CopyFrom,
// several statements in one string): a Query is a transaction of its own, so nothing can
// join it without changing the application's SQL, and a message before or after it would
// be another transaction.
const MissingSimpleProtocol = "simple_protocol"

// Frame.Missing's words for the other implicit transactions without a reference:
// MissingUnchecked, the connection's first, whose write carried the check;
// MissingNoTransactionBlock, a statement that may not run in a transaction block (only
// INSERT, UPDATE, DELETE, MERGE, SELECT and WITH carry one); MissingXIDLost, the xid read
// went, and its reply was lost with the commit's. MissingImplicit stays for the rest.
const (
	MissingUnchecked          = "unchecked"
	MissingNoTransactionBlock = "no_transaction_block"
	MissingXIDLost            = "xid_lost"
)

// ArmImplicit has the write of f's implicit transaction (the statement s) carry what f's
// reference needs, when its references are on and the write is one executing
// extended-protocol Sync group (wire.Addition.Extended; else, a simple Query, it carries
// nothing: f has no reference, MissingSimpleProtocol):
//
//   - on a connection not checked yet (or whose marker function is not), the check, as a
//     Query of its own ahead of the group, which changes nothing of the application's
//     whatever it answers, and, inside the group, the xid read, which cannot fail on the
//     PostgreSQL 13 or later the server said it is at connection start: f's reference is
//     that xid, once the check answered (the connection's first write is settled as any
//     other — the moment indeterminate commits cluster, after a failover or a restart,
//     is the moment connections are new); with the marker, the connection's later writes
//     carry the marker call;
//   - else, after the statement, inside its implicit transaction, the call of the marker
//     function (WithCommitMarker), or the xid read (pg_current_xact_id_if_assigned), then
//     a Flush: the server sends the call's reply before it commits at the Sync, so that
//     a commit whose own reply is lost (a connection cut, a backend ended in its
//     synchronous-replication wait) leaves the reference on the client. The call runs
//     only if the statement did not fail; the marker row commits or rolls back with it;
//     neither assigns an xid to a statement that wrote nothing.
//
// Only after a statement that may run in a transaction block (INSERT, UPDATE, DELETE,
// MERGE, SELECT, WITH): a second statement makes the group an implicit transaction block,
// which VACUUM, CREATE INDEX CONCURRENTLY and the like refuse.
func (c *Conn) ArmImplicit(f *Frame, s Statement, serverVersion string) *Off {
	if f == nil {
		return nil
	}
	if !c.on(f.refs) {
		return nil
	}
	f.implicit = true
	if c.adding {
		return nil
	}
	// A transaction-control statement (a COMMIT, a ROLLBACK) or one that may commit inside
	// (a CALL) among a batch's statements ends the transaction f began before the Sync:
	// what rides ahead of the Sync runs in, and answers for, the group's last transaction,
	// which is not f's (TestCommitsMoreThanOnce, "batch: insert, commit, cut, then 1/0":
	// a marker there, absent, reconciled f aborted while its row was committed).
	several := !s.Single && (!s.Plain || s.Inside)
	if several {
		f.implicitWhy = MissingMultiStatement
	}
	if _, checked := c.marker(f.refs.Marker); c.state != on || f.refs.Mode == Marker && !checked {
		if !several {
			f.implicitWhy = MissingUnchecked
		}
		var then []byte
		if c.postgres && runsInBlock(s.SQL) && !several {
			// What cannot fail rides with the check: the xid read (the server is PostgreSQL
			// 13 or later, as it reported at connection start), inside the transaction, the
			// check ahead of it as a Query of its own; the marker waits for a connection
			// whose marker function is checked.
			then = c.implicitMsg(nil, f.id)
		}
		off := c.armCheck(f.refs, serverVersion, true, "", "", true, then)
		if c.adding {
			c.implicit = f
		}
		return off
	}
	if several {
		return nil
	}
	if !runsInBlock(s.SQL) {
		f.implicitWhy = MissingNoTransactionBlock
		if s.Inside {
			return c.armInside(f, s)
		}
		return nil
	}
	m := c.markerOf(f.refs)
	if c.nc.Arm(&wire.Addition{Kind: wire.LibraryPortal, Extended: true, Commit: true, Msg: c.implicitMsg(m, f.id)}) {
		c.adding, c.implicit, f.marker = true, f, m
	}
	return nil
}

// runsInBlock reports whether sql is one statement that may run in a transaction block,
// by its first keyword.
func runsInBlock(sql string) bool {
	w, _ := sqltext.NextWord(sql)
	for _, k := range []string{"insert", "update", "delete", "merge", "select", "with"} {
		if strings.EqualFold(w, k) {
			return true
		}
	}
	return false
}

// implicitXIDSQL is the xid read after an implicit transaction's statement.
const implicitXIDSQL = "select pg_catalog.pg_current_xact_id_if_assigned()::text"

// implicitMsg is the call after an implicit transaction's statement, for operation id:
// m's marker function (nil: the xid read) as extended-protocol messages of the unnamed
// statement, which the application's Bind ahead of them has used already — Parse, Bind,
// Execute — and a Flush. The bytes are the connection's, valid until the next call.
func (c *Conn) implicitMsg(m *markerFn, id outcome.OperationID) []byte {
	if m == nil {
		if c.implicitXID == nil {
			c.implicitXID = portalMsg(implicitXIDSQL)
		}
		return c.implicitXID
	}
	if m.portal == nil {
		sql := markerCallSQL(m.table)
		m.portal = portalMsg(sql)
		m.portalArgAt = bytes.Index(m.portal, []byte(sql)) + strings.Index(sql, "'") + 1
	}
	const hexDigits = "0123456789abcdef"
	for i, v := range id {
		m.portal[m.portalArgAt+2*i] = hexDigits[v>>4]
		m.portal[m.portalArgAt+2*i+1] = hexDigits[v&0xf]
	}
	return m.portal
}

// portalMsg is sql as the unnamed statement's Parse, Bind and Execute, and a Flush.
func portalMsg(sql string) []byte {
	b, _ := (&pgproto3.Parse{Query: sql}).Encode(nil)
	b, _ = (&pgproto3.Bind{}).Encode(b)
	b, _ = (&pgproto3.Execute{}).Encode(b)
	b, _ = (&pgproto3.Flush{}).Encode(b)
	return b
}
