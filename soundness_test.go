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

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
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

// soakCommitControl says how an operation's COMMIT may be interrupted from the client side.
type soakCommitControl uint8

const (
	soakCommitPlain    soakCommitControl = iota
	soakCommitCancel                     // the SyncRep watcher may cancel the context during COMMIT
	soakCommitDeadline                   // the COMMIT's context has a short deadline
)

// soakOp is one logical operation: one row id, one worker, one or more physical
// transactions (Run retries). Only its worker writes it; the checker reads it after the
// workers are done.
type soakOp struct {
	ran  bool // a worker ran it (an id handed out after the time bound is not run)
	id   int64
	run  bool   // through Run; otherwise plain pgx
	via  string // "direct" or "proxy"
	span trace.SpanID

	syncRep        bool
	control        soakCommitControl
	dup            bool // inserts a duplicate into the deferred unique column
	serial         bool // SERIALIZABLE, updates a shared row
	appRollback    bool
	pause          bool // think time before COMMIT: idle in transaction
	postCommitFail bool // Run: a post-commit hook fails
	participant    bool // Run: a Required call joins and inserts a second row
	marker         bool // Run: with the commit marker (Policy.CommitMarker)
	// ref: plain pgx: the commit references of its pool ("", "xid": WithCaptureReference,
	// "marker": WithCommitMarker).
	ref string

	// Plain pgx: what the caller saw.
	failedAt  string // "", "begin", "statement"
	err       error
	committed bool // Commit was called
	commitErr error

	// Run.
	res   outcome.Result[int64]
	inner outcome.Result[int64] // the participant's result, of the last attempt
	calls int
}

func (o *soakOp) path() string {
	if o.run {
		return "run"
	}
	return "pgx"
}

// soakFrame is what the checker needs of one ended frame span.
type soakFrame struct {
	span, parent     trace.SpanID
	trace            trace.TraceID
	start            time.Time
	outcome, phase   string
	op, ref, errType string
	sqlstate         string
	attempt          int64
	committedLocally bool
	participants     map[string]int64 // tx.participant events by tx.participant.outcome
}

// soakSpans is a span processor that records the start and end of every span of this
// library's scope, and the frame spans' attributes. It keeps nothing else, so that a long
// run does not hold hundreds of thousands of statement spans in memory.
type soakSpans struct {
	mu      sync.Mutex
	started map[trace.SpanID]string
	ends    map[trace.SpanID]int
	frames  []soakFrame
	// reconciles are the tx.reconcile spans, by operation id, in end order.
	reconciles map[string][]string
}

// soakScope reports a span of the library's: the tracer's, or the reconciler's.
func soakScope(name string) bool { return name == ScopeName || name == reconcile.ScopeName }

func (p *soakSpans) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	if !soakScope(s.InstrumentationScope().Name) {
		return
	}
	p.mu.Lock()
	p.started[s.SpanContext().SpanID()] = s.Name()
	p.mu.Unlock()
}

func (p *soakSpans) OnEnd(s sdktrace.ReadOnlySpan) {
	if !soakScope(s.InstrumentationScope().Name) {
		return
	}
	var fr soakFrame
	isFrame := false
	if s.Name() == DefaultSpanName {
		isFrame = true
		fr = soakFrame{span: s.SpanContext().SpanID(), trace: s.SpanContext().TraceID(), parent: s.Parent().SpanID(), start: s.StartTime()}
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case OutcomeKey:
				fr.outcome = kv.Value.AsString()
			case PhaseKey:
				fr.phase = kv.Value.AsString()
			case OperationIDKey:
				fr.op = kv.Value.AsString()
			case ReconciliationRefKey:
				fr.ref = kv.Value.AsString()
			case errorTypeKey:
				fr.errType = kv.Value.AsString()
			case dbResponseStatusKey:
				fr.sqlstate = kv.Value.AsString()
			case AttemptKey:
				fr.attempt = kv.Value.AsInt64()
			case CommittedLocallyKey:
				fr.committedLocally = kv.Value.AsBool()
			}
		}
		for _, e := range s.Events() {
			if e.Name != EventParticipant {
				continue
			}
			for _, kv := range e.Attributes {
				if kv.Key == ParticipantOutcomeKey {
					if fr.participants == nil {
						fr.participants = map[string]int64{}
					}
					fr.participants[kv.Value.AsString()]++
				}
			}
		}
	}
	if s.Name() == SpanNameReconcile {
		var op, resolved, reason string
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case OperationIDKey:
				op = kv.Value.AsString()
			case ResolvedOutcomeKey:
				resolved = kv.Value.AsString()
			case errorTypeKey:
				reason = kv.Value.AsString()
			}
		}
		p.mu.Lock()
		p.reconciles[op] = append(p.reconciles[op], resolved+"/"+reason)
		p.mu.Unlock()
	}
	p.mu.Lock()
	p.ends[s.SpanContext().SpanID()]++
	if isFrame {
		p.frames = append(p.frames, fr)
	}
	p.mu.Unlock()
}

func (p *soakSpans) Shutdown(context.Context) error   { return nil }
func (p *soakSpans) ForceFlush(context.Context) error { return nil }

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

