package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Cluster is a primary and a streaming standby made from it with pg_basebackup (or, where
// the installation lacks it, the server's low-level backup functions), with
// synchronous replication to the standby, which can fail over and back as often as a
// test wants: Promote crashes the primary and promotes the standby, Rejoin brings the old
// primary back as the new primary's standby with pg_rewind.
//
// It is separate from the single [Server] that [Main] starts, whose phantom synchronous
// standby never connects (the "committed locally" cases need that wait to never end).
type Cluster struct {
	nodes [2]*Server

	mu      sync.Mutex
	primary int  // index of the node that is primary
	down    bool // the old primary is stopped and not yet rejoined
}

// clusterConfig is shared by both nodes. Synchronous replication names both nodes, so
// whichever is standby is the synchronous one and nothing changes at a failover;
// pg_rewind needs wal_log_hints and full_page_writes.
const clusterConfig = `
# added by pgtest for a Cluster
wal_level = replica
max_wal_senders = 10
wal_keep_size = 256MB
wal_log_hints = on
full_page_writes = on
hot_standby = on
synchronous_standby_names = 'FIRST 1 (node0, node1)'
synchronous_commit = on
`

// StartCluster creates the primary, takes a base backup of it for the standby and starts
// both; it returns once the standby streams synchronously. Close it when done.
func StartCluster(ctx context.Context) (*Cluster, error) {
	c := &Cluster{}
	for i := range c.nodes {
		s, err := newServer(fmt.Sprintf("pgtest-node%d-", i), "")
		if err != nil {
			return nil, errors.Join(err, c.Close())
		}
		c.nodes[i] = s
	}
	p := c.nodes[0]
	if err := p.initdb(); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if err := p.writeConfig(c.nodeConfig(0)); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if err := p.startServer(ctx); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	sb := c.nodes[1]
	if err := sb.baseBackup(ctx, p); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if err := c.startStandby(ctx, 1); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// ClusterFor starts a Cluster for a test and closes it when the test ends; a cluster that
// cannot start fails tb.
func ClusterFor(tb testing.TB, ctx context.Context) *Cluster {
	tb.Helper()
	c, err := StartCluster(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Error(err)
		}
	})
	return c
}

// nodeConfig is node i's own part of postgresql.conf; the standby's primary_conninfo
// names the other node (ignored while i is primary: it has no standby.signal).
// Replication stays on plain TCP, as it was before the nodes served TLS.
func (c *Cluster) nodeConfig(i int) string {
	other := c.nodes[1-i]
	return clusterConfig + fmt.Sprintf(`cluster_name = 'node%d'
primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=node%d sslmode=disable'
`, i, other.port, i)
}

// startStandby makes node i a standby of the other node and starts it, then waits until
// the primary reports it streaming as its synchronous standby. Base backups and pg_rewind
// copy the source's postgresql.conf, so node i's own settings are appended again.
func (c *Cluster) startStandby(ctx context.Context, i int) error {
	s := c.nodes[i]
	if err := s.writeConfig(c.nodeConfig(i)); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.dataDir, "standby.signal"), nil, 0o600); err != nil {
		return err
	}
	if s.cred != nil {
		if err := os.Chown(filepath.Join(s.dataDir, "standby.signal"), int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return err
		}
	}
	s.mu.Lock()
	err := s.startServer(ctx)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return c.waitSynchronous(ctx, i)
}

// waitSynchronous waits until the primary reports node i streaming as its synchronous
// standby.
func (c *Cluster) waitSynchronous(ctx context.Context, i int) error {
	name := fmt.Sprintf("node%d", i)
	return c.nodes[1-i].poll(ctx, name+" to stream as the synchronous standby", func(conn *pgx.Conn) (bool, error) {
		var n int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' AND sync_state = 'sync'", name).Scan(&n)
		return n == 1, err
	})
}

// Primary returns the node that is primary now.
func (c *Cluster) Primary() *Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[c.primary]
}

// Standby returns the other node: a running standby, or after Promote and before Rejoin,
// the stopped old primary.
func (c *Cluster) Standby() *Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[1-c.primary]
}

// ConnString returns a URL naming both nodes with target_session_attrs=read-write, so a
// client connects to whichever is primary, as clients of a failover pair do.
func (c *Cluster) ConnString() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		c.nodes[0].port, c.nodes[1].port)
}

// TLSConnString is ConnString over TLS, verified as Server.TLSConnString is: one CA
// signed both nodes' certificates.
func (c *Cluster) TLSConnString() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?%s&target_session_attrs=read-write",
		c.nodes[0].port, c.nodes[1].port, tlsQuery(c.nodes[0].certs.ca))
}

