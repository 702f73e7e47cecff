// Command quickstart is otelpgxtx in one program: the OpenTelemetry SDK, an instrumented
// pool, one transaction of the application's, and the safe retry, which asks the database
// about a commit whose reply was lost instead of replaying it. docs/quickstart.md walks
// through it; the README's setup and retry are its lines.
//
//	DATABASE_URL='postgres://…' go run .
//	DATABASE_URL='postgres://…' go run . -wait-for-standby   # COMMIT waits for a synchronous standby
//
// The spans go to standard output, what the program says to standard error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

func main() {
	waitForStandby := flag.Bool("wait-for-standby", false,
		"commit with synchronous_commit = on, so that COMMIT waits for the synchronous standby (see docs/quickstart.md)")
	flag.Parse()
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		log.Fatal("set DATABASE_URL to the PostgreSQL to use")
	}
	if err := run(context.Background(), dsn, *waitForStandby, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run is the whole program: spans to spans, what it says to out.
func run(ctx context.Context, dsn string, waitForStandby bool, spans, out io.Writer) (err error) {
	// The SDK: every span to standard output, through the global provider, which the
	// library uses unless WithTracerProvider says otherwise. A service exports OTLP.
	exp, err := stdouttrace.New(stdouttrace.WithWriter(spans), stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	otel.SetTracerProvider(tp)
	defer func() { err = errors.Join(err, tp.Shutdown(context.WithoutCancel(ctx))) }() // last: it exports what the others ended

	// The setup, in a function that returns an error; dsn is the database's URL.
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	tracer, err := otelpgxtx.InstrumentPool(cfg, otelpgxtx.WithCommitReference())
	if err != nil {
		return err // an invalid option: the config has no tracer
	}
	defer tracer.Close(ctx) // deferred first, so it runs after pool.Close
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := tracer.Check(ctx, pool); err != nil {
		return err // the server or the role cannot give references: say so now
	}

	if _, err := pool.Exec(ctx, `create table if not exists quickstart_accounts (id int primary key, balance int not null);
		insert into quickstart_accounts values (1, 100), (2, 0) on conflict do nothing`); err != nil {
		return err
	}
	// The application's transaction, unchanged: not idempotent, so a replay of a commit
	// that did apply would move the money twice.
	transfer := func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "update quickstart_accounts set balance = balance - 10 where id = 1"); err != nil {
				return err
			}
			if waitForStandby {
				if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
					return err
				}
				fmt.Fprintf(out, "COMMIT will wait for the synchronous standby; end it with: select pg_terminate_backend(%d)\n",
					tx.Conn().PgConn().PID())
			}
			_, err := tx.Exec(ctx, "update quickstart_accounts set balance = balance + 10 where id = 2")
			return err
		})
	}

	// The safe retry. The reconciler asks the database, on a pool of its own, so that it
	// never waits behind the application for a connection. A plain pool: the reconciler
	// reads PostgreSQL's own records and needs no tracer.
	recPool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer recPool.Close()
	rec, err := reconcile.New(recPool)
	if err != nil {
		return err
	}
	res, err := otelpgxtx.Retry(ctx, 3, transfer, otelpgxtx.WithReconciler(rec))
	switch r := res.(type) {
	case outcome.Committed[struct{}]:
		fmt.Fprintln(out, "transferred") // once, even if a COMMIT's reply was lost
	case outcome.DeterminateRollback[struct{}]:
		fmt.Fprintln(out, "not transferred:", r.Cause()) // for certain; retryable ones were retried
	case outcome.Indeterminate[struct{}]:
		fmt.Fprintln(out, "unknown, for the operator:", r.OperationID(), r.Cause()) // never replayed
	default:
		return err // no verdict: the pool is not instrumented
	}
	return nil
}
