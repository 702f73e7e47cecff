//go:build soak

package otelpgxtx

// TestSoundness is a Jepsen-style check of the one promise the library makes: no outcome
// it reports ever contradicts what the database holds. Workers run transactions, each
// inserting a row that names the operation, through plain pgx with the tracer and through
// Run, while a nemesis terminates backends (in the synchronous-replication wait, idle in a
// transaction, mid-statement), cancels waits, cuts proxied connections before and after
// COMMIT, crashes and restarts the server, and cancels contexts during COMMIT; deferred
// constraint violations and serialization failures come from the workload itself. Once
// the server is back and quiet, every frame span and every Run result is compared with
// the table, every indeterminate Run result is reconciled, and every reference is
// resolved and compared with the table too. Automatic reconciliation (WithAutoReconcile)
// is on in both pools: every indeterminate frame must get exactly one final answer, which
// must not contradict the table, the tx.reconcile spans must say what the callback got,
// and the reconciliation metrics must count what the callbacks got.
//
// Size and duration come from the environment (see soakConfigFromEnv); the seed is
// logged so that a failure can be replayed (the same seed gives every worker, the
// nemesis and the SyncRep watcher the same decisions; the interleaving is the
// scheduler's).
//
// The soak is behind the build tag soak: it runs in a go test of its own (make test:
// go test -race -tags soak -run '^TestSoundness(Failover)?$' .), so that neither it nor the
// root package's other tests nears go test's 10-minute limit.
//
// The soak in files by concern: this file holds its configuration, the two tests, and the
// setup of the pools and the tables; soak_workload_test.go the workers and what each
// operation does; soak_nemesis_test.go the faults (the nemesis, the SyncRep watcher, the
// crashes and failovers); soak_check_test.go the checker, step by step, and its report.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// soakAppName marks the workload's sessions in pg_stat_activity, so that the nemesis
// and the quiet check never touch anyone else's (the admin connections of pgtest and
// of this test have no application name).
const soakAppName = "otelpgxtx_soak"

// soakParticipantOffset is added to an operation's id for the row its participant inserts.
const soakParticipantOffset = 1_000_000_000

type soakConfig struct {
	tx         int           // transactions (logical operations) to run
	workers    int           // concurrent workers
	seed       uint64        // seeds every random decision
	duration   time.Duration // stop starting operations after this long (0: no bound)
	maxFaults  int           // nemesis faults, at most (SyncRep resolutions not included)
	crashes    int           // server crashes (stop -m immediate + restart)
	faultEvery time.Duration // mean time between nemesis faults
}

// soakConfigFromEnv reads
//
//	OTELPGXTX_SOAK_TX        transactions (default 5000)
//	OTELPGXTX_SOAK_SEED      seed (default: random, logged)
//	OTELPGXTX_SOAK_WORKERS   workers (default 8)
//	OTELPGXTX_SOAK_DURATION  bound on the workload, a Go duration (default 100s)
//	OTELPGXTX_SOAK_CRASHES   server crashes (default 3)
//	OTELPGXTX_SOAK_FAULTS    nemesis faults at most (default tx/6)
//	OTELPGXTX_SOAK_FAULT_EVERY  mean time between faults (default 20ms)
func soakConfigFromEnv(t *testing.T) soakConfig {
	t.Helper()
	c := soakConfig{tx: 5000, workers: 8, seed: rand.Uint64(), duration: 100 * time.Second, crashes: 3,
		faultEvery: 20 * time.Millisecond}
	intEnv := func(name string, dst *int) {
		if s := os.Getenv(name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a non-negative integer", name, s)
			}
			*dst = n
		}
	}
	durEnv := func(name string, dst *time.Duration) {
		if s := os.Getenv(name); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 {
				t.Fatalf("%s=%q: want a duration", name, s)
			}
			*dst = d
		}
	}
	intEnv("OTELPGXTX_SOAK_TX", &c.tx)
	intEnv("OTELPGXTX_SOAK_WORKERS", &c.workers)
	intEnv("OTELPGXTX_SOAK_CRASHES", &c.crashes)
	c.maxFaults = c.tx / 6
	intEnv("OTELPGXTX_SOAK_FAULTS", &c.maxFaults)
	durEnv("OTELPGXTX_SOAK_DURATION", &c.duration)
	durEnv("OTELPGXTX_SOAK_FAULT_EVERY", &c.faultEvery)
	if s := os.Getenv("OTELPGXTX_SOAK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("OTELPGXTX_SOAK_SEED=%q: want an unsigned integer", s)
		}
		c.seed = n
	}
	if c.workers < 1 || c.tx < 1 {
		t.Fatal("OTELPGXTX_SOAK_TX and OTELPGXTX_SOAK_WORKERS must be at least 1")
	}
	if c.faultEvery <= 0 {
		c.faultEvery = time.Millisecond
	}
	return c
}

