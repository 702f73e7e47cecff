package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/outcome"
)

// identitySQL reads what makes an xid meaningful: the cluster's system identifier, its
// current timeline and the server's start time. After a failover, and after a crash
// restart, the same xid may name another transaction.
const identitySQL = "select s.system_identifier::text, " + timelineSQL + ", " + serverStartSQL +
	" from pg_control_system() s"

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
const captureSQL = "select pg_current_xact_id_if_assigned()::text"

// readIdentity reads the cluster identity into st, once per connection. It goes through
// pgconn directly: it is the instrumentation's own query, not the application's, and
// makes no span.
func readIdentity(ctx context.Context, pg *pgconn.PgConn, st *connState) error {
	if st.identityRead {
		return nil
	}
	st.identityRead = true // tried once: a refusal (no permission) is not retried per commit
	results, err := pg.Exec(ctx, identitySQL).ReadAll()
	if err != nil {
		return fmt.Errorf("otelpgxtx: reading the cluster identity: %w", err)
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != 3 {
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

// commitResult is what a COMMIT produced.
type commitResult struct {
	err         error
	rollbackTag bool
	ref         *outcome.ReconciliationRef
}

// commitWithCapture sends the xid read, a Sync, COMMIT and a Sync in one write: one
// network round trip, as plain COMMIT takes. The Sync makes the server flush the xid
// before it starts committing, so the reference arrives even if the commit never
// answers. Identity unknown (no permission for pg_control_*) leaves ref nil.
func commitWithCapture(ctx context.Context, pg *pgconn.PgConn, st *connState, commitSQL string) commitResult {
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
				var tag pgconn.CommandTag
				tag, err = rr.Close()
				res.rollbackTag = tag.String() == "ROLLBACK"
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
	if xidOK && st.systemID != 0 {
		ref := outcome.ReconciliationRef{XID: xid, SystemIdentifier: st.systemID, Timeline: st.timeline, ServerStart: st.serverStart}
		res.ref = &ref
	}
	return res
}

// readXID reads the first pipeline result, the xid. A server error there (an aborted
// transaction answers 25P02) is not the commit's error: the server skips to the Sync and
// then answers COMMIT with ROLLBACK.
func readXID(p *pgconn.Pipeline) (xid uint64, ok bool, err error) {
	r, err := p.GetResults()
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
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
		var pgErr *pgconn.PgError
		if errors.As(rows.Err, &pgErr) {
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
