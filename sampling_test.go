package otelpgxtx

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// TestUnsampledFramesStillCounted: with a never-sample sampler no span is exported, but
// every frame's phases are still tracked, and counted by outcome; the indeterminate one is
// logged, on WithLogger's logger, and without it on slog's default.
func TestUnsampledFramesStillCounted(t *testing.T) {
	for _, viaDefault := range []bool{false, true} {
		t.Run(map[bool]string{false: "WithLogger", true: "slog_default"}[viaDefault], func(t *testing.T) {
			var logs bytes.Buffer
			l := slog.New(slog.NewTextHandler(&logs, nil))
			var opts []Option
			if viaDefault {
				defer slog.SetDefault(slog.Default())
				slog.SetDefault(l)
			} else {
				opts = append(opts, WithLogger(l))
			}
			unsampledFramesStillCounted(t, &logs, opts...)
		})
	}
}

func unsampledFramesStillCounted(t *testing.T, logs *bytes.Buffer, opts ...Option) {
	ctx := pgtest.ContextFor(t)
	h := newHarnessSampled(t, "", 1, sdktrace.NeverSample(), opts...)
	table := srv.NewTable(t, ctx, tableColumns)
	tx := mustBegin(t, ctx, h.pool)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx = mustBegin(t, ctx, h.pool)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	pc, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, commitErr := syncRepTerminate(t, ctx, pc.Conn(), table, 1)
	pc.Release()
	if commitErr == nil {
		t.Fatal("commit succeeded after termination")
	}
	if n := len(h.exp.GetSpans()); n != 0 {
		t.Fatalf("%d spans exported with a never-sample sampler", n)
	}
	got := h.countsByOutcome(t, ctx)
	if got["committed"] != 1 || got["rolled_back"] != 1 || got["indeterminate"] != 1 {
		t.Fatalf("transactions by outcome = %v", got)
	}
	// The indeterminate outcome is logged even though its trace was not sampled.
	if s := logs.String(); !strings.Contains(s, "indeterminate") || !strings.Contains(s, "tx.operation_id=") || !strings.Contains(s, "tx.commit.committed_locally=true") {
		t.Fatalf("log = %q", s)
	}
	h.wantNoFrames(t, ctx)
}

func TestMetricsByOutcome(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	for range 3 {
		tx := mustBegin(t, ctx, h.pool)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			if strings.HasPrefix(m.Name, "db.client.connection.") {
				continue // the pool's, in TestPoolMetrics
			}
			seen[m.Name] = true
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				if m.Unit != "s" || len(d.DataPoints) != 1 || d.DataPoints[0].Count != 3 {
					t.Fatalf("%s: unit %q, points %+v", m.Name, m.Unit, d.DataPoints)
				}
				if v, _ := d.DataPoints[0].Attributes.Value(OutcomeKey); v.AsString() != "committed" {
					t.Fatalf("%s outcome = %v", m.Name, v)
				}
			case metricdata.Sum[int64]:
				// No Run call joined a transaction: six series, each at 0. No other sum: the
				// duration histogram's count counts the transactions.
				if m.Name != metrics.MetricParticipations || m.Unit != "{call}" || !d.IsMonotonic || len(d.DataPoints) != 6 ||
					slices.ContainsFunc(d.DataPoints, func(dp metricdata.DataPoint[int64]) bool { return dp.Value != 0 }) {
					t.Fatalf("%s: %+v", m.Name, d)
				}
			}
		}
	}
	for _, name := range []string{metrics.MetricParticipations, metrics.MetricDuration, metrics.MetricCommitDuration} {
		if !seen[name] {
			t.Fatalf("metric %s not recorded; seen %v", name, seen)
		}
	}
}

