package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/settings"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

var srv *pgtest.Server

// TestMain starts the test server and names it in DATABASE_URL, where the examples read
// it the way an application reads its database.
func TestMain(m *testing.M) {
	pgtest.Main(m, &srv, func(s *pgtest.Server) {
		os.Setenv("DATABASE_URL", s.ConnString())
		ddl, err := reconcile.MarkerTableDDL(spanMarker)
		if err == nil {
			err = s.Exec(context.Background(), ddl)
		}
		if err != nil {
			panic(fmt.Sprintf("creating the span tests' marker table: %v", err))
		}
	})
}

// transports are the ways the commit-path tests reach the server: plain TCP, and TLS
// verified against the test server's own CA (pgtest's TLS mode). base gives a connection
// string of the test server for that transport; a proxy's ConnString keeps its TLS.
var transports = []struct {
	name string
	base func() string
}{{"tcp", func() string { return srv.ConnString() }}, {"tls", func() string { return srv.TLSConnString() }}}

// overTransports runs test as a subtest for each of the transports, on its base
// connection string.
func overTransports(t *testing.T, test func(t *testing.T, base string)) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) { test(t, tr.base()) })
	}
}

// endCounter counts End calls per span, to prove every frame span is ended exactly once.
type endCounter struct {
	mu   sync.Mutex
	ends map[trace.SpanID]int
}

func (c *endCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *endCounter) OnEnd(s sdktrace.ReadOnlySpan) {
	c.mu.Lock()
	c.ends[s.SpanContext().SpanID()]++
	c.mu.Unlock()
}
func (c *endCounter) Shutdown(context.Context) error   { return nil }
func (c *endCounter) ForceFlush(context.Context) error { return nil }

// harness is an instrumented pool on the test server with an in-memory exporter.
type harness struct {
	exp    *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	reader *metric.ManualReader
	ends   *endCounter
	pool   *pgxpool.Pool
	tracer *Tracer
	// controlEvents: the options ask for transaction-control statements as events of
	// their frame (the default), read from the options, not from the tracer under test.
	controlEvents bool
}

func newHarness(t *testing.T, connString string, maxConns int32, opts ...Option) *harness {
	t.Helper()
	return newHarnessSampled(t, connString, maxConns, sdktrace.AlwaysSample(), opts...)
}

func newHarnessSampled(t *testing.T, connString string, maxConns int32, sampler sdktrace.Sampler, opts ...Option) *harness {
	t.Helper()
	pgtest.LeakCheck(t) // registered first, so it runs after the pool's Close
	if connString == "" {
		connString = srv.ConnString()
	}
	h := &harness{exp: tracetest.NewInMemoryExporter(), reader: metric.NewManualReader(),
		ends: &endCounter{ends: map[trace.SpanID]int{}}}
	h.tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler),
		sdktrace.WithSyncer(h.exp), sdktrace.WithSpanProcessor(h.ends))
	mp := metric.NewMeterProvider(metric.WithReader(h.reader))
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	for i, o := range opts {
		switch o := o.(type) {
		case harnessOption:
			opts[i] = o(h.tp)
		case harnessConfig:
			o(cfg)
		}
	}
	oc := newConfig(opts)
	h.controlEvents = !oc.InnerSet && oc.KeepSpans&(1<<InnerSpanTransactionControl) == 0
	h.tracer, err = InstrumentPool(cfg, append([]Option{WithTracerProvider(h.tp), WithMeterProvider(mp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	h.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.pool.Close)
	return h
}

// harnessOption is an option made once the harness's tracer provider exists: automatic
// reconciliation's reconciler records its spans with it.
type harnessOption func(tp trace.TracerProvider) Option

func (harnessOption) apply(*settings.Config) {}

// harnessConfig changes the harness's pool config before it is instrumented.
type harnessConfig func(*pgxpool.Config)

func (harnessConfig) apply(*settings.Config) {}

// dialGate refuses every new connection of a harness while refuse is set, so that a
// test can keep pgconn from sending the CancelRequest with which it closes a connection
// whose context ended (asyncClose): one that arrives while a COMMIT waits rolls it back.
type dialGate struct {
	refuse  atomic.Bool
	refused chan struct{} // a dial was refused
}

// newDialGate returns a gate that lets every dial through until refuse is set.
func newDialGate() *dialGate { return &dialGate{refused: make(chan struct{}, 1)} }

// config is the harnessConfig that installs g.
func (g *dialGate) config() harnessConfig {
	return func(cfg *pgxpool.Config) {
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if g.refuse.Load() {
				select {
				case g.refused <- struct{}{}:
				default:
				}
				return nil, errors.New("dialGate: refused")
			}
			return dial(ctx, network, addr)
		}
	}
}

// withAutoReconcile is WithAutoReconcile over a reconciler of db that records to the
// harness's tracer provider.
func withAutoReconcile(t *testing.T, db reconcile.Querier, opts ...AutoReconcileOption) Option {
	return harnessOption(func(tp trace.TracerProvider) Option {
		rec, err := reconcile.New(db, reconcile.WithTracerProvider(tp))
		if err != nil {
			t.Fatal(err)
		}
		return WithAutoReconcile(rec, opts...)
	})
}

// frames returns the ended frame spans, in start order.
func (h *harness) frames() []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range h.exp.GetSpans() {
		if _, isFrame := attr(s, FrameDepthKey); isFrame && s.InstrumentationScope.Name == ScopeName {
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].StartTime.Before(out[j].StartTime) })
	return out
}

// children returns the spans whose parent is s.
func (h *harness) children(s tracetest.SpanStub) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, c := range h.exp.GetSpans() {
		if c.Parent.SpanID() == s.SpanContext.SpanID() && c.Parent.TraceID() == s.SpanContext.TraceID() {
			out = append(out, c)
		}
	}
	return out
}