// soakWaiter is a COMMIT that may sit in the SyncRep wait, as its worker registered it.
type soakWaiter struct {
	cancel   context.CancelFunc // nil for a deadline: the deadline will end the wait
	deadline bool
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
			n, _ := tr.auto.oldest()
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
	if err := first.Exec(ctx, `drop table if exists soak_rows, soak_shared;
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
	for ref, opt := range map[string]Option{"xid": WithCaptureReference(), "marker": WithCommitMarker(soakMarker)} {
		s.refPools[ref] = [2]*pgxpool.Pool{mkPool(connString, opt), mkPool(proxied, opt)}
	}
	s.ops = make([]soakOp, cfg.tx)
	return s
}

// ---- the workload ----

func (s *soak) worker(ctx context.Context, w int, deadline time.Time) {
	rng := rand.New(rand.NewPCG(s.cfg.seed, uint64(w)))
	for {
		id := s.next.Add(1)
		if id > int64(s.cfg.tx) || (s.cfg.duration > 0 && time.Now().After(deadline)) || ctx.Err() != nil {
			return
		}
		op := &s.ops[id-1]
		s.plan(op, id, rng)
		s.runOp(ctx, op, rng)
		s.done.Add(1)
		if op.failedAt == "begin" || soakNotStarted(op.res) {
			// The server is down or unreachable: give it a moment rather than spin.
			soakThink(ctx, time.Duration(2+rng.IntN(10))*time.Millisecond)
		}
	}
}

func soakNotStarted(r outcome.Result[int64]) bool {
	rb, ok := r.(outcome.DeterminateRollback[int64])
	return ok && rb.Phase() == outcome.PhaseNotStarted
}

// plan draws what the operation does.
func (s *soak) plan(op *soakOp, id int64, rng *rand.Rand) {
	op.ran, op.id = true, id
	op.run = rng.IntN(2) == 0
	op.via = "direct"
	if rng.IntN(100) < 40 {
		op.via = "proxy"
	}
	switch r := rng.IntN(100); {
	case r < 15:
		op.syncRep = true
		op.control = soakCommitCancel
		if rng.IntN(100) < 30 {
			op.control = soakCommitDeadline
		}
	case r < 20:
		op.dup = true
	case r < 40:
		op.serial = true
	case r < 45:
		op.appRollback = true
	}
	op.pause = rng.IntN(100) < 15
	if op.run {
		op.postCommitFail = rng.IntN(100) < 5
		op.participant = rng.IntN(100) < 8
		op.marker = rng.IntN(2) == 0
	} else {
		op.ref = [...]string{"", "xid", "marker"}[rng.IntN(3)]
	}
}

// soakMarker is the soak's commit-marker table.
var soakMarker = pgx.Identifier{"soak_marker"}

// mode is how an operation's indeterminate outcome can be settled: plain pgx frames have
// no reference without the tracer's option, an xid with WithCaptureReference, and a marker
// row too with WithCommitMarker; Run's carry an xid, and with the marker its row too.
func (o *soakOp) mode() string {
	switch {
	case !o.run && o.ref == "xid":
		return "pgx, xid only"
	case !o.run && o.ref == "marker":
		return "pgx, xid + marker"
	case !o.run:
		return "pgx"
	case o.marker:
		return "run, xid + marker"
	}
	return "run, xid only"
}

// soakAtSource reports an error.type the tracer gives a COMMIT it proved never executed.
func soakAtSource(errType string) bool {
	return errType == classifier.ReasonCommitNotSent || errType == classifier.ReasonSessionEndedBeforeCommit ||
		errType == classifier.ReasonIdleInTransactionTimeout
}

func (s *soak) pool(op *soakOp) *pgxpool.Pool {
	i := 0
	if op.via == "proxy" {
		i = 1
	}
	if !op.run && op.ref != "" {
		return s.refPools[op.ref][i]
	}
	return [2]*pgxpool.Pool{s.direct, s.proxied}[i]
}

var errSoakAppRollback = errors.New("soak: the application rolls back")

func (s *soak) runOp(ctx context.Context, op *soakOp, rng *rand.Rand) {
	// Bounds every operation: a hang is a finding, not a reason to stall the suite.
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	ctx, span := s.tp.Tracer("soak").Start(ctx, "soak.op", trace.WithAttributes(
		attribute.Int64("soak.id", op.id), attribute.String("soak.path", op.path()), attribute.String("soak.via", op.via)))
	defer span.End()
	op.span = span.SpanContext().SpanID()
	if op.run {
		s.runWithRun(ctx, op, rng)
	} else {
		s.runPlain(ctx, op, rng)
	}
}

// body is the work of one physical transaction; opID names its frame in the row.
func (s *soak) body(ctx context.Context, tx pgx.Tx, op *soakOp, opID string, rng *rand.Rand) error {
	if op.syncRep {
		if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
			return err
		}
	}
	if op.serial {
		var sum int64
		if err := tx.QueryRow(ctx, "select coalesce(sum(v), 0)::bigint from soak_shared").Scan(&sum); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "update soak_shared set v = v + 1 where id = $1", 1+rng.IntN(4)); err != nil {
			return err
		}
	}
	k := op.id
	if op.dup {
		k = 0 // the seed row's: the deferred unique check fails at COMMIT
	}
	if _, err := tx.Exec(ctx, "insert into soak_rows (id, k, op, path) values ($1, $2, $3, $4)", op.id, k, opID, op.path()); err != nil {
		return err
	}
	if op.pause {
		soakThink(ctx, time.Duration(rng.IntN(4000))*time.Microsecond)
	}
	return nil
}

// soakThink is the workload's think time: idle in transaction, for the nemesis to find.
func soakThink(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// commitContext returns the context for a COMMIT on backend pid, registered with the
// SyncRep watcher; release unregisters it.
func (s *soak) commitContext(ctx context.Context, op *soakOp, pid uint32, rng *rand.Rand) (context.Context, func()) {
	if !op.syncRep || op.control == soakCommitPlain {
		return ctx, func() {}
	}
	var cctx context.Context
	var cancel context.CancelFunc
	w := soakWaiter{}
	if op.control == soakCommitDeadline {
		cctx, cancel = context.WithTimeout(ctx, time.Duration(10+rng.IntN(60))*time.Millisecond)
		w.deadline = true
	} else {
		cctx, cancel = context.WithCancel(ctx)
		w.cancel = cancel
	}
	s.register(pid, w)
	return cctx, func() {
		s.unregister(pid)
		cancel()
	}
}

func (s *soak) register(pid uint32, w soakWaiter) {
	s.waitersMu.Lock()
	s.waiters[pid] = w
	s.waitersMu.Unlock()
}

func (s *soak) unregister(pid uint32) {
	s.waitersMu.Lock()
	delete(s.waiters, pid)
	s.waitersMu.Unlock()
}

func (s *soak) waiter(pid uint32) (soakWaiter, bool) {
	s.waitersMu.Lock()
	defer s.waitersMu.Unlock()
	w, ok := s.waiters[pid]
	return w, ok
}

// runPlain is the plain pgx path: the caller has no Result; the outcome is the span's.
func (s *soak) runPlain(ctx context.Context, op *soakOp, rng *rand.Rand) {
	opts := pgx.TxOptions{}
	if op.serial {
		opts.IsoLevel = pgx.Serializable
	}
	tx, err := s.pool(op).BeginTx(ctx, opts)
	if err != nil {
		op.failedAt, op.err = "begin", err
		return
	}
	opID := ""
	if f := frameOfTx(tx); f != nil {
		opID = f.id.String()
	}
	if err := s.body(ctx, tx, op, opID, rng); err != nil {
		op.failedAt, op.err = "statement", err
		_ = tx.Rollback(ctx)
		return
	}
	if op.appRollback {
		op.err = tx.Rollback(ctx)
		return
	}
	cctx, release := s.commitContext(ctx, op, tx.Conn().PgConn().PID(), rng)
	op.committed = true
	op.commitErr = tx.Commit(cctx)
	release()
}

// runWithRun is the executor path, with reference capture on.
func (s *soak) runWithRun(ctx context.Context, op *soakOp, rng *rand.Rand) {
	p := DefaultPolicy()
	p.BackoffBase, p.BackoffMax = time.Millisecond, 20*time.Millisecond
	if op.marker {
		p.CommitMarker = soakMarker
	}
	if op.serial {
		p.IsoLevel = pgx.Serializable
	}
	policyCtx := ctx
	if op.syncRep && op.control != soakCommitPlain {
		// The whole call runs under the context that may end during COMMIT; fn registers
		// the backend with the SyncRep watcher once it knows it.
		var cancel context.CancelFunc
		w := soakWaiter{deadline: op.control == soakCommitDeadline}
		if w.deadline {
			// Long enough for the statements, short enough to end the SyncRep wait.
			policyCtx, cancel = context.WithTimeout(ctx, time.Duration(30+rng.IntN(60))*time.Millisecond)
		} else {
			policyCtx, cancel = context.WithCancel(ctx)
			w.cancel = cancel
		}
		defer cancel()
		var pids []uint32
		defer func() {
			for _, pid := range pids {
				s.unregister(pid)
			}
		}()
		op.res = Run(policyCtx, s.pool(op), p, func(ctx context.Context, tx pgx.Tx) (int64, error) {
			v, err := s.runBody(ctx, tx, op, rng)
			if err == nil {
				pid := tx.Conn().PgConn().PID()
				pids = append(pids, pid)
				s.register(pid, w)
			}
			return v, err
		})
		return
	}
	op.res = Run(policyCtx, s.pool(op), p, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		return s.runBody(ctx, tx, op, rng)
	})
}

// runBody is the Run function: the body, the participant, the post-commit hook.
func (s *soak) runBody(ctx context.Context, tx pgx.Tx, op *soakOp, rng *rand.Rand) (int64, error) {
	op.calls++
	sc := scopeFromContext(ctx)
	if sc == nil {
		return 0, errors.New("soak: no scope in the Run function's context")
	}
	opID := sc.id.String()
	if err := s.body(ctx, tx, op, opID, rng); err != nil {
		return 0, err
	}
	if op.participant {
		op.inner = Run(ctx, s.pool(op), DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int64, error) {
			_, err := tx.Exec(ctx, "insert into soak_rows (id, k, op, path) values ($1, $1, $2, 'participant')", op.id+soakParticipantOffset, opID)
			return op.id, err
		})
		if op.inner.Outcome() != outcome.OutcomeParticipating {
			return 0, fmt.Errorf("soak: participant: %s", op.inner.Outcome())
		}
	}
	if op.postCommitFail {
		if err := AfterCommit(ctx, func(context.Context) error { return errors.New("soak: post-commit work failed") }); err != nil {
			return 0, err
		}
	}
	if op.appRollback {
		return 0, errSoakAppRollback
	}
	return op.id, nil
}

// ---- the nemesis ----

// soakAdmin is an admin connection that reconnects after the server was restarted.
type soakAdmin struct {
	dial func(context.Context) (*pgx.Conn, error)
	c    *pgx.Conn
}

// dial opens an admin connection to the primary.
func (s *soak) dial(ctx context.Context) (*pgx.Conn, error) {
	if s.cluster != nil {
		return pgx.Connect(ctx, s.cluster.ConnString())
	}
	return srv.Conn(ctx)
}

func (a *soakAdmin) get(ctx context.Context) (*pgx.Conn, error) {
	if a.c != nil && !a.c.IsClosed() {
		return a.c, nil
	}
	c, err := a.dial(ctx)
	if err != nil {
		return nil, err
	}
	a.c = c
	return c, nil
}

func (a *soakAdmin) close() {
	if a.c != nil {
		_ = a.c.Close(context.Background())
	}
}

// soakPids returns the workload's backends matching the condition.
func soakPids(ctx context.Context, a *soakAdmin, where string) ([]uint32, error) {
	c, err := a.get(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := c.Query(ctx, "select pid from pg_stat_activity where application_name = '"+soakAppName+"' and "+where)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (uint32, error) {
		var pid int32
		err := r.Scan(&pid)
		return uint32(pid), err
	})
}

func soakSignal(ctx context.Context, a *soakAdmin, fn string, pid uint32) bool {
	c, err := a.get(ctx)
	if err != nil {
		return false
	}
	var ok bool
	if err := c.QueryRow(ctx, "select "+fn+"($1)", int32(pid)).Scan(&ok); err != nil {
		return false
	}
	return ok
}

// watchSyncRep ends every SyncRep wait of the workload (the phantom standby never
// connects): by terminating the backend, by cancelling the wait (the commit completes
// with a warning), or by cancelling the client's context (the client gives up; the
// backend, orphaned, is then ended on a later round). A COMMIT under a client deadline
// is left alone while its client waits: the deadline ends it.
func (s *soak) watchSyncRep(ctx context.Context, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(s.cfg.seed, 1<<20))
	a := soakAdmin{dial: s.dial}
	defer a.close()
	acted := map[uint32]time.Time{}
	tick := time.NewTicker(3 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pids, err := soakPids(ctx, &a, "wait_event = 'SyncRep'")
		if err != nil {
			a.close()
			a.c = nil
			continue // the server is down, or restarting
		}
		now := time.Now()
		for _, pid := range pids {
			if at, ok := acted[pid]; ok && now.Sub(at) < 250*time.Millisecond {
				continue // already signalled; it takes a moment to leave the wait
			}
			w, registered := s.waiter(pid)
			if registered && w.deadline {
				continue
			}
			choices := 2
			if registered {
				choices = 3
			}
			switch rng.IntN(choices) {
			case 0:
				if soakSignal(ctx, &a, "pg_terminate_backend", pid) {
					s.faults.add("syncrep: backend terminated", 1)
				}
			case 1:
				if soakSignal(ctx, &a, "pg_cancel_backend", pid) {
					s.faults.add("syncrep: wait cancelled (pg_cancel_backend)", 1)
				}
			case 2:
				w.cancel()
				s.faults.add("syncrep: client context cancelled during COMMIT", 1)
			}
			acted[pid] = now
		}
		for pid, at := range acted {
			if now.Sub(at) > time.Second {
				delete(acted, pid)
			}
		}
	}
}

// nemesis injects faults at random moments until stopped, out of budget or out of time.
// It always returns with the server running.
func (s *soak) nemesis(ctx context.Context, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(s.cfg.seed, 1<<21))
	a := soakAdmin{dial: s.dial}
	defer a.close()
	// Crashes happen when the workload crosses random points of its progress, so that
	// every run has them whatever its speed.
	crashAt := make([]int64, s.cfg.crashes)
	for i := range crashAt {
		crashAt[i] = int64(float64(s.cfg.tx) * (0.1 + 0.8*rng.Float64()))
	}
	slices.Sort(crashAt)
	deadline := time.Now().Add(s.cfg.duration)
	for faults := 0; faults < s.cfg.maxFaults+s.cfg.crashes; {
		wait := time.Duration(rng.ExpFloat64() * float64(s.cfg.faultEvery))
		t := time.NewTimer(wait)
		select {
		case <-stop:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if s.cfg.duration > 0 && time.Now().After(deadline) {
			return
		}
		if len(crashAt) > 0 && s.done.Load() >= crashAt[0] {
			crashAt = crashAt[1:]
			a.close()
			a.c = nil
			s.crash(ctx, rng)
			faults++
			continue
		}
		if faults >= s.cfg.maxFaults {
			continue // only crashes are left
		}
		// terminate ends one backend in the given state, if any; a failed lookup drops the
		// admin connection, to be dialled again.
		terminate := func(where, fault string) {
			pids, err := soakPids(ctx, &a, where)
			if err != nil {
				a.close()
				a.c = nil
				return
			}
			if len(pids) > 0 && soakSignal(ctx, &a, "pg_terminate_backend", pids[rng.IntN(len(pids))]) {
				s.faults.add(fault, 1)
				faults++
			}
		}
		switch r := rng.IntN(100); {
		case r < 35:
			terminate("state = 'idle in transaction'", "terminate: idle in transaction")
		case r < 45:
			terminate("state = 'active' and wait_event is distinct from 'SyncRep'", "terminate: active backend")
		case r < 70:
			s.proxy.CutAfterCommit()
			s.faults.add("proxy: cut after COMMIT (armed)", 1)
			faults++
		case r < 95:
			s.proxy.CutBeforeCommit()
			s.faults.add("proxy: cut before COMMIT (armed)", 1)
			faults++
		default:
			s.proxy.CutAll()
			s.faults.add("proxy: cut all connections", 1)
			faults++
		}
	}
	// Out of budget: the remaining crashes still happen, when their moment comes.
	for len(crashAt) > 0 {
		t := time.NewTimer(s.cfg.faultEvery)
		select {
		case <-stop:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if s.done.Load() >= crashAt[0] {
			crashAt = crashAt[1:]
			s.crash(ctx, rng)
		}
	}
}

// crash stops the server like a power cut and restarts it after a short random downtime;
// on a cluster every other event is a failover instead.
func (s *soak) crash(ctx context.Context, rng *rand.Rand) {
	target := srv
	if s.cluster != nil {
		s.events++
		switch s.events % 3 {
		case 1:
			if err := s.cluster.Failover(context.WithoutCancel(ctx)); err != nil {
				s.errs.add("Failover: "+err.Error(), 1)
				return
			}
			s.faults.add("cluster: failover (crash primary, promote standby, pg_rewind old primary)", 1)
			return
		case 0:
			// Longer than the reconcile wait: replication barriers give up meanwhile.
			if err := s.cluster.Standby().StopImmediate(); err != nil {
				s.errs.add("standby StopImmediate: "+err.Error(), 1)
				return
			}
			s.faults.add("cluster: standby down for 2.5-3.5 s (commits wait, barriers give up)", 1)
			soakThink(ctx, time.Duration(2500+rng.IntN(1000))*time.Millisecond)
			if err := s.cluster.ResumeStandby(context.WithoutCancel(ctx)); err != nil {
				s.errs.add("ResumeStandby: "+err.Error(), 1)
			}
			return
		}
		target = s.cluster.Primary()
	}
	if err := target.StopImmediate(); err != nil {
		s.errs.add("StopImmediate: "+err.Error(), 1)
		return
	}
	s.faults.add("server: stop -m immediate + restart", 1)
	soakThink(ctx, time.Duration(50+rng.IntN(250))*time.Millisecond) // downtime: transactions fail
	if err := target.Restart(context.WithoutCancel(ctx)); err != nil {
		s.errs.add("Restart: "+err.Error(), 1)
	}
}

// waitQuiet waits until no backend of the workload is doing anything: orphaned backends
// (their client cut or gone) have finished, and the watcher has ended every SyncRep wait.
func (s *soak) waitQuiet(ctx context.Context) {
	a := soakAdmin{dial: s.dial}
	defer a.close()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		pids, err := soakPids(ctx, &a, "state <> 'idle'")
		if err == nil && len(pids) == 0 {
			return
		}
		if err != nil {
			a.close()
			a.c = nil
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("the workload's backends never went quiet: %v %v", pids, err)
		case <-tick.C:
		}
	}
}

// ---- the checker ----

type soakViolation struct {
	op   int64
	what string
}

func (s *soak) check(ctx context.Context, workload, total time.Duration) {
	t := s.t
	var bad []soakViolation
	fail := func(id int64, format string, args ...any) {
		bad = append(bad, soakViolation{id, fmt.Sprintf(format, args...)})
	}
	var ops []soakOp
	for i := range s.ops {
		if s.ops[i].ran {
			ops = append(ops, s.ops[i])
		}
	}
	ran := len(ops)

	// No frame on any pooled connection: every one is idle now.
	pools := []*pgxpool.Pool{s.direct, s.proxied}
	for _, ps := range s.refPools {
		pools = append(pools, ps[:]...)
	}
	for _, p := range pools {
		conns := p.AcquireAllIdle(ctx)
		for _, c := range conns {
			if st := connStateOf(c.Conn()); st != nil && st.frame != nil {
				fail(0, "an idle pooled connection still holds a frame in phase %s (operation %s)", st.frame.currentPhase(), st.frame.id)
			}
			c.Release()
		}
	}

	// The database's answer.
	rows := map[int64]string{}
	{
		r, err := s.admin.Query(ctx, "select id, op from soak_rows where id > 0")
		if err != nil {
			t.Fatal(err)
		}
		for r.Next() {
			var id int64
			var op string
			if err := r.Scan(&id, &op); err != nil {
				t.Fatal(err)
			}
			rows[id] = op
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
	}

	// Every span of the library's scope started was ended, exactly once.
	s.spans.mu.Lock()
	frames := slices.Clone(s.spans.frames)
	unended := 0
	for id, name := range s.spans.started {
		if n := s.spans.ends[id]; n != 1 {
			unended++
			if unended <= 5 {
				fail(0, "span %s %q ended %d times", id, name, n)
			}
		}
	}
	started, ended := len(s.spans.started), len(s.spans.ends)
	autoSpans := maps.Clone(s.spans.reconciles) // before the checker's own reconciliations
	s.spans.mu.Unlock()

	byParent := map[trace.SpanID][]*soakFrame{}
	for i := range frames {
		byParent[frames[i].parent] = append(byParent[frames[i].parent], &frames[i])
	}
	for _, fs := range byParent {
		slices.SortFunc(fs, func(a, b *soakFrame) int { return a.start.Compare(b.start) })
	}
	orphans := len(frames)

	frameOutcomes := map[soakPathKey]int{}
	resultOutcomes := map[soakPathKey]int{}
	indetTruth := map[string]int{}  // "pgx present" ...
	lost := map[string]int{}        // committed locally, lost in a failover, by path
	atSource := map[string]int{}    // frames made determinate at the source, by mode
	indetFrames := map[string]int{} // indeterminate frames, by mode
	opOfFrame := map[*soakFrame]*soakOp{}

	for i := range ops {
		op := &ops[i]
		fs := byParent[op.span]
		orphans -= len(fs)
		row, present := rows[op.id]
		known := false
		for _, f := range fs {
			opOfFrame[f] = op
			frameOutcomes[soakPathKey{op.path(), f.outcome}]++
			if soakAtSource(f.errType) {
				// Checked below like every rolled_back frame: its row must be absent.
				atSource[op.mode()]++
				if f.outcome != "rolled_back" {
					fail(op.id, "frame %s has error.type %s but tx.outcome %s", f.op, f.errType, f.outcome)
				}
			}
			if f.outcome == "indeterminate" {
				indetFrames[op.mode()]++
			}
			here := present && row == f.op
			known = known || here
			switch f.outcome {
			case "committed", "committed_with_post_commit_failure":
				if !here && s.lostInFailover(f) {
					lost[op.path()]++
				} else if !here {
					fail(op.id, "%s frame %s says %s; its row is absent (row names %q) [%s]", op.path(), f.op, f.outcome, row, op.describe())
				}
			case "rolled_back":
				if here {
					fail(op.id, "%s frame %s says rolled_back (%s %s); its row is present [%s]", op.path(), f.op, f.errType, f.sqlstate, op.describe())
				}
			case "indeterminate":
				if here {
					indetTruth[op.path()+": committed"]++
				} else {
					indetTruth[op.path()+": not committed"]++
				}
			default:
				fail(op.id, "%s frame %s has tx.outcome %q", op.path(), f.op, f.outcome)
			}
		}
		if present && !known {
			fail(op.id, "row %d was committed by %q, which is none of the operation's %d frame(s) [%s]", op.id, row, len(fs), op.describe())
		}
		if op.run {
			s.checkRun(op, fs, present, row, rows, fail)
			resultOutcomes[soakPathKey{"run", op.res.Outcome().String()}]++
		} else {
			s.checkPlain(op, fs, present, fail)
			o := "none (BEGIN failed before a frame)"
			if len(fs) > 0 {
				o = fs[len(fs)-1].outcome
			}
			resultOutcomes[soakPathKey{"pgx", o}]++
		}
	}
	if orphans != 0 {
		fail(0, "%d frame span(s) belong to no operation", orphans)
	}

	// The metrics count what the spans say: frames by outcome, participant calls by theirs.
	h := &harness{reader: s.reader}
	metricCounts := nonZero(h.countsByOutcome(t, ctx)) // every outcome's series starts at 0
	spanCounts := map[string]int64{}
	participantCounts := map[string]int64{}
	for _, f := range frames {
		spanCounts[f.outcome]++
		for o, n := range f.participants {
			participantCounts["tx.participant.outcome="+o] += n
		}
	}
	if fmt.Sprint(metricCounts) != fmt.Sprint(spanCounts) {
		fail(0, "metrics by outcome %v, frame spans by outcome %v", metricCounts, spanCounts)
	}
	if got := nonZero(h.sums(t, ctx, MetricParticipations, ParticipantOutcomeKey)); fmt.Sprint(got) != fmt.Sprint(participantCounts) {
		fail(0, "participations by outcome %v, tx.participant events %v", got, participantCounts)
	}

	// Automatic reconciliation: one final answer per indeterminate frame, none contradicting
	// the table, the last tx.reconcile span saying the same, the metrics counting the same.
	s.autoMu.Lock()
	auto := maps.Clone(s.auto)
	s.autoMu.Unlock()
	autoCounts := map[string]int{}       // resolution/reason → callbacks
	autoByMode := map[string]int{}       // mode: resolution → callbacks
	indeterminate, notReplicated := 0, 0 // notReplicated: attempts a barrier gave up on, retried
	for i := range frames {
		f := &frames[i]
		if f.outcome != "indeterminate" {
			continue
		}
		indeterminate++
		op := opOfFrame[f]
		got := auto[f.op]
		delete(auto, f.op)
		if len(got) != 1 {
			fail(0, "indeterminate frame %s reconciled automatically %d times, want once", f.op, len(got))
			continue
		}
		r := got[0].Answer
		key := r.Status().String() + "/" + r.Reason()
		autoCounts[key]++
		if op == nil {
			continue
		}
		autoByMode[op.mode()+": "+soakResolutionLabel(r)]++
		if (f.ref != "") == (r.Reason() == reconcile.ReasonNoReference) {
			fail(op.id, "frame %s with reference %q reconciled automatically %s", f.op, f.ref, key)
		}
		row, present := rows[op.id]
		here := present && row == f.op
		if got[0].CommittedLocally != f.committedLocally {
			fail(op.id, "frame %s: committed_locally %v, the reconciliation says %v", f.op, f.committedLocally, got[0].CommittedLocally)
		}
		// A committed answer waited for the synchronous standby (the replication barrier),
		// so a later failover keeps what it confirmed: any loss is a contradiction.
		if msg := soakResolutionContradicts(r, here); msg != "" {
			fail(op.id, "automatic reconciliation of frame %s: %s [%s]", f.op, msg, op.describe())
		}
		spans := autoSpans[f.op]
		for _, sp := range spans {
			if sp == reconcile.Unknown.String()+"/"+reconcile.ReasonNotReplicated {
				notReplicated++
			}
		}
		switch r.Reason() {
		case reconcile.ReasonQueueFull, reconcile.ReasonStopped:
			// Settled without a final attempt: every span it has is a retried one.
		default:
			if len(spans) == 0 || spans[len(spans)-1] != key {
				fail(op.id, "frame %s reconciled %s; its tx.reconcile spans say %v", f.op, key, spans)
			}
		}
	}
	for op, rs := range auto {
		fail(0, "automatic reconciliation of %s (%d answers), which is no indeterminate frame", op, len(rs))
	}
	{
		counts, _, _ := (&harness{reader: s.reader}).reconcileCounts(t, ctx)
		metricAuto := map[string]int{}
		for k, n := range counts {
			if n > 0 { // every series starts at 0
				metricAuto[k] = int(n)
			}
		}
		if fmt.Sprint(metricAuto) != fmt.Sprint(autoCounts) {
			fail(0, "reconciliation metrics %v, callbacks %v", metricAuto, autoCounts)
		}
		total := 0
		for _, n := range metricAuto {
			total += n
		}
		if total != indeterminate {
			fail(0, "reconciliation metrics count %d, indeterminate frame spans %d", total, indeterminate)
		}
	}

	// Reconciliation: every indeterminate Run result, and every reference on any frame
	// span, resolved against the table.
	rec, err := reconcile.New(s.admin, reconcile.WithTracerProvider(s.tp), reconcile.WithWait(5*time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	reconciled := map[string]int{}
	indetResults, settled := map[string]int{}, map[string]int{}
	for i := range ops {
		op := &ops[i]
		ind, ok := op.res.(outcome.Indeterminate[int64])
		if !ok {
			continue
		}
		indetResults[op.mode()]++
		got, err := reconcile.Indeterminate(ctx, rec, ind)
		if err != nil {
			fail(op.id, "Reconcile: %v", err)
			continue
		}
		row, present := rows[op.id]
		here := present && row == ind.OperationID().String()
		reconciled[op.mode()+": "+soakResolutionLabel(got)]++
		if got.Status() != reconcile.Unknown {
			settled[op.mode()]++
		}
		if msg := soakResolutionContradicts(got, here); msg != "" {
			fail(op.id, "Reconcile of an indeterminate Run result: %s [%s]", msg, op.describe())
		}
	}
	resolvedRefs := map[string]int{}
	for i := range frames {
		f := &frames[i]
		if f.ref == "" {
			continue
		}
		ref, err := outcome.ParseReconciliationRef(f.ref)
		if err != nil {
			fail(0, "frame %s: tx.reconciliation.ref %q: %v", f.op, f.ref, err)
			continue
		}
		got, err := rec.Resolve(ctx, ref, trace.NewSpanContext(trace.SpanContextConfig{TraceID: f.trace, SpanID: f.span, TraceFlags: trace.FlagsSampled}))
		if err != nil {
			fail(0, "Resolve %s: %v", ref, err)
			continue
		}
		op := opOfFrame[f]
		if op == nil {
			continue
		}
		row, present := rows[op.id]
		here := present && row == f.op
		resolvedRefs[f.outcome+" → "+soakResolutionLabel(got)]++
		if f.outcome == "indeterminate" && !op.run {
			// Plain pgx has no Result: its indeterminate frames are what Reconcile settles.
			reconciled[op.mode()+": "+soakResolutionLabel(got)]++
			if got.Status() != reconcile.Unknown {
				settled[op.mode()]++
			}
		}
		if msg := soakResolutionContradicts(got, here); msg != "" {
			fail(op.id, "Resolve of the reference %s of a %s frame %s: %s [%s]", ref, f.outcome, f.op, msg, op.describe())
		}
		if f.outcome == "committed" && got.Status() == reconcile.Aborted && !(!here && s.lostInFailover(f)) ||
			f.outcome == "rolled_back" && got.Status() == reconcile.Committed {
			fail(op.id, "the reconciler says %s of a frame the tracer saw %s", got.Status(), f.outcome)
		}
	}

	for k, n := range s.errs.snapshot() {
		fail(0, "harness: %s (%d times)", k, n)
	}

	// The report.
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintf(&b, "\nsoundness: seed %d, %d workers, %d operations (of %d) in %s (workload %s), %d frame spans, %d/%d library spans ended\n",
		s.cfg.seed, s.cfg.workers, ran, s.cfg.tx, total.Round(time.Millisecond), workload.Round(time.Millisecond), len(frames), ended, started)
	fmt.Fprintln(&b, "\nframe spans by tx.outcome (every physical transaction, retries included):")
	soakPrintByPath(tw, frameOutcomes)
	tw.Flush()
	fmt.Fprintln(&b, "\nper operation: Run's returned result / plain pgx's last frame span:")
	soakPrintByPath(tw, resultOutcomes)
	tw.Flush()
	fmt.Fprintln(&b, "\nfaults injected:")
	faults := s.faults.snapshot()
	var dup, serialFailures, deadlines int
	for i := range frames {
		switch {
		case frames[i].sqlstate == "23505" && frames[i].phase == "rolled_back" && strings.Contains(frames[i].errType, "constraint"):
			dup++
		case frames[i].sqlstate == "40001":
			serialFailures++
		}
		if frames[i].errType == "deadline_exceeded" && frames[i].outcome == "indeterminate" {
			deadlines++
		}
	}
	faults["workload: deferred unique violation (23505 frames)"] = dup
	faults["workload: serialization failure (40001 frames)"] = serialFailures
	faults["client: context deadline during COMMIT (indeterminate frames)"] = deadlines
	faults["proxy: connections cut (fired)"] = int(s.proxy.Cuts())
	for _, k := range slices.Sorted(maps.Keys(faults)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, faults[k])
	}
	tw.Flush()
	fmt.Fprintln(&b, "\nindeterminate frames, ground truth after the fact:")
	for _, k := range slices.Sorted(maps.Keys(indetTruth)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, indetTruth[k])
	}
	tw.Flush()
	if s.cluster != nil {
		fmt.Fprintln(&b, "\ncommitted locally (synchronous-replication wait ended), lost in a failover:")
		for _, k := range slices.Sorted(maps.Keys(lost)) {
			fmt.Fprintf(tw, "  %s\t%d\t\n", k, lost[k])
		}
		tw.Flush()
	}
	fmt.Fprintf(&b, "\nautomatic reconciliation of the %d indeterminate frames (one answer each; metrics = callbacks = spans):\n", indeterminate)
	for _, k := range slices.Sorted(maps.Keys(autoByMode)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, autoByMode[k])
	}
	fmt.Fprintf(tw, "  attempts unknown %s (retried)\t%d\t\n", reconcile.ReasonNotReplicated, notReplicated)
	tw.Flush()
	fmt.Fprintln(&b, "\nReconcile on indeterminate Run results, and on the references of indeterminate plain pgx frames:")
	for _, k := range slices.Sorted(maps.Keys(reconciled)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, reconciled[k])
	}
	tw.Flush()
	fmt.Fprintln(&b, "\nsettled, by mode: indeterminate frames; made determinate at the source (each checked against the table);")
	fmt.Fprintln(&b, "indeterminate results; settled by Reconcile; settled of all that would have been indeterminate:")
	for _, m := range []string{"pgx", "pgx, xid only", "pgx, xid + marker", "run, xid only", "run, xid + marker"} {
		would := atSource[m] + indetResults[m]
		if strings.HasPrefix(m, "pgx") {
			would = atSource[m] + indetFrames[m]
		}
		pct := 0.0
		if would > 0 {
			pct = 100 * float64(atSource[m]+settled[m]) / float64(would)
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%.1f%%\t\n", m, indetFrames[m], atSource[m], indetResults[m], settled[m], pct)
	}
	tw.Flush()
	fmt.Fprintln(&b, "\nResolve on every frame span's reference (outcome → resolution):")
	for _, k := range slices.Sorted(maps.Keys(resolvedRefs)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, resolvedRefs[k])
	}
	tw.Flush()
	fmt.Fprintf(&b, "\nmisclassifications: %d\n", len(bad))
	t.Log(b.String())
	for i, v := range bad {
		if i == 30 {
			t.Errorf("… and %d more", len(bad)-i)
			break
		}
		t.Errorf("operation %d: %s", v.op, v.what)
	}
}

// lostInFailover reports whether a committed frame may be absent from the surviving
// history: it only committed locally, on a cluster that failed over.
func (s *soak) lostInFailover(f *soakFrame) bool {
	return s.cluster != nil && f.committedLocally
}

// soakPathKey counts outcomes per path ("pgx", "run").
type soakPathKey struct{ path, outcome string }

func soakPrintByPath(tw *tabwriter.Writer, counts map[soakPathKey]int) {
	outcomes := map[string]bool{}
	for k := range counts {
		outcomes[k.outcome] = true
	}
	fmt.Fprintf(tw, "  outcome\tpgx\trun\ttotal\t\n")
	var tp, tr int
	for _, o := range slices.Sorted(maps.Keys(outcomes)) {
		p, r := counts[soakPathKey{"pgx", o}], counts[soakPathKey{"run", o}]
		tp, tr = tp+p, tr+r
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t\n", o, p, r, p+r)
	}
	fmt.Fprintf(tw, "  total\t%d\t%d\t%d\t\n", tp, tr, tp+tr)
}

func soakResolutionLabel(r reconcile.Answer) string {
	if r.Status() == reconcile.Unknown {
		return "unknown: " + r.Reason()
	}
	return r.Status().String()
}

// soakResolutionContradicts says how a resolution contradicts the table, or "".
func soakResolutionContradicts(r reconcile.Answer, present bool) string {
	switch r.Status() {
	case reconcile.Committed:
		if !present {
			return "resolved committed; the row is absent"
		}
	case reconcile.Aborted, reconcile.NoWrites:
		if present {
			return "resolved " + r.Status().String() + "; the row is present"
		}
	case reconcile.Unknown:
		if r.Reason() == "" {
			return "unresolved without a reason"
		}
	}
	return ""
}

func (o *soakOp) describe() string {
	var parts []string
	parts = append(parts, o.path(), o.via)
	for _, f := range []struct {
		on   bool
		name string
	}{{o.syncRep, "syncrep"}, {o.control == soakCommitCancel, "cancellable"}, {o.control == soakCommitDeadline, "deadline"},
		{o.dup, "dup"}, {o.serial, "serializable"}, {o.appRollback, "app-rollback"}, {o.pause, "pause"},
		{o.postCommitFail, "post-commit-fail"}, {o.participant, "participant"}, {o.marker, "marker"}} {
		if f.on {
			parts = append(parts, f.name)
		}
	}
	if o.run {
		parts = append(parts, fmt.Sprintf("calls=%d", o.calls))
		if o.res != nil {
			parts = append(parts, "result="+o.res.Outcome().String())
			switch r := o.res.(type) {
			case outcome.DeterminateRollback[int64]:
				parts = append(parts, fmt.Sprintf("phase=%s cause=%v", r.Phase(), r.Cause()))
			case outcome.Indeterminate[int64]:
				parts = append(parts, fmt.Sprintf("cause=%v", r.Cause()))
			}
		}
	} else {
		if o.failedAt != "" {
			parts = append(parts, "failed at "+o.failedAt+": "+fmt.Sprint(o.err))
		}
		if o.committed {
			parts = append(parts, fmt.Sprintf("Commit error=%v", o.commitErr))
		}
	}
	return strings.Join(parts, " ")
}

// checkPlain: the plain caller's own view must agree with the span.
func (s *soak) checkPlain(op *soakOp, fs []*soakFrame, present bool, fail func(int64, string, ...any)) {
	if len(fs) > 1 {
		fail(op.id, "plain pgx operation has %d frames, want at most one [%s]", len(fs), op.describe())
		return
	}
	if len(fs) == 0 {
		if op.failedAt != "begin" {
			fail(op.id, "plain pgx transaction began but has no frame span [%s]", op.describe())
		}
		if present {
			fail(op.id, "no transaction began, yet row is present [%s]", op.describe())
		}
		return
	}
	f := fs[0]
	switch {
	case op.committed && op.commitErr == nil && f.outcome != "committed":
		fail(op.id, "Commit returned nil; the span says %s [%s]", f.outcome, op.describe())
	case f.outcome == "committed" && (!op.committed || op.commitErr != nil):
		fail(op.id, "the span says committed; the caller's Commit said %v [%s]", op.commitErr, op.describe())
	case f.outcome == "indeterminate" && !op.committed:
		fail(op.id, "the span says indeterminate, but COMMIT was never sent [%s]", op.describe())
	}
}

// checkRun: the returned result agrees with its frame span and with the table.
func (s *soak) checkRun(op *soakOp, fs []*soakFrame, present bool, row string, rows map[int64]string, fail func(int64, string, ...any)) {
	res := op.res
	if res == nil {
		fail(op.id, "Run returned no result")
		return
	}
	id := res.OperationID()
	if len(fs) == 0 {
		if !soakNotStarted(res) {
			fail(op.id, "Run result %s has no frame span [%s]", res.Outcome(), op.describe())
		}
	} else {
		last := fs[len(fs)-1]
		if last.outcome != res.Outcome().String() {
			fail(op.id, "Run returned %s; its frame span says %s [%s]", res.Outcome(), last.outcome, op.describe())
		}
		if !id.IsZero() && last.op != id.String() {
			fail(op.id, "Run result names operation %s; the last frame span is %s", id, last.op)
		}
		for _, f := range fs[:len(fs)-1] {
			if f.outcome != "rolled_back" {
				fail(op.id, "an attempt that was retried ended %s [%s]", f.outcome, op.describe())
			}
		}
	}
	switch res.Outcome() {
	case outcome.OutcomeCommitted, outcome.OutcomeCommittedWithPostCommitFailure:
		if !present && len(fs) > 0 && s.lostInFailover(fs[len(fs)-1]) {
			break // counted with its frame
		}
		if !present || row != id.String() {
			fail(op.id, "Run returned %s; row present %v (named %q) [%s]", res.Outcome(), present, row, op.describe())
		}
		if res.Outcome() == outcome.OutcomeCommittedWithPostCommitFailure && !op.postCommitFail {
			fail(op.id, "committed_with_post_commit_failure without a failing hook")
		}
	case outcome.OutcomeRolledBack:
		if present {
			fail(op.id, "Run returned rolled_back; the row is present (committed by %s) [%s]", row, op.describe())
		}
	case outcome.OutcomeIndeterminate:
		if ind := res.(outcome.Indeterminate[int64]); ind.TraceParent() == "" {
			fail(op.id, "indeterminate Run result without a traceparent")
		}
	default:
		fail(op.id, "Run returned %s", res.Outcome())
	}
	if op.participant && op.inner != nil {
		switch op.inner.Outcome() {
		case outcome.OutcomeParticipating, outcome.OutcomeRolledBack:
		default:
			fail(op.id, "the participant claims %s", op.inner.Outcome())
		}
		innerRow, innerPresent := rows[op.id+soakParticipantOffset]
		if innerPresent != present || innerPresent && innerRow != row {
			fail(op.id, "participant's row present %v (%q), owner's %v (%q): one transaction, two fates", innerPresent, innerRow, present, row)
		}
	}
}

// TestReconcileXIDReusedAfterCrash is the regression test for a misclassification found
// by the soundness work: a reconciliation reference names (system identifier, timeline,
// xid8), but a crash restart keeps both the system identifier and the timeline while it
// can hand the same xid to a new transaction. PostgreSQL does not WAL-log xid assignment:
// after crash recovery nextXid is the last checkpoint's, advanced past the xids of the
// records that were replayed. A transaction whose records were still in WAL buffers when
// the server died (it cannot have committed: its commit record is not on disk) leaves
// its xid free, and the next transaction after the restart takes it. pg_xact_status then
// describes that other transaction.
//
// Here COMMIT is held in a deferred trigger (after Run captured the xid, before the
// commit record), the server crashes, the first transaction after the restart takes
// the same xid and commits, and the reconciler resolves the lost transaction committed.
func TestReconcileXIDReusedAfterCrash(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := testCtx(t)
	h := newHarness(t, "", 2)
	if err := srv.Exec(ctx, `drop table if exists xr_held, xr_next;
		create table xr_held (id int primary key);
		create table xr_next (id int primary key);
		create or replace function xr_hold() returns trigger language plpgsql as $$
		begin perform pg_advisory_lock(4242); perform pg_advisory_unlock(4242); return null; end $$;
		create constraint trigger xr_hold after insert on xr_held deferrable initially deferred
		for each row execute function xr_hold()`); err != nil {
		t.Fatal(err)
	}
	holder, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background()) // the crash closes it; this only frees it
	if _, err := holder.Exec(ctx, "select pg_advisory_lock(4242)"); err != nil {
		t.Fatal(err)
	}
	pid, done := runInBackground(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, "insert into xr_held values (1)")
		return 1, err
	})
	// COMMIT is in the deferred trigger: the xid was read, the commit record not written.
	if err := srv.WaitForWaitEvent(ctx, pid, "advisory"); err != nil {
		t.Fatal(err)
	}
	if err := srv.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	ind, ok := res.(outcome.Indeterminate[int])
	if !ok {
		t.Fatalf("result = %T %+v, want Indeterminate", res, res)
	}
	ref, ok := ind.Reference()
	if !ok || ref.NoWrites() {
		t.Fatalf("reference %v %v, want a captured xid", ref, ok)
	}
	// The first transaction after the restart that needs an xid.
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var next uint64
	if _, err := tx.Exec(ctx, "insert into xr_next values (1)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&next); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(h.pool)
	if err != nil {
		t.Fatal(err)
	}
	got, err := reconcile.Indeterminate(ctx, rec, ind)
	if err != nil {
		t.Fatal(err)
	}
	present := rowExists(t, ctx, "xr_held", 1)
	t.Logf("captured %s; the first transaction after the restart got xid %d; Reconcile: %s %q; row present: %v",
		ref, next, got.Status(), got.Reason(), present)
	if msg := soakResolutionContradicts(got, present); msg != "" {
		t.Fatalf("Reconcile contradicts the database: %s (xid %d was reused by a transaction after the crash restart)", msg, ref.XID)
	}
	// The end-of-recovery checkpoint's next xid is the boundary: the xid is at or above
	// it (reused) or below it with its own "aborted" (its insert reached the WAL).
	if got.Status() != reconcile.Aborted {
		t.Fatalf("Reconcile = %s %q, want aborted", got.Status(), got.Reason())
	}
}

// TestReconcileAfterCrashRestart resolves references read before a crash restart
// (pg_ctl stop -m immediate): an xid assigned but never WAL-logged, which the restarted
// server has not handed out again, resolves aborted (the next xid restarted below it); a
// commit that reached the WAL stays unknown (server_restarted), because another restart
// in between could have reused its xid and the server keeps no record of it.
func TestReconcileAfterCrashRestart(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := testCtx(t)
	h := newHarness(t, "", 2)
	table := newTable(t, ctx)
	if res := Run(ctx, h.pool, DefaultPolicy(), insertFn(table, 1)); res.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("result = %T", res)
	}
	var durable outcome.ReconciliationRef
	for _, f := range h.frames() {
		if v, ok := attr(f, ReconciliationRefKey); ok {
			r, err := outcome.ParseReconciliationRef(v.AsString())
			if err != nil {
				t.Fatal(err)
			}
			durable = r
		}
	}
	// An xid assigned inside an open transaction writes no WAL.
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background()) // the crash closes it; this only frees it
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xid uint64
	if err := tx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	unlogged := durable
	unlogged.XID = xid
	if err := srv.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(h.pool, reconcile.WithWait(0, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	checkResolutions(t, ctx, rec, []resolveCase{
		{"assigned, never logged", unlogged, reconcile.Aborted, ""},
		{"committed before the crash", durable, reconcile.Unknown, reconcile.ReasonServerRestarted},
	})
	if !rowExists(t, ctx, table, 1) {
		t.Error("the committed row is gone after the crash restart")
	}
}
