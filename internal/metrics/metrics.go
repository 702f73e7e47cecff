package metrics

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/txevidence/otelpgxtx/internal/record"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// Metric names, unexported: what selects a series is a query or an alert rule, by the
// name docs/metrics.md documents, not Go code. With the Prometheus exporter they become
// otelpgxtx_transaction_duration_seconds_{bucket,sum,count}{tx_outcome="…"},
// otelpgxtx_transaction_commit_duration_seconds_{bucket,sum,count} and
// otelpgxtx_participations_total{tx_participant_outcome="…", tx_propagation="…"}.
const (
	// MetricDuration is the time from BEGIN (an implicit transaction's statement) to a
	// frame's outcome, in seconds: one data point per frame, when it ends, by its
	// tx.outcome (committed, rolled_back, indeterminate, committed_with_post_commit_failure,
	// participating), for rolled_back tx.rollback ([RollbackDeliberate] or
	// [RollbackFailure]), and tx.implicit. Its count is the number of physical
	// transactions: plain pgx transactions, each attempt of [Run] and each implicit
	// transaction alike; a Run call that joined an outer transaction has no frame and is
	// counted by otelpgxtx.participations. One record per frame gives both the count and
	// the duration (there is no counter beside it).
	MetricDuration = "otelpgxtx.transaction.duration"
	// MetricCommitDuration is the time a frame spent committing, in seconds, with the
	// attributes of otelpgxtx.transaction.duration; frames that never sent COMMIT have
	// none, nor implicit transactions (their committing phase is their whole statement).
	MetricCommitDuration = "otelpgxtx.transaction.commit.duration"
	// MetricParticipations counts [Run] calls that joined a transaction already in their
	// context (Required, Mandatory, Nested): one per call, by tx.participant.outcome
	// (participating, or rolled_back when the call failed: a Nested call's savepoint was
	// rolled back, a Required or Mandatory call's failure dooms the owner's transaction,
	// whose own frame counts in otelpgxtx.transaction.duration) and tx.propagation.
	// Participants commit nothing, so they are kept out of the transaction counts.
	MetricParticipations = "otelpgxtx.participations"
)

// DurationBuckets spans a fast local commit (sub-millisecond) to a stuck synchronous
// replication wait (tens of seconds).
var DurationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// frameOutcomes are the outcomes a frame ends with: participating is a prepared
// transaction's (PREPARE TRANSACTION), which waits for its coordinator.
var frameOutcomes = []outcome.Outcome{outcome.OutcomeCommitted, outcome.OutcomeParticipating, outcome.OutcomeRolledBack,
	outcome.OutcomeIndeterminate, outcome.OutcomeCommittedWithPostCommitFailure}

// seriesDeliberate indexes the rolled_back series with tx.rollback=deliberate in the
// metrics' option tables; every other series is indexed by its outcome (rolled_back by
// the failure one).
const seriesDeliberate = outcome.OutcomeCommittedWithPostCommitFailure + 1

// participantPropagations are the propagations whose calls can join a transaction.
var participantPropagations = [...]string{"required", "nested", "mandatory"}

// Metrics are recorded for every frame, sampled or not: an indeterminate commit must be
// countable even when its trace was dropped.
type Metrics struct {
	participations metric.Int64Counter
	Duration       metric.Float64Histogram
	Commit         metric.Float64Histogram
	// RecordOpts are the per-series options, [implicit][series], each one
	// metric.WithAttributeSet of a set made here, so that recording allocates nothing and
	// builds no set. The SDK (v1.45 to v1.47) still reads every attribute of the set again
	// on each call (its attribute normalization), and caches nothing of it between calls:
	// what a record costs grows with the set's attributes, and a second record on the same
	// set (the counter there was beside the histogram) costs it again.
	RecordOpts [2][seriesDeliberate + 1][]metric.RecordOption
	// participantOpts[failed][propagation]
	participantOpts [2][len(participantPropagations)][]metric.AddOption
}

