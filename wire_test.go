package otelpgxtx

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// TestWireUnchangedByInstrumentation records the whole conversation of plain pgx use of
// a pool — connect, queries, a committed and a rolled-back transaction, a batch, a
// prepared statement, autocommit writes (implicit transactions, each a frame: pool.Exec in
// two query modes, an INSERT … RETURNING, a batch of writes, a unique violation,
// CopyFrom), close — with and without InstrumentPool: the client's bytes are identical,
// and so is the sequence of the server's message types.
func TestWireUnchangedByInstrumentation(t *testing.T) {
	plainClient, plainServer := recordPlainUse(t, false)
	instrClient, instrServer := recordPlainUse(t, true)
	if !bytes.Equal(plainClient, instrClient) {
		t.Fatalf("client bytes differ with InstrumentPool:\nplain        %q\ninstrumented %q", plainClient, instrClient)
	}
	if !bytes.Equal(plainServer, instrServer) {
		t.Fatalf("server message types differ with InstrumentPool:\nplain        %q\ninstrumented %q", plainServer, instrServer)
	}
	t.Logf("%d client bytes, %d server messages, identical", len(plainClient), len(plainServer))
}

// recordPlainUse runs plain pgx work through a recording proxy and returns the client's
// bytes and the server's message types.
func recordPlainUse(t *testing.T, instrument bool) (client, serverTypes []byte) {
	t.Helper()
	ctx := pgtest.ContextFor(t)
	proxy := pgtest.ProxyFor(t, srv)
	rec := proxy.Record()
	const table = "wire_autocommit"
	srv.FreshTable(t, ctx, table, "id int primary key, v text")
	cfg, err := pgxpool.ParseConfig(proxy.ConnString(srv.ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = 1, 0
	// The pool's ping before handing out a connection idle for a second depends on timing.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	exp := tracetest.NewInMemoryExporter()
	if instrument {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		if _, err := InstrumentPool(cfg, WithTracerProvider(tp)); err != nil {
			t.Fatal(err)
		}
		var root trace.Span
		ctx, root = tp.Tracer("test").Start(ctx, "root") // otelpgx records under a recording parent
		defer root.End()
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer pool.Close()
		var n int
		if err := pool.QueryRow(ctx, "select $1::int + 1", 1).Scan(&n); err != nil || n != 2 {
			t.Fatalf("query: %d %v", n, err)
		}
		if _, err := pool.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
		for _, commit := range []bool{true, false} {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "select $1::int", 3); err != nil {
				t.Fatal(err)
			}
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		b := &pgx.Batch{}
		b.Queue("select 1")
		b.Queue("select $1::text", "x")
		if err := pool.SendBatch(ctx, b).Close(); err != nil {
			t.Fatal(err)
		}
		// Autocommit writes: implicit transactions.
		if _, err := pool.Exec(ctx, "insert into "+table+" values ($1, $2)", 1, "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "insert into "+table+" values ($1, $2)", pgx.QueryExecModeSimpleProtocol, 2, "b"); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, "insert into "+table+" values ($1, 'c') returning id", 3).Scan(&n); err != nil || n != 3 {
			t.Fatalf("insert returning: %d %v", n, err)
		}
		wb := &pgx.Batch{}
		wb.Queue("insert into "+table+" values ($1, 'd')", 4)
		wb.Queue("update "+table+" set v = 'e' where id = $1", 4)
		if err := pool.SendBatch(ctx, wb).Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "insert into "+table+" values ($1, 'dup')", 1); err == nil {
			t.Fatal("a duplicate key was inserted")
		}
		if _, err := pool.CopyFrom(ctx, pgx.Identifier{table}, []string{"id", "v"}, pgx.CopyFromRows([][]any{{5, "f"}})); err != nil {
			t.Fatal(err)
		}
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Conn().Prepare(ctx, "ps", "select $1::int * 2"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "ps", 4).Scan(&n); err != nil || n != 8 {
			t.Fatalf("prepared: %d %v", n, err)
		}
		conn.Release()
	}()
	if instrument && len(exp.GetSpans()) == 0 {
		t.Fatal("the instrumented pool recorded no span: the comparison would prove nothing")
	}
	// The 6 autocommit writes; not the read run by its name, "ps" (judged by the SQL it was
	// prepared with).
	if implicit := countImplicit(exp.GetSpans()); instrument && implicit != 6 {
		var got []string
		for _, sp := range exp.GetSpans() {
			if v, _ := attr(sp, ImplicitKey); v.AsBool() {
				q, _ := attr(sp, "db.query.text")
				got = append(got, sp.Name+": "+q.AsString())
			}
		}
		t.Fatalf("%d implicit transactions' frames, want 6: %q", implicit, got)
	}
	convs := rec.Conversations()
	if len(convs) != 1 {
		t.Fatalf("%d connections, want 1", len(convs))
	}
	select {
	case <-convs[0].Done():
	case <-ctx.Done():
		t.Fatal("the proxied connection never closed")
	}
	return canonicalStartup(t, convs[0].ClientBytes()), backendTypes(t, convs[0].ServerBytes())
}

// canonicalStartup sorts the parameters of the startup message at the head of a client's
// bytes: pgconn writes them from a map, in no fixed order.
func canonicalStartup(t *testing.T, b []byte) []byte {
	t.Helper()
	if len(b) < 8 {
		t.Fatalf("no startup message in %q", b)
	}
	n := int(binary.BigEndian.Uint32(b))
	if n < 8 || n > len(b) || b[n-1] != 0 {
		t.Fatalf("bad startup message %q", b)
	}
	params := strings.Split(string(b[8:n-2]), "\x00") // key, value, …; then the final NUL
	if len(params)%2 != 0 {
		t.Fatalf("odd startup parameters %q", params)
	}
	pairs := make([]string, 0, len(params)/2)
	for i := 0; i < len(params); i += 2 {
		pairs = append(pairs, params[i]+"\x00"+params[i+1])
	}
	sort.Strings(pairs)
	out := append([]byte(nil), b[:8]...)
	for _, p := range pairs {
		out = append(out, p...)
		out = append(out, 0)
	}
	out = append(out, 0)
	return append(out, b[n:]...)
}

// backendTypes returns the type byte of every message in a server's byte stream.
func backendTypes(t *testing.T, b []byte) []byte {
	t.Helper()
	var types []byte
	for len(b) > 0 {
		if len(b) < 5 {
			t.Fatalf("truncated server message %q", b)
		}
		n := int(binary.BigEndian.Uint32(b[1:5]))
		if n < 4 || len(b) < 1+n {
			t.Fatalf("bad server message length %d", n)
		}
		types = append(types, b[0])
		b = b[1+n:]
	}
	return types
}

// silentServer is a scripted PostgreSQL that completes the startup and then answers
// nothing: what it receives after the startup is recorded.
type silentServer struct {
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	recv [][]byte // per connection, the bytes after the startup message
}

func newSilentServer(t *testing.T) *silentServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentServer{ln: ln}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *silentServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		i := len(s.recv)
		s.recv = append(s.recv, nil)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c, i)
	}
}

