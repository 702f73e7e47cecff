package reference

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// The check ahead of a connection's first BEGIN: the cluster identity and the marker
// functions, in that BEGIN's write.

// check is what a check ahead of BEGIN asks: the cluster identity, and a marker
// function (its quoted table; "" for none); ahead of COMMIT PREPARED or ROLLBACK
// PREPARED, also the xid of the prepared transaction of gid (its string literal).
type check struct {
	identity bool
	marker   string
	gid      string
}

// ArmCheck has the write of a BEGIN (the statement sql, sent as a lone simple Query)
// carry, ahead of it, what refs need that the connection has not checked yet: the
// cluster identity, once per connection, which also calls the xid read's function (so
// that a missing privilege shows there), and the marker function of refs, once per
// connection and table. It goes outside any transaction, so that a failure of it changes
// nothing of the application's, and in the same write, so that it costs no round trip.
//
// serverVersion is what the server reported at connection start; single says sql is one
// statement. A server older than MinServerMajor turns references off at once, with the
// notice returned: the check itself calls what that server does not have.
func (c *Conn) ArmCheck(refs Refs, serverVersion string, single bool, sql string) *Off {
	return c.armCheck(refs, serverVersion, single, sql, "", false, nil)
}

// ArmPrepared has the write of f's COMMIT PREPARED or ROLLBACK PREPARED (the statement
// sql, of the prepared transaction whose gid is the string literal gid) carry, ahead of
// it, the check ArmCheck would, and a read of that transaction's xid in
// pg_prepared_xacts: f's reference (Collect), which reconciliation settles whatever the
// statement's reply. It costs no round trip, and runs outside any transaction: it
// changes nothing of the statement's. Without a gid literal, or when the gid names no
// prepared transaction, f has no reference.
func (c *Conn) ArmPrepared(f *Frame, serverVersion string, single bool, sql, gid string) *Off {
	if f == nil {
		return nil
	}
	if gid == "" || !single {
		return nil
	}
	off := c.armCheck(f.refs, serverVersion, single, sql, gid, false, nil)
	if c.adding && c.checking.gid != "" {
		c.preparing = f
	}
	return off
}

// armCheck is ArmCheck, with the read of the prepared transaction of gid when it is not "";
// extended: ahead of an extended-protocol Sync group (sql unused), as a Query of its own,
// with then (if not nil) inside the group, before its Sync (LibraryPortal: the implicit
// transaction's xid read).
func (c *Conn) armCheck(refs Refs, serverVersion string, single bool, sql, gid string, extended bool, then []byte) *Off {
	if c.state == unchecked && c.on(refs) {
		if why := TooOld(serverVersion); why != "" {
			c.state, c.offWhy = off, why
			return &Off{What: offReferences, Why: why}
		}
	}
	if !c.on(refs) || c.adding || !single {
		return nil
	}
	ck := check{identity: c.state == unchecked, gid: gid}
	if _, checked := c.marker(refs.Marker); refs.Mode == Marker && !checked {
		ck.marker = refs.Marker
	}
	if ck == (check{}) {
		return nil
	}
	a := &wire.Addition{Kind: wire.LibraryQuery, Match: sql, Msg: ck.message(), Extended: extended}
	if then != nil {
		a = &wire.Addition{Kind: wire.LibraryPortal, Extended: true, Commit: true, Ahead: ck.message(), Msg: then}
	}
	if c.nc.Arm(a) {
		c.adding, c.checking = true, ck
	}
	return nil
}

// sql is c's query: identitySelect's columns with the marker check's after them, then
// the prepared transaction's; or the marker check's and the prepared transaction's alone.
func (c check) sql() string {
	var cols []string
	if c.marker != "" {
		cols = append(cols, markerCheckSQL(c.marker))
	}
	if c.gid != "" {
		cols = append(cols, preparedSQL(c.gid))
	}
	if !c.identity {
		return "select " + strings.Join(cols, ", ")
	}
	sql := identitySelect
	for _, col := range cols {
		sql += ", " + col
	}
	return sql + identityFrom
}

// preparedSQL is the two columns that read the xid of the prepared transaction of gid
// (a string literal): its 32 bits as pg_prepared_xacts shows them (NULL when none is
// prepared with that gid), and the snapshot's xmax, a full xid that places them in their
// epoch (preparedXID). Nothing in them can fail, and neither assigns an xid.
func preparedSQL(gid string) string {
	return "(select p.transaction::text from pg_catalog.pg_prepared_xacts p where p.gid = " + gid + ")" +
		", pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text"
}

