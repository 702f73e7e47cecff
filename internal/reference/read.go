package reference

import (
	"context"
	"strings"
	"time"

	"github.com/txevidence/otelpgxtx/internal/sqltext"
	"github.com/txevidence/otelpgxtx/internal/wire"
)

// Statement is what the references need of the statement whose write may carry an
// addition.
type Statement struct {
	SQL    string
	Single bool // the string holds one statement
	Writes bool // a statement may write
	Plain  bool // of no transaction-control kind
	// Opens: several statements, a BEGIN among them and no other transaction control
	// ("begin; insert …"), so that the string leaves a transaction open.
	Opens  bool
	Commit bool // a COMMIT (also AND CHAIN) or PREPARE TRANSACTION: it decides the transaction
	// InTx: the connection is in a transaction that has not failed (pgconn's status T).
	InTx bool
	// Inside: it may commit inside (CALL, DO, VACUUM …), when it runs alone.
	Inside bool
}

// ArmRead has the write of a statement s of f's transaction carry the xid read after the
// statement, so that the xid is on the client before COMMIT is written: a connection lost
// with COMMIT's write still leaves a reference the server can answer. The statement must
// be one that may assign the xid, leaves the transaction open, and cannot leave the server
// waiting for the client's data: statements that may write, none of them COPY, in a
// transaction that has not failed, or opening one ("begin; insert …" in one string: the
// read runs after the last, in the transaction they leave open, and answers for it, or
// fails with it). The transaction must have no xid known yet and not have begun
// read-only, and no cancel request may land on the read (see readsEarly). The read is
// taken once per transaction, unless it finds no xid yet. The marker's call stays ahead
// of COMMIT. ctx is the statement's context.
func (c *Conn) ArmRead(ctx context.Context, f *Frame, s Statement) {
	if f == nil {
		return
	}
	if f.xid != 0 || f.life.ReadOnly() || !f.life.Open() || !c.on(f.refs) || c.markerOf(f.refs) != nil ||
		!c.Known() || c.adding || !s.Writes || !(s.Plain && s.InTx || s.Opens) || !c.readsEarly(ctx, s.SQL) {
		return
	}
	// Inside the statement's Sync group, after its messages and before its Sync: should the
	// statement fail, the server skips the read without a word (after the Sync, in the
	// failed transaction, it would answer, and log, 25P02). A simple Query has no group:
	// the read follows it as a FunctionCall, which a failed statement makes the server
	// answer with 25P02 and log — the one place a reference can make the server log an
	// error of its own, the price of having the xid before COMMIT is written there.
	if c.nc.Arm(&wire.Addition{Kind: wire.LibraryPortal, Extended: true, Msg: c.implicitMsg(nil, f.id), OrCall: c.xidCall}) {
		c.adding, c.reading = true, f
	}
}

// readsEarly reports whether the xid read may follow the statements sql: none a COPY,
// whose FROM STDIN would take the read for its data, and no cancel request possible —
// pgconn's default context watcher sets a deadline and sends none; with another, only a
// context that can never be cancelled is safe, since a cancel request sent for the
// statement can arrive as the read runs, fail it, and so abort the transaction.
func (c *Conn) readsEarly(ctx context.Context, sql string) bool {
	for rest := sql; ; {
		if w, _ := sqltext.NextWord(rest); len(w) == len("copy") && strings.EqualFold(w, "copy") {
			return false
		}
		end := sqltext.StatementEnd(rest)
		if end >= len(rest) {
			break
		}
		rest = rest[end+1:]
	}
	return !c.cancels || ctx.Done() == nil
}

// Settle makes sure, before f's COMMIT is written, that the reply to an xid read after
// one of f's statements is in: it follows that statement's reply at once, so it is
// normally read already; if not, it is read now, for up to readWait (ctx's deadline, if
// sooner), so that a connection lost with COMMIT's write cannot take it along.
func (c *Conn) Settle(ctx context.Context, f *Frame) Collected {
	if f == nil {
		return Collected{}
	}
	if c.reading != f || !c.adding {
		return Collected{}
	}
	deadline := time.Now().Add(readWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.nc.Await(deadline)
	return c.Collect(f, true)
}

// readWait bounds how long Settle waits for a reply the server sent right after the
// statement's: only a connection that is failing keeps it that long.
const readWait = time.Second
