package reference

import (
	"bytes"
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txevidence/otelpgxtx/internal/wire"
)

// The reference of a statement that may commit inside (CALL, DO, VACUUM …: evidence's
// Set.CommitsInside), sent outside a transaction block: its failure proves the rollback
// of its last transaction only, and no command tag tells how many it ran. A backend
// starts every transaction with the next local transaction id of its virtual transaction
// id (procNumber/lxid, which the transaction holds a lock on, shown in pg_locks), and
// every COMMIT or ROLLBACK inside a procedure ends one and starts another. So the lxid
// read ahead of the statement, in the same write, as a Query of its own (its transaction
// L), and read again after the statement failed, on the same connection (the failure path's
// one round trip), proves that the statement ran in exactly one transaction — which its
// error rolled back, so nothing of it committed — when the second read's is L+2 on the
// same backend: L+1 the statement's, L+2 the read's. Anything else (a transaction the
// backend started between, for a notification or a cache catch-up; an lxid wrapped past
// zero; another backend behind a pooler) proves nothing, and the frame stays unknown.

// lxidSQL reads the virtual transaction id of the reading transaction and the backend's
// pid; it assigns no xid, takes no lock a session could wait on, and cannot abort anything.
const lxidSQL = "select l.virtualtransaction, pg_catalog.pg_backend_pid()::text from pg_catalog.pg_locks l " +
	"where l.locktype operator(pg_catalog.=) 'virtualxid' and l.pid operator(pg_catalog.=) pg_catalog.pg_backend_pid() " +
	"and l.virtualxid operator(pg_catalog.=) l.virtualtransaction"

// insideReadTimeout bounds the failure path's read, should the server not answer.
const insideReadTimeout = 5 * time.Second

// vxid is a backend's virtual transaction id as pg_locks shows it, with the backend's pid.
type vxid struct {
	proc, lxid, pid uint32
	ok              bool
}

// parseVXID reads lxidSQL's row.
func parseVXID(row [][]byte) (v vxid) {
	if len(row) != 2 {
		return v
	}
	proc, lxid, found := bytes.Cut(row[0], []byte("/"))
	p, e1 := strconv.ParseUint(string(proc), 10, 32)
	l, e2 := strconv.ParseUint(string(lxid), 10, 32)
	pid, e3 := strconv.ParseUint(string(row[1]), 10, 32)
	if !found || e1 != nil || e2 != nil || e3 != nil {
		return vxid{}
	}
	return vxid{proc: uint32(p), lxid: uint32(l), pid: uint32(pid), ok: true}
}

// armInside has the write of f's statement s, which may commit inside, carry the lxid read
// ahead of it, as a Query of its own, on a checked connection to the server itself; else f
// has no such read, and its failure stays unknown.
func (c *Conn) armInside(f *Frame, s Statement) *Off {
	if c.identity.pooled {
		return nil
	}
	if c.lxidQuery == nil {
		c.lxidQuery, _ = (&pgproto3.Query{String: lxidSQL}).Encode(nil)
	}
	if c.nc.Arm(&wire.Addition{Kind: wire.LibraryQuery, Extended: true, AnyQuery: true, Msg: c.lxidQuery}) {
		c.adding, c.inside = true, f
	}
	return nil
}

// collectInside keeps, for f, the lxid read's answer r.
func (c *Conn) collectInside(f *Frame, r wire.Reply) {
	c.before, c.beforeOf = vxid{}, nil
	if r.Done && !r.Fatal && r.ErrCode == "" {
		c.before, c.beforeOf = parseVXID(r.Row), f
	}
}

// OneTransaction reports whether f's statement, which may commit inside and failed with an
// error reply on pg, idle and open, ran in exactly one transaction of its backend (see
// above): then its error rolled back all of it. It costs one round trip on pg, on this
// failure path only, and only where the read ahead of the statement answered.
func (c *Conn) OneTransaction(ctx context.Context, f *Frame, pg *pgconn.PgConn) bool {
	if f == nil {
		return false
	}
	before, of := c.before, c.beforeOf
	c.before, c.beforeOf = vxid{}, nil
	if of != f || !before.ok || c.identity.pooled || pg.IsClosed() || pg.IsBusy() || pg.TxStatus() != 'I' {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, insideReadTimeout)
	defer cancel()
	res, err := pg.Exec(ctx, lxidSQL).ReadAll()
	if err != nil || len(res) != 1 || res[0].Err != nil || len(res[0].Rows) != 1 {
		return false
	}
	after := parseVXID(res[0].Rows[0])
	return after.ok && after.proc == before.proc && after.pid == before.pid && after.lxid == before.lxid+2
}
