package otelpgxtx

import (
	"context"
	"log/slog"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Commit references for plain pgx ([WithCaptureReference], [WithCommitMarker]): what the
// tracer adds to the application's writes, through the connection's net.Conn wrapper,
// and what it makes of the replies (see wire_reply.go). Run captures its own references
// through pgconn (capture.go).

// identityMessage returns the Query the tracer sends ahead of a connection's first BEGIN:
// the cluster identity, which also calls the xid read's function (so that a missing
// privilege shows there, outside any transaction), and the marker table's check.
func (t *Tracer) identityMessage() []byte {
	sql := identitySelect
	if t.cfg.reference == referenceMarker {
		sql += ", " + markerCheckSQL(t.cfg.marker)
	}
	msg, _ := (&pgproto3.Query{String: sql + identityFrom}).Encode(nil)
	return msg
}

// referencesOn reports whether the tracer may add to st's connection's writes: the option
// is on, the connection's net.Conn is the wrapper, and the server is PostgreSQL (the xid
// read, the fast-path call and the marker's proof are PostgreSQL's).
func (t *Tracer) referencesOn(st *connState) bool {
	return t.cfg.reference != referenceNone && st.nc != nil && st.server == classifier.ServerPostgreSQL && !st.refsOff
}

// armIdentity has the write of a BEGIN (the statement sql, sent as a lone simple Query)
// carry the identity read ahead of it, the first time: outside any transaction, so that a
// failure of it changes nothing of the application's, and in the same write, so that it
// costs no round trip.
func (t *Tracer) armIdentity(st *connState, set stmtSet, sql string) {
	if !t.referencesOn(st) || st.identityRead || st.adding || !set.single() {
		return
	}
	if st.nc.arm(&addition{kind: libraryQuery, match: sql, before: t.identityMsg}) {
		st.adding = true
	}
}

// armReference has the write of f's COMMIT (the statement sql) carry the xid read, or
// the marker insert, when f's transaction can have one: it wrote something the tracer
// saw, is not read-only, has not failed, and commits with a lone COMMIT Query.
func (t *Tracer) armReference(st *connState, f *frame, pg *pgconn.PgConn, set stmtSet, sql string) {
	if !t.referencesOn(st) || !st.identityKnown() || st.adding || !f.wrote || f.readOnly ||
		!set.single() || !set.has(stmtCommit) || pg.TxStatus() != 'T' {
		return
	}
	a := &addition{kind: libraryCall, match: sql}
	if t.cfg.reference == referenceMarker && st.markerOK {
		a.kind = libraryInsert
		a.before, _ = (&pgproto3.Query{String: markerSQL(t.cfg.marker, f.id)}).Encode(nil)
	} else {
		if st.xidCallMsg == nil {
			st.xidCallMsg, _ = st.xidCall.Encode(nil)
		}
		a.before = st.xidCallMsg
	}
	if st.nc.arm(a) {
		st.adding = true
	}
}

// takeAddition collects, after the query it was armed for, what became of the library's
// addition: the cluster identity after a BEGIN; f's reference after its COMMIT. It reports
// whether the server answered the xid read (or the marker insert) with a FATAL, after
// which it read nothing more: COMMIT never ran.
func (t *Tracer) takeAddition(st *connState, f *frame) (endedBeforeCommit bool) {
	if !st.adding {
		return false
	}
	st.adding = false
	st.nc.disarm() // a write that never came
	a := st.nc.takeAddition()
	if a == nil || !a.sent {
		return false // tried again at the next BEGIN or COMMIT
	}
	r := a.reply
	switch a.kind {
	case libraryQuery:
		if !r.done || r.fatal {
			// The connection ended before the check was answered: nothing was checked, and
			// the connection is gone with whatever BEGIN it carried.
			return false
		}
		st.identityRead = true
		t.identityChecked(st, r)
	case libraryCall:
		if f != nil && r.gotValue && r.errCode == "" {
			xid, err := strconv.ParseUint(string(r.value), 10, 64) // NULL: 0, it wrote nothing
			if r.value == nil || err == nil {
				f.ref = st.ref(xid)
			}
		}
		return r.fatal
	case libraryInsert:
		if f != nil && r.errCode == "" {
			// The operation id went out with COMMIT: the reference stands even if no reply
			// ever came, for the marker row exists exactly when the transaction committed.
			f.ref = st.markerRef(t.cfg.marker, f.id)
			if len(r.row) == 1 && r.row[0] != nil {
				if xid, err := strconv.ParseUint(string(r.row[0]), 10, 64); err == nil {
					f.ref.XID = xid
				}
			}
		}
		return r.fatal
	}
	return false
}

// identityChecked keeps the identity the check read, or turns references off for the
// connection, with one log record saying why.
func (t *Tracer) identityChecked(st *connState, r libraryReply) {
	reason := ""
	switch {
	case r.errCode != "":
		reason = "the identity check failed with SQLSTATE " + r.errCode
	default:
		if err := st.setIdentity(r.row); err != nil {
			reason = err.Error()
		}
	}
	if reason != "" {
		st.refsOff = true
		t.referenceLog("commit references are off for this connection", reason)
		return
	}
	if t.cfg.reference == referenceMarker {
		switch {
		case len(r.row) > 5 && string(r.row[5]) == "true":
			st.markerOK = true
		case len(r.row) > 5 && r.row[5] == nil:
			t.referenceLog("the commit marker is off for this connection; commits carry the xid read", "the marker table "+t.cfg.marker+" does not exist")
		default:
			t.referenceLog("the commit marker is off for this connection; commits carry the xid read", "the role may not insert into the marker table "+t.cfg.marker)
		}
	}
}

// referenceLog writes one record about the connection's references, on the WithLogger
// logger, else slog's default: what it holds is the library's own (SQLSTATEs, the table
// name the application configured), never user data.
func (t *Tracer) referenceLog(msg, reason string) {
	l := t.cfg.logger
	if l == nil {
		l = slog.Default()
	}
	l.LogAttrs(context.Background(), slog.LevelWarn, "otelpgxtx: "+msg, slog.String("reason", reason))
}

// markerRef is the reference of a marked commit of operation id on st's cluster.
func (st *connState) markerRef(table string, id outcome.OperationID) *outcome.ReconciliationRef {
	r := st.ref(0)
	r.MarkerTable, r.Operation = table, id
	return r
}
