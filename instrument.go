package otelpgxtx

import (
	"context"
	"net"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/auto"
	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/framespan"
	"github.com/txevidence/otelpgxtx/internal/hooks"
	"github.com/txevidence/otelpgxtx/internal/inner"
	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/poolmetrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/internal/wire"
)

// InstrumentPool instruments every connection of a pool that cfg will create; call it
// before pgxpool.NewWithConfig (the package documentation and the example show the whole
// setup). An error (wrapping [ErrInvalidArgument]: a nil config or one without its
// ConnConfig, an option refused, a config instrumented already) means cfg was left as it
// was, without a tracer: check it, or the pool records nothing. Close the returned Tracer
// after the pool.
//
// It does what [InstrumentConnConfig] does for cfg.ConnConfig, and chains (never
// replaces) cfg.BeforeClose so that a frame never outlives its connection. A connection
// released in the middle of a transaction is seen by the tracer's release hook.
func InstrumentPool(cfg *pgxpool.Config, opts ...Option) (*Tracer, error) {
	if cfg == nil {
		return nil, invalid("InstrumentPool: nil pool config")
	}
	if cfg.ConnConfig == nil {
		return nil, invalid("InstrumentPool: the pool config has no ConnConfig (make it with pgxpool.ParseConfig)")
	}
	t, err := InstrumentConnConfig(cfg.ConnConfig, opts...)
	if err != nil {
		return nil, err
	}
	if !t.a.Cfg.NoPoolMetrics {
		t.a.Pool = poolmetrics.New(t.a.Cfg, cfg)
	}
	userBeforeClose := cfg.BeforeClose
	cfg.BeforeClose = func(conn *pgx.Conn) {
		t.a.ConnClosing(conn)
		if userBeforeClose != nil {
			userBeforeClose(conn)
		}
	}
	return t, nil
}

// InstrumentConnConfig instruments a single connection's configuration: it sets a new
// [Tracer] as cfg.Tracer — a tracer cfg already has becomes its inner tracer, in place
// of a new otelpgx one, unless [WithInnerTracer] says otherwise — and chains (never
// replaces) cfg.OnNotice so that the server's "already committed locally" warnings reach
// the classifier, and cfg.AfterNetConnect to wrap the net.Conn pgconn will use, so that
// a frame still open when its connection closes ends then (pgx.Conn.Close has no hook);
// the wrapper's NetConn method returns the net.Conn underneath. By default it sends
// nothing of its own: the bytes on the wire are those of the application, unless commit
// references are asked for ([WithCommitReference], [WithCommitMarker], or a [Policy] of
// [Run]'s), which add to the application's writes what they name.
// Calling it twice on one config is an error: frames would be recorded twice. Every
// error it returns (a nil cfg, a config instrumented already, an option refused) wraps
// [ErrInvalidArgument] and leaves cfg as it was.
func InstrumentConnConfig(cfg *pgx.ConnConfig, opts ...Option) (*Tracer, error) {
	if cfg == nil {
		return nil, invalid("InstrumentConnConfig: nil connection config")
	}
	if _, ok := cfg.Tracer.(*Tracer); ok {
		return nil, invalid("InstrumentConnConfig: the connection config is already instrumented")
	}
	if cfg.Tracer != nil {
		opts = append([]Option{WithInnerTracer(cfg.Tracer)}, opts...)
	}
	t, err := newTracer(opts)
	if err != nil {
		return nil, err
	}
	cfg.Tracer = t
	if userDial := cfg.DialFunc; userDial != nil && mayUseTLS(&cfg.Config) {
		// The socket under TLS: what its writes got into the kernel tells a COMMIT that
		// never left from one that did (see wire.Dialed).
		cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := userDial(ctx, network, addr)
			if err != nil || conn == nil {
				return conn, err
			}
			return &wire.Dialed{Conn: conn}, nil
		}
	}
	userAfterNetConnect := cfg.AfterNetConnect
	cfg.AfterNetConnect = func(ctx context.Context, pcfg *pgconn.Config, conn net.Conn) (net.Conn, error) {
		if d, ok := conn.(*wire.Dialed); ok {
			conn = d.Conn // no TLS on this connection: the socket, as it was dialed
		}
		if userAfterNetConnect != nil {
			var err error
			if conn, err = userAfterNetConnect(ctx, pcfg, conn); err != nil {
				return conn, err
			}
		}
		return newNetConn(conn, t), nil
	}
	if build := cfg.BuildContextWatcherHandler; build != nil {
		cfg.BuildContextWatcherHandler = func(pg *pgconn.PgConn) ctxwatch.Handler {
			h := build(pg)
			if _, deadline := h.(*pgconn.DeadlineContextWatcherHandler); !deadline {
				if st := t.a.State(pg); st != nil {
					st.Refs.Cancels() // see reference.Conn.readsEarly
				}
			}
			return h
		}
	}
	userOnNotice := cfg.OnNotice
	cfg.OnNotice = func(pg *pgconn.PgConn, n *pgconn.Notice) {
		t.a.OnNotice(pg, n)
		if userOnNotice != nil {
			userOnNotice(pg, n)
		}
	}
	return t, nil
}

