package otelpgxtx_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// The setup: instrument the pool's config before the pool is made, check the error (an
// invalid option leaves the config without a tracer), and close the tracer after the pool.
// Application code does not change: each transaction becomes one frame span with its
// tx.outcome, with otelpgx's statement spans under it.
func ExampleInstrumentPool() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	// The xid: an unknown commit can be settled, from its log record (slog's default logger
	// unless WithLogger says otherwise) or in the background (WithAutoReconcile).
	tracer, err := otelpgxtx.InstrumentPool(cfg, otelpgxtx.WithCommitReference())
	if err != nil {
		log.Fatal(err)
	}
	defer tracer.Close(ctx) // deferred first, so it runs after pool.Close
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "select 1")
		return err
	})
	fmt.Println("committed:", err == nil)
	// Output: committed: true
}

// Run returns the outcome algebra as a type: each case does only what its outcome allows.
func ExampleRun() {
	ctx := context.Background()
	var pool *pgxpool.Pool // instrumented with otelpgxtx.InstrumentPool

	policy := otelpgxtx.DefaultPolicy()
	policy.IsoLevel = pgx.Serializable
	res := otelpgxtx.Run(ctx, pool, policy, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		var id int64
		err := tx.QueryRow(ctx, "insert into orders (total) values (42) returning id").Scan(&id)
		if err == nil {
			err = otelpgxtx.AfterCommit(ctx, func(ctx context.Context) error {
				return publishOrderCreated(ctx, id) // runs only after the physical commit
			})
		}
		return id, err
	})

	switch r := res.(type) {
	case outcome.Committed[int64]:
		fmt.Println("order", r.Value())
	case outcome.Participating[int64]:
		fmt.Println("joined the caller's transaction: nothing is committed yet")
	case outcome.DeterminateRollback[int64]:
		fmt.Println("not created:", r.Cause()) // retryable ones were already retried
	case outcome.Indeterminate[int64]:
		// Never replay: queue it for reconciliation.
		ref, _ := r.Reference()
		fmt.Println("unknown; reconcile", r.OperationID(), ref)
	case outcome.CommittedWithPostCommitFailure[int64]:
		fmt.Println("order", r.Value(), "created; event not published:", r.Failure())
	}
}

func publishOrderCreated(context.Context, int64) error {
	return errors.New("not wired in this example")
}

// Automatic reconciliation: indeterminate commits are settled in the background, and the
// application resumes the follow-up work of each one that turned out committed, exactly
// once. Outcomes still pending when the tracer closes are logged for the operator command.
func ExampleWithAutoReconcile() {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL")
	// A pool of its own, so that reconciliation never waits behind the application.
	recDB, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer recDB.Close() // deferred first: closed last
	rec, err := reconcile.New(recDB)
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		log.Fatal(err)
	}
	tracer, err := otelpgxtx.InstrumentPool(cfg,
		otelpgxtx.WithLogger(slog.New(slog.NewJSONHandler(os.Stderr, nil))),
		otelpgxtx.WithAutoReconcile(rec, otelpgxtx.WithOnReconciled(func(r otelpgxtx.Reconciliation) {
			switch r.Answer.Status() {
			case reconcile.Committed:
				log.Printf("operation %s committed after all: resuming its follow-up work", r.OperationID)
			case reconcile.Aborted:
				log.Printf("operation %s did not commit: redo it or tell the user", r.OperationID)
			case reconcile.Unknown:
				log.Printf("operation %s stays unknown (%s): the operator settles it", r.OperationID, r.Answer.Reason())
			}
		})))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tracer.Close(ctx) }() // after the pool's Close, before recDB's
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	res := otelpgxtx.Run(ctx, pool, otelpgxtx.DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, "insert into orders (id) values (1)")
		return 1, err
	})
	if _, ok := res.(outcome.Indeterminate[int]); ok {
		log.Print("commit outcome unknown: do not replay; the callback will say")
	}
}
