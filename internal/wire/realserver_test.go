package wire

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txevidence/otelpgxtx/pgtest"
)

// srv is the real PostgreSQL of the tests that need a server's own replies.
var srv *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &srv) }

// realConn connects pgconn to the real server through a Conn that tracks message
// boundaries, as the instrumentation wraps it (AfterNetConnect, before the startup
// exchange).
func realConn(t *testing.T, ctx context.Context) (*pgconn.PgConn, *Conn) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	var wc *Conn
	cfg.AfterNetConnect = func(_ context.Context, _ *pgconn.Config, c net.Conn) (net.Conn, error) {
		wc = NewConn(c, nil, true)
		return wc, nil
	}
	pc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close(context.WithoutCancel(ctx)) })
	return pc, wc
}

// exec runs sql and returns its last result's rows as text, failing on an error.
func exec(t *testing.T, ctx context.Context, pc *pgconn.PgConn, sql string) ([][][]byte, string) {
	t.Helper()
	results, err := pc.Exec(ctx, sql).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	last := results[len(results)-1]
	return last.Rows, last.CommandTag.String()
}

// xidReadCall is the xid read's FunctionCall on pc's server, as the identity check finds
// the function's OID.
func xidReadCall(t *testing.T, ctx context.Context, pc *pgconn.PgConn) []byte {
	t.Helper()
	rows, _ := exec(t, ctx, pc, "select 'pg_catalog.pg_current_xact_id_if_assigned()'::pg_catalog.regprocedure::pg_catalog.oid::text")
	oid, err := strconv.ParseUint(string(rows[0][0]), 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	call, err := (&pgproto3.FunctionCall{Function: uint32(oid)}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	return call
}

// TestSpliceRealServer splices the library's two messages into a real server's stream,
// each ahead of the statement it was armed for, in the same write: the identity Query
// ahead of BEGIN, the xid read (a fast-path FunctionCall) ahead of COMMIT. pgconn reads
// exactly its own replies (BEGIN, COMMIT, and the row the transaction's own statements
// return), the library's replies are read whole by Reply, and the connection is left at
// a message boundary, usable: the next statement's reply is its own. A call that fails in
// a failed transaction (25P02) is the library's, and COMMIT still answers ROLLBACK.
func TestSpliceRealServer(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pc, wc := realConn(t, ctx)
	xidRead := xidReadCall(t, ctx, pc)
	identity, err := (&pgproto3.Query{String: "select pg_catalog.current_database()::text"}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}

	// The identity ahead of BEGIN.
	if !wc.Arm(&Addition{Kind: LibraryQuery, Match: "begin", Msg: identity}) {
		t.Fatal("the addition to BEGIN was refused at a message boundary")
	}
	if _, tag := exec(t, ctx, pc, "begin"); tag != "BEGIN" {
		t.Fatalf("BEGIN's reply %q", tag)
	}
	a := collected(wc)
	if a == nil || !a.Sent() || !a.Reply().Done || a.Reply().ErrCode != "" || len(a.Reply().Row) != 1 || string(a.Reply().Row[0]) != "postgres" {
		t.Fatalf("the identity addition: %+v", a)
	}

	// The transaction's own statements, then the xid read ahead of COMMIT.
	rows, _ := exec(t, ctx, pc, "create temporary table splice_t (n int); insert into splice_t values (1); select pg_catalog.pg_current_xact_id()::text")
	xid := string(rows[0][0])
	if !wc.Arm(&Addition{Kind: LibraryCall, Match: "commit", Msg: xidRead, Commit: true}) {
		t.Fatal("the addition to COMMIT was refused")
	}
	if _, tag := exec(t, ctx, pc, "commit"); tag != "COMMIT" {
		t.Fatalf("COMMIT's reply %q", tag)
	}
	a = collected(wc)
	if r := a.Reply(); a == nil || !r.Done || !r.GotValue || string(r.Value) != xid || r.ErrCode != "" {
		t.Fatalf("the xid read: %+v, want %s", a, xid)
	}
	if rows, _ := exec(t, ctx, pc, "select n from splice_t"); len(rows) != 1 || string(rows[0][0]) != "1" {
		t.Fatalf("after the commit, the connection reads %q", rows)
	}

	// In a transaction that has already failed, the call gets 25P02 and COMMIT answers
	// ROLLBACK, as it does without the call.
	exec(t, ctx, pc, "begin")
	if _, err := pc.Exec(ctx, "select 1/0").ReadAll(); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if !wc.Arm(&Addition{Kind: LibraryCall, Match: "commit", Msg: xidRead, Commit: true}) {
		t.Fatal("the addition to COMMIT was refused")
	}
	if _, tag := exec(t, ctx, pc, "commit"); tag != "ROLLBACK" {
		t.Fatalf("COMMIT of a failed transaction answered %q, want ROLLBACK", tag)
	}
	if r := collected(wc).Reply(); !r.Done || r.ErrCode != "25P02" || r.GotValue || r.Fatal {
		t.Fatalf("the call in a failed transaction: %+v", r)
	}
	if rows, _ := exec(t, ctx, pc, "select 2"); len(rows) != 1 || string(rows[0][0]) != "2" {
		t.Fatalf("after the rollback, the connection reads %q", rows)
	}
	if pc.TxStatus() != 'I' {
		t.Fatalf("transaction status %c, want idle", pc.TxStatus())
	}
}

// TestSpliceAfterRealServer adds the xid read after the application's messages, in the
// same write, as the tracer does after a statement that may assign the transaction's xid:
// after a simple Query, after the extended protocol's Bind, Execute, Sync (pgx's
// prepare-only write before it is passed over: the addition waits for the write that
// executes), and after a statement that fails. pgconn reads exactly its own replies, Await
// gets the library's reply before the next write, it names the xid the transaction holds,
// and COMMIT then carries nothing of the library's.
func TestSpliceAfterRealServer(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	pc, wc := realConn(t, ctx)
	xidRead := xidReadCall(t, ctx, pc)
	read := func(t *testing.T) Reply {
		t.Helper()
		if !wc.Await(time.Now().Add(10 * time.Second)) {
			t.Fatal("the reply to the xid read never came whole")
		}
		a, pending := wc.Collect(false)
		if a == nil || pending || !a.Sent() {
			t.Fatalf("the xid read after the statement: %+v, pending %v", a, pending)
		}
		return a.Reply()
	}
	// beginArmed begins a transaction and arms the xid read for the next statement's write.
	beginArmed := func(t *testing.T) {
		t.Helper()
		exec(t, ctx, pc, "begin")
		if !wc.Arm(&Addition{Kind: LibraryCall, Msg: xidRead, After: true}) {
			t.Fatal("refused at a message boundary")
		}
	}
	// readThenCommit checks the read's xid against the one the transaction holds, then
	// commits: COMMIT carries nothing of the library's.
	readThenCommit := func(t *testing.T) {
		t.Helper()
		r := read(t)
		rows, _ := exec(t, ctx, pc, "select pg_catalog.pg_current_xact_id()::text")
		if !r.Done || !r.GotValue || string(r.Value) != string(rows[0][0]) {
			t.Fatalf("the xid read %+v, want %s", r, rows[0][0])
		}
		if _, tag := exec(t, ctx, pc, "commit"); tag != "COMMIT" {
			t.Fatalf("COMMIT's reply %q", tag)
		}
	}
	exec(t, ctx, pc, "create temporary table splice_after (n int)")

	t.Run("simple", func(t *testing.T) {
		beginArmed(t)
		if _, tag := exec(t, ctx, pc, "insert into splice_after values (1)"); tag != "INSERT 0 1" {
			t.Fatalf("the insert's reply %q", tag)
		}
		readThenCommit(t)
	})

	t.Run("extended", func(t *testing.T) {
		beginArmed(t)
		// Parse, Describe, Sync executes nothing: the addition waits for Bind, Execute, Sync.
		sd, err := pc.Prepare(ctx, "ins", "insert into splice_after values ($1) returning n", nil)
		if err != nil {
			t.Fatal(err)
		}
		if wc.splice.added != nil || wc.splice.next.Load() == nil {
			t.Fatalf("the prepare-only write took the addition: %+v", wc.splice.added)
		}
		res := pc.ExecPrepared(ctx, sd.Name, [][]byte{[]byte("2")}, nil, nil).Read()
		if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != "2" {
			t.Fatalf("the insert's reply: %+v", res)
		}
		readThenCommit(t)
	})

	t.Run("failed", func(t *testing.T) {
		beginArmed(t)
		_, err := pc.Exec(ctx, "insert into splice_after values (1/0)").ReadAll()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
			t.Fatalf("the failing insert: %v", err)
		}
		if r := read(t); r.ErrCode != "25P02" || r.GotValue || r.Fatal {
			t.Fatalf("the call after a failed statement: %+v", r)
		}
		if _, tag := exec(t, ctx, pc, "commit"); tag != "ROLLBACK" {
			t.Fatalf("COMMIT of the failed transaction answered %q", tag)
		}
	})

	if rows, _ := exec(t, ctx, pc, "select count(*)::text from splice_after"); string(rows[0][0]) != "2" {
		t.Fatalf("rows committed: %s, want 2", rows[0][0])
	}
	if pc.TxStatus() != 'I' || !wc.splice.pos.atBoundary() {
		t.Fatalf("transaction status %c, at a boundary %v", pc.TxStatus(), wc.splice.pos.atBoundary())
	}
}