func New(mp metric.MeterProvider, extra []attribute.KeyValue) *Metrics {
	meter := mp.Meter(schema.ScopeName, metric.WithInstrumentationVersion(schema.Version))
	m := &Metrics{
		participations: Counter(meter, MetricParticipations, "{call}",
			"Run calls that joined a transaction already in their context, by tx.participant.outcome and tx.propagation."),
		Duration: Histogram(meter, MetricDuration, "s",
			"Duration of transaction frames from BEGIN to their outcome, one per physical transaction (its count counts them), by tx.outcome, tx.rollback and tx.implicit.", DurationBuckets),
		Commit: Histogram(meter, MetricCommitDuration, "s",
			"Time spent in the committing phase, by tx.outcome and tx.rollback.", DurationBuckets),
	}
	series := func(implicit int, i outcome.Outcome, kv ...attribute.KeyValue) {
		set := attribute.NewSet(append(append(kv, schema.ImplicitKey.Bool(implicit == 1), schema.DBSystemPostgreSQL), extra...)...)
		m.RecordOpts[implicit][i] = []metric.RecordOption{metric.WithAttributeSet(set)}
	}
	for implicit := range 2 {
		for _, o := range frameOutcomes {
			if o == outcome.OutcomeRolledBack {
				series(implicit, o, schema.OutcomeKey.String(o.String()), schema.RollbackKey.String(schema.RollbackFailure))
				series(implicit, seriesDeliberate, schema.OutcomeKey.String(o.String()), schema.RollbackKey.String(schema.RollbackDeliberate))
				continue
			}
			series(implicit, o, schema.OutcomeKey.String(o.String()))
		}
	}
	for failed, o := range []outcome.Outcome{outcome.OutcomeParticipating, outcome.OutcomeRolledBack} {
		for p, name := range participantPropagations {
			set := attribute.NewSet(append([]attribute.KeyValue{schema.ParticipantOutcomeKey.String(o.String()),
				schema.PropagationKey.String(name), schema.DBSystemPostgreSQL}, extra...)...)
			m.participantOpts[failed][p] = []metric.AddOption{metric.WithAttributeSet(set)}
			// Every series exists from the start at 0, so that an alert on increase(…)
			// sees the very first one.
			m.participations.Add(context.Background(), 0, m.participantOpts[failed][p]...)
		}
	}
	return m
}

// Counter creates a counter on meter. A failure is reported to otel.Handle and leaves the
// no-op instrument the API returns with it, so that recording never needs a nil check.
func Counter(meter metric.Meter, name, unit, description string) metric.Int64Counter {
	c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(description))
	if err != nil {
		otel.Handle(err)
	}
	return c
}

// Histogram creates a histogram on meter with explicit buckets; a failure is handled as
// counter's is.
func Histogram(meter metric.Meter, name, unit, description string, buckets []float64) metric.Float64Histogram {
	h, err := meter.Float64Histogram(name, metric.WithUnit(unit), metric.WithDescription(description),
		metric.WithExplicitBucketBoundaries(buckets...))
	if err != nil {
		otel.Handle(err)
	}
	return h
}

// Participant counts a Run call with the propagation named propagation (Propagation's
// String) that joined an outer transaction and ended with o: participating, or
// rolled_back when it failed.
func (m *Metrics) Participant(propagation string, o outcome.Outcome) {
	p := slices.Index(participantPropagations[:], propagation)
	if m == nil || p < 0 {
		return
	}
	failed := 0
	if o != outcome.OutcomeParticipating {
		failed = 1
	}
	m.participations.Add(context.Background(), 1, m.participantOpts[failed][p]...)
}

// Record records e, a frame's ending: its duration, whose data point also counts it, and
// the time it spent committing.
func (m *Metrics) Record(e *record.Ending) {
	o := e.Outcome
	if m == nil || !o.Valid() {
		return
	}
	i := o
	if o == outcome.OutcomeRolledBack && e.Deliberate {
		i = seriesDeliberate
	}
	kind := 0
	if e.Implicit {
		kind = 1
	}
	recordOpts := m.RecordOpts[kind][i]
	// The instruments are never nil: a failed creation returns a no-op instrument.
	ctx := context.Background()
	if e.Span.IsSampled() && e.SpanCtx != nil {
		ctx = e.SpanCtx // carries the frame span: links exemplars to the frame's trace
	}
	m.Duration.Record(ctx, e.At.Sub(e.StartedAt).Seconds(), recordOpts...)
	// An implicit transaction commits its whole statement: its committing phase is its
	// duration, already recorded, and would make the commit histogram one of statements.
	if !e.Implicit && !e.CommittingAt.IsZero() && !e.ConcludedAt.IsZero() {
		m.Commit.Record(ctx, e.ConcludedAt.Sub(e.CommittingAt).Seconds(), recordOpts...)
	}
}

