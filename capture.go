package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// identitySQL reads what makes an xid meaningful: the cluster's system identifier, its
// current timeline and the server's start time. After a failover, and after a crash
// restart, the same xid may name another transaction. It also calls the function
// captureSQL calls, so that capture is only attempted where that call cannot fail for
// want of a privilege: an ERROR there would abort the transaction being committed.
const identitySQL = "select s.system_identifier::text, " + timelineSQL + ", " + serverStartSQL +
	", pg_current_xact_id_if_assigned()::text from pg_control_system() s"

// timelineSQL is the timeline the server writes WAL on, the first eight hex digits of
// the current WAL file's name, NULL on a standby. pg_control_checkpoint() shows the
// previous timeline until the first checkpoint after a promotion, which PostgreSQL 15 only
// requests after writing its end-of-recovery record (xlog.c, PerformRecoveryXLogAction),
// so an xid assigned meanwhile would be filed under the wrong history.
const timelineSQL = "case when pg_is_in_recovery() then null else " +
	"('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint::text end"

// serverStartSQL is pg_postmaster_start_time() in microseconds since the Unix epoch.
const serverStartSQL = "(extract(epoch from pg_postmaster_start_time()) * 1000000)::bigint::text"

// captureSQL reads the transaction's xid without assigning one: NULL means the
// transaction wrote nothing, so its commit changes nothing.
const captureSQL = "select " + captureXIDExpr

// captureXIDExpr is the xid read alone, which the commit marker's INSERT returns too, so
// that a marked commit needs no second query for its xid.
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
	if len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != 4 {
		return errors.New("otelpgxtx: reading the cluster identity: unexpected result shape")
	}
	row := results[0].Rows[0]
	if row[1] == nil {
		return errors.New("otelpgxtx: reading the cluster identity: the server is a standby; no reconciliation references on this connection")
	}
	sys, err1 := strconv.ParseUint(string(row[0]), 10, 64)
	tli, err2 := strconv.ParseUint(string(row[1]), 10, 32)
	start, err3 := strconv.ParseInt(string(row[2]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || sys == 0 || tli == 0 || start <= 0 {
		return fmt.Errorf("otelpgxtx: reading the cluster identity: unexpected values %q", row)
	}
	st.systemID, st.timeline, st.serverStart = sys, uint32(tli), start
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
	// endedBeforeCommit: the server answered the xid read with a FATAL. It executes the
	// pipeline's messages in order and reads nothing after a FATAL, so COMMIT never ran.
	endedBeforeCommit bool
	ref               *outcome.ReconciliationRef
}

// commitWithCapture sends the xid read, a Sync, COMMIT and a Sync in one write: one
// network round trip, as plain COMMIT takes. The Sync makes the server flush the xid
// before it starts committing, so the reference arrives even if the commit never
// answers. With a marker table (quoted), see commitWithMarker. The caller has read the
// identity (see identityKnown).
func commitWithCapture(ctx context.Context, pg *pgconn.PgConn, st *connState, commitSQL, marker string, id outcome.OperationID) commitResult {
	if marker != "" {
		return commitWithMarker(ctx, pg, st, commitSQL, marker, id)
	}
	var res commitResult
	p := pg.StartPipeline(ctx)
	p.SendQueryParams(captureSQL, nil, nil, nil, nil)
	p.SendPipelineSync()
	p.SendQueryParams(commitSQL, nil, nil, nil, nil)
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		res.err = err
		return res
	}
	xid, xidOK, err := readXID(p)
	res.endedBeforeCommit = classifier.IsFatal(err)
	if err == nil {
		err = expectSync(p)
	}
	if err == nil {
		var r any
		if r, err = p.GetResults(); err == nil {
			rr, ok := r.(*pgconn.ResultReader)
			if !ok {
				err = fmt.Errorf("otelpgxtx: unexpected pipeline result %T for COMMIT", r)
			} else {
				res.tag, err = rr.Close()
				res.rollbackTag = res.tag.String() == "ROLLBACK"
			}
		}
		if err == nil {
			err = expectSync(p)
		}
	}
	res.err = err
	if cerr := p.Close(); cerr != nil && res.err == nil {
		res.err = cerr
	}
	if xidOK {
		res.ref = st.ref(xid)
	}
	return res
}

// sqlStateInFailedTransaction is what a statement in an already failed transaction gets.
const sqlStateInFailedTransaction = "25P02"

// ref returns a reference to xid on st's cluster.
func (st *connState) ref(xid uint64) *outcome.ReconciliationRef {
	return &outcome.ReconciliationRef{XID: xid, SystemIdentifier: st.systemID, Timeline: st.timeline, ServerStart: st.serverStart}
}

// commitWithMarker sends the marker insert of id (returning the xid) and COMMIT as one
// simple Query: one message and one server flush, as a plain COMMIT — the Sync that
// makes the xid arrive before COMMIT runs costs the server a flush per commit, and the
// marker needs no xid. The server executes the two in order and abandons the rest of
// the string at an error: an insert that did not complete (an ERROR, or a FATAL before
// its command completed) means COMMIT never ran.
func commitWithMarker(ctx context.Context, pg *pgconn.PgConn, st *connState, commitSQL, marker string, id outcome.OperationID) commitResult {
	var res commitResult
	results, err := pg.Exec(ctx, markerSQL(marker, id)+"; "+commitSQL).ReadAll()
	res.ref = st.ref(0)
	res.ref.MarkerTable, res.ref.Operation = marker, id
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

// readXID reads the first pipeline result, the xid. A server ERROR there (an aborted
// transaction answers 25P02) is not the commit's error: the server skips to the Sync and
// then answers COMMIT with ROLLBACK. A FATAL is: the session ended there.
func readXID(p *pgconn.Pipeline) (xid uint64, ok bool, err error) {
	r, err := p.GetResults()
	if err != nil {
		if isServerError(err) {
			return 0, false, nil
		}
		return 0, false, err
	}
	rr, isReader := r.(*pgconn.ResultReader)
	if !isReader {
		return 0, false, fmt.Errorf("otelpgxtx: unexpected pipeline result %T for the xid", r)
	}
	rows := rr.Read()
	if rows.Err != nil {
		if isServerError(rows.Err) {
			return 0, false, nil
		}
		return 0, false, rows.Err
	}
	if len(rows.Rows) != 1 || len(rows.Rows[0]) != 1 {
		return 0, false, nil
	}
	if v := rows.Rows[0][0]; v != nil {
		n, perr := strconv.ParseUint(string(v), 10, 64)
		return n, perr == nil, nil
	}
	return 0, true, nil // NULL: no xid, the transaction wrote nothing
}

// isServerError reports a server error that leaves the session alive.
func isServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && !classifier.IsFatal(err)
}

func expectSync(p *pgconn.Pipeline) error {
	r, err := p.GetResults()
	if err != nil {
		return err
	}
	if _, ok := r.(*pgconn.PipelineSync); !ok {
		return fmt.Errorf("otelpgxtx: unexpected pipeline result %T, want the Sync", r)
	}
	return nil
}

// commitSQLOf returns the commit statement a pgx transaction would send.
func commitSQLOf(opts pgx.TxOptions) string {
	if opts.CommitQuery != "" {
		return opts.CommitQuery
	}
	return "commit"
}