// TestNilArgumentsWrapErrInvalidArgument: a nil config, pool or connection given to a
// constructor (InstrumentPool, InstrumentConnConfig, Begin, reconcile.New), untyped or
// typed, is an error wrapping ErrInvalidArgument, prefixed with its own package, and
// nothing panics.
func TestNilArgumentsWrapErrInvalidArgument(t *testing.T) {
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"InstrumentPool(nil)": func() error { _, err := InstrumentPool(nil); return err },
		"InstrumentPool(nil, an option)": func() error {
			_, err := InstrumentPool(nil, WithCommitReference())
			return err
		},
		"InstrumentPool without ConnConfig": func() error { _, err := InstrumentPool(&pgxpool.Config{}); return err },
		"InstrumentConnConfig(nil)":         func() error { _, err := InstrumentConnConfig(nil); return err },
		"InstrumentConnConfig(nil, an option)": func() error {
			_, err := InstrumentConnConfig(nil, WithCommitReference())
			return err
		},
		"Begin(nil)":                  func() error { _, _, err := Begin(ctx, nil, pgx.TxOptions{}); return err },
		"Begin(nil *pgxpool.Pool)":    func() error { _, _, err := Begin(ctx, (*pgxpool.Pool)(nil), pgx.TxOptions{}); return err },
		"Begin(nil *pgx.Conn)":        func() error { _, _, err := Begin(ctx, (*pgx.Conn)(nil), pgx.TxOptions{}); return err },
		"reconcile.New(nil)":          func() error { _, err := reconcile.New(nil); return err },
		"reconcile.New(nil *pgxpool)": func() error { _, err := reconcile.New((*pgxpool.Pool)(nil)); return err },
		"reconcile.New(nil *pgx.Conn)": func() error {
			_, err := reconcile.New((*pgx.Conn)(nil))
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("panicked: %v", r)
					}
				}()
				err = call()
			}()
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("%v, want an error wrapping ErrInvalidArgument", err)
			}
			pkg := "otelpgxtx"
			if strings.HasPrefix(name, "reconcile.") {
				pkg = "reconcile"
			}
			wantOwnPrefix(t, name, err, pkg)
		})
	}
}

func TestInstrumentBadInput(t *testing.T) {
	cfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InstrumentConnConfig(cfg, WithStatusMapping(StatusMapping(9))); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "unknown status mapping 9") {
		t.Fatalf("unknown status mapping: err = %v", err)
	}
	if cfg.Tracer != nil {
		t.Fatal("a failed InstrumentConnConfig changed the config")
	}
	if _, err := InstrumentConnConfig(cfg, WithSpanName("")); err == nil {
		t.Fatal("empty span name accepted")
	}
	if _, err := InstrumentConnConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := InstrumentConnConfig(cfg); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("instrumenting twice: %v, want ErrInvalidArgument", err)
	}
	pcfg, err := pgxpool.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InstrumentPool(pcfg, WithSpanName("")); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("InstrumentPool with a refused option: %v, want ErrInvalidArgument", err)
	}
	if pcfg.ConnConfig.Tracer != nil || pcfg.BeforeClose != nil {
		t.Fatal("a failed InstrumentPool changed the config")
	}
	if _, err := InstrumentPool(pcfg); err != nil {
		t.Fatal(err)
	}
	if _, err := InstrumentPool(pcfg); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("instrumenting a pool config twice: %v, want ErrInvalidArgument", err)
	}
}

// TestInstrumentChainsUserHooks: the user's tracer becomes the inner tracer, and the
// user's OnNotice and BeforeClose still run.
func TestInstrumentChainsUserHooks(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	cfg, err := pgxpool.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	user := &recordingTracer{}
	notices, closes := 0, 0
	cfg.ConnConfig.Tracer = user
	cfg.ConnConfig.OnNotice = func(*pgconn.PgConn, *pgconn.Notice) { notices++ }
	cfg.BeforeClose = func(*pgx.Conn) { closes++ }
	if _, err := InstrumentPool(cfg); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, ctx, pool, "do $$ begin raise notice 'hello'; end $$")
	pool.Close()
	if notices != 1 || closes != 1 || user.starts == 0 || user.starts != user.ends {
		t.Fatalf("notices=%d closes=%d inner starts=%d ends=%d", notices, closes, user.starts, user.ends)
	}
}

// recordingTracer is a user's own query tracer that starts no spans: it must still be
// called, and it must never end the frame span.
type recordingTracer struct{ starts, ends int }

func (r *recordingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.starts++
	return ctx
}

func (r *recordingTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	r.ends++
}
