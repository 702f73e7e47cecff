package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// app is one demo process: a database, an instrumented pool on it, and the telemetry.
type app struct {
	cfg    config
	out    io.Writer
	errOut io.Writer

	srv   *pgtest.Server // the throw-away server, when no DATABASE_URL was given
	admin *pgxpool.Pool  // uninstrumented: schema, ground truth and backend control
	ctl   backendControl
	pool  *pgxpool.Pool // instrumented: every scenario runs here

	tel    *telemetry
	tracer trace.Tracer // the scenarios' own root spans
	// otx is the library's tracer: it reconciles indeterminate commits in the background
	// and hands each answer to reconciled.
	otx        *otelpgxtx.Tracer
	reconciled reconciledOutcomes
	logger     *slog.Logger

	table, skewTable string
}

// backendControl is what the indeterminate scenario needs from the server's side:
// *pgtest.Server has it, and sqlControl does it over any superuser connection.
type backendControl interface {
	WaitForWaitEvent(ctx context.Context, pid uint32, event string) error
	Terminate(ctx context.Context, pid uint32) error
}

func newApp(ctx context.Context, cfg config, out, errOut io.Writer) (a *app, err error) {
	a = &app{cfg: cfg, out: out, errOut: errOut}
	defer func() {
		if err != nil {
			err = errors.Join(err, a.close(context.WithoutCancel(ctx)))
			a = nil
		}
	}()
	setupCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	url := cfg.databaseURL
	if url == "" {
		fmt.Fprintln(out, "PostgreSQL: no DATABASE_URL; starting a throw-away server (pgtest) …")
		if a.srv, err = pgtest.Start(); err != nil {
			return a, err
		}
		url = a.srv.ConnString()
		a.ctl = a.srv
		fmt.Fprintf(out, "PostgreSQL: throw-away server at %s:%d, synchronous_standby_names = 'phantom_standby'\n", a.srv.Host(), a.srv.Port())
	}
	if a.admin, err = pgxpool.New(setupCtx, url); err != nil {
		return a, fmt.Errorf("database: %w", err)
	}
	if err := waitForDatabase(setupCtx, a.admin); err != nil {
		return a, err
	}
	if a.ctl == nil {
		a.ctl = sqlControl{a.admin}
		fmt.Fprintf(out, "PostgreSQL: %s\n", redact(url))
	}
	if err := checkSyncStandby(setupCtx, a.admin); err != nil {
		return a, err
	}

	if a.tel, err = newTelemetry(setupCtx, cfg, out); err != nil {
		return a, err
	}
	a.tracer = a.tel.tp.Tracer("github.com/txevidence/otelpgxtx/examples/jaeger")
	// The library logs every indeterminate outcome, so that it survives trace sampling.
	a.logger = slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelInfo}))

	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return a, err
	}
	pcfg.MaxConns = 4 // two writers at once, an outer and a RequiresNew inner transaction
	// Indeterminate commits are reconciled in the background on the admin pool (a pool of
	// its own: reconciliation never waits behind the application for a connection).
	rec, err := reconcile.New(a.admin, reconcile.WithTracerProvider(a.tel.tp))
	if err != nil {
		return a, err
	}
	opts := []otelpgxtx.Option{
		otelpgxtx.WithTracerProvider(a.tel.tp),
		otelpgxtx.WithMeterProvider(a.tel.mp),
		otelpgxtx.WithLogger(a.logger),
		otelpgxtx.WithOtelpgxOptions(otelpgx.WithDisableAcquireTracer()),
		otelpgxtx.WithAutoReconcile(rec, otelpgxtx.WithOnReconciled(a.reconciled.deliver)),
	}
	if cfg.spans == spansStatements {
		opts = append(opts, otelpgxtx.WithInnerSpans(otelpgxtx.InnerSpanTransactionControl, otelpgxtx.InnerSpanPrepare))
	}
	if a.otx, err = otelpgxtx.InstrumentPool(pcfg, opts...); err != nil {
		return a, err
	}
	if a.pool, err = pgxpool.NewWithConfig(setupCtx, pcfg); err != nil {
		return a, err
	}

	// Tables of this process only, so that two demos on one database never meet.
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	a.table = "otelpgxtx_demo_" + hex.EncodeToString(suffix)
	a.skewTable = a.table + "_skew"
	_, err = a.admin.Exec(setupCtx, fmt.Sprintf(`
create table %s (id int primary key, k int unique deferrable initially deferred, note text);
create table %s (k int primary key, v int not null)`, a.table, a.skewTable))
	return a, err
}

// waitForDatabase waits until the server accepts a query (in docker compose it may
// still be starting), for at most 30 seconds.
func waitForDatabase(ctx context.Context, db *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		err := db.Ping(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("database not reachable within 30s: %w", last)
		case <-tick.C:
		}
	}
}

