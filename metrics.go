package otelpgxtx

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/txevidence/otelpgxtx/outcome"
)

// Metric names. With the Prometheus exporter they become
// otelpgxtx_transactions_total{tx_outcome="…"}, otelpgxtx_transaction_duration_seconds and
// otelpgxtx_transaction_commit_duration_seconds.
const (
	MetricTransactions   = "otelpgxtx.transactions"
	MetricDuration       = "otelpgxtx.transaction.duration"
	MetricCommitDuration = "otelpgxtx.transaction.commit.duration"
)

// durationBuckets spans a fast local commit (sub-millisecond) to a stuck synchronous
// replication wait (tens of seconds).
var durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// metrics are recorded for every frame, sampled or not: an indeterminate commit must be
// countable even when its trace was dropped.
type metrics struct {
	transactions metric.Int64Counter
	duration     metric.Float64Histogram
	commit       metric.Float64Histogram
	// Per-outcome options, built once so recording allocates nothing.
	addOpts    [outcome.OutcomeCommittedWithPostCommitFailure + 1][]metric.AddOption
	recordOpts [outcome.OutcomeCommittedWithPostCommitFailure + 1][]metric.RecordOption
}

func newMetrics(mp metric.MeterProvider, extra []attribute.KeyValue) *metrics {
	meter := mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version()))
	m := &metrics{}
	var err error
	if m.transactions, err = meter.Int64Counter(MetricTransactions,
		metric.WithUnit("{transaction}"),
		metric.WithDescription("Finished transaction frames, by tx.outcome.")); err != nil {
		otel.Handle(err)
	}
	if m.duration, err = meter.Float64Histogram(MetricDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Duration of transaction frames from BEGIN to their outcome, by tx.outcome."),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		otel.Handle(err)
	}
	if m.commit, err = meter.Float64Histogram(MetricCommitDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Time spent in the committing phase, by tx.outcome."),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		otel.Handle(err)
	}
	for _, o := range outcome.Outcomes() {
		set := attribute.NewSet(append([]attribute.KeyValue{OutcomeKey.String(o.String()), dbSystemPostgreSQL}, extra...)...)
		m.addOpts[o] = []metric.AddOption{metric.WithAttributeSet(set)}
		m.recordOpts[o] = []metric.RecordOption{metric.WithAttributeSet(set)}
		// Every outcome's series exists from the start at 0, so that an alert on
		// increase(…{tx_outcome="indeterminate"}) sees the very first one.
		m.transactions.Add(context.Background(), 0, m.addOpts[o]...)
	}
	return m
}

// participant counts a Run call that joined an outer transaction: it has no frame, but
// tx.outcome=participating must be countable like every outcome.
func (m *metrics) participant() {
	if m != nil {
		m.transactions.Add(context.Background(), 1, m.addOpts[outcome.OutcomeParticipating]...)
	}
}

func (m *metrics) record(o outcome.Outcome, f *frame, now time.Time) {
	if m == nil || !o.Valid() {
		return
	}
	// The instruments are never nil: a failed creation returns a no-op instrument.
	ctx := context.Background()
	if f.span.SpanContext().IsSampled() && f.spanCtx != nil {
		ctx = f.spanCtx // carries the frame span: links exemplars to the frame's trace
	}
	m.transactions.Add(ctx, 1, m.addOpts[o]...)
	m.duration.Record(ctx, now.Sub(f.start).Seconds(), m.recordOpts[o]...)
	if !f.committingAt.IsZero() && !f.doneAt.IsZero() {
		m.commit.Record(ctx, f.doneAt.Sub(f.committingAt).Seconds(), m.recordOpts[o]...)
	}
}