// preparedXID is the full xid of a prepared transaction whose xid's 32 bits are xid32,
// read with a snapshot whose xmax (the oldest xid still running or not yet completed,
// plus the completed ones' last) is xmax: the full xid with those bits nearest xmax. Both
// are live xids, less than 2^31 apart (the server stops assigning xids before
// wraparound), so the nearest is the one; the prepared transaction's may lie above xmax,
// when transactions older than it are still running. 0 when the text is not that.
func preparedXID(xid32, xmax []byte) uint64 {
	x, err1 := strconv.ParseUint(string(xid32), 10, 32)
	n, err2 := strconv.ParseUint(string(xmax), 10, 64)
	if err1 != nil || err2 != nil || x < 3 {
		return 0 // 0 to 2 are not ordinary xids
	}
	full := int64(n) + int64(int32(uint32(x)-uint32(n)))
	if full < 3 {
		return 0
	}
	return uint64(full)
}

// message is c's query as the Query message the check's write carries.
func (c check) message() []byte {
	msg, _ := (&pgproto3.Query{String: c.sql()}).Encode(nil)
	return msg
}

// identitySelect and identityFrom, the check ahead of a connection's first BEGIN (the
// marker check's column goes between them, see check.message), read what makes an xid
// meaningful: the cluster's system identifier, its current timeline, the server's start time and its statistics' reset time (after a
// failover, a crash restart, and a crash recovery the postmaster survives, the same xid
// may name another transaction), and the backend's PID (another than the connection was
// told means a pooler in between, whose transactions may run on other server
// connections, of a later incarnation), with the database (a marker
// row is in one) and the server's clock (a marker row is never older than it). It also
// reads the OID of the function the xid read calls, and calls it, so that a reference is
// only attempted where that call cannot fail for want of a privilege: an ERROR there
// would abort the transaction being committed.
const (
	identitySelect = "select s.system_identifier::text, " + pg.TimelineSQL + ", " + pg.ServerStartSQL + ", " + pg.StatsResetSQL + ", pg_catalog.pg_backend_pid()::text" +
		", pg_current_xact_id_if_assigned()::text, 'pg_catalog.pg_current_xact_id_if_assigned()'::pg_catalog.regprocedure::pg_catalog.oid::text" +
		", pg_catalog.current_database()::text, (extract(epoch from pg_catalog.now()) * 1000000)::bigint::text" +
		", " + pg.FlushLSNSQL + ", k.checkpoint_lsn::text, k.next_xid::text, k.timeline_id::text, " + pg.ShutdownCheckpointSQL +
		", " + pg.CheckpointTimeSQL
	identityFrom = " from pg_control_system() s, pg_control_checkpoint() k"
)

// The columns of identitySelect, and the marker check's after them (exported for the
// tests of a scripted server, which answer them).
const (
	ColSystem = iota
	ColTimeline
	ColStart
	ColStatsReset
	ColBackendPID
	ColXIDRead
	ColXIDFunction
	ColDatabase
	ColCheckedAt
	ColFlushLSN
	ColCheckpointLSN
	ColCheckpointNextXID
	ColCheckpointTimeline
	ColCheckpointShutdown
	ColCheckpointTime
	ColMarker
)

// markerCheckSQL is the column that checks the commit-marker function of table (quoted,
// schema-qualified), as MarkerTableDDL creates it: its OID when a call of it cannot fail
// for want of a privilege, whatever role the session has switched to (SECURITY DEFINER,
// EXECUTE for PUBLIC, USAGE on its schema for PUBLIC, its owner may insert into the
// table), else the word that says what is wrong. Nothing in it can fail: a missing
// table or function is NULL, not an error.
func markerCheckSQL(table string) string {
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	return "(select case when r.t is null or p.oid is null then 'missing'" +
		" when not p.prosecdef or p.prorettype <> 'pg_catalog.text'::pg_catalog.regtype then 'not_marker_function'" +
		" when not pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE') or not pg_catalog.has_schema_privilege('public', p.pronamespace, 'USAGE') then 'not_public'" +
		" when not pg_catalog.has_table_privilege(p.proowner, r.t, 'INSERT') then 'owner_cannot_insert'" +
		" else p.oid::text end" +
		" from (select pg_catalog.to_regclass(" + lit(table) + ") t, pg_catalog.to_regprocedure(" + lit(table+"(pg_catalog.uuid)") + ") f) r" +
		" left join pg_catalog.pg_proc p on p.oid = r.f)"
}

