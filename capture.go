package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.opentelemetry.io/otel"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/outcome"
)

// identitySQL reads what makes an xid meaningful: the cluster's system identifier, its
// current timeline and the server's start time. After a failover, and after a crash
// restart, the same xid may name another transaction. It also reads the OID of the
// function the xid read calls, and calls it, so that capture is only attempted where
// that call cannot fail for want of a privilege: an ERROR there would abort the
// transaction being committed.
const identitySQL = identitySelect + identityFrom

// identitySelect and identityFrom are identitySQL's two halves, so that the tracer's
// check (see Tracer.identityMessage) can add the marker table's column between them.
const (
	identitySelect = "select s.system_identifier::text, " + pg.TimelineSQL + ", " + pg.ServerStartSQL +
		", " + captureXIDExpr + ", 'pg_catalog.pg_current_xact_id_if_assigned()'::pg_catalog.regprocedure::pg_catalog.oid::text"
	identityFrom = " from pg_control_system() s"
)

// markerCheckSQL is the identity read's column that says whether the marker table (the
// quoted name) exists and the role may insert into it: NULL when it does not exist,
// without an error, so that a missing table leaves the xid read on.
func markerCheckSQL(table string) string {
	lit := "'" + strings.ReplaceAll(table, "'", "''") + "'"
	return "(case when pg_catalog.to_regclass(" + lit + ") is null then null else pg_catalog.has_table_privilege(pg_catalog.to_regclass(" + lit + "), 'INSERT') end)::text"
}

// captureXIDExpr reads the transaction's xid without assigning one: NULL means the
// transaction wrote nothing, so its commit changes nothing. The commit marker's INSERT
// returns it, so that a marked commit needs no second call for its xid.
const captureXIDExpr = "pg_current_xact_id_if_assigned()::text"

// readIdentity reads the cluster identity into st, once per connection. It goes through
// pgconn directly: it is the instrumentation's own query, not the application's, and
// makes no span. Only [Run] calls it, on a connection it holds and before BEGIN, so it
// never runs inside a transaction of the application's.
func readIdentity(ctx context.Context, pg *pgconn.PgConn, st *connState) error {
	if st.identityRead {
		return nil
	}
	results, err := pg.Exec(ctx, identitySQL).ReadAll()
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) {
		// The server answered: a refusal (no privilege) is not retried per commit. A
		// context that had already expired sent nothing, and the next Run tries again.
		st.identityRead = true
	}
	if err != nil {
		return fmt.Errorf("otelpgxtx: reading the cluster identity: %w", err)
	}
	if len(results) != 1 || len(results[0].Rows) != 1 {
		return errors.New("otelpgxtx: reading the cluster identity: unexpected result shape")
	}
	return st.setIdentity(results[0].Rows[0])
}

// setIdentity keeps the cluster identity of row, identitySQL's columns (and, when the
// tracer's check asked, the marker table's after them).
func (st *connState) setIdentity(row [][]byte) error {
	if len(row) < 5 {
		return errors.New("otelpgxtx: reading the cluster identity: unexpected result shape")
	}
	if row[1] == nil {
		return errors.New("otelpgxtx: reading the cluster identity: the server is a standby; no reconciliation references on this connection")
	}
	sys, err1 := strconv.ParseUint(string(row[0]), 10, 64)
	tli, err2 := strconv.ParseUint(string(row[1]), 10, 32)
	start, err3 := strconv.ParseInt(string(row[2]), 10, 64)
	fn, err4 := strconv.ParseUint(string(row[4]), 10, 32)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || sys == 0 || tli == 0 || start <= 0 || fn == 0 {
		return fmt.Errorf("otelpgxtx: reading the cluster identity: unexpected values %q", row)
	}
	st.systemID, st.timeline, st.serverStart = sys, uint32(tli), start
	st.xidCall = pgproto3.FunctionCall{Function: uint32(fn)} // result in text format
	return nil
}

// identityKnown reports whether st holds a cluster identity, without which a reference
// could not be checked and capture is off.
func (st *connState) identityKnown() bool { return st != nil && st.systemID != 0 }

