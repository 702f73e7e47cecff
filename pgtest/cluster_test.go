package pgtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// timeline returns the timeline the server writes WAL on now (the first eight hex
// digits of the current WAL file's name); pg_control_checkpoint() shows the old timeline
// until the first checkpoint after a promotion.
func timeline(t *testing.T, ctx context.Context, s *Server) int64 {
	t.Helper()
	var tli int64
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint").Scan(&tli)
	})
	if err != nil {
		t.Fatal(err)
	}
	return tli
}

// follower inserts rows through the cluster's multi-host connection string until stopped,
// reconnecting after every error, and records which inserts were acknowledged and how
// many failed.
type follower struct {
	mu    sync.Mutex
	acked []int
	errs  int
}

func (f *follower) run(ctx context.Context, connString, table string, stop <-chan struct{}) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for id := 1; ; id++ {
		select {
		case <-stop:
			return
		default:
		}
		if conn == nil || conn.IsClosed() {
			c, err := pgx.Connect(ctx, connString)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				f.mu.Lock()
				f.errs++
				f.mu.Unlock()
				continue
			}
			conn = c
		}
		_, err := conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", id)
		f.mu.Lock()
		if err == nil {
			f.acked = append(f.acked, id)
		} else {
			f.errs++
			_ = conn.Close(context.WithoutCancel(ctx))
			conn = nil
		}
		f.mu.Unlock()
	}
}

// progress returns how many inserts were acknowledged and how many failed so far.
func (f *follower) progress() (acked, errs int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.acked), f.errs
}

// waitProgress waits until the follower has had more acknowledged inserts than n.
func (f *follower) waitProgress(ctx context.Context, n int) error {
	tick := time.NewTicker(waitEventPoll)
	defer tick.Stop()
	for {
		if a, _ := f.progress(); a > n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: waiting for the follower to pass %d acknowledged inserts: %w", n, ctx.Err())
		case <-tick.C:
		}
	}
}

// TestClusterFailoverBackAndForth fails over twice, back and forth, while two clients
// that follow the primary (both hosts, target_session_attrs=read-write), one on plain TCP
// and one over verified TLS, keep committing: each loses its connection at each promotion
// and carries on with the new primary, no acknowledged commit is lost (synchronous
// replication), each promotion starts a new timeline, and the old primary comes back as a
// streaming standby.
func TestClusterFailoverBackAndForth(t *testing.T) {
	LeakCheck(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := ClusterFor(t, ctx)
	first := c.Primary()
	if in, err := c.Standby().InRecovery(ctx); err != nil || !in {
		t.Fatalf("standby: pg_is_in_recovery() = %v, %v; want true", in, err)
	}
	followers := []struct {
		table, connString string
		f                 follower
	}{{table: "cluster_follow", connString: c.ConnString()}, {table: "cluster_follow_tls", connString: c.TLSConnString()}}
	for i := range followers {
		if err := first.Exec(ctx, "CREATE TABLE "+followers[i].table+" (id int PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
	}
	if got := timeline(t, ctx, first); got != 1 {
		t.Fatalf("initial timeline = %d, want 1", got)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range followers {
		fl := &followers[i]
		wg.Go(func() { fl.f.run(ctx, fl.connString, fl.table, stop) })
	}
	stopped := false
	stopFollowers := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopFollowers()

	for round, wantTLI := range []int64{2, 3} {
		var errs [2]int
		for i := range followers {
			var acked int
			acked, errs[i] = followers[i].f.progress()
			if err := followers[i].f.waitProgress(ctx, acked); err != nil {
				t.Fatal(err)
			}
		}
		old := c.Primary()
		if err := c.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		if c.Primary() == old {
			t.Fatalf("round %d: Promote did not change the primary", round)
		}
		if got := timeline(t, ctx, c.Primary()); got != wantTLI {
			t.Errorf("round %d: new primary's timeline = %d, want %d", round, got, wantTLI)
		}
		if err := c.Rejoin(ctx); err != nil {
			t.Fatal(err)
		}
		if in, err := old.InRecovery(ctx); err != nil || !in {
			t.Fatalf("round %d: old primary after Rejoin: pg_is_in_recovery() = %v, %v; want true", round, in, err)
		}
		// The clients follow: they commit again, on the new primary.
		for i := range followers {
			acked2, _ := followers[i].f.progress()
			if err := followers[i].f.waitProgress(ctx, acked2); err != nil {
				t.Fatal(err)
			}
			if _, errs2 := followers[i].f.progress(); errs2 <= errs[i] {
				t.Errorf("round %d: the follower on %s saw no error across the promotion", round, followers[i].table)
			}
		}
	}
	stopFollowers()
	if c.Primary() != first {
		t.Error("after two failovers the first node is not primary again")
	}

	// Every acknowledged insert is on the primary, and the standby replays them all.
	var lsn string
	if err := c.Primary().withConn(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	}); err != nil {
		t.Fatal(err)
	}
	err := c.Standby().poll(ctx, "the standby to replay "+lsn, func(conn *pgx.Conn) (bool, error) {
		var ok bool
		err := conn.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&ok)
		return ok, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range followers {
		fl := &followers[i]
		acked, errs := fl.f.progress()
		t.Logf("%s: acknowledged inserts: %d, failed attempts: %d", fl.table, acked, errs)
		for role, node := range map[string]*Server{"primary": c.Primary(), "standby": c.Standby()} {
			var missing int
			err := node.withConn(ctx, func(conn *pgx.Conn) error {
				return conn.QueryRow(ctx, "SELECT count(*) FROM unnest($1::int[]) a(id) WHERE NOT EXISTS (SELECT FROM "+fl.table+" t WHERE t.id = a.id)", fl.f.acked).Scan(&missing)
			})
			if err != nil {
				t.Fatal(err)
			}
			if missing != 0 {
				t.Errorf("%s: %d acknowledged inserts are missing on the %s", fl.table, missing, role)
			}
		}
	}

	// The TLS follower's connections were TLS at the server, verified at the client.
	checkTransport(t, connect(t, parseConfig(t, c.TLSConnString())), true, true)
}

// TestClusterAsyncCommitLostInFailover documents the one loss synchronous replication
// exists to prevent: a commit with synchronous_commit = local is acknowledged by the
// primary before the standby has it, and a failover at that moment loses it — the client
// was told "committed" and the row is not in the surviving history.
func TestClusterAsyncCommitLostInFailover(t *testing.T) {
	LeakCheck(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := ClusterFor(t, ctx)
	const table = "cluster_lost"
	if err := c.Primary().Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	// The standby stops receiving (as when the network between the nodes fails).
	if err := c.Standby().StopImmediate(); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = local"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit on the old primary: %v (want acknowledged)", err)
	}
	if err := c.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("the connection to the crashed old primary still answers")
	}
	_ = conn.Close(ctx)
	follow, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer follow.Close(ctx)
	if follow.PgConn().Conn().RemoteAddr().String() != fmt.Sprintf("127.0.0.1:%d", c.Primary().Port()) {
		t.Errorf("the client connected to %s, want the new primary on port %d", follow.PgConn().Conn().RemoteAddr(), c.Primary().Port())
	}
	var n int
	if err := follow.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE id = 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("the acknowledged row is on the new primary (count %d): the standby had it after all", n)
	}
	if err := c.Rejoin(ctx); err != nil {
		t.Fatal(err)
	}
	// pg_rewind winds the old primary back too: the row is gone from every node.
	if err := c.Standby().withConn(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE id = 1").Scan(&n)
	}); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the rewound old primary still has the lost row")
	}
}
