package otelpgxtx

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/sqltext"
	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Commit references, for plain pgx ([WithCommitReference], [WithCommitMarker]) and
// [Run] alike: what the tracer adds to the application's writes, through the
// connection's net.Conn wrapper, and what it makes of the replies (see internal/wire).
// A frame carries what its references are (references: the tracer's options, or Run's
// Policy for a transaction Run begins); what the call ahead of COMMIT is and what its
// reply means are reference.go's.

// frameReference is the frame's commit reference: what its COMMIT carries for one, and
// what it got.
type frameReference struct {
	// refs is what its COMMIT carries for a reference (the tracer's options, or Run's).
	refs references
	// xid is the transaction's xid as the xid read after one of its statements found it
	// (armXIDRead); 0 while none was found, and then COMMIT's write carries the read.
	xid uint64
	ref *outcome.ReconciliationRef
	// marker is the marker function whose call the COMMIT write carries (WithCommitMarker).
	marker *markerFn
}

// referencesOn reports whether the tracer may add to st's connection's writes for refs:
// they are on, the connection's net.Conn is the wrapper, the check found nothing wrong,
// and the server is PostgreSQL (the xid read, the fast-path call and what a marker's
// absence proves are PostgreSQL's).
func referencesOn(st *connState, refs references) bool {
	return refs.mode != referenceNone && st.nc != nil && st.server() == classifier.ServerPostgreSQL && st.refs != refsOff
}

// check is what a check ahead of BEGIN asks: the cluster identity, and a marker
// function (its quoted table; "" for none).
type check struct {
	identity bool
	marker   string
}

// armCheck has the write of a BEGIN (the statement sql, sent as a lone simple Query)
// carry, ahead of it, what refs need that the connection has not checked yet: the
// cluster identity, once per connection, which also calls the xid read's function (so
// that a missing privilege shows there), and the marker function of refs, once per
// connection and table. It goes outside any transaction, so that a failure of it changes
// nothing of the application's, and in the same write, so that it costs no round trip.
func (t *Tracer) armCheck(st *connState, refs references, pg *pgconn.PgConn, set evidence.Set, sql string) {
	if st.refs == refsUnchecked && referencesOn(st, refs) {
		if why := tooOld(pg.ParameterStatus("server_version")); why != "" {
			// Nothing is sent: the check itself calls what the server does not have.
			st.refs, st.offWhy = refsOff, why
			t.referenceLog("commit references are off for this connection", why)
			return
		}
	}
	if !referencesOn(st, refs) || st.adding || !set.Single() {
		return
	}
	c := check{identity: st.refs == refsUnchecked}
	if _, checked := st.marker(refs.marker); refs.mode == referenceMarker && !checked {
		c.marker = refs.marker
	}
	if c == (check{}) {
		return
	}
	if st.nc.Arm(&wire.Addition{Kind: wire.LibraryQuery, Match: sql, Msg: c.message()}) {
		st.adding, st.checking = true, c
	}
}

// sql is c's query: identitySelect's columns with the marker check's after them, or the
// marker check alone.
func (c check) sql() string {
	sql := "select " + markerCheckSQL(c.marker)
	if c.identity {
		sql = identitySelect
		if c.marker != "" {
			sql += ", " + markerCheckSQL(c.marker)
		}
		sql += identityFrom
	}
	return sql
}

// message is c's query as the Query message the check's write carries.
func (c check) message() []byte {
	msg, _ := (&pgproto3.Query{String: c.sql()}).Encode(nil)
	return msg
}

// armXIDRead has the write of a statement of f's transaction (sql, of kinds set) carry
// the xid read after the statement, so that the xid is on the client before COMMIT is
// written: a connection lost with COMMIT's write still leaves a reference the server can
// answer. The statement must be one that may assign the xid and cannot leave the server
// waiting for the client's data (a lone statement that may write, not COPY), in a
// transaction that has none known yet, did not begin read-only and has not failed; and
// no cancel request may land on the read (see readsEarly). The read is taken once per
// transaction, unless it finds no xid yet. The marker's call stays ahead of COMMIT.
func (t *Tracer) armXIDRead(ctx context.Context, st *connState, f *frame, pgConn *pgconn.PgConn, set evidence.Set, sql string) {
	if f.xid != 0 || f.ReadOnly() || !f.Open() || !referencesOn(st, f.refs) || st.markerOf(f.refs) != nil ||
		!st.identityKnown() || st.adding || !set.Single() || !set.Writes() || set.Kinds() != evidence.OtherSet ||
		pgConn.TxStatus() != 'T' || !readsEarly(ctx, st, sql) {
		return
	}
	if st.nc.Arm(&wire.Addition{Kind: wire.LibraryCall, Msg: st.xidCallMsg, After: true}) {
		st.adding, st.reading = true, f
	}
}

// readsEarly reports whether the xid read may follow the statement sql: not a COPY,
// whose FROM STDIN would take the read for its data, and no cancel request possible —
// pgconn's default context watcher sets a deadline and sends none; with another, only a
// context that can never be cancelled is safe, since a cancel request sent for the
// statement can arrive as the read runs, fail it, and so abort the transaction.
func readsEarly(ctx context.Context, st *connState, sql string) bool {
	if w, _ := sqltext.NextWord(sql); evidence.IsKeyword(w, "copy") {
		return false
	}
	return !st.cancels || ctx.Done() == nil
}