// prepareCapture reads conn's cluster identity once, while conn is idle: outside any
// transaction, so that no failure of it can abort one. A refusal (no privilege for
// pg_control_*) turns capture off for the connection. It returns an error only when the
// read broke the connection, which then must not be used. A context that had already
// ended sent nothing: BEGIN reports it as it would have without capture.
func prepareCapture(ctx context.Context, conn *pgx.Conn) error {
	pg := conn.PgConn()
	st := stateOf(pg)
	if st == nil || st.identityRead || pg.TxStatus() != 'I' {
		return nil
	}
	if st.server != classifier.ServerPostgreSQL {
		// The xid read, the fast-path call and what a marker's failed insert proves are
		// PostgreSQL's: capture stays off, and nothing is sent.
		st.identityRead = true
		return nil
	}
	err := readIdentity(ctx, pg, st)
	if err == nil {
		return nil
	}
	if pg.IsClosed() {
		return err
	}
	if ctx.Err() == nil {
		otel.Handle(err)
	}
	return nil
}

// closePgxTx marks pgx's own Tx object closed after Run committed through pgconn, so
// that what is bound to it (LargeObjects) fails with pgx.ErrTxClosed. pgx's Commit with
// an already cancelled context sets its closed flag and sends nothing: pgconn checks the
// context before it writes, and on an idle or closed connection pgx closes nothing
// either. st.silent keeps that call out of the tracer: it is no statement.
func closePgxTx(tx pgx.Tx, st *connState) {
	conn := tx.Conn()
	if conn == nil || !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		return
	}
	st.silent = true
	_ = tx.Commit(cancelledCtx)
	st.silent = false
}

// cancelledCtx is a context cancelled once and for all, built once so that closing pgx's
// Tx object allocates no context.
var cancelledCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// commitResult is what a COMMIT produced.
type commitResult struct {
	err         error
	tag         pgconn.CommandTag // COMMIT's
	rollbackTag bool
	// endedBeforeCommit: the server answered the xid read with a FATAL. It reads its
	// messages in order and nothing after a FATAL, so COMMIT never ran.
	endedBeforeCommit bool
	ref               *outcome.ReconciliationRef
}

// commitWithCapture sends the xid read and COMMIT in one write: one network round trip,
// as plain COMMIT takes. The xid read is a fast-path FunctionCall message of
// pg_current_xact_id_if_assigned: the server calls the function by OID, with no parse,
// plan or portal, which make a Query message of the same call cost it twice as much and
// more (docs/performance.md). The server ends each message with ReadyForQuery and
// flushes its output there, so the xid arrives before it reads COMMIT, even if the
// commit never answers. With a marker table (quoted), see commitWithMarker. The caller
// has read the identity (see identityKnown).
func commitWithCapture(ctx context.Context, pg *pgconn.PgConn, st *connState, commitSQL, marker string, id outcome.OperationID) commitResult {
	if marker != "" {
		return commitWithMarker(ctx, pg, st, commitSQL, marker, id)
	}
	var res commitResult
	if ctx.Err() != nil || pg.IsClosed() || pg.IsBusy() {
		// pgconn refuses before writing a byte, and says why as pgx's Commit would.
		res.err = pg.Exec(ctx, commitSQL).Close()
		return res
	}
	// pgconn has no call that sends a FunctionCall, nor one that returns its reply: the
	// two messages go out through its frontend and the replies come back message by
	// message. The connection is idle, so its socket has room for the few bytes and the
	// write cannot block on the context's behalf.
	fe := pg.Frontend()
	fe.Send(&st.xidCall)
	fe.SendQuery(&pgproto3.Query{String: commitSQL})
	if err := fe.Flush(); err != nil {
		// Some bytes may have left (the error says whether none did): the connection is
		// unusable either way, and closing it makes the server roll back what it lacks.
		_ = pg.Close(cancelledCtx)
		res.err = err
		return res
	}
	xr, err := readReply(ctx, pg)
	if xr.xidOK {
		res.ref = st.ref(xr.xid)
	}
	switch {
	case err == nil:
		// An ERROR (an aborted transaction answers 25P02) is not the commit's: the server
		// answers COMMIT with ROLLBACK next.
		cr, err := readReply(ctx, pg)
		res.tag, res.err = cr.tag, cr.err
		if err != nil {
			res.tag = pgconn.CommandTag{}
			if res.err == nil {
				res.err = commitReplyError{err}
			}
		}
		res.rollbackTag = res.tag.String() == "ROLLBACK"
	case classifier.IsFatal(err):
		// The server reads its messages in order and nothing after a FATAL.
		res.err, res.endedBeforeCommit = err, true
	default:
		res.err = commitReplyError{err}
	}
	return res
}

// reply is what the server answered to one message, read up to its ReadyForQuery.
type reply struct {
	tag   pgconn.CommandTag // the last command tag
	xid   uint64            // a FunctionCallResponse's result, the xid read's
	xidOK bool              // a FunctionCallResponse came: xid, or none if it was NULL
	err   error             // the first ErrorResponse (an ERROR: pgconn returns a FATAL as readErr)
}

