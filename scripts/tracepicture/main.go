// Command tracepicture draws the picture of a trace in the README (docs/trace.png): the
// spans of a real run, rendered in the look of Jaeger's trace timeline.
//
// It starts a throw-away PostgreSQL (pgtest) whose synchronous standby never connects,
// instruments a pool with otelpgxtx, and runs under one server span two plain pgx
// transactions: one that commits, and one whose COMMIT waits for the standby until its
// backend is terminated — an indeterminate commit, for real. The spans come from an
// in-memory exporter; nothing leaves the process.
//
//	go run . -o ../../docs/trace.png [-spans spans.json]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// serviceName is the service the picture's rows are named after, as Jaeger names them.
const serviceName = "orders-api"

func main() {
	out := flag.String("o", "docs/trace.png", "the PNG file to write")
	spansFile := flag.String("spans", "", "also write the captured spans to this file, as JSON")
	flag.Parse()
	if err := run(*out, *spansFile); err != nil {
		log.Fatal(err)
	}
}

// run captures the spans of one real run and writes the picture (and the JSON, if asked).
func run(out, spansFile string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spans, err := capture(ctx)
	if err != nil {
		return err
	}
	if spansFile != "" {
		b, err := json.MarshalIndent(spans, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(spansFile, b, 0o644); err != nil {
			return err
		}
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := writePNG(f, spans); err != nil {
		return errors.Join(err, f.Close())
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Printf("tracepicture: wrote %s (%d spans)\n", out, len(spans))
	return nil
}

// capture starts a throw-away server, runs the two transactions under one root span and
// returns the spans of that trace (the setup's spans, in traces of their own, are left out).
func capture(ctx context.Context) (spans tracetest.SpanStubs, err error) {
	srv, err := pgtest.Start()
	if err != nil {
		return nil, fmt.Errorf("starting a throw-away PostgreSQL: %w", err)
	}
	defer func() { err = errors.Join(err, srv.Close()) }()
	if err := srv.Exec(ctx, "create table orders (id bigserial primary key, item text not null)"); err != nil {
		return nil, err
	}

	// A synchronous exporter: every span is in memory once it ends, no flush to wait for.
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", serviceName))),
	)
	defer func() { err = errors.Join(err, tp.Shutdown(context.WithoutCancel(ctx))) }()

	cfg, err := pgxpool.ParseConfig(srv.ConnString())
	if err != nil {
		return nil, err
	}
	tracer, err := otelpgxtx.InstrumentPool(cfg,
		otelpgxtx.WithCommitReference(), // the reference an operator reconciles from
		otelpgxtx.WithTracerProvider(tp),
		// No pool.acquire spans: they would crowd the rows the picture is about.
		otelpgxtx.WithOtelpgxOptions(otelpgx.WithDisableAcquireTracer()),
	)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, errors.Join(err, tracer.Close(ctx))
	}
	defer func() {
		pool.Close()
		err = errors.Join(err, tracer.Close(context.WithoutCancel(ctx)))
	}()
	// One transaction before the trace begins, in a trace of its own: the connection is
	// made (no connect span in the picture), and the first transaction's one-off work (the
	// first commit reference, the statement's prepare) does not stretch the picture's.
	if err := commitOne(ctx, pool, "warm-up"); err != nil {
		return nil, err
	}

	// The connection that terminates the waiting backend, opened (uninstrumented) before
	// the trace begins.
	admin, err := srv.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, admin.Close(context.WithoutCancel(ctx))) }()

	root := tp.Tracer("github.com/txevidence/otelpgxtx/scripts/tracepicture")
	rctx, span := root.Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	traceID := span.SpanContext().TraceID()
	err = transactions(rctx, pool, admin)
	span.End()
	if err != nil {
		return nil, err
	}
	outcomes := map[string]int{}
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() == traceID {
			spans = append(spans, s)
			if o, ok := attr(s, outcomeKey); ok {
				outcomes[o]++
			}
		}
	}
	// The picture is of these two outcomes; any other trace would mislead its readers.
	if len(outcomes) != 2 || outcomes["committed"] != 1 || outcomes["indeterminate"] != 1 {
		return nil, fmt.Errorf("the trace's frames have the outcomes %v, want one committed and one indeterminate", outcomes)
	}
	return spans, nil
}

// transactions runs the committed transaction, then the indeterminate one. It fails
// unless the second COMMIT failed: a commit that succeeded would make a wrong picture.
func transactions(ctx context.Context, pool *pgxpool.Pool, admin *pgx.Conn) error {
	if err := commitOne(ctx, pool, "book"); err != nil {
		return err
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "insert into orders (item) values ($1)", "lamp"); err != nil {
		return errors.Join(err, tx.Rollback(ctx))
	}
	// The COMMIT now waits for the phantom synchronous standby after its record is in
	// the local WAL; terminated there, the client cannot know whether it committed.
	if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
		return errors.Join(err, tx.Rollback(ctx))
	}
	pid := tx.Conn().PgConn().PID()
	terminated := make(chan error, 1)
	// On the connection opened beforehand, polling without a pause: that wait is the
	// picture's longest bar, and pgtest's Server.TerminateInSyncRep, which opens a
	// connection per call and polls every 2 ms, would stretch it several times over and
	// shrink the committed transaction beside it to a sliver.
	go func() { terminated <- pgtest.TerminateInSyncRepOn(ctx, admin, pid) }()
	commitErr := tx.Commit(ctx)
	if err := <-terminated; err != nil {
		return fmt.Errorf("terminating the backend in COMMIT: %w", err)
	}
	if commitErr == nil {
		return errors.New("the second COMMIT succeeded: it should have lost its connection")
	}
	return nil
}

// commitOne inserts one order in a plain pgx transaction: BEGIN, INSERT, COMMIT.
func commitOne(ctx context.Context, pool *pgxpool.Pool, item string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "insert into orders (item) values ($1)", item); err != nil {
		return errors.Join(err, tx.Rollback(ctx))
	}
	return tx.Commit(ctx)
}