// settleXIDRead makes sure, before f's COMMIT is written, that the reply to an xid read
// after one of f's statements is in: it follows that statement's reply at once, so it is
// normally read already; if not, it is read now, for up to xidReadWait, so that a
// connection lost with COMMIT's write cannot take it along.
func (t *Tracer) settleXIDRead(ctx context.Context, st *connState, f *frame) {
	if st.reading != f || !st.adding {
		return
	}
	deadline := time.Now().Add(xidReadWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	st.nc.Await(deadline)
	t.collectAddition(st, f, true)
}

// xidReadWait bounds how long settleXIDRead waits for a reply the server sent right after
// the statement's: only a connection that is failing keeps it that long.
const xidReadWait = time.Second

// armReference has the write of f's COMMIT (the statement sql) carry the call of the
// marker function, or the xid read (see reference.go), when f's transaction can have a
// reference: it wrote something the tracer saw (or its references go with every commit,
// Run's), did not begin read-only, has not failed, and commits with a lone COMMIT Query.
// When the xid read after a statement found the xid, COMMIT carries nothing for it, and
// the reference is that xid's.
func (t *Tracer) armReference(st *connState, f *frame, pgConn *pgconn.PgConn, set evidence.Set, sql string) {
	if !referencesOn(st, f.refs) || !st.identityKnown() || !f.Wrote() && !f.refs.every || f.ReadOnly() || pgConn.TxStatus() != 'T' {
		return
	}
	f.marker = st.markerOf(f.refs)
	if f.xid != 0 && f.marker == nil {
		f.ref = st.ref(f.xid)
		return
	}
	if st.adding || !set.Single() || !set.Has(evidence.Commit) {
		return
	}
	msg, kind := st.callMsg(f.marker, f.id)
	if st.nc.Arm(&wire.Addition{Kind: kind, Match: sql, Msg: msg, Commit: true}) {
		st.adding = true
	}
}

// collectAddition collects, after the query it was armed for, what became of the library's
// addition: the cluster identity after a BEGIN; f's reference after its COMMIT; the xid
// after a statement, once its reply is in or final. It reports whether the server
// answered the call ahead of COMMIT with a FATAL, after which it read nothing more:
// COMMIT never ran.
func (t *Tracer) collectAddition(st *connState, f *frame, final bool) (endedBeforeCommit bool) {
	if !st.adding {
		return false
	}
	a, pending := st.nc.Collect(final) // withdrawn if its write never came
	if pending {
		return false // the xid read's reply is still on its way
	}
	st.adding = false
	reading := st.reading
	st.reading = nil
	if a == nil || !a.Sent() {
		return false // tried again at the next BEGIN, statement or COMMIT
	}
	r := a.Reply()
	switch {
	case a.After:
		if reading == nil || !reading.Open() {
			return false
		}
		switch {
		case r.ErrCode != "" && r.ErrCode != pg.InFailedTransaction && !reading.Failed():
			// The read itself failed (a cancel landed on it, a privilege revoked since the
			// check): the transaction is aborted, and this error, which pgconn never saw, is
			// the cause of the rollback to come.
			reading.ReadFailed(classifier.Classify(outcome.PhaseActive, r.Err, classifier.Facts{Server: st.server()}), r.Err)
		case r.Done && r.GotValue:
			// The xid, if the read found one: a later statement's read is tried when it
			// found none (NULL), never once it found one.
			if xid, err := strconv.ParseUint(string(r.Value), 10, 64); err == nil {
				reading.xid = xid
			}
		}
		return false
	}
	switch {
	case !a.Commit:
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
		t.checked(st, r)
	default:
		if f != nil && !r.Fatal {
			f.ref = st.callRef(f.marker, f.id, r)
		}
		return r.Fatal
	}
	return false
}

// checked keeps what the check ahead of BEGIN found: the identity, or references off for
// the connection; the marker function, or the marker off for it and table; each with one
// log record saying why it is off.
func (t *Tracer) checked(st *connState, r wire.Reply) {
	c := st.checking
	st.checking = check{}
	col := 0 // the marker check's column
	if c.identity {
		if r.ErrCode != "" {
			st.offWhy = "the identity check failed with SQLSTATE " + r.ErrCode
		} else if err := st.setIdentity(r.Row); err != nil {
			st.offWhy = err.Error()
		}
		if st.offWhy != "" {
			st.refs = refsOff
			t.referenceLog("commit references are off for this connection", st.offWhy)
			return
		}
		col = colMarker
	}
	if c.marker == "" {
		return
	}
	var answer []byte
	if r.ErrCode == "" && len(r.Row) > col {
		answer = r.Row[col]
	}
	if m := st.newMarkerFn(c.marker, answer); m.problem != "" {
		t.referenceLog("the commit marker is off for this connection; commits carry the xid read", m.problem)
	}
}

// referenceLog writes one record about the connection's references: what it holds is the
// library's own (SQLSTATEs, the table name the application configured), never user data.
func (t *Tracer) referenceLog(msg, reason string) {
	t.logger().LogAttrs(context.Background(), slog.LevelWarn, "otelpgxtx: "+msg, slog.String("reason", reason))
}
