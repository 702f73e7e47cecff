package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/reconcile"
)

const pruneUsage = `usage: otelpgxtx prune [-dsn URL] [-dry-run] -retention duration table

Deletes the rows of the commit-marker table ("schema"."name", or schema.name for lower-case
names) older than -retention (reconcile.PruneMarkers), and prints how many. With -dry-run
it counts them and removes nothing. A retention below 24h is refused: a reference still to
be reconciled (automatic reconciliation asks again about a transaction in progress; an
operator may run reconcile the next day) would find its row pruned and stay unknown
(marker_pruned). Keep it well above the longest time an outcome stays unsettled.
Exit status: 0 done, 2 bad input or no database.
`

// minRetention is the shortest retention prune accepts (see pruneUsage).
const minRetention = 24 * time.Hour

// pruneCmd is otelpgxtx prune: the pruning job of a commit-marker table, for cron.
func pruneCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := newFlags("prune", pruneUsage)
	dsn := dsnFlag(fs, "prune")
	retention := fs.Duration("retention", 0, "how old a marker row must be to go, at least 24h (e.g. 720h for 30 days)")
	dryRun := fs.Bool("dry-run", false, "count the rows that would go, and remove none")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "otelpgxtx prune: "+format+"\n", a...)
		return exitBad
	}
	if fs.NArg() != 1 {
		return bad("%d arguments, want one table", fs.NArg())
	}
	table, err := markertable.Parse(fs.Arg(0))
	if err != nil {
		return bad("%v", err)
	}
	if *retention < minRetention {
		return bad("-retention %v is below %v: a reference still to be reconciled would find its marker row gone", *retention, minRetention)
	}
	if *dsn == "" {
		*dsn = getenv("DATABASE_URL")
	}
	conn, err := pgx.Connect(ctx, *dsn)
	if err != nil {
		return bad("connecting to the database: %s", redact(err.Error(), *dsn))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	n, err := prune(ctx, conn, table, *retention, *dryRun)
	if err != nil {
		return bad("%s", redact(err.Error(), *dsn))
	}
	if *dryRun {
		fmt.Fprintf(stdout, "would prune %d marker rows of %s older than %v (dry run: none removed)\n", n, fs.Arg(0), *retention)
	} else {
		fmt.Fprintf(stdout, "pruned %d marker rows of %s older than %v\n", n, fs.Arg(0), *retention)
	}
	return exitSettled
}

// prune runs reconcile.PruneMarkers; a dry run runs it in a transaction it rolls back, so
// that the count is exactly what the same call would remove.
func prune(ctx context.Context, conn *pgx.Conn, table pgx.Identifier, retention time.Duration, dryRun bool) (int64, error) {
	if !dryRun {
		return reconcile.PruneMarkers(ctx, conn, table, retention)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	return reconcile.PruneMarkers(ctx, tx, table, retention)
}