// mayUseTLS reports whether a connection made with cfg may be TLS.
func mayUseTLS(cfg *pgconn.Config) bool {
	if cfg.TLSConfig != nil {
		return true
	}
	for _, fb := range cfg.Fallbacks {
		if fb.TLSConfig != nil {
			return true
		}
	}
	return false
}

// newTracer builds the tracer and returns an invalid option's error, for the Instrument
// functions to return rather than hand to otel.Handle.
func newTracer(opts []Option) (*Tracer, error) {
	cfg := newConfig(opts)
	if cfg.Err == nil {
		cfg.Err = checkOmitSpans(&cfg)
	}
	t := &Tracer{a: hooks.Adapter{Core: frame.Core{
		Cfg:     cfg,
		Tracer:  cfg.TracerProvider.Tracer(schema.ScopeName, trace.WithInstrumentationVersion(schema.Version)),
		Metrics: metrics.New(cfg.MeterProvider, cfg.MeterAttributes),
	}}}
	t.a.Spans = framespan.Starter{Cfg: &t.a.Cfg, Tracer: t.a.Tracer, Sanitized: &t.a.Sanitized}
	t.a.Inner.Cfg, t.a.Inner.Sanitized = &t.a.Cfg, &t.a.Sanitized
	t.a.Sanitized.Raw = cfg.RawQueryText
	t.a.Inner.AsIs = cfg.InnerSet && cfg.Inner != nil && !cfg.SanitizeInner
	innerTracer := cfg.Inner
	if !cfg.InnerSet {
		oo := []otelpgx.Option{
			// Wrapped, so that a batch query failing with an expected error keeps its span's
			// status Unset (see expectedCtx).
			otelpgx.WithTracerProvider(inner.ExpectedStatusProvider{TracerProvider: cfg.TracerProvider}),
			otelpgx.WithMeterProvider(cfg.MeterProvider),
			otelpgx.WithTracerAttributes(cfg.SpanAttributes...),
			otelpgx.WithMeterAttributes(cfg.MeterAttributes...),
			otelpgx.WithSpanNameCtxFunc(t.a.Sanitized.OperationName), // a user's own, passed after, wins
		}
		if cfg.NoConnDetails {
			oo = append(oo, otelpgx.WithDisableConnectionDetailsInAttributes())
		}
		innerTracer = otelpgx.NewTracer(append(oo, cfg.OtelpgxOptions...)...)
	}
	t.a.Inner.SetInner(innerTracer)
	if cfg.Err == nil && cfg.Auto != nil {
		t.a.Auto = auto.New(cfg.Auto, t.a.Cfg.Logger, cfg.MeterProvider, cfg.MeterAttributes)
	}
	return t, cfg.Err
}