// Metric names of automatic reconciliation ([WithAutoReconcile]), unexported as the
// others are. With the Prometheus
// exporter they become otelpgxtx_reconciliations_total{tx_outcome_resolved="…",
// error_type="…"}, otelpgxtx_reconciliation_unresolved, otelpgxtx_reconciliation_unresolved_age_seconds
// and otelpgxtx_reconciliation_duration_seconds.
const (
	// MetricReconciliations counts settled indeterminate frames, by tx.outcome.resolved
	// and, when unknown, error.type.
	MetricReconciliations = "otelpgxtx.reconciliations"
	// MetricUnresolved is the number of indeterminate frames waiting to be settled.
	MetricUnresolved = "otelpgxtx.reconciliation.unresolved"
	// MetricUnresolvedAge is the age of the oldest of them, in seconds; 0 when none is.
	MetricUnresolvedAge = "otelpgxtx.reconciliation.unresolved.age"
	// MetricReconciliationDuration is the time from an indeterminate commit to its final
	// answer, in seconds.
	MetricReconciliationDuration = "otelpgxtx.reconciliation.duration"
)

// reconcileBuckets spans a commit settled at the first attempt to one left for an hour.
var reconcileBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// finalReasons are the reasons an automatic reconciliation can end unknown with.
var finalReasons = []string{reconcile.ReasonNoReference, reconcile.ReasonTooOld, reconcile.ReasonInTheFuture, reconcile.ReasonOtherSystem,
	reconcile.ReasonOtherTimeline, reconcile.ReasonServerRestarted, reconcile.ReasonCrashRecovered, reconcile.ReasonQueueFull, reconcile.ReasonStopped}

// ReconcileMetrics count what automatic reconciliation learned, whether the frames were
// sampled or not.
type ReconcileMetrics struct {
	reconciliations metric.Int64Counter
	duration        metric.Float64Histogram
	extra           []attribute.KeyValue
	leave           func() // leaves the unresolved gauges' group
}

func NewReconcile(mp metric.MeterProvider, extra []attribute.KeyValue, pending func() (int, time.Duration)) *ReconcileMetrics {
	meter := mp.Meter(schema.ScopeName, metric.WithInstrumentationVersion(schema.Version))
	m := &ReconcileMetrics{
		extra: extra,
		reconciliations: Counter(meter, MetricReconciliations, "{transaction}",
			"Indeterminate frames settled by automatic reconciliation, by tx.outcome.resolved and, when unknown, error.type (the reason)."),
		duration: Histogram(meter, MetricReconciliationDuration, "s",
			"Time from an indeterminate commit to its reconciliation's final answer, by tx.outcome.resolved.", reconcileBuckets),
	}
	set := attribute.NewSet(append([]attribute.KeyValue{schema.DBSystemPostgreSQL}, extra...)...)
	m.leave = UnresolvedGauges.Join(meter, set, pending)
	// Every series exists from the start at 0, as the participation series do: an alert on
	// increase(…) sees the first answer of a process.
	for _, r := range []reconcile.Status{reconcile.Committed, reconcile.Aborted, reconcile.NoWrites} {
		m.reconciliations.Add(context.Background(), 0, metric.WithAttributeSet(m.attrs(r, "")))
	}
	for _, reason := range finalReasons {
		m.reconciliations.Add(context.Background(), 0, metric.WithAttributeSet(m.attrs(reconcile.Unknown, reason)))
	}
	return m
}

