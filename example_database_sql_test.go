package otelpgxtx

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// database/sql: instrument a pgx pool, then open a *sql.DB on it with
// stdlib.OpenDBFromPool. Every database/sql transaction is a pgx transaction on one of the
// pool's connections, so it becomes a frame span with its tx.outcome, like any other.
// (Run needs a pgx.Tx, so database/sql code reads its outcome from the spans and metrics.)
func Example_databaseSQL() {
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter() // in an application: an OTLP exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(ctx)

	cfg, err := pgxpool.ParseConfig(srv.ConnString()) // in an application: your DATABASE_URL
	if err != nil {
		log.Fatal(err)
	}
	if _, err := InstrumentPool(cfg, WithTracerProvider(tp)); err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
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
		log.Print(err) // the span says whether this was a rollback or an unknown commit
	}

	for _, s := range exp.GetSpans() {
		if s.InstrumentationScope.Name == ScopeName {
			attrs := map[string]string{}
			for _, kv := range s.Attributes {
				attrs[string(kv.Key)] = kv.Value.Emit()
			}
			fmt.Println(s.Name, "tx.outcome="+attrs["tx.outcome"], "tx.isolation="+attrs[string(IsolationKey)])
		}
	}
	// Output: transaction tx.outcome=committed tx.isolation=serializable
}
