package pgtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// transports are the two ways a client reaches the server: plain TCP and verified TLS.
// Connecting through a proxy takes connectTrips round trips (see Proxy.RoundTrips).
var transports = []struct {
	name         string
	connString   func() string
	connectTrips int64
}{
	{"plain", func() string { return srv.ConnString() }, 1},
	{"tls", func() string { return srv.TLSConnString() }, 2},
}

// connectVia connects through p with base's settings (see Proxy.ConnString).
func connectVia(t *testing.T, ctx context.Context, p *Proxy, base string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, p.ConnString(base))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func TestProxyForwards(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	p := ProxyFor(t, srv)
	c := connectVia(t, ctx, p, srv.ConnString())
	var port int
	if err := c.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port); err != nil {
		t.Fatal(err)
	}
	if port != srv.Port() {
		t.Errorf("server port through proxy = %d, want %d", port, srv.Port())
	}
	if c.PgConn().Conn().RemoteAddr().String() != p.Addr() {
		t.Errorf("client is connected to %s, not the proxy %s", c.PgConn().Conn().RemoteAddr(), p.Addr())
	}
}

func TestProxyConnString(t *testing.T) {
	LeakCheck(t)
	p := ProxyFor(t, srv)
	addr := p.Addr()
	for base, want := range map[string]string{
		"postgres://u:pw@db.example:5432/app?sslmode=disable":            "postgres://u:pw@" + addr + "/app?sslmode=disable",
		"postgresql://u@h1:1,h2:2/app?host=h3&port=3&application_name=x": "postgresql://u@" + addr + "/app?application_name=x",
		"user=u dbname=app host=db port=5432":                            fmt.Sprintf("user=u dbname=app host=db port=5432 host=127.0.0.1 port=%d", p.Port()),
	} {
		if got := p.ConnString(base); got != want {
			t.Errorf("ConnString(%q) = %q, want %q", base, got, want)
		}
	}
}

// TestProxyRoundTrips pins down the documented RoundTrips definition with
// pgx's observable behaviour.
func TestProxyRoundTrips(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := ProxyFor(t, srv)
			c := connectVia(t, ctx, p, tr.connString())
			if got := p.RoundTrips(); got != tr.connectTrips {
				t.Errorf("round trips to connect = %d, want %d (SSLRequest over TLS, startup, trust auth)", got, tr.connectTrips)
			}

			p.ResetRoundTrips()
			for range 3 {
				if _, err := c.Exec(ctx, "SELECT 1"); err != nil { // no arguments: simple protocol
					t.Fatal(err)
				}
			}
			if got := p.RoundTrips(); got != 3 {
				t.Errorf("round trips for 3 simple queries = %d, want 3", got)
			}

			var n int
			for i, want := range []int64{2, 1} { // prepare+execute, then cached execute
				p.ResetRoundTrips()
				if err := c.QueryRow(ctx, "SELECT $1::int", i).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if got := p.RoundTrips(); got != want {
					t.Errorf("query with arguments, run %d: %d round trips, want %d", i+1, got, want)
				}
			}

			p.ResetRoundTrips()
			b := &pgx.Batch{}
			for i := range 5 {
				b.Queue("SELECT $1::int", i)
			}
			if err := c.SendBatch(ctx, b).Close(); err != nil {
				t.Fatal(err)
			}
			if got := p.RoundTrips(); got != 1 {
				t.Errorf("batch of 5 cached queries: %d round trips, want 1", got)
			}
		})
	}
}