func (m *ReconcileMetrics) attrs(r reconcile.Status, reason string) attribute.Set {
	kv := append([]attribute.KeyValue{schema.ResolvedOutcomeKey.String(r.String()), schema.DBSystemPostgreSQL}, m.extra...)
	if reason != "" {
		kv = append(kv, schema.ErrorTypeKey.String(reason))
	}
	return attribute.NewSet(kv...)
}

// Record counts one final answer, age after its indeterminate commit.
func (m *ReconcileMetrics) Record(res reconcile.Answer, age time.Duration) {
	ctx := context.Background()
	m.reconciliations.Add(ctx, 1, metric.WithAttributeSet(m.attrs(res.Status(), res.Reason())))
	m.duration.Record(ctx, age.Seconds(), metric.WithAttributeSet(m.attrs(res.Status(), "")))
}

func (m *ReconcileMetrics) Unregister() { m.leave() }

// UnresolvedGauges reports the unresolved gauges of every automatic reconciler, one
// callback per meter and attribute set: two tracers on one meter provider with the same
// attributes observe the same series, and with a callback each the last observation
// would win. The group sums the pending frames and reports the oldest age.
var UnresolvedGauges = gaugeGroups{groups: map[gaugeKey]*gaugeGroup{}}

type gaugeGroups struct {
	mu     sync.Mutex
	groups map[gaugeKey]*gaugeGroup
}

type gaugeKey struct {
	meter metric.Meter
	attrs attribute.Distinct
}

type gaugeGroup struct {
	// mu guards members; the callback takes only it, never gaugeGroups.mu, which is held
	// while registering with the SDK (the SDK holds its own lock around callbacks).
	mu      sync.Mutex
	members map[*func() (int, time.Duration)]struct{}
	reg     metric.Registration
}

// Join adds pending to the group of meter and set, registering the group's callback
// when it is the first member, and returns the function that leaves it. A meter that
// cannot be a map key (not comparable) gets a group of its own.
func (g *gaugeGroups) Join(meter metric.Meter, set attribute.Set, pending func() (int, time.Duration)) (leave func()) {
	shared := reflect.TypeOf(meter) != nil && reflect.TypeOf(meter).Comparable()
	var key gaugeKey
	g.mu.Lock()
	defer g.mu.Unlock()
	var grp *gaugeGroup
	if shared {
		key = gaugeKey{meter, set.Equivalent()}
		grp = g.groups[key]
	}
	if grp == nil {
		grp = &gaugeGroup{members: map[*func() (int, time.Duration)]struct{}{}}
		grp.register(meter, set)
		if shared {
			g.groups[key] = grp
		}
	}
	member := &pending
	grp.mu.Lock()
	grp.members[member] = struct{}{}
	grp.mu.Unlock()
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		grp.mu.Lock()
		delete(grp.members, member)
		last := len(grp.members) == 0
		grp.mu.Unlock()
		if !last {
			return
		}
		if shared {
			delete(g.groups, key)
		}
		if grp.reg != nil {
			if err := grp.reg.Unregister(); err != nil {
				otel.Handle(err)
			}
		}
	}
}

// register creates the gauges on meter and the callback that reports the group's members.
func (grp *gaugeGroup) register(meter metric.Meter, set attribute.Set) {
	count, err1 := meter.Int64ObservableGauge(MetricUnresolved,
		metric.WithUnit("{transaction}"),
		metric.WithDescription("Indeterminate frames waiting for automatic reconciliation."))
	age, err2 := meter.Float64ObservableGauge(MetricUnresolvedAge,
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest indeterminate frame waiting for automatic reconciliation; 0 when none is."))
	if err := errors.Join(err1, err2); err != nil {
		otel.Handle(err)
	}
	opt := metric.WithAttributeSet(set)
	var err error
	if grp.reg, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		var n int
		var oldest time.Duration
		grp.mu.Lock()
		for pending := range grp.members {
			c, a := (*pending)()
			n, oldest = n+c, max(oldest, a)
		}
		grp.mu.Unlock()
		o.ObserveInt64(count, int64(n), opt)
		o.ObserveFloat64(age, oldest.Seconds(), opt)
		return nil
	}, count, age); err != nil {
		otel.Handle(err)
	}
}
