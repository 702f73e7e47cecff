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
// reference needs rides ahead of the statement, in the same Sync group.

// MissingSimpleProtocol is Frame.Missing's word for an implicit transaction sent as a
// simple Query (pgx's simple protocol, CopyFrom, several statements in one string): a
// Query is a transaction of its own, so nothing can join it without changing the
// application's SQL, and a message before or after it would be another transaction.
const MissingSimpleProtocol = "simple_protocol"

// implicitName is the prepared statement of the marker call ahead of an implicit
// transaction: the unnamed statement may be the application's, bound in this write.
const implicitName = "otelpgxtx_marker"

// ArmImplicit has the write of f's implicit transaction (the statement s) carry what f's
// reference needs, when its references are on and the write is one extended-protocol
// Sync group (wire.Addition.Extended; else, a simple Query, it carries nothing: f has no
// reference, MissingSimpleProtocol):
//
//   - on a connection not checked yet (or whose marker function is not), the check,
//     as a Query of its own ahead of the group, which changes nothing of the application's;
//     f has no reference (MissingImplicit), the next implicit transaction will;
//   - with the commit marker, the call of the marker function ahead of the statement,
//     inside the implicit transaction: the marker row commits or rolls back with the
//     statement, whatever became of its reply. Only ahead of a statement that may run in
//     a transaction block (INSERT, UPDATE, DELETE, MERGE, SELECT, WITH): a second
//     statement makes the group an implicit transaction block, which VACUUM, CREATE
//     INDEX CONCURRENTLY and the like refuse.
//
// The xid has no such place: pg_current_xact_id_if_assigned ahead of the statement finds
// none, and after it, before the Sync, its reply comes with the commit's. f then has no
// reference (MissingImplicit).
func (c *Conn) ArmImplicit(f *Frame, s Statement, serverVersion string) *Off {
	if !c.on(f.Refs) {
		return nil
	}
	f.implicit = true
	if c.adding {
		return nil
	}
	if _, checked := c.marker(f.Refs.Marker); c.state != on || f.Refs.Mode == Marker && !checked {
		off := c.armCheck(f.Refs, serverVersion, true, "", "", true)
		if c.adding {
			c.implicit = f
		}
		return off
	}
	m := c.markerOf(f.Refs)
	if m == nil || !runsInBlock(s.SQL) {
		return nil
	}
	if c.nc.Arm(&wire.Addition{Kind: wire.LibraryPortal, Extended: true, Commit: true, Msg: m.portalMsg(f.id)}) {
		c.adding, c.implicit, f.marker, f.extended = true, f, m, true
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

// portalMsg is the marker call for operation id as extended-protocol messages of a
// statement of the library's (implicitName, closed first, so that it is parsed anew,
// under the schema-qualified name, as the Query form is): Close, Parse, Bind, Execute.
// The bytes are m's, valid until the next call.
//
// Ahead of the application's statement the transaction has no xid yet, and the marker
// function writes only in a transaction that has one (a COMMIT's call comes after the
// writes): its argument assigns it (pg_current_xact_id, which also works in a read-only
// transaction), evaluated, as every argument is, before the function runs.
func (m *markerFn) portalMsg(id outcome.OperationID) []byte {
	if m.portal == nil {
		sql := "select " + m.table + "(case when pg_catalog.pg_current_xact_id() is not null then '" +
			strings.Repeat("0", 2*len(outcome.OperationID{})) + "'::pg_catalog.uuid end)"
		b, _ := (&pgproto3.Close{ObjectType: 'S', Name: implicitName}).Encode(nil)
		b, _ = (&pgproto3.Parse{Name: implicitName, Query: sql}).Encode(b)
		b, _ = (&pgproto3.Bind{PreparedStatement: implicitName}).Encode(b)
		b, _ = (&pgproto3.Execute{}).Encode(b)
		m.portal = b
		m.portalArgAt = bytes.Index(b, []byte(sql)) + strings.Index(sql, "'") + 1
	}
	const hexDigits = "0123456789abcdef"
	for i, v := range id {
		m.portal[m.portalArgAt+2*i] = hexDigits[v>>4]
		m.portal[m.portalArgAt+2*i+1] = hexDigits[v&0xf]
	}
	return m.portal
}
