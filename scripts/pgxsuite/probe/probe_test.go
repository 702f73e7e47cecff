package probe

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/pgtest"
)

var srv *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &srv) }

// fakePgx stands for the hook variables of the harness's copy of pgx: the probe sets
// them, the test calls them where the copy's pgx would.
type fakePgx struct {
	parseConn func(*pgx.ConnConfig)
	parsePool func(*pgxpool.Config)
	connect   func(*pgx.ConnConfig)
	connected func(*pgx.Conn)
}

func (f *fakePgx) hooks() Hooks {
	return Hooks{
		ParseConn: func(h func(*pgx.ConnConfig)) { f.parseConn = h },
		ParsePool: func(h func(*pgxpool.Config)) { f.parsePool = h },
		Connect:   func(h func(*pgx.ConnConfig)) { f.connect = h },
		Connected: func(h func(*pgx.Conn)) { f.connected = h },
	}
}

// conn connects as the patched pgx.Connect does: parse, then connect, with the hooks the
// probe set.
func (f *fakePgx) conn(t *testing.T, ctx context.Context) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	if f.parseConn != nil {
		f.parseConn(cfg)
	}
	if f.connect != nil {
		f.connect(cfg)
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.connected(c)
	return c
}

// install installs p with f's hooks and restores the OpenTelemetry globals after the test.
func install(t *testing.T, p *Probe, f *fakePgx) {
	tp, mp, eh := otel.GetTracerProvider(), otel.GetMeterProvider(), otel.GetErrorHandler()
	t.Cleanup(func() {
		otel.SetTracerProvider(tp)
		otel.SetMeterProvider(mp)
		otel.SetErrorHandler(eh)
	})
	p.Install(f.hooks())
}

func TestProbeReport(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.Context(t, time.Minute)
	for _, mode := range []string{Parse, Connect} {
		t.Run(mode, func(t *testing.T) {
			p, err := New(mode)
			if err != nil {
				t.Fatal(err)
			}
			var f fakePgx
			install(t, p, &f)
			if mode == Parse && (f.parseConn == nil || f.parsePool == nil || f.connect != nil) {
				t.Fatalf("the parse mode set the hooks %+v", f)
			}
			if mode == Connect && (f.parseConn != nil || f.connect == nil) {
				t.Fatalf("the connect mode set the hooks %+v", f)
			}

			// A committed transaction, then one on a connection the test closes: the
			// library ends its frame.
			closed := f.conn(t, ctx)
			if err := pgx.BeginFunc(ctx, closed, func(pgx.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
			if _, err := closed.Begin(ctx); err != nil {
				t.Fatal(err)
			}
			if err := closed.Close(ctx); err != nil {
				t.Fatal(err)
			}
			// A transaction on a connection the test leaves open: Finish closes it.
			open := f.conn(t, ctx)
			if _, err := open.Begin(ctx); err != nil {
				t.Fatal(err)
			}
			// What a broken library would do: a frame span ended without its outcome, one
			// never ended, and an error handed to OpenTelemetry.
			tracer := p.TracerProvider().Tracer(otelpgxtx.ScopeName)
			_, noOutcome := tracer.Start(ctx, otelpgxtx.DefaultSpanName)
			noOutcome.End()
			_, _ = tracer.Start(ctx, otelpgxtx.DefaultSpanName)
			otel.Handle(errors.New("export failed"))
			// Spans of other names and scopes are not frames.
			_, other := p.TracerProvider().Tracer("elsewhere").Start(ctx, otelpgxtx.DefaultSpanName)
			other.End()

			rep := p.Finish(ctx)
			if !open.IsClosed() {
				t.Error("Finish left the open connection open")
			}
			if rep.FramesStarted != 5 || rep.FramesEnded != 4 || rep.EndedByProbe != 1 {
				t.Errorf("frames started %d, ended %d, ended by the probe %d; want 5, 4, 1", rep.FramesStarted, rep.FramesEnded, rep.EndedByProbe)
			}
			if rep.Connections != 2 || rep.Instrumented != 2 || rep.LeftOpen != 1 || rep.Busy != 0 {
				t.Errorf("connections %d, instrumented %d, left open %d, busy %d; want 2, 2, 1, 0", rep.Connections, rep.Instrumented, rep.LeftOpen, rep.Busy)
			}
			name := "TestProbeReport"
			if len(rep.NoOutcome) != 1 || rep.NoOutcome[0].Test != name {
				t.Errorf("frames without an outcome: %+v; want the one of %s", rep.NoOutcome, name)
			}
			if len(rep.Unended) != 1 || rep.Unended[0].Test != name {
				t.Errorf("frames never ended: %+v; want the one of %s", rep.Unended, name)
			}
			if len(rep.HandlerErrors) != 1 || rep.HandlerErrors[0] != (Call{Test: name, Error: "export failed"}) {
				t.Errorf("error handler calls: %+v", rep.HandlerErrors)
			}
			if rep.InstrumentErrors != nil || rep.MetricsError != "" {
				t.Errorf("instrument errors %v, metrics error %q", rep.InstrumentErrors, rep.MetricsError)
			}
		})
	}
}

// TestProbeConnectOverInstrumented connects, in the connect mode, with the configuration
// of an instrumented connection, as a test that reconnects with conn.Config() does: it
// is used as it is, not instrumented twice.
func TestProbeConnectOverInstrumented(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.Context(t, time.Minute)
	p, err := New(Connect)
	if err != nil {
		t.Fatal(err)
	}
	var f fakePgx
	install(t, p, &f)
	first := f.conn(t, ctx)
	cfg := first.Config()
	f.connect(cfg)
	second, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.connected(second)
	rep := p.Finish(ctx)
	if rep.InstrumentErrors != nil || rep.Instrumented != 2 {
		t.Errorf("instrument errors %v, instrumented connections %d; want none, 2", rep.InstrumentErrors, rep.Instrumented)
	}
}

// TestProbeSynctestBubble makes connections inside a testing/synctest bubble, as
// pgxpool's tests do: Finish must not touch their channels from outside it (the runtime
// ends the process if it does), and counts one left open as busy.
func TestProbeSynctestBubble(t *testing.T) {
	pgtest.LeakCheck(t)
	p, err := New(Parse)
	if err != nil {
		t.Fatal(err)
	}
	var f fakePgx
	install(t, p, &f)
	var open *pgx.Conn
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		c := f.conn(t, ctx)
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
		open = f.conn(t, ctx)
	})
	rep := p.Finish(context.Background())
	if rep.Connections != 2 || rep.Busy != 1 || rep.LeftOpen != 0 {
		t.Errorf("connections %d, busy %d, left open %d; want 2, 1, 0", rep.Connections, rep.Busy, rep.LeftOpen)
	}
	_ = open
}