// markerProblems says, for each word of markerCheckSQL, why the marker is off.
var markerProblems = map[string]string{
	"missing":             "the marker table or its function does not exist (create them with reconcile.MarkerTableDDL, or: otelpgxtx marker-ddl <table> | psql)",
	"not_marker_function": "the marker function is not the SECURITY DEFINER function of reconcile.MarkerTableDDL",
	"not_public":          "the marker function or its schema is not usable by every role (reconcile.MarkerTableDDL grants EXECUTE and USAGE to PUBLIC)",
	"owner_cannot_insert": "the marker function's owner may not insert into the marker table",
}

// markerProblem says why the marker function is off from what markerCheckSQL answered,
// "" when it is usable.
func markerProblem(check []byte) string {
	if check == nil {
		return "the marker check answered nothing"
	}
	if _, err := strconv.ParseUint(string(check), 10, 32); err == nil {
		return ""
	}
	if p := markerProblems[string(check)]; p != "" {
		return p
	}
	return "the marker check answered " + strconv.Quote(string(check))
}

// markerOf returns the marker function refs call on the connection, nil when refs has
// none or the check found it unusable: then COMMIT carries the xid read.
func (c *Conn) markerOf(refs Refs) *markerFn {
	if refs.Mode != Marker {
		return nil
	}
	if m, _ := c.marker(refs.Marker); m != nil && m.msg != nil {
		return m
	}
	return nil
}

// markerFn is a commit-marker function checked on a connection.
type markerFn struct {
	table string // quoted, schema-qualified, as configured
	ref   string // the reference's name of it: "database"."schema"."table"
	// msg is its call, a Query that names it, encoded with a zero operation id (32 hex
	// digits) at argAt, which callMsg fills in; nil when the check found it unusable
	// (problem says why).
	msg     []byte
	argAt   int
	problem string
	// portal and portalArgAt are its call as extended-protocol messages (portalMsg).
	portal      []byte
	portalArgAt int
}

// markerCallSQL is the call of table's marker function with a zero operation id: by its
// schema-qualified name, so that the server finds the function as it is at COMMIT — one
// dropped and created again (a migration re-run, a restore) is found under its new OID,
// where a call by the OID the check read would fail and take the application's
// transaction with it —, and with the argument's type qualified, so that the session's
// search_path changes nothing of it.
func markerCallSQL(table string) string {
	return "select " + table + "('" + strings.Repeat("0", 2*len(outcome.OperationID{})) + "'::pg_catalog.uuid)"
}

// newMarkerFn makes table's marker from what markerCheckSQL answered.
func (c *Conn) newMarkerFn(table string, check []byte) *markerFn {
	m := &markerFn{table: table, problem: markerProblem(check)}
	if m.problem == "" {
		sql := markerCallSQL(table)
		m.msg, _ = (&pgproto3.Query{String: sql}).Encode(nil)
		m.argAt = 5 + strings.Index(sql, "'") + 1
		var err error
		if m.ref, err = markertable.RefTable(c.identity.database, table); err != nil {
			m.msg, m.problem = nil, err.Error()
		}
	}
	c.markers = append(c.markers, m)
	return m
}

// marker returns table's marker function as checked on the connection, and whether it was.
func (c *Conn) marker(table string) (*markerFn, bool) {
	for _, m := range c.markers {
		if m.table == table {
			return m, true
		}
	}
	return nil, false
}

// setIdentity keeps the cluster identity of row, the columns of identitySelect.
func (c *Conn) setIdentity(row [][]byte) error {
	if len(row) < ColMarker {
		return errors.New("reading the cluster identity: unexpected result shape")
	}
	if row[ColTimeline] == nil {
		return errors.New("reading the cluster identity: the server is a standby; no reconciliation references on this connection")
	}
	sys, err1 := strconv.ParseUint(string(row[ColSystem]), 10, 64)
	tli, err2 := strconv.ParseUint(string(row[ColTimeline]), 10, 32)
	start, err3 := strconv.ParseInt(string(row[ColStart]), 10, 64)
	fn, err4 := strconv.ParseUint(string(row[ColXIDFunction]), 10, 32)
	checked, err5 := strconv.ParseInt(string(row[ColCheckedAt]), 10, 64)
	reset, err6 := strconv.ParseInt(string(row[ColStatsReset]), 10, 64)
	pid, err7 := strconv.ParseUint(string(row[ColBackendPID]), 10, 32)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil || err6 != nil || err7 != nil || sys == 0 || tli == 0 ||
		start <= 0 || fn == 0 || checked <= 0 || reset < 0 || len(row[ColDatabase]) == 0 {
		return fmt.Errorf("reading the cluster identity: unexpected values %q", row)
	}
	flushed, err8 := outcome.ParseLSN(string(row[ColFlushLSN]))
	ckpt, err9 := parseCheckpoint(row, sys, uint32(tli), start)
	if err8 != nil || err9 != nil || flushed == 0 {
		return fmt.Errorf("reading the cluster identity: unexpected values %q", row)
	}
	id := &c.identity
	id.systemID, id.timeline, id.serverStart, id.statsReset = sys, uint32(tli), start, reset
	c.state = on
	id.pooled = uint32(pid) != id.pid
	id.database, id.checkedAt, id.flushLSN = string(row[ColDatabase]), checked, flushed
	id.checkpoint = ckpt
	c.xidCall, _ = (&pgproto3.FunctionCall{Function: uint32(fn)}).Encode(nil) // result in text format
	return nil
}

