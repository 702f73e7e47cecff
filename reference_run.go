package otelpgxtx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.opentelemetry.io/otel"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Run's side of the commit references: it reads the identity and checks the marker
// function itself, on a connection it holds and before BEGIN, and sends the call and
// COMMIT through pgconn (commitWithReference). What the call is and what its reply means
// are reference.go's, shared with the tracer (reference_tracer.go).
// readIdentity reads the cluster identity into st, once per connection. It goes through
// pgconn directly: it is the instrumentation's own query, not the application's, and
// makes no span. Only [Run] calls it, on a connection it holds and before BEGIN, so it
// never runs inside a transaction of the application's.
func readIdentity(ctx context.Context, pgConn *pgconn.PgConn, st *connState) error {
	if st.identityRead {
		return nil
	}
	row, err := readRow(ctx, pgConn, identitySQL, &st.identityRead)
	if err != nil {
		return fmt.Errorf("otelpgxtx: reading the cluster identity: %w", err)
	}
	return st.setIdentity(row)
}

// checkMarker checks table's marker function on st's connection, once per connection
// and table, before BEGIN, as readIdentity (Run's Policy.CommitMarker).
func checkMarker(ctx context.Context, pgConn *pgconn.PgConn, st *connState, table string) error {
	if _, ok := st.marker(table); ok {
		return nil
	}
	var answered bool
	row, err := readRow(ctx, pgConn, "select "+markerCheckSQL(table), &answered)
	if err != nil {
		if answered {
			st.markers = append(st.markers, &markerFn{table: table, problem: err.Error()})
		}
		return fmt.Errorf("otelpgxtx: checking the commit marker %s: %w", table, err)
	}
	if m := st.newMarkerFn(table, row[0]); m.problem != "" {
		return fmt.Errorf("otelpgxtx: the commit marker %s is off on this connection: %s", table, m.problem)
	}
	return nil
}

// readRow runs sql, the library's own one-row query, through pgconn. answered is set
// when the server answered, a refusal included: that is not asked again per commit. A
// context that had already expired sent nothing, and an error that happened to the
// statement (a cancel, a timeout: pg.Transient) answered nothing; the next Run asks again.
func readRow(ctx context.Context, pgConn *pgconn.PgConn, sql string, answered *bool) ([][]byte, error) {
	results, err := pgConn.Exec(ctx, sql).ReadAll()
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) && !pg.Transient(pgErr.Code) {
		*answered = true
	}
	if err != nil {
		return nil, err
	}
	if len(results) != 1 || len(results[0].Rows) != 1 {
		return nil, errors.New("unexpected result shape")
	}
	return results[0].Rows[0], nil
}