func TestBaselineInstallsNothing(t *testing.T) {
	p, err := New(Baseline)
	if err != nil {
		t.Fatal(err)
	}
	tp := otel.GetTracerProvider()
	fail := func(string) { t.Error("the baseline set a hook") }
	p.Install(Hooks{
		ParseConn: func(func(*pgx.ConnConfig)) { fail("ParseConn") },
		ParsePool: func(func(*pgxpool.Config)) { fail("ParsePool") },
		Connect:   func(func(*pgx.ConnConfig)) { fail("Connect") },
		Connected: func(func(*pgx.Conn)) { fail("Connected") },
	})
	if otel.GetTracerProvider() != tp {
		t.Error("the baseline set the global tracer provider")
	}
	if _, err := New("sideways"); err == nil || !strings.Contains(err.Error(), ModeEnv) {
		t.Errorf("an unknown mode: %v", err)
	}
}

func TestTestOf(t *testing.T) {
	for fn, want := range map[string]string{
		"github.com/jackc/pgx/v5_test.TestConnect":                   "TestConnect",
		"github.com/jackc/pgx/v5_test.TestConnect.func1.2":           "TestConnect",
		"github.com/jackc/pgx/v5/pgxpool_test.TestPoolAcquire.func3": "TestPoolAcquire",
		"github.com/jackc/pgx/v5.TestInternal":                       "TestInternal",
		"github.com/jackc/pgx/v5_test.Test":                          "Test",
		"github.com/jackc/pgx/v5_test.Test_underscore":               "Test_underscore",
		"github.com/jackc/pgx/v5_test.TestMain":                      "",
		"github.com/jackc/pgx/v5_test.Testify":                       "",
		"github.com/jackc/pgx/v5.(*Conn).Begin":                      "",
		"testing.tRunner":                                            "",
		"main.main":                                                  "",
	} {
		if got := TestOf(fn); got != want {
			t.Errorf("TestOf(%q) = %q, want %q", fn, got, want)
		}
	}
}
