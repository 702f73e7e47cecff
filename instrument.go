package otelpgxtx

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
)

// InstrumentPool instruments every connection of a pool that cfg will create:
//
//	cfg, _ := pgxpool.ParseConfig(dsn)
//	if err := otelpgxtx.InstrumentPool(cfg); err != nil { … }
//	pool, _ := pgxpool.NewWithConfig(ctx, cfg)
//
// It does what [InstrumentConnConfig] does for cfg.ConnConfig, and chains (never
// replaces) cfg.BeforeClose so that a frame never outlives its connection. A connection
// released in the middle of a transaction is seen by the tracer's release hook.
func InstrumentPool(cfg *pgxpool.Config, opts ...Option) (*Tracer, error) {
	if cfg == nil || cfg.ConnConfig == nil {
		return nil, errors.New("otelpgxtx: InstrumentPool: nil pool config")
	}
	t, err := InstrumentConnConfig(cfg.ConnConfig, opts...)
	if err != nil {
		return nil, err
	}
	userBeforeClose := cfg.BeforeClose
	cfg.BeforeClose = func(conn *pgx.Conn) {
		t.connClosing(conn)
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
// the classifier, and cfg.AfterConnect to read the cluster identity that reconciliation
// references need, once per connection. Calling it twice on one config is an error: frames would be recorded
// twice.
func InstrumentConnConfig(cfg *pgx.ConnConfig, opts ...Option) (*Tracer, error) {
	if cfg == nil {
		return nil, errors.New("otelpgxtx: InstrumentConnConfig: nil connection config")
	}
	if _, ok := cfg.Tracer.(*Tracer); ok {
		return nil, errors.New("otelpgxtx: the connection config is already instrumented")
	}
	if cfg.Tracer != nil {
		opts = append([]Option{WithInnerTracer(cfg.Tracer)}, opts...)
	}
	t, err := newTracer(opts)
	if err != nil {
		return nil, err
	}
	cfg.Tracer = t
	userAfterConnect := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, pg *pgconn.PgConn) error {
		if userAfterConnect != nil {
			if err := userAfterConnect(ctx, pg); err != nil {
				return err
			}
		}
		// Read once per connection, so that capturing a reference at COMMIT costs no
		// round trip. Without permission for pg_control_*, capture is off for this
		// connection; the connection itself must not fail for it.
		if st := stateOf(pg); st != nil {
			if err := readIdentity(ctx, pg, st); err != nil {
				otel.Handle(err)
			}
		}
		return nil
	}
	userOnNotice := cfg.OnNotice
	cfg.OnNotice = func(pg *pgconn.PgConn, n *pgconn.Notice) {
		t.onNotice(pg, n)
		if userOnNotice != nil {
			userOnNotice(pg, n)
		}
	}
	return t, nil
}
