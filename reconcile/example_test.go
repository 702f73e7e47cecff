package reconcile_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// A reconciliation loop resolves indeterminate commits from PostgreSQL's own records.
func ExampleIndeterminate() {
	ctx := context.Background()
	var pool *pgxpool.Pool
	var pending []outcome.Indeterminate[int64] // e.g. read back from a durable queue

	rec, err := reconcile.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	for _, ind := range pending {
		res, err := reconcile.Indeterminate(ctx, rec, ind)
		switch {
		case err != nil:
			log.Print(err) // the database did not answer: try again later
		case res.Status() == reconcile.Committed:
			fmt.Println(ind.OperationID(), "committed: continue with follow-up work")
		case res.Status() == reconcile.Aborted:
			fmt.Println(ind.OperationID(), "not applied: safe to run again")
		case res.Status() == reconcile.NoWrites:
			fmt.Println(ind.OperationID(), "wrote nothing: its commit changed nothing")
		default:
			fmt.Println(ind.OperationID(), "still unknown:", res.Reason()) // never guess
		}
	}
}
