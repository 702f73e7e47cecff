// Command minimal is the smallest service built on otelpgxtx: the OpenTelemetry SDK with
// a stdout exporter, an instrumented pool with automatic reconciliation, one transaction
// through Run, and the shutdown in its order. docs/minimal-service.md walks through it.
//
//	DATABASE_URL='postgres://…' go run .
//	DATABASE_URL='postgres://…' go run . -wait-for-standby   # COMMIT waits for a synchronous standby
//
// The spans go to standard output, the outcome and the library's log records to standard
// error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"
	"time"

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
		"commit with synchronous_commit = on, so that COMMIT waits for the synchronous standby (see docs/minimal-service.md)")
	flag.Parse()
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		log.Fatal("set DATABASE_URL to the PostgreSQL to use")
	}
	if err := run(context.Background(), dsn, *waitForStandby, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run is the whole service: spans to spans, the outcome and log records to out.
func run(ctx context.Context, dsn string, waitForStandby bool, spans, out io.Writer) (err error) {
	// The SDK: every span to standard output. A real service exports OTLP instead
	// (otlptracegrpc or otlptracehttp) and samples as its collector expects.
	exp, err := stdouttrace.New(stdouttrace.WithWriter(spans), stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	otel.SetTracerProvider(tp) // otelpgxtx uses the global providers unless told otherwise

	// Reconciliation asks the database through a pool of its own, so that it never waits
	// behind the application for a connection.
	recPool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	rec, err := reconcile.New(recPool)
	if err != nil {
		recPool.Close()
		return err
	}
	settled := make(chan otelpgxtx.Reconciliation, 1)

	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		recPool.Close()
		return err
	}
	tracer, err := otelpgxtx.InstrumentPool(cfg,
		// One JSON record per indeterminate commit: what an operator settles it from.
		otelpgxtx.WithLogger(slog.New(slog.NewJSONHandler(out, nil))),
		otelpgxtx.WithAutoReconcile(rec, otelpgxtx.WithOnReconciled(func(r otelpgxtx.Reconciliation) {
			settled <- r
		})),
	)
	if err != nil {
		recPool.Close()
		return err // an invalid option: the config has no tracer, so stop here
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		recPool.Close()
		return err
	}

	// Shutdown, in this order. The pool first: no transaction ends after it. Then the
	// tracer: it stops automatic reconciliation's workers (a forgotten Close leaves them
	// running) and logs every outcome still unknown. Then the reconciler's pool, which
	// those workers used. The SDK last, so that it exports the spans the others ended.
	defer func() {
		pool.Close()
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err = errors.Join(err, tracer.Close(closeCtx))
		recPool.Close()
		err = errors.Join(err, tp.Shutdown(closeCtx))
	}()

	if _, err := pool.Exec(ctx, "create table if not exists minimal_orders (id bigserial primary key, total int not null)"); err != nil {
		return err
	}
	res := otelpgxtx.Run(ctx, pool, otelpgxtx.DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int64, error) {
		var id int64
		if err := tx.QueryRow(ctx, "insert into minimal_orders (total) values (42) returning id").Scan(&id); err != nil {
			return 0, err
		}
		if waitForStandby {
			if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
				return 0, err
			}
			fmt.Fprintf(out, "COMMIT will wait for the synchronous standby; end it with: select pg_terminate_backend(%d)\n",
				tx.Conn().PgConn().PID())
		}
		return id, nil
	})
	switch r := res.(type) {
	case outcome.Committed[int64]:
		fmt.Fprintln(out, "committed: order", r.Value())
	case outcome.DeterminateRollback[int64]:
		fmt.Fprintln(out, "rolled back:", r.Cause())
	case outcome.Indeterminate[int64]:
		// Never replay it: automatic reconciliation asks the database in the background.
		ref, _ := r.Reference()
		fmt.Fprintf(out, "indeterminate: operation %s, reference %s\n", r.OperationID(), ref)
		select {
		case s := <-settled:
			fmt.Fprintln(out, strings.TrimSpace("reconciled: "+s.Answer.Status().String()+" "+s.Answer.Reason()))
		case <-time.After(time.Minute):
			fmt.Fprintln(out, "not reconciled within a minute: Tracer.Close logs it for the operator")
		}
	default:
		fmt.Fprintln(out, "outcome:", res.Outcome())
	}
	return nil
}