// commitStyles are the ways a client's COMMIT reaches the wire.
var commitStyles = []struct {
	name  string
	setup func(context.Context, *pgx.Conn) error
	// bindOnly styles send COMMIT as Bind/Execute/Sync of a statement that
	// is already prepared on the server.
	bindOnly bool
	// commit commits the open transaction.
	commit func(context.Context, *pgx.Conn) error
}{{
	name:   "simple Query",
	commit: func(ctx context.Context, c *pgx.Conn) error { _, err := c.Exec(ctx, "commit"); return err },
}, {
	name: "unnamed Parse+Bind in one write",
	commit: func(ctx context.Context, c *pgx.Conn) error {
		return c.PgConn().ExecParams(ctx, "  COMMIT", nil, nil, nil, nil).Read().Err
	},
}, {
	// The first batch prepares "commit" under a stmtcache name; later
	// batches send only Bind/Execute/Sync for it.
	name:     "statement-cached batch",
	bindOnly: true,
	commit: func(ctx context.Context, c *pgx.Conn) error {
		b := &pgx.Batch{}
		b.Queue("commit")
		return c.SendBatch(ctx, b).Close()
	},
}, {
	// pgx keys a statement prepared with name == sql by its SQL, so
	// Exec("commit") (what Tx.Commit sends) becomes Bind/Execute/Sync.
	name:     "explicitly prepared, via Tx.Commit",
	bindOnly: true,
	setup:    func(ctx context.Context, c *pgx.Conn) error { _, err := c.Prepare(ctx, "commit", "commit"); return err },
	commit:   func(ctx context.Context, c *pgx.Conn) error { _, err := c.Exec(ctx, "commit"); return err },
}}

// TestProxyCutCommit runs, per commit style and fault, on a fresh
// connection: one transaction with nothing armed (must commit normally),
// then one with the fault armed. For the Bind-only styles the armed COMMIT
// carries no Parse, so detection must come from the tracked statement name.
func TestProxyCutCommit(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	srv.FreshTable(t, ctx, "proxy_cut", "id int primary key")
	id := 0
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := ProxyFor(t, srv)
			for _, style := range commitStyles {
				for _, after := range []bool{true, false} {
					name := style.name + "/cut before commit"
					if after {
						name = style.name + "/cut after commit"
					}
					t.Run(name, func(t *testing.T) {
						c, err := pgx.Connect(ctx, p.ConnString(tr.connString()))
						if err != nil {
							t.Fatal(err)
						}
						defer c.Close(ctx)
						if style.setup != nil {
							if err := style.setup(ctx, c); err != nil {
								t.Fatal(err)
							}
						}
						begin := func() (rowID int, xid uint64) {
							id++
							if _, err := c.Exec(ctx, "BEGIN"); err != nil {
								t.Fatal(err)
							}
							if _, err := c.Exec(ctx, "INSERT INTO proxy_cut VALUES ($1)", id); err != nil {
								t.Fatal(err)
							}
							if err := c.QueryRow(ctx, "SELECT pg_current_xact_id()").Scan(&xid); err != nil {
								t.Fatal(err)
							}
							return id, xid
						}

						unarmed, _ := begin()
						if err := style.commit(ctx, c); err != nil {
							t.Fatalf("un-armed commit: %v", err)
						}
						if srv.CountOf(t, ctx, "SELECT count(*) FROM "+"proxy_cut"+" WHERE id = $1", unarmed) != 1 {
							t.Fatal("un-armed commit lost its row")
						}
						var cached int
						if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE statement ILIKE '%commit'").Scan(&cached); err != nil {
							t.Fatal(err)
						}
						if style.bindOnly && cached != 1 {
							t.Fatalf("%d prepared COMMIT statements on the connection, want 1: the Bind-only path is not exercised", cached)
						}

						cuts := p.Cuts()
						row, xid := begin()
						if after {
							p.CutAfterCommit()
						} else {
							p.CutBeforeCommit()
						}
						err = style.commit(ctx, c)
						if err == nil {
							t.Fatal("armed commit returned no error")
						}
						t.Logf("client error: %v", err)
						if got := p.Cuts() - cuts; got != 1 {
							t.Errorf("cuts = %d, want 1", got)
						}
						wantStatus, wantRows := "aborted", 0
						if after {
							wantStatus, wantRows = "committed", 1
						}
						if st := srv.Settled(t, ctx, xid); st != wantStatus {
							t.Errorf("transaction status = %q, want %q", st, wantStatus)
						}
						if n := srv.CountOf(t, ctx, "SELECT count(*) FROM "+"proxy_cut"+" WHERE id = $1", row); n != wantRows {
							t.Errorf("rows = %d, want %d", n, wantRows)
						}
					})
				}
			}
			if want := int64(2 * len(commitStyles)); p.Cuts() != want {
				t.Errorf("total cuts = %d, want %d", p.Cuts(), want)
			}
		})
	}
}

