package otelpgxtx

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/wire"
)

// Commit references for plain pgx ([WithCaptureReference], [WithCommitMarker]): what the
// tracer adds to the application's writes, through the connection's net.Conn wrapper,
// and what it makes of the replies (see internal/wire). The call ahead of COMMIT and
// what its reply means are reference.go's, shared with Run (reference_run.go).

// identityMessage returns the Query the tracer sends ahead of a connection's first BEGIN:
// the cluster identity, which also calls the xid read's function (so that a missing
// privilege shows there, outside any transaction), and the marker function's check.
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
// read, the fast-path call and what a marker's absence proves are PostgreSQL's).
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
	if st.nc.Arm(&wire.Addition{Kind: wire.LibraryQuery, Match: sql, Before: t.identityMsg}) {
		st.adding = true
	}
}

// armReference has the write of f's COMMIT (the statement sql) carry the call of the
// marker function, or the xid read (see reference.go), when f's transaction can have a
// reference: it wrote something the tracer saw, did not begin read-only, has not failed,
// and commits with a lone COMMIT Query.
func (t *Tracer) armReference(st *connState, f *frame, pgConn *pgconn.PgConn, set stmtSet, sql string) {
	if !t.referencesOn(st) || !st.identityKnown() || st.adding || !f.wrote || f.readOnly ||
		!set.single() || !set.has(stmtCommit) || pgConn.TxStatus() != 'T' {
		return
	}
	f.marker = nil
	if t.cfg.reference == referenceMarker {
		f.marker, _ = st.marker(t.cfg.marker)
	}
	if st.nc.Arm(&wire.Addition{Kind: wire.LibraryCall, Match: sql, Before: st.callMsg(f.marker, f.id)}) {
		st.adding = true
	}
}

// collectAddition collects, after the query it was armed for, what became of the library's
// addition: the cluster identity after a BEGIN; f's reference after its COMMIT. It reports
// whether the server answered the call with a FATAL, after which it read nothing more:
// COMMIT never ran.
func (t *Tracer) collectAddition(st *connState, f *frame) (endedBeforeCommit bool) {
	if !st.adding {
		return false
	}
	st.adding = false
	a := st.nc.Collect() // withdrawn if its write never came
	if a == nil || !a.Sent() {
		return false // tried again at the next BEGIN or COMMIT
	}
	r := a.Reply()
	switch a.Kind {
	case wire.LibraryQuery:
		if !r.Done || r.Fatal {
			// The connection ended before the check was answered: nothing was checked, and
			// the connection is gone with whatever BEGIN it carried.
			return false
		}
		if pg.Transient(r.ErrCode) {
			// A cancel or a timeout hit the check, not an answer to it: asked again at the
			// next BEGIN.
			return false
		}
		st.identityRead = true
		t.identityChecked(st, r)
	case wire.LibraryCall:
		if f != nil && !r.Fatal {
			f.ref = st.callRef(f.marker, f.id, r)
		}
		return r.Fatal
	}
	return false
}

// identityChecked keeps the identity the check read, or turns references off for the
// connection, with one log record saying why.
func (t *Tracer) identityChecked(st *connState, r wire.Reply) {
	reason := ""
	switch {
	case r.ErrCode != "":
		reason = "the identity check failed with SQLSTATE " + r.ErrCode
	default:
		if err := st.setIdentity(r.Row); err != nil {
			reason = err.Error()
		}
	}
	if reason != "" {
		st.refsOff = true
		t.referenceLog("commit references are off for this connection", reason)
		return
	}
	if t.cfg.reference == referenceMarker {
		var check []byte
		if len(r.Row) > colMarker {
			check = r.Row[colMarker]
		}
		if m := st.newMarkerFn(t.cfg.marker, check); m.problem != "" {
			t.referenceLog("the commit marker is off for this connection; commits carry the xid read", m.problem)
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