// checkSyncStandby refuses a server on which the indeterminate scenario cannot happen:
// without a synchronous standby, COMMIT never waits.
func checkSyncStandby(ctx context.Context, db *pgxpool.Pool) error {
	var names string
	if err := db.QueryRow(ctx, "show synchronous_standby_names").Scan(&names); err != nil {
		return err
	}
	if names == "" {
		return errors.New("the server has no synchronous_standby_names: the indeterminate scenario needs a synchronous standby " +
			"that never connects (start it with -c synchronous_standby_names=phantom_standby -c synchronous_commit=local, as docker-compose.yml does)")
	}
	return nil
}

func redact(url string) string {
	if cfg, err := pgx.ParseConfig(url); err == nil {
		return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
	}
	return "(DATABASE_URL)"
}

// resetTables empties the tables between rounds and puts back what the scenarios
// start from: a row whose k the deferred-violation scenario collides with, and the
// two rows of the write-skew scenario.
func (a *app) resetTables(ctx context.Context) error {
	_, err := a.admin.Exec(ctx, fmt.Sprintf(`
truncate %[1]s, %[2]s;
insert into %[1]s (id, k, note) values (0, 7, 'existing order');
insert into %[2]s (k, v) values (1, 0), (2, 0)`, a.table, a.skewTable))
	return err
}

func (a *app) rowExists(ctx context.Context, id int) (bool, error) {
	var n int
	err := a.admin.QueryRow(ctx, fmt.Sprintf("select count(*) from %s where id = $1", a.table), id).Scan(&n)
	return n > 0, err
}

// flush sends every ended span on.
func (a *app) flush(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return a.tel.tp.ForceFlush(ctx)
}

// close releases everything newApp made, in reverse order; it is safe on a partly
// built app.
func (a *app) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var errs []error
	if a.pool != nil {
		a.pool.Close()
	}
	if a.otx != nil {
		// After the pool, before the admin pool it reconciles with.
		errs = append(errs, a.otx.Close(ctx))
	}
	if a.admin != nil {
		if a.table != "" && a.srv == nil {
			_, err := a.admin.Exec(ctx, fmt.Sprintf("drop table if exists %s, %s", a.table, a.skewTable))
			errs = append(errs, err)
		}
		a.admin.Close()
	}
	if a.tel != nil {
		errs = append(errs, a.tel.shutdown(ctx))
	}
	if a.srv != nil {
		errs = append(errs, a.srv.Close())
	}
	return errors.Join(errs...)
}

// registry is the Prometheus registry the metrics are exported to.
func (a *app) registry() *prometheus.Registry { return a.tel.registry }

// sqlControl finds and ends backends through a superuser connection, for a server
// the demo did not start.
type sqlControl struct{ db *pgxpool.Pool }

func (c sqlControl) WaitForWaitEvent(ctx context.Context, pid uint32, event string) error {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		var ev *string
		err := c.db.QueryRow(ctx, "select wait_event from pg_stat_activity where pid = $1", int64(pid)).Scan(&ev)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("backend %d is gone before reaching wait_event %s", pid, event)
		case err != nil && ctx.Err() == nil:
			return err
		case err == nil && ev != nil && *ev == event:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("backend %d never reached wait_event %s: %w", pid, event, ctx.Err())
		case <-tick.C:
		}
	}
}

func (c sqlControl) Terminate(ctx context.Context, pid uint32) error {
	var ok bool
	if err := c.db.QueryRow(ctx, "select pg_terminate_backend($1)", int64(pid)).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("pg_terminate_backend(%d) returned false", pid)
	}
	return nil
}

// reconciledOutcomes hands each automatic reconciliation's answer to the scenario that
// waits for it, whichever comes first.
type reconciledOutcomes struct {
	mu        sync.Mutex
	ch        map[outcome.OperationID]chan otelpgxtx.Reconciliation
	delivered int
}

func (r *reconciledOutcomes) chanOf(id outcome.OperationID) chan otelpgxtx.Reconciliation {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		r.ch = map[outcome.OperationID]chan otelpgxtx.Reconciliation{}
	}
	c, ok := r.ch[id]
	if !ok {
		c = make(chan otelpgxtx.Reconciliation, 1)
		r.ch[id] = c
	}
	return c
}

// deliver is the WithOnReconciled callback: once per indeterminate frame.
func (r *reconciledOutcomes) deliver(rec otelpgxtx.Reconciliation) {
	r.chanOf(rec.OperationID) <- rec
	r.mu.Lock()
	r.delivered++
	r.mu.Unlock()
}

// count is how many answers have been delivered.
func (r *reconciledOutcomes) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.delivered
}

// wait returns the answer for id.
func (r *reconciledOutcomes) wait(ctx context.Context, id outcome.OperationID) (otelpgxtx.Reconciliation, error) {
	select {
	case rec := <-r.chanOf(id):
		return rec, nil
	case <-ctx.Done():
		return otelpgxtx.Reconciliation{}, fmt.Errorf("waiting for the automatic reconciliation of %s: %w", id, ctx.Err())
	}
}
