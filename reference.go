package otelpgxtx

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Commit references, one mechanism for Run and for plain pgx alike, carried by the
// application's own writes (reference_tracer.go, internal/wire): the xid read
// (pg_current_xact_id_if_assigned, a fast-path FunctionCall) after the transaction's first
// statement that may write, in that statement's write, so that the xid is on the client
// before COMMIT is written; else, or for the commit marker of MarkerTableDDL (a Query
// that names its function), a call in COMMIT's write, ahead of it, whose reply the server
// flushes before it reads COMMIT. The reply is read with wire.Reply.Take and turned into
// a reference with connState.callRef.

// references is what a frame's COMMIT carries for its reference: nothing, the xid read,
// or the commit marker of a table (quoted). The tracer's options give it to the frames of
// plain pgx, a Policy to those Run begins. every: the call goes with every COMMIT, also of
// a transaction whose statements the tracer took to only read (a SELECT may call a
// function that writes) — Run's promise, on which the marker's absence as proof of an
// abort rests (reconcile's asserted markers); the tracer's options add nothing to those.
type references struct {
	mode   referenceMode
	marker string
	every  bool
}

// markerOf returns the marker function refs call on st's connection, nil when refs has
// none or the check found it unusable: then COMMIT carries the xid read.
func (st *connState) markerOf(refs references) *markerFn {
	if refs.mode != referenceMarker {
		return nil
	}
	if m, _ := st.marker(refs.marker); m != nil && m.msg != nil {
		return m
	}
	return nil
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
		", pg_catalog.current_database()::text, (extract(epoch from pg_catalog.now()) * 1000000)::bigint::text"
	identityFrom = " from pg_control_system() s"
)

// The columns of identitySelect, and the marker check's after them.
const (
	colSystem = iota
	colTimeline
	colStart
	colStatsReset
	colBackendPID
	colXIDRead
	colXIDFunction
	colDatabase
	colCheckedAt
	colMarker
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
func (st *connState) newMarkerFn(table string, check []byte) *markerFn {
	m := &markerFn{table: table, problem: markerProblem(check)}
	if m.problem == "" {
		sql := markerCallSQL(table)
		m.msg, _ = (&pgproto3.Query{String: sql}).Encode(nil)
		m.argAt = 5 + strings.Index(sql, "'") + 1
		var err error
		if m.ref, err = markertable.RefTable(st.database, table); err != nil {
			m.msg, m.problem = nil, err.Error()
		}
	}
	st.markers = append(st.markers, m)
	return m
}

// marker returns table's marker function as checked on st, and whether it was.
func (st *connState) marker(table string) (*markerFn, bool) {
	for _, m := range st.markers {
		if m.table == table {
			return m, true
		}
	}
	return nil, false
}

// callMsg returns the call to send ahead of a COMMIT of operation id, and its kind: m's
// marker function (a Query) when m is usable, else the xid read (a fast-path call). The
// bytes are st's, valid until the next call: both Run and the tracer write them out
// before that.
func (st *connState) callMsg(m *markerFn, id outcome.OperationID) ([]byte, wire.LibraryMessage) {
	if m != nil && m.msg != nil {
		hex.Encode(m.msg[m.argAt:], id[:])
		return m.msg, wire.LibraryQuery
	}
	return st.xidCallMsg, wire.LibraryCall
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
func (st *connState) callRef(m *markerFn, id outcome.OperationID, r wire.Reply) *outcome.ReconciliationRef {
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
		return st.ref(xid)
	}
	v := string(r.Value)
	var xid uint64
	var err error
	if len(v) > 1 {
		xid, err = strconv.ParseUint(v[1:], 10, 64)
	}
	switch {
	case !r.GotValue, len(v) > 1 && v[0] == 'm' && err == nil:
		ref := st.ref(xid) // 0: no reply came
		ref.MarkerTable, ref.Operation, ref.CheckedAt = m.ref, id, st.checkedAt
		return ref
	case v == "n":
		return st.ref(0)
	case len(v) > 1 && v[0] == 'r' && err == nil:
		return st.ref(xid)
	}
	return nil // not the function MarkerTableDDL makes
}

// setIdentity keeps the cluster identity of row, the columns of identitySelect.
func (st *connState) setIdentity(row [][]byte) error {
	if len(row) < colMarker {
		return errors.New("reading the cluster identity: unexpected result shape")
	}
	if row[colTimeline] == nil {
		return errors.New("reading the cluster identity: the server is a standby; no reconciliation references on this connection")
	}
	sys, err1 := strconv.ParseUint(string(row[colSystem]), 10, 64)
	tli, err2 := strconv.ParseUint(string(row[colTimeline]), 10, 32)
	start, err3 := strconv.ParseInt(string(row[colStart]), 10, 64)
	fn, err4 := strconv.ParseUint(string(row[colXIDFunction]), 10, 32)
	checked, err5 := strconv.ParseInt(string(row[colCheckedAt]), 10, 64)
	reset, err6 := strconv.ParseInt(string(row[colStatsReset]), 10, 64)
	pid, err7 := strconv.ParseUint(string(row[colBackendPID]), 10, 32)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil || err6 != nil || err7 != nil || sys == 0 || tli == 0 ||
		start <= 0 || fn == 0 || checked <= 0 || reset < 0 || len(row[colDatabase]) == 0 {
		return fmt.Errorf("reading the cluster identity: unexpected values %q", row)
	}
	st.systemID, st.timeline, st.serverStart, st.statsReset = sys, uint32(tli), start, reset
	st.refs = refsOn
	st.pooled = uint32(pid) != st.pid
	st.database, st.checkedAt = string(row[colDatabase]), checked
	st.xidCallMsg, _ = (&pgproto3.FunctionCall{Function: uint32(fn)}).Encode(nil) // result in text format
	return nil
}

// refState is where a connection's commit references are. Whether a marker function is
// usable is the table's own, on top of refsOn (markerFn.problem says why it is off).
type refState uint8

// minServerMajor is the oldest PostgreSQL the references work with: the functions they
// call, pg_current_xact_id_if_assigned and (to reconcile) pg_xact_status, came with 13.
const minServerMajor = 13

// tooOld says why references are off on a server that reports server_version v, "" when
// they are not: its major version is below minServerMajor. A version that does not begin
// with a number is left to the check.
func tooOld(v string) string {
	major := 0
	for _, c := range v {
		if c < '0' || c > '9' || major > minServerMajor {
			break
		}
		major = major*10 + int(c-'0')
	}
	if major == 0 || major >= minServerMajor {
		return ""
	}
	return "PostgreSQL " + strconv.Itoa(major) + " is older than " + strconv.Itoa(minServerMajor) +
		", the oldest with the functions the references call (pg_current_xact_id_if_assigned, pg_xact_status)"
}

const (
	refsUnchecked refState = iota // no check answered yet: asked ahead of the next BEGIN
	refsOn                        // the cluster identity is known: references can be taken
	refsOff                       // the check refused them (offWhy): for the connection's life
)

// identityKnown reports whether st holds a cluster identity, without which a reference
// could not be checked and references are off.
func (st *connState) identityKnown() bool { return st != nil && st.refs == refsOn }

// ref returns a reference to xid on st's cluster.
func (st *connState) ref(xid uint64) *outcome.ReconciliationRef {
	return &outcome.ReconciliationRef{XID: xid, SystemIdentifier: st.systemID, Timeline: st.timeline, ServerStart: st.serverStart,
		StatsReset: st.statsReset, Pooled: st.pooled}
}