// Promote fails over: it stops the primary like a crash (pg_ctl stop -m immediate) unless
// a test stopped it already, starts the standby if a test stopped it, and promotes it
// (pg_ctl promote, which waits until it accepts writes). Commits in
// flight on the old primary lose their connection; with synchronous replication the
// standby has every commit that was acknowledged. The old primary stays down until Rejoin.
func (c *Cluster) Promote(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return errors.New("pgtest: Promote: the cluster has no standby (Rejoin first)")
	}
	old, next := c.nodes[c.primary], c.nodes[1-c.primary]
	if err := old.stopIfRunning(); err != nil {
		return err
	}
	c.down = true
	if !next.isRunning() {
		if err := next.Restart(ctx); err != nil {
			return err
		}
	}
	if err := next.run(ctx, next.bins.pgCtl, "promote", "-w", "-t", "60", "-D", next.dataDir); err != nil {
		return fmt.Errorf("%w\nserver log (%s) ends with:\n%s", err, next.logFile, next.logTail(30))
	}
	c.primary = 1 - c.primary
	return nil
}

// Rejoin brings the old primary back as the new primary's synchronous standby:
// pg_rewind winds its data directory back to the point where the histories forked (it
// first runs crash recovery on it, since Promote crashed it), then it starts streaming.
// An installation without pg_rewind (the npm packages' builds) replaces the old
// primary's data directory with a new base backup of the new primary instead: the same
// standby, without the rewind.
func (c *Cluster) Rejoin(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.down {
		return errors.New("pgtest: Rejoin: no node is down")
	}
	i := 1 - c.primary
	s, src := c.nodes[i], c.nodes[c.primary]
	// pg_rewind reads the source's timeline from its control file, which shows the new
	// timeline only after the first checkpoint since the promotion (which pg_ctl promote
	// does not wait for); without it pg_rewind finds "no rewind required".
	if err := src.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	if err := s.rewind(ctx, src); err != nil {
		return err
	}
	if err := c.startStandby(ctx, i); err != nil {
		return err
	}
	c.down = false
	return nil
}

// rewind makes s, the stopped old primary, a copy of src's history: pg_rewind where the
// installation has it, else a new base backup.
func (s *Server) rewind(ctx context.Context, src *Server) error {
	if s.hasProgram("pg_rewind") {
		return s.run(ctx, s.bin("pg_rewind"), "--target-pgdata", s.dataDir, "--source-server", src.ConnString(), "--no-sync")
	}
	if err := os.RemoveAll(s.dataDir); err != nil {
		return err
	}
	return s.baseBackup(ctx, src)
}

// ResumeStandby starts the standby again after a test stopped it (Standby().StopImmediate)
// and returns once the primary reports it streaming as its synchronous standby again:
// commits that waited for it are then confirmed.
func (c *Cluster) ResumeStandby(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return errors.New("pgtest: ResumeStandby: the cluster has no standby (Rejoin first)")
	}
	i := 1 - c.primary
	if !c.nodes[i].isRunning() {
		if err := c.nodes[i].Restart(ctx); err != nil {
			return err
		}
	}
	return c.waitSynchronous(ctx, i)
}

// Failover is Promote then Rejoin: the roles swap and the pair is whole again.
func (c *Cluster) Failover(ctx context.Context) error {
	if err := c.Promote(ctx); err != nil {
		return err
	}
	return c.Rejoin(ctx)
}

// Close stops both nodes and removes their files; it is idempotent.
func (c *Cluster) Close() error {
	var errs []error
	for _, s := range c.nodes {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

// bin returns the path of another program of the server's installation: the directory
// of pg_ctl once symbolic links are resolved (/usr/local/bin may link just a few).
func (s *Server) bin(name string) string {
	dir := filepath.Dir(s.bins.pgCtl)
	if real, err := filepath.EvalSymlinks(s.bins.pgCtl); err == nil {
		dir = filepath.Dir(real)
	}
	return filepath.Join(dir, name)
}

// InRecovery reports pg_is_in_recovery(): true on a standby.
func (s *Server) InRecovery(ctx context.Context) (bool, error) {
	var in bool
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&in)
	})
	return in, err
}

// stopIfRunning is StopImmediate for a server that may be stopped already.
func (s *Server) stopIfRunning() error {
	if !s.isRunning() {
		return nil
	}
	return s.StopImmediate()
}

// isRunning reports whether the server is up, as far as this package started or
// stopped it.
func (s *Server) isRunning() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}