// soakMarker is the soak's commit-marker table.
var soakMarker = pgx.Identifier{"public", "soak_marker"}

// soakCounters is a set of named counts, safe for concurrent use.
type soakCounters struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *soakCounters) add(k string, n int) {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[k] += n
	c.mu.Unlock()
}

func (c *soakCounters) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.m))
	for k, v := range c.m {
		out[k] = v
	}
	return out
}

type soak struct {
	t       *testing.T
	cfg     soakConfig
	tp      *sdktrace.TracerProvider
	spans   *soakSpans
	reader  *sdkmetric.ManualReader
	direct  *pgxpool.Pool
	proxied *pgxpool.Pool
	// refPools are the plain pgx operations' pools with commit references, by op.ref and
	// then direct and proxied.
	refPools map[string][2]*pgxpool.Pool
	proxy    *pgtest.Proxy
	admin    *pgxpool.Pool // uninstrumented, for the reconciler and the checker
	// rec reconciles the increments' indeterminate verdicts in the workload, with no
	// spans of its own: the checker compares the tx.reconcile spans with the automatic
	// reconciliation's answers.
	rec *reconcile.Reconciler
	// cluster, when not nil, replaces srv: the workload follows its primary, and the
	// nemesis's server events alternate between a failover and a crash of the primary.
	cluster *pgtest.Cluster
	events  int // server events so far

	ops  []soakOp
	next atomic.Int64 // the last id handed out
	done atomic.Int64 // operations finished

	waitersMu sync.Mutex
	waiters   map[uint32]soakWaiter

	faults soakCounters
	errs   soakCounters // unexpected errors of the harness itself (not of the workload)

	tracers []*Tracer // the pools' tracers, with automatic reconciliation
	autoMu  sync.Mutex
	auto    map[string][]Reconciliation // the callback's answers, by operation id
}

func (s *soak) onReconciled(r Reconciliation) {
	s.autoMu.Lock()
	s.auto[r.OperationID.String()] = append(s.auto[r.OperationID.String()], r)
	s.autoMu.Unlock()
}

// drainReconciliation waits until the tracers' automatic reconciliation has nothing
// pending (the server is back and quiet), for at most a bound, then closes the tracers:
// what is still pending then ends unknown with reason stopped, and is counted so.
func (s *soak) drainReconciliation(ctx context.Context) {
	deadline := time.Now().Add(2 * time.Minute)
	for _, tr := range s.tracers {
		for {
			n, _ := tr.a.Auto.Oldest()
			if n == 0 || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			soakThink(ctx, 20*time.Millisecond)
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := tr.Close(cctx); err != nil {
			s.errs.add("closing a tracer: "+err.Error(), 1)
		}
		cancel()
	}
}

func TestSoundness(t *testing.T) {
	pgtest.LeakCheck(t)
	cfg := soakConfigFromEnv(t)
	t.Logf("seed %d: replay with OTELPGXTX_SOAK_SEED=%d OTELPGXTX_SOAK_TX=%d OTELPGXTX_SOAK_WORKERS=%d OTELPGXTX_SOAK_CRASHES=%d",
		cfg.seed, cfg.seed, cfg.tx, cfg.workers, cfg.crashes)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.duration+10*time.Minute)
	defer cancel()
	s := newSoak(t, ctx, cfg, nil)
	s.run(ctx)
}

// TestSoundnessFailover is TestSoundness on a primary with a synchronous streaming standby
// (pgtest.Cluster): the server events are, in turn, failovers (crash the primary, promote
// the standby, rewind the old primary into the new standby), crash restarts of the primary
// and standby outages longer than the reconcile wait (replication barriers give up), and
// the checker checks against the surviving history. A commit that only committed locally
// (its synchronous-replication wait was cancelled or terminated,
// tx.commit.committed_locally) may be lost in a later failover: that is what the frame's
// attribute warns of, so its absence is counted, not failed; a reconciliation's committed
// answer lost in a failover is a contradiction.
func TestSoundnessFailover(t *testing.T) {
	pgtest.LeakCheck(t)
	cfg := soakConfigFromEnv(t)
	if cfg.crashes == 0 {
		t.Fatal("OTELPGXTX_SOAK_CRASHES=0: this test needs at least one failover")
	}
	t.Logf("seed %d: replay with OTELPGXTX_SOAK_SEED=%d OTELPGXTX_SOAK_TX=%d OTELPGXTX_SOAK_WORKERS=%d OTELPGXTX_SOAK_CRASHES=%d (failovers, crashes and standby outages, in turn)",
		cfg.seed, cfg.seed, cfg.tx, cfg.workers, cfg.crashes)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.duration+10*time.Minute)
	defer cancel()
	s := newSoak(t, ctx, cfg, pgtest.ClusterFor(t, ctx))
	s.run(ctx)
}

