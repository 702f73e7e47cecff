package otelpgxtx_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/txevidence/otelpgxtx"
)

// database/sql: instrument a pgx pool, then open a *sql.DB on it with
// stdlib.OpenDBFromPool. Every database/sql transaction is a pgx transaction on one of the
// pool's connections, so it becomes a frame span with its tx.outcome, like any other.
// Run needs a pgx.Tx; database/sql code asks for its outcome with a Verdict
// (ExampleNewVerdict), and finds it in the spans, the metrics and the WithLogger records.
// The in-memory exporter stands in for an OTLP one, so that
// the example can print what was recorded.
func Example_databaseSQL() {
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(ctx) // deferred first: the last to run

	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	tracer, err := otelpgxtx.InstrumentPool(cfg, otelpgxtx.WithTracerProvider(tp))
	if err != nil {
		log.Fatal(err)
	}
	defer tracer.Close(ctx)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool) // github.com/jackc/pgx/v5/stdlib
	defer db.Close()

	// Unchanged database/sql code.
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
	if err != nil {
		log.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, "select count(*) from pg_class where relname = $1", "pg_class").Scan(&n); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Print(err) // a Verdict says whether this was a rollback or an unknown commit (ExampleNewVerdict)
	}

	for _, s := range exp.GetSpans() {
		if s.InstrumentationScope.Name == otelpgxtx.ScopeName {
			attrs := map[string]string{}
			for _, kv := range s.Attributes {
				attrs[string(kv.Key)] = kv.Value.String()
			}
			fmt.Println(s.Name, "tx.outcome="+attrs[string(otelpgxtx.OutcomeKey)], "tx.isolation="+attrs[string(otelpgxtx.IsolationKey)])
		}
	}
	// Output: transaction tx.outcome=committed tx.isolation=serializable
}