// TestProxyCutTwiceInPool arms a cut for two transactions in a row on one
// pool: the second runs on a fresh pooled connection after the first one was
// cut.
func TestProxyCutTwiceInPool(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	srv.FreshTable(t, ctx, "proxy_pool", "id int primary key")
	p := ProxyFor(t, srv)
	pool, err := pgxpool.New(ctx, p.ConnString(srv.ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for id := 1; id <= 2; id++ {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO proxy_pool VALUES ($1)", id); err != nil {
			t.Fatal(err)
		}
		var xid uint64
		if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()").Scan(&xid); err != nil {
			t.Fatal(err)
		}
		p.CutAfterCommit()
		if err := tx.Commit(ctx); err == nil {
			t.Fatalf("transaction %d: commit returned no error", id)
		}
		if st := srv.Settled(t, ctx, xid); st != "committed" {
			t.Errorf("transaction %d: status %q, want committed", id, st)
		}
		if got := p.Cuts(); got != int64(id) {
			t.Errorf("after transaction %d: cuts = %d", id, got)
		}
	}
}

func TestProxyCutAll(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	p := ProxyFor(t, srv)
	a, b := connectVia(t, ctx, p, srv.ConnString()), connectVia(t, ctx, p, srv.ConnString())
	p.CutAll()
	if got := p.Cuts(); got != 2 {
		t.Errorf("cuts = %d, want 2", got)
	}
	for _, c := range []*pgx.Conn{a, b} {
		if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
			t.Error("query on a cut connection succeeded")
		}
	}
	// The proxy itself keeps working.
	c := connectVia(t, ctx, p, srv.ConnString())
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}