func (s *silentServer) serve(c net.Conn, i int) {
	defer s.wg.Done()
	defer c.Close()
	be := pgproto3.NewBackend(c, c)
	if _, err := be.ReceiveStartupMessage(); err != nil {
		return
	}
	be.Send(&pgproto3.AuthenticationOk{})
	be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "15.0"})
	be.Send(&pgproto3.ParameterStatus{Name: "client_encoding", Value: "UTF8"})
	be.Send(&pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "on"})
	be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := be.Flush(); err != nil {
		return
	}
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		s.mu.Lock()
		s.recv[i] = append(s.recv[i], buf[:n]...)
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (s *silentServer) connString() string {
	return fmt.Sprintf("postgres://u@%s/db?sslmode=disable", s.ln.Addr())
}

func (s *silentServer) received() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]byte, len(s.recv))
	for i, r := range s.recv {
		out[i] = append([]byte(nil), r...)
	}
	return out
}

// TestConnectSilentServerUnchanged connects to a server that never answers a query,
// under a deadline, with and without the instrumentation: the connection (single and
// pooled) is handed out healthy in both cases, and the server receives the same bytes.
// When the instrumentation read the cluster identity at connect, that read ran into the
// deadline and pgx handed out a closed connection as a success.
func TestConnectSilentServerUnchanged(t *testing.T) {
	type result struct {
		err    error
		closed bool
		recv   [][]byte
	}
	run := func(t *testing.T, instrument, pooled bool) result {
		s := newSilentServer(t)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var r result
		if pooled {
			cfg, err := pgxpool.ParseConfig(s.connString())
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1
			cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
			if instrument {
				if _, err := InstrumentPool(cfg); err != nil {
					t.Fatal(err)
				}
			}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			c, err := pool.Acquire(ctx)
			r.err = err
			if err == nil {
				r.closed = c.Conn().IsClosed()
				c.Release()
			}
			pool.Close()
		} else {
			cfg, err := pgx.ParseConfig(s.connString())
			if err != nil {
				t.Fatal(err)
			}
			if instrument {
				if _, err := InstrumentConnConfig(cfg); err != nil {
					t.Fatal(err)
				}
			}
			c, err := pgx.ConnectConfig(ctx, cfg)
			r.err = err
			if err == nil {
				r.closed = c.IsClosed()
				c.Close(context.Background())
			}
		}
		s.ln.Close()
		s.wg.Wait()
		r.recv = s.received()
		return r
	}
	for _, pooled := range []bool{false, true} {
		t.Run(fmt.Sprintf("pooled %v", pooled), func(t *testing.T) {
			plain, instr := run(t, false, pooled), run(t, true, pooled)
			if plain.err != nil || plain.closed {
				t.Fatalf("without the library: err %v, closed %v", plain.err, plain.closed)
			}
			if instr.err != nil || instr.closed {
				t.Fatalf("with the library: err %v, closed %v; without: err %v, closed %v", instr.err, instr.closed, plain.err, plain.closed)
			}
			if fmt.Sprintf("%q", plain.recv) != fmt.Sprintf("%q", instr.recv) {
				t.Fatalf("the server received\nwithout %q\nwith    %q", plain.recv, instr.recv)
			}
			if len(instr.recv) != 1 || string(instr.recv[0]) != "X\x00\x00\x00\x04" {
				t.Fatalf("after the startup the server received %q, want only Terminate", instr.recv)
			}
		})
	}
}

