package otelpgxtx_test

import (
	"context"
	"errors"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx"
)

// An application that handles duplicate keys itself, and whose users cancel requests as
// they browse: neither is an error on its spans. Its batches are large, so the spans of
// their queries go; its pool is named for its dashboards.
func ExampleWithExpectedErrors() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	duplicateKey := func(_ context.Context, err error) bool {
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && pgErr.Code == "23505"
	}
	tracer, err := otelpgxtx.InstrumentPool(cfg,
		// Replaces the default: keep CallerCanceled to keep it.
		otelpgxtx.WithExpectedErrors(otelpgxtx.CallerCanceled, duplicateKey),
		otelpgxtx.WithoutInnerSpans(otelpgxtx.InnerSpanBatchQuery),
		otelpgxtx.WithPoolName("orders"), // db.client.connection.pool.name
	)
	if err != nil {
		log.Fatal(err)
	}
	defer tracer.Close(ctx) // deferred first, so it runs after pool.Close
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
}