// TestProxyCloseWithLiveConnections checks that Close ends live relays and
// leaves no goroutines (leakCheck) even though clients are still connected.
func TestProxyCloseWithLiveConnections(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	p, err := NewProxy(fmt.Sprintf("%s:%d", srv.Host(), srv.Port()))
	if err != nil {
		t.Fatal(err)
	}
	var conns []*pgx.Conn
	for range 3 {
		c, err := pgx.Connect(ctx, p.ConnString(srv.ConnString()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		conns = append(conns, c)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, c := range conns {
		if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
			t.Error("query through a closed proxy succeeded")
		}
	}
	if _, err := pgx.Connect(ctx, p.ConnString(srv.ConnString())); err == nil {
		t.Error("connected through a closed proxy")
	}
}

func TestIsCommitSQL(t *testing.T) {
	for sql, want := range map[string]bool{
		"commit": true, "COMMIT": true, "  Commit;": true, "end": true, "END TRANSACTION": true,
		"commit prepared 'x'": true, "PREPARE TRANSACTION 'g'": true, "prepare /* c */ transaction 'g'": true,
		"rollback prepared 'x'": true, "prepare q as select 1": false, "prepare transactions": false, "/* trace */ commit": true, "-- c\n commit": true,
		"/* a /* nested */ b */commit": true,
		"committed":                    false, "endless": false, "commit_x": false, "rollback": false,
		"select 'commit'": false, "": false, "/* unterminated commit": false,
	} {
		if got := isCommitSQL(sql); got != want {
			t.Errorf("isCommitSQL(%q) = %v, want %v", sql, got, want)
		}
	}
}

// TestProxyDelay: with a delay, every round trip takes at least the two one-way
// delays, round trips are counted as without one, and pipelined messages and large
// replies arrive complete and in order.
func TestProxyDelay(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	p := ProxyFor(t, srv)
	const toServer, toClient = 3 * time.Millisecond, 2 * time.Millisecond
	p.SetDelay(toServer, toClient)
	c := connectVia(t, ctx, p, srv.ConnString())

	p.ResetRoundTrips()
	for range 3 {
		t0 := time.Now()
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d < toServer+toClient {
			t.Errorf("a round trip took %v, less than the delays %v", d, toServer+toClient)
		}
	}
	if got := p.RoundTrips(); got != 3 {
		t.Errorf("round trips for 3 simple queries = %d, want 3", got)
	}

	b := &pgx.Batch{}
	for i := range 500 {
		b.Queue("SELECT $1::int, repeat('x', $1::int)", i)
	}
	br := c.SendBatch(ctx, b)
	for i := range 500 {
		var n int
		var s string
		if err := br.QueryRow().Scan(&n, &s); err != nil {
			t.Fatal(err)
		}
		if n != i || len(s) != i {
			t.Fatalf("batch reply %d: %d, %d bytes", i, n, len(s))
		}
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	var sum, length int64
	if err := c.QueryRow(ctx, "SELECT sum(g), sum(length(md5(g::text) || repeat('y', g % 100))) FROM generate_series(1, 200000) g").
		Scan(&sum, &length); err != nil {
		t.Fatal(err)
	}
	rows, err := c.Query(ctx, "SELECT g, md5(g::text) || repeat('y', g % 100) FROM generate_series(1, 200000) g")
	if err != nil {
		t.Fatal(err)
	}
	var gotSum, gotLength, want int64
	for rows.Next() {
		var g int64
		var s string
		if err := rows.Scan(&g, &s); err != nil {
			t.Fatal(err)
		}
		if want++; g != want {
			t.Fatalf("row %d arrived as row %d", g, want)
		}
		gotSum += g
		gotLength += int64(len(s))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if gotSum != sum || gotLength != length {
		t.Errorf("200000 rows through the delay: sum %d, %d bytes; the server counted %d, %d", gotSum, gotLength, sum, length)
	}
}

// TestProxyProcess runs the delaying proxy in a child process (this test binary).
func TestProxyProcess(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	const delay = 2 * time.Millisecond
	pp, err := StartProxyProcess(fmt.Sprintf("%s:%d", srv.Host(), srv.Port()), delay, delay)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, pp.ConnString(srv.ConnString()))
	if err != nil {
		t.Fatal(err)
	}
	var port int
	t0 := time.Now()
	if err := c.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 2*delay {
		t.Errorf("a round trip took %v, less than the delays %v", d, 2*delay)
	}
	if port != srv.Port() {
		t.Errorf("server port through the proxy process = %d, want %d", port, srv.Port())
	}
	if c.PgConn().Conn().RemoteAddr().String() == fmt.Sprintf("%s:%d", srv.Host(), srv.Port()) {
		t.Error("connected to the server directly, not through the proxy process")
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The child was handed this process's CA: TLS through it verifies as through a Proxy.
	tc := connect(t, parseConfig(t, pp.ConnString(srv.TLSConnString())))
	checkTransport(t, tc, true, true)
	if err := tc.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pp.Close(); err != nil {
		t.Errorf("proxy process Close: %v", err)
	}
}

// TestProxyDropsCancelDuringCutAll: pgx answers the close of CutAll (and ResetAll) with a
// CancelRequest (pgconn's asyncClose), which can reach the proxy before CutAll returns; the
// proxy drops it all the same, so that what the server still runs after a cut is not
// cancelled by chance (a statement waiting for a lock, in TestCommitsMoreThanOnce). The
// seam afterClose holds the cut, after its close, until that CancelRequest was dropped or
// the backend's pg_sleep ended.
func TestProxyDropsCancelDuringCutAll(t *testing.T) {
	ctx := ContextFor(t)
	for _, cut := range []struct {
		name string
		do   func(*Proxy)
	}{{"CutAll", (*Proxy).CutAll}, {"ResetAll", (*Proxy).ResetAll}} {
		t.Run(cut.name, func(t *testing.T) {
			p := ProxyFor(t, srv)
			c := connectVia(t, ctx, p, srv.ConnString())
			pid := c.PgConn().PID()
			done := make(chan error, 1)
			go func() {
				_, err := c.Exec(ctx, "select pg_sleep(600)")
				done <- err
			}()
			if err := srv.WaitForWaitEvent(ctx, pid, "PgSleep"); err != nil {
				t.Fatal(err)
			}
			sleeping := func(c *pgx.Conn) (bool, error) {
				var n int
				err := c.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1 and wait_event = 'PgSleep'", int64(pid)).Scan(&n)
				return n == 1, err
			}
			p.afterClose = func() {
				err := srv.poll(ctx, "the cut's CancelRequest dropped, or the backend cancelled", func(c *pgx.Conn) (bool, error) {
					if p.dropped.Load() > 0 {
						return true, nil
					}
					ok, err := sleeping(c)
					return !ok, err
				})
				if err != nil {
					t.Error(err)
				}
			}
			cut.do(p)
			if err := <-done; err == nil {
				t.Fatal("the statement survived the cut")
			}
			if n := p.dropped.Load(); n != 1 {
				t.Fatalf("%d CancelRequests dropped, want pgx's one", n)
			}
			c2, err := srv.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close(ctx)
			if ok, err := sleeping(c2); err != nil || !ok {
				t.Fatalf("backend %d no longer sleeps (%v): the cancel reached the server", pid, err)
			}
			if err := srv.Terminate(ctx, pid); err != nil {
				t.Fatal(err)
			}
			if err := srv.WaitBackendGone(ctx, pid); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestProxyDropsCancelAfterCut: a CancelRequest goes through the proxy until it has cut
// a connection; from then on it is dropped, as by a network that lost the server, so
// that pgx's own cancel of the broken connection cannot abort a COMMIT it forwarded.
func TestProxyDropsCancelAfterCut(t *testing.T) {
	ctx := ContextFor(t)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			p := ProxyFor(t, srv)
			// sleep runs pg_sleep through the proxy and cancels it once the server runs it.
			sleep := func() error {
				c := connectVia(t, ctx, p, tr.connString())
				defer c.Close(ctx)
				pid := c.PgConn().PID()
				done := make(chan error, 1)
				go func() {
					_, err := c.Exec(ctx, "select pg_sleep(1)")
					done <- err
				}()
				if err := srv.WaitForWaitEvent(ctx, pid, "PgSleep"); err != nil {
					t.Fatal(err)
				}
				if err := c.PgConn().CancelRequest(ctx); err != nil {
					t.Fatal(err)
				}
				return <-done
			}
			if err := sleep(); err == nil {
				t.Fatal("before any cut: the cancel request did not reach the server")
			}
			c := connectVia(t, ctx, p, tr.connString())
			defer c.Close(ctx)
			if _, err := c.Exec(ctx, "begin"); err != nil {
				t.Fatal(err)
			}
			p.CutAfterCommit()
			if _, err := c.Exec(ctx, "commit"); err == nil || p.Cuts() != 1 {
				t.Fatalf("cut after commit: %v, %d cuts", err, p.Cuts())
			}
			if err := sleep(); err != nil {
				t.Fatalf("after a cut: %v, want the cancel request dropped", err)
			}
			if p.Cuts() != 1 {
				t.Fatalf("%d cuts: a dropped cancel request is no cut", p.Cuts())
			}
		})
	}
}
