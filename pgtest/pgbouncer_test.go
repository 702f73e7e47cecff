package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPgBouncerTransactionMode: two clients of a transaction-mode PgBouncer with one
// server connection run on the same backend, and a transaction keeps its backend to the
// end; after Close, PgBouncer no longer accepts connections, and a second Close is
// harmless.
func TestPgBouncerTransactionMode(t *testing.T) {
	ctx := ContextFor(t)
	b, err := StartPgBouncer(ctx, srv, "transaction", 1)
	if err != nil {
		t.Fatal(err)
	}
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, b.ConnString()+"&default_query_exec_mode=exec")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	pid := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) uint32 {
		var p uint32
		if err := q.QueryRow(ctx, "select pg_backend_pid()").Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c1, c2 := connect(), connect()
	p1, p2 := pid(c1), pid(c2)
	if p1 != p2 {
		t.Fatalf("backends %d and %d: two clients of a one-connection pool on different server connections", p1, p2)
	}
	if p1 == c1.PgConn().PID() {
		t.Fatalf("backend %d is the PID PgBouncer reported to the client: want a real backend behind it", p1)
	}
	tx, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if q1, q2 := pid(tx), pid(tx); q1 != q2 || q1 != p1 {
		t.Fatalf("backends %d, %d inside one transaction, want %d", q1, q2, p1)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if c, err := pgx.Connect(ctx, b.ConnString()); err == nil {
		_ = c.Close(ctx)
		t.Fatal("connected to a closed PgBouncer")
	}
}

// TestPgBouncerBadInput: an unknown pool mode and an empty pool are refused before
// anything starts, and a machine without PgBouncer gets an error that says how to
// install it.
func TestPgBouncerBadInput(t *testing.T) {
	ctx := ContextFor(t)
	t.Run("not installed", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		saved := pgbouncerDirs
		pgbouncerDirs = []string{t.TempDir()}
		defer func() { pgbouncerDirs = saved }()
		b, err := StartPgBouncer(ctx, srv, "transaction", 1)
		if err == nil {
			_ = b.Close()
			t.Fatal("started a PgBouncer that is not there")
		}
		if !strings.Contains(err.Error(), "apt-get install pgbouncer") {
			t.Fatalf("error %q does not say how to install PgBouncer", err)
		}
	})
	for _, c := range []struct {
		mode string
		size int
		want string
	}{{"transactional", 1, `unknown PgBouncer pool mode "transactional"`}, {"session", 0, "pool size 0"}} {
		b, err := StartPgBouncer(ctx, srv, c.mode, c.size)
		if err == nil {
			_ = b.Close()
			t.Fatalf("StartPgBouncer(%q, %d) started", c.mode, c.size)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("StartPgBouncer(%q, %d): %v, want %q", c.mode, c.size, err, c.want)
		}
	}
}

// TestPgBouncerSessionMode: in session mode a client keeps its server connection until it
// leaves, and the next client gets the same backend reset with DISCARD ALL: a statement
// the first client prepared is gone.
func TestPgBouncerSessionMode(t *testing.T) {
	ctx := ContextFor(t)
	b, err := StartPgBouncer(ctx, srv, "session", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var pids [2]uint32
	for i := range pids {
		c, err := pgx.Connect(ctx, b.ConnString())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRow(ctx, "select pg_backend_pid()").Scan(&pids[i]); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "prepare kept as select 1", pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if pids[0] != pids[1] {
		t.Fatalf("backends %d and %d: the second client did not get the first one's server connection", pids[0], pids[1])
	}
}

// TestPgBouncerTLS: a client may reach PgBouncer over TLS, verified against PgBouncer's
// CA file, directly or through a Proxy, while PgBouncer reaches the server in plain TCP;
// a plain client of the same PgBouncer stays plain.
func TestPgBouncerTLS(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	b := PgBouncerFor(t, ctx, srv, "session", 1)
	p, err := NewProxy(fmt.Sprintf("127.0.0.1:%d", b.port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	for _, c := range []struct {
		name, connString string
		tls              bool
	}{
		{"plain", b.ConnString(), false},
		{"tls", b.TLSConnString(), true},
		{"tls through a proxy", p.ConnString(b.TLSConnString()), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkTransport(t, connect(t, parseConfig(t, c.connString)), false, c.tls)
		})
	}
}