// readReply reads one reply up to its ReadyForQuery, as pgx reads a simple Query. A
// failure to read is returned as readErr and closes the connection, which pgconn leaves
// open on a timeout, so that no unread reply remains on a connection pgconn believes
// idle.
func readReply(ctx context.Context, pg *pgconn.PgConn) (r reply, readErr error) {
	for {
		msg, err := pg.ReceiveMessage(ctx)
		if err != nil {
			if !pg.IsClosed() {
				_ = pg.Close(cancelledCtx)
			}
			return r, err
		}
		switch m := msg.(type) {
		case *pgproto3.CommandComplete:
			r.tag = pgconn.NewCommandTag(string(m.CommandTag))
		case *pgproto3.FunctionCallResponse:
			if m.Result == nil {
				r.xidOK = true // NULL: no xid, the transaction wrote nothing
			} else if n, perr := strconv.ParseUint(string(m.Result), 10, 64); perr == nil {
				r.xid, r.xidOK = n, true
			}
		case *pgproto3.ErrorResponse:
			if r.err == nil {
				r.err = pgconn.ErrorResponseToPgError(m)
			}
		case *pgproto3.ReadyForQuery:
			return r, nil
		}
	}
}

// commitReplyError is a failure to read COMMIT's reply. COMMIT was sent, so a retry is
// never safe, whatever pgconn's receive error says (it says safe: it sent nothing).
type commitReplyError struct{ err error }

func (e commitReplyError) Error() string     { return e.err.Error() }
func (e commitReplyError) Unwrap() error     { return e.err }
func (e commitReplyError) SafeToRetry() bool { return false }

// sqlStateInFailedTransaction is what a statement in an already failed transaction gets.
const sqlStateInFailedTransaction = "25P02"

// ref returns a reference to xid on st's cluster.
func (st *connState) ref(xid uint64) *outcome.ReconciliationRef {
	return &outcome.ReconciliationRef{XID: xid, SystemIdentifier: st.systemID, Timeline: st.timeline, ServerStart: st.serverStart}
}

// commitWithMarker sends the marker insert of id (returning the xid) and COMMIT as one
// simple Query: one message and one server flush, as a plain COMMIT — the marker needs
// no xid before COMMIT runs, so nothing has to make the server flush it first. The server executes the two in order and abandons the rest of
// the string at an error: an insert that did not complete (an ERROR, or a FATAL before
// its command completed) means COMMIT never ran.
func commitWithMarker(ctx context.Context, pg *pgconn.PgConn, st *connState, commitSQL, marker string, id outcome.OperationID) commitResult {
	var res commitResult
	results, err := pg.Exec(ctx, markerSQL(marker, id)+"; "+commitSQL).ReadAll()
	res.ref = st.markerRef(marker, id)
	insertDone := len(results) > 0 && results[0].Err == nil
	if insertDone && len(results[0].Rows) == 1 && len(results[0].Rows[0]) == 1 {
		if xid, perr := strconv.ParseUint(string(results[0].Rows[0][0]), 10, 64); perr == nil {
			res.ref.XID = xid
		}
	}
	if len(results) == 2 && results[1].Err == nil {
		res.tag = results[1].CommandTag
		res.rollbackTag = res.tag.String() == "ROLLBACK"
	}
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
	case !insertDone && errors.As(err, &pgErr) && pgErr.Code == sqlStateInFailedTransaction:
		err = pgx.ErrTxCommitRollback // the transaction had already failed
	case !insertDone && isServerError(err):
		err = fmt.Errorf("otelpgxtx: inserting the commit marker: %w", err)
	case !insertDone && classifier.IsFatal(err):
		res.endedBeforeCommit = true
	}
	res.err = err
	return res
}

// isServerError reports a server error that leaves the session alive.
func isServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && !classifier.IsFatal(err)
}

// commitSQLOf returns the commit statement a pgx transaction would send.
func commitSQLOf(opts pgx.TxOptions) string {
	if opts.CommitQuery != "" {
		return opts.CommitQuery
	}
	return "commit"
}

// markerSQL is the marker insert of id into the quoted table name, returning the xid,
// which the insert has just assigned. The id is inlined: 32 hex digits, nothing to quote.
func markerSQL(table string, id outcome.OperationID) string {
	return "insert into " + table + " (operation_id) values ('" + id.String() + "') returning " + captureXIDExpr
}