// revokeIdentity takes EXECUTE on pg_control_system(), the function the cluster identity
// is read with, from every role but superusers (every other test's role) until t ends.
// Revoking it from PUBLIC is the only way to take it from one role; PostgreSQL's default
// is given back at the end, for the tests after t read the identity as an ordinary role
// (TestReconcilerAsOrdinaryRole), in the same process with -count=2 too.
func revokeIdentity(t *testing.T, ctx context.Context) {
	t.Helper()
	t.Cleanup(func() {
		if err := srv.Exec(context.WithoutCancel(ctx), "grant execute on function pg_control_system() to public"); err != nil {
			t.Error(err)
		}
	})
	if err := srv.Exec(ctx, "revoke execute on function pg_control_system() from public"); err != nil {
		t.Fatal(err)
	}
}

// TestRunIdentityRefused runs Run as a role that may not execute pg_control_system(),
// the function the cluster identity is read with, on an uninstrumented and an
// instrumented pool: the user's work commits and Run returns Committed, without a
// reference. When the identity was read inside the transaction, the permission error
// aborted it and COMMIT answered ROLLBACK.
func TestRunIdentityRefused(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	role := fmt.Sprintf("norun_%d", tableSeq.Add(1))
	for _, sql := range []string{
		"create role " + role + " login",
		"grant all on table " + table + " to " + role,
	} {
		if err := srv.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	revokeIdentity(t, ctx)
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var may bool
	err = conn.QueryRow(ctx, "select has_function_privilege($1, 'pg_control_system()', 'execute')", role).Scan(&may)
	conn.Close(ctx)
	if err != nil || may {
		t.Fatalf("the role may execute pg_control_system(): %v %v", may, err)
	}
	connString := strings.Replace(srv.ConnString(), "postgres@", role+"@", 1)
	for i, instrumented := range []bool{false, true} {
		t.Run(fmt.Sprintf("instrumented %v", instrumented), func(t *testing.T) {
			var pool *pgxpool.Pool
			var h *harness
			if instrumented {
				h = newHarness(t, connString, 1)
				pool = h.pool
			} else {
				pgtest.LeakCheck(t)
				var err error
				if pool, err = pgxpool.New(ctx, connString); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
			}
			for j := range 2 { // the second Run finds the refusal remembered
				id := 10*i + j
				res := Run(ctx, pool, DefaultPolicy(), insertFn(table, id))
				if _, ok := res.(outcome.Committed[int]); !ok {
					t.Fatalf("result = %T %+v, want Committed", res, res)
				}
				if !srv.RowExists(t, ctx, table, id) {
					t.Fatalf("row %d absent", id)
				}
			}
			if h == nil {
				return
			}
			for _, f := range h.frames() {
				if ref, ok := attr(f, ReconciliationRefKey); ok {
					t.Fatalf("a reference without the cluster identity: %v", ref.String())
				}
			}
		})
	}
}

// TestRunIdentityReadOnDeadConnection terminates the backend of the pool's idle
// connection: Run's BEGIN, with the identity check ahead of it in its write, is the first
// to find it dead. The attempt ends not_started and retryable like any failed BEGIN, the
// pool discards the connection, and the next attempt commits on a new one.
func TestRunIdentityReadOnDeadConnection(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	table := srv.NewTable(t, ctx, tableColumns)
	var pid uint32
	if err := h.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		pid = c.Conn().PgConn().PID()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Terminate(ctx, pid); err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitBackendGone(ctx, pid); err != nil {
		t.Fatal(err)
	}
	once := DefaultPolicy()
	once.MaxAttempts = 1
	res := Run(ctx, h.pool, once, insertFn(table, 1))
	rb, ok := res.(outcome.DeterminateRollback[int])
	if !ok || rb.Phase() != outcome.PhaseNotStarted || !rb.Retryable() {
		t.Fatalf("result = %T %+v, want a retryable rollback in not_started", res, res)
	}
	t.Logf("cause: %v", rb.Cause())
	if r := Run(ctx, h.pool, once, insertFn(table, 2)); r.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("second Run = %T %+v", r, r)
	}
	if n := h.pool.Stat().NewConnsCount(); n != 2 {
		t.Fatalf("%d connections made, want 2: the dead one must be discarded", n)
	}
	if srv.RowExists(t, ctx, table, 1) || !srv.RowExists(t, ctx, table, 2) {
		t.Fatal("rows: want only 2")
	}
}