// parseCheckpoint reads the latest checkpoint of row, of the server of system sys on
// timeline tli started at start (see Checkpoint).
func parseCheckpoint(row [][]byte, sys uint64, tli uint32, start int64) (Checkpoint, error) {
	lsn, err1 := outcome.ParseLSN(string(row[ColCheckpointLSN]))
	next, err2 := pg.ParseFullXID(string(row[ColCheckpointNextXID]))
	ckptTLI, err3 := strconv.ParseUint(string(row[ColCheckpointTimeline]), 10, 32)
	shutdown, err4 := strconv.ParseBool(string(row[ColCheckpointShutdown]))
	at, err5 := strconv.ParseInt(string(row[ColCheckpointTime]), 10, 64)
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return Checkpoint{}, err
	}
	ck := Checkpoint{Recovery: reconcile.Recovery{SystemIdentifier: sys, Timeline: tli, ServerStart: start, CheckpointLSN: lsn}}
	switch startSecond := start / 1e6; {
	case !shutdown || at < startSecond || uint32(ckptTLI) != tli:
		// An online checkpoint, the shutdown before the postmaster started, or a
		// checkpoint of a timeline the server has left.
	case at > startSecond:
		ck.Recovery.NextXID, ck.Ended = next, true
	default:
		ck.Recovery.NextXID = next // within the second the postmaster started: either
	}
	return ck, nil
}

// checked keeps what the check ahead of BEGIN found: the identity, or references off for
// the connection; the marker function, or the marker off for it and table; each with the
// notice, for one log record, of why it is off.
func (c *Conn) checked(r wire.Reply) *Off {
	// The end of a crash recovery the check may show is the caller's to keep: Recovery.
	ck := c.checking
	c.checking = check{}
	col := 0 // the marker check's column
	if ck.identity {
		if r.ErrCode != "" {
			c.offWhy = "the identity check failed with SQLSTATE " + r.ErrCode
		} else if err := c.setIdentity(r.Row); err != nil {
			c.offWhy = err.Error()
		}
		if c.offWhy != "" {
			c.state = off
			return &Off{What: offReferences, Why: c.offWhy}
		}
		col = ColMarker
	}
	var off *Off
	if ck.marker != "" {
		var answer []byte
		if r.ErrCode == "" && len(r.Row) > col {
			answer = r.Row[col]
		}
		if m := c.newMarkerFn(ck.marker, answer); m.problem != "" {
			off = &Off{What: offMarker, Why: m.problem}
		}
		col++
	}
	if ck.gid != "" && r.ErrCode == "" && len(r.Row) >= col+2 {
		c.preparedXID = preparedXID(r.Row[col], r.Row[col+1])
	}
	return off
}

// What the notices of a check say is off.
const (
	offReferences = "commit references are off for this connection"
	offMarker     = "the commit marker is off for this connection; commits carry the xid read"
)

// CheckQuery is the query of the check each connection's first BEGIN carries: the
// cluster identity and, for marker ("" for none), the marker function; Columns its
// number of columns.
func CheckQuery(marker string) (sql string, columns int) {
	ck := check{identity: true, marker: marker}
	columns = ColMarker
	if marker != "" {
		columns++
	}
	return ck.sql(), columns
}

// CheckAnswer says what is wrong in row, CheckQuery's answer for marker, "" when nothing
// is: the same judgement a connection's check makes.
func CheckAnswer(row [][]byte, marker string) string {
	var c Conn
	if err := c.setIdentity(row); err != nil {
		return err.Error()
	}
	if marker != "" {
		if p := markerProblem(row[ColMarker]); p != "" {
			return "the commit marker " + marker + ": " + p
		}
	}
	return ""
}

// MarkerChecked reports whether the marker function of table (quoted) was checked on the
// connection, and why it is off, "" when it is usable.
func (c *Conn) MarkerChecked(table string) (checked bool, problem string) {
	m, ok := c.marker(table)
	if !ok {
		return false, ""
	}
	return true, m.problem
}
