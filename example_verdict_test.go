package otelpgxtx_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// The retry loop of plain pgx code, made safe: Retry calls the transfer again only after
// a rollback that is certain and retryable; an indeterminate commit is never replayed but
// settled by the reconciler, whose answer says whether the transfer happened.
func ExampleRetry() {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL")
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		log.Fatal(err)
	}
	tracer, err := otelpgxtx.InstrumentPool(cfg, otelpgxtx.WithCommitReference()) // or WithCommitMarker
	if err != nil {
		log.Fatal(err)
	}
	defer tracer.Close(ctx)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	recDB, err := pgxpool.New(ctx, dsn) // the reconciler's own pool
	if err != nil {
		log.Fatal(err)
	}
	defer recDB.Close()
	rec, err := reconcile.New(recDB)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `drop table if exists example_accounts;
		create table example_accounts (id int primary key, balance int not null);
		insert into example_accounts values (1, 100), (2, 0)`); err != nil {
		log.Fatal(err)
	}

	// The application's code, unchanged: not idempotent, so a replay moves the money twice.
	transfer := func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "update example_accounts set balance = balance - 10 where id = 1"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "update example_accounts set balance = balance + 10 where id = 2")
			return err
		})
	}

	// Retry runs the transfer again only after a rollback that is certain and retryable;
	// with WithReconciler it asks the database about a commit whose reply was lost, and
	// runs it again only if the answer proves it aborted.
	res, err := otelpgxtx.Retry(ctx, 3, transfer, otelpgxtx.WithReconciler(rec))
	switch r := res.(type) {
	case outcome.Committed[struct{}]:
		fmt.Println("transferred")
	case outcome.DeterminateRollback[struct{}]:
		fmt.Println("not transferred:", r.Cause()) // for certain; retryable ones were retried
	case outcome.Indeterminate[struct{}]:
		// Still unknown (its cause says why): never replay it; the operator settles it.
		fmt.Println("unknown: the operator settles", r.OperationID(), r.Cause())
	case outcome.Participating[struct{}]:
		fmt.Println("joined the caller's transaction: its owner's commit decides") // a savepoint
	default: // nil: the tracer cannot tell (an uninstrumented pool): err wraps ErrNoVerdict
		fmt.Println("cannot tell:", err, errors.Is(err, otelpgxtx.ErrNoVerdict))
	}

	var from, to int
	if err := pool.QueryRow(ctx, "select (select balance from example_accounts where id = 1), (select balance from example_accounts where id = 2)").Scan(&from, &to); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balances", from, to)
	// Output:
	// transferred
	// balances 90 10
}

// database/sql's Commit takes no context: the Verdict travels in the context given to
// BeginTx, and is asked once Commit has returned.
func ExampleNewVerdict() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	tracer, err := otelpgxtx.InstrumentPool(cfg, otelpgxtx.WithCommitReference())
	if err != nil {
		log.Fatal(err)
	}
	defer tracer.Close(ctx)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()

	vctx, verdict := otelpgxtx.NewVerdict(ctx) // one per transaction
	tx, err := db.BeginTx(vctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.ExecContext(vctx, "select pg_current_xact_id()"); err != nil {
		log.Fatal(err)
	}
	commitErr := tx.Commit()
	res, err := verdict.Result()
	switch r := res.(type) {
	case outcome.Committed[struct{}]:
		fmt.Println("committed", commitErr)
	case outcome.DeterminateRollback[struct{}]:
		fmt.Println("rolled back; retry:", r.Retryable())
	case outcome.Indeterminate[struct{}]:
		ref, _ := r.Reference()
		fmt.Println("unknown: reconcile, never replay", r.OperationID(), ref)
	default:
		fmt.Println("cannot tell:", err)
	}
	// Output: committed <nil>
}