// prepareReference reads conn's cluster identity once, and checks the marker function of
// table (quoted; "" for none) once, while conn is idle: outside any transaction, so
// that no failure of either can abort one. A refusal (no privilege for pg_control_*, no
// marker function) turns capture, or the marker, off for the connection. It returns an
// error only when the read broke the connection, which then must not be used. A context
// that had already ended sent nothing: BEGIN reports it as it would have without capture.
func prepareReference(ctx context.Context, conn *pgx.Conn, table string) error {
	pgConn := conn.PgConn()
	st := stateOf(pgConn)
	if st == nil || pgConn.TxStatus() != 'I' {
		return nil
	}
	if st.server != classifier.ServerPostgreSQL {
		// The xid read, the fast-path call and what a marker's absence proves are
		// PostgreSQL's: capture stays off, and nothing is sent.
		st.identityRead = true
		return nil
	}
	err := readIdentity(ctx, pgConn, st)
	if err == nil && table != "" && st.identityKnown() {
		err = checkMarker(ctx, pgConn, st, table)
	}
	if err == nil {
		return nil
	}
	if pgConn.IsClosed() {
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
	// endedBeforeCommit: the server answered the call with a FATAL. It reads its
	// messages in order and nothing after a FATAL, so COMMIT never ran.
	endedBeforeCommit bool
	ref               *outcome.ReconciliationRef
}

// commitWithReference sends the call of m (nil: the xid read; see callMsg) and COMMIT in
// one write: one network round trip, as plain COMMIT takes. A fast-path call is a
// FunctionCall message: the server calls the function by OID, with no parse, plan or
// portal, which make a Query message of the same call cost it twice as much and more
// (docs/performance.md), and whatever the session's search_path. The server ends each
// message with ReadyForQuery and flushes its output there, so the call's reply arrives
// before it reads COMMIT, even if the commit never answers. The caller has read the
// identity (see identityKnown).
func commitWithReference(ctx context.Context, conn *pgconn.PgConn, st *connState, commitSQL string, m *markerFn, id outcome.OperationID) commitResult {
	var res commitResult
	if ctx.Err() != nil || conn.IsClosed() || conn.IsBusy() {
		// pgconn refuses before writing a byte, and says why as pgx's Commit would.
		res.err = conn.Exec(ctx, commitSQL).Close()
		return res
	}
	// pgconn has no call that sends a FunctionCall, nor one that returns its reply: the
	// two messages go out through its frontend and the replies come back message by
	// message. The connection is idle, so its socket has room for the few bytes and the
	// write cannot block on the context's behalf.
	fe := conn.Frontend()
	msg, kind := st.callMsg(m, id)
	fe.Send(rawMessage(msg))
	fe.SendQuery(&pgproto3.Query{String: commitSQL})
	if err := fe.Flush(); err != nil {
		// Some bytes may have left (the error says whether none did): the connection is
		// unusable either way, and closing it makes the server roll back what it lacks.
		_ = conn.Close(cancelledCtx)
		res.err = err
		return res
	}
	var call wire.Reply
	err := readCallReply(ctx, conn, kind, &call)
	switch {
	case err == nil && call.ErrCode != "":
		// The call failed: COMMIT answers ROLLBACK. The call's error is what the
		// application is told, in place of that tag — unless it only says that the
		// transaction had already failed, when the ROLLBACK is COMMIT's own answer.
		cr, rerr := readReply(ctx, conn)
		res.rollbackTag = cr.tag.String() == "ROLLBACK"
		switch {
		case rerr != nil:
			res.err = commitReplyError{rerr}
		case call.ErrCode == pg.InFailedTransaction:
			res.err = pgx.ErrTxCommitRollback
		default:
			res.err = fmt.Errorf("otelpgxtx: the commit reference's call failed: %w", call.Err)
		}
		return res
	case err == nil:
		res.ref = st.callRef(m, id, call)
		cr, err := readReply(ctx, conn)
		res.tag, res.err = cr.tag, cr.err
		if err != nil {
			res.tag = pgconn.CommandTag{}
			if res.err == nil {
				res.err = commitReplyError{err}
			}
		}
		res.rollbackTag = res.tag.String() == "ROLLBACK"
	case pg.FatalError(err):
		// The server reads its messages in order and nothing after a FATAL.
		res.err, res.endedBeforeCommit = err, true
	default:
		// The connection broke: the call's reply, if any came, says what the call did.
		res.ref = st.callRef(m, id, call)
		res.err = commitReplyError{err}
	}
	return res
}

// readCallReply reads the reply to the library's call into r, up to its ReadyForQuery.
// A failure to read is returned and closes the connection (see readReply); a message
// that has no place there too.
func readCallReply(ctx context.Context, pgConn *pgconn.PgConn, kind wire.LibraryMessage, r *wire.Reply) error {
	for !r.Done {
		msg, err := pgConn.ReceiveMessage(ctx)
		if err != nil {
			if !pgConn.IsClosed() {
				_ = pgConn.Close(cancelledCtx)
			}
			return err
		}
		switch msg.(type) {
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus, *pgproto3.NotificationResponse:
			continue // pgconn has handled them
		}
		if !r.Take(kind, msg) {
			_ = pgConn.Close(cancelledCtx)
			return wire.ErrUnaccountedReply
		}
	}
	return nil
}

// reply is what the server answered to one message, read up to its ReadyForQuery.
type reply struct {
	tag pgconn.CommandTag // the last command tag
	err error             // the first ErrorResponse (an ERROR: pgconn returns a FATAL as readErr)
}

// readReply reads one reply up to its ReadyForQuery, as pgx reads a simple Query. A
// failure to read is returned as readErr and closes the connection, which pgconn leaves
// open on a timeout, so that no unread reply remains on a connection pgconn believes
// idle.
func readReply(ctx context.Context, pgConn *pgconn.PgConn) (r reply, readErr error) {
	for {
		msg, err := pgConn.ReceiveMessage(ctx)
		if err != nil {
			if !pgConn.IsClosed() {
				_ = pgConn.Close(cancelledCtx)
			}
			return r, err
		}
		switch m := msg.(type) {
		case *pgproto3.CommandComplete:
			r.tag = pgconn.NewCommandTag(string(m.CommandTag))
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

// commitSQLOf returns the commit statement a pgx transaction would send.
func commitSQLOf(opts pgx.TxOptions) string {
	if opts.CommitQuery != "" {
		return opts.CommitQuery
	}
	return "commit"
}