// TestIdentityReadWithEndedContext: a BEGIN whose context had already ended sent
// nothing, the identity check ahead of it included: it does not turn references off for
// the connection (it used to count as a refusal), and the next check succeeds.
func TestIdentityReadWithEndedContext(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	conn := instrumentedConn(t, ctx, srv.ConnString())
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := checkReferences(cctx, conn, reference.Refs{Mode: reference.XID}); !errors.Is(err, context.Canceled) {
		t.Fatalf("with an ended context: %v", err)
	}
	// pgx closes a connection whose BEGIN failed, as it does without the library.
	if st := frame.State(conn.PgConn()); st.Refs.Checked() || st.Refs.Adding() {
		t.Fatal("an ended context counted as the server's answer")
	}
	conn = instrumentedConn(t, ctx, srv.ConnString())
	if err := checkReferences(ctx, conn, reference.Refs{Mode: reference.XID}); err != nil {
		t.Fatal(err)
	}
	if !frame.State(conn.PgConn()).Refs.Known() {
		t.Fatal("identity not read")
	}
}

// countImplicit counts the spans of implicit transactions' frames.
func countImplicit(spans tracetest.SpanStubs) int {
	n := 0
	for _, s := range spans {
		if v, _ := attr(s, ImplicitKey); v.AsBool() {
			n++
		}
	}
	return n
}