// run runs the workload, the nemesis and the SyncRep watcher, then checks.
func (s *soak) run(ctx context.Context) {
	cfg := s.cfg
	began := time.Now()
	stopNemesis := make(chan struct{})
	stopWatcher := make(chan struct{})
	var watcher, nemesis sync.WaitGroup
	watcher.Go(func() { s.watchSyncRep(ctx, stopWatcher) })
	nemesis.Go(func() { s.nemesis(ctx, stopNemesis) })

	var workers sync.WaitGroup
	deadline := time.Now().Add(cfg.duration)
	for w := range cfg.workers {
		workers.Go(func() { s.worker(ctx, w, deadline) })
	}
	workers.Wait()
	workload := time.Since(began)
	close(stopNemesis)
	nemesis.Wait() // it returns with the server running, even from the middle of a crash
	// Wait for every orphaned backend to finish (the watcher ends the SyncRep waits
	// nobody else will end), then stop watching.
	s.waitQuiet(ctx)
	close(stopWatcher)
	watcher.Wait()
	s.drainReconciliation(ctx)

	s.check(ctx, workload, time.Since(began))
}

func newSoak(t *testing.T, ctx context.Context, cfg soakConfig, cluster *pgtest.Cluster) *soak {
	t.Helper()
	s := &soak{t: t, cfg: cfg, waiters: map[uint32]soakWaiter{}, cluster: cluster, auto: map[string][]Reconciliation{},
		spans:  &soakSpans{started: map[trace.SpanID]string{}, ends: map[trace.SpanID]int{}, reconciles: map[string][]string{}},
		reader: sdkmetric.NewManualReader()}
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(s.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	first, connString := srv, srv.ConnString()
	if cluster != nil {
		first, connString = cluster.Primary(), cluster.ConnString()
	}
	markerDDL, err := reconcile.MarkerTableDDL(soakMarker)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Exec(ctx, "drop table if exists soak_marker; "+markerDDL); err != nil {
		t.Fatal(err)
	}
	if err := first.Exec(ctx, `drop table if exists soak_rows, soak_shared, soak_counter, soak_incr;
		create table soak_counter (id bigint primary key, n int not null);
		create table soak_incr (frame text primary key, id bigint not null);
		create table soak_rows (id bigint primary key, k bigint unique deferrable initially deferred, op text not null, path text not null);
		create table soak_shared (id int primary key, v bigint not null);
		insert into soak_shared select g, 0 from generate_series(1, 4) g;
		insert into soak_rows values (0, 0, 'seed', 'seed')`); err != nil {
		t.Fatal(err)
	}
	s.proxy, err = pgtest.NewProxy(fmt.Sprintf("%s:%d", first.Host(), first.Port()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.proxy.Close() })
	proxied := s.proxy.ConnString(connString)
	if cluster != nil {
		// Through the proxy to the first primary, directly to the other node: the
		// proxy's faults hit whenever the first node is primary.
		proxied = fmt.Sprintf("postgres://postgres@%s,%s:%d/postgres?sslmode=disable&target_session_attrs=read-write",
			s.proxy.Addr(), cluster.Standby().Host(), cluster.Standby().Port())
	}
	s.admin, err = pgxpool.New(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.admin.Close)
	if s.rec, err = reconcile.New(s.admin, reconcile.WithWait(2*time.Second, 10*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	perPool := int32(max(2, cfg.workers))
	mkPool := func(connString string, opts ...Option) *pgxpool.Pool {
		pc, err := pgxpool.ParseConfig(connString)
		if err != nil {
			t.Fatal(err)
		}
		pc.MaxConns = perPool
		pc.ConnConfig.RuntimeParams["application_name"] = soakAppName
		pc.ConnConfig.ConnectTimeout = 5 * time.Second
		rec, err := reconcile.New(s.admin, reconcile.WithTracerProvider(s.tp), reconcile.WithWait(2*time.Second, 10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		tr, err := InstrumentPool(pc, append([]Option{WithTracerProvider(s.tp), WithMeterProvider(mp),
			WithAutoReconcile(rec, WithRetryBackoff(10*time.Millisecond, 500*time.Millisecond), WithOnReconciled(s.onReconciled))}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		s.tracers = append(s.tracers, tr)
		t.Cleanup(func() { _ = tr.Close(context.Background()) })
		p, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	s.direct = mkPool(connString)
	s.proxied = mkPool(proxied)
	s.refPools = map[string][2]*pgxpool.Pool{}
	for ref, opt := range map[string]Option{"xid": WithCommitReference(), "marker": WithCommitMarker(soakMarker)} {
		s.refPools[ref] = [2]*pgxpool.Pool{mkPool(connString, opt), mkPool(proxied, opt)}
	}
	s.ops = make([]soakOp, cfg.tx)
	return s
}
