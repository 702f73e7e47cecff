// Command otelpgxtx is the operator's tool for otelpgxtx ("otelpgxtx help" lists its
// commands, "otelpgxtx <command> -h" each one's flags).
//
// reconcile asks PostgreSQL what became of transactions whose commit outcome is
// indeterminate:
//
//	otelpgxtx reconcile [-dsn URL] [-wait 5s] [-terminate] [-assert-marker table] [reference|operation-id ...]
//
// Each argument is a reconciliation reference (tx.reconciliation.ref, e.g.
// pg:7713899101641277397/1/725/1796032293925689/1796032293412871, from the span in the
// trace backend; quote it in the shell: a reference with a commit marker holds ';' and '"')
// or an operation id (tx.operation_id). Without arguments it reads standard input, one per
// line: references, operation ids, or the JSON log records the library writes for each
// indeterminate frame (slog's JSON handler; see otelpgxtx.WithLogger) and, at Tracer.Close,
// for each outcome automatic reconciliation had not settled
// (otelpgxtx.MessagePendingAtShutdown), so a log query can be piped in as it is.
//
// Each transaction is answered once, however often the input names it (a log query returns
// both records of an operation that stayed unknown at shutdown).
//
// Only a reference is evidence: it names the transaction's xid, and the commit marker when
// one was written with the COMMIT. An operation id, or a log record, without a reference
// stays unknown (reason no_reference). The one exception is -assert-marker table: the
// operator asserts that every operation id given as an argument was committed by Run
// with Policy.CommitMarker set to that table, so that its marker row settles it. The
// command then fences each id it does not find, and answers aborted, which is true only if
// that operation's COMMIT carried a marker: never use it for a plain pgx transaction or
// for Run without a marker. It never applies to standard input: given with nothing it can
// apply to, the command says so on standard error.
//
// It prints one line per transaction, "ref=<reference> operation=<id> resolved=<resolution>"
// ("-" for what the input did not give), with "reason=<why>" when the answer stays
// unknown, and exits 0 when every one is settled (committed, aborted or no_writes), 1 when
// some stay unknown, and 2 on malformed input (named on standard error; nothing is asked
// of the database then) or when the database cannot be reached.
//
// prune is the pruning job of a commit-marker table (reconcile.PruneMarkers), for cron:
//
//	otelpgxtx prune [-dsn URL] [-dry-run] -retention 720h '"app"."tx_marker"'
//
// It prints how many rows it removed (with -dry-run, how many it would: it runs the same
// deletion in a transaction it rolls back) and refuses a retention below 24 hours, which
// would leave references still to be reconciled without their rows (marker_pruned).
//
// marker-ddl prints the SQL that creates a commit-marker table (reconcile.MarkerTableDDL),
// for psql:
//
//	otelpgxtx marker-ddl '"app"."tx_marker"' | psql "$DATABASE_URL" -v ON_ERROR_STOP=1
//
// A table is written as references print it ("app"."tx_marker") or, for lower-case names,
// as app.tx_marker. The database is -dsn, else $DATABASE_URL, else the PG* environment
// variables; ask the surviving primary. Its password never appears in any output.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

// Exit statuses.
const (
	exitSettled = 0
	exitUnknown = 1
	exitBad     = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

const usage = `usage: otelpgxtx <command> [flags] [arguments]

Commands:
  reconcile   asks PostgreSQL what became of transactions whose commit outcome is unknown
  prune       deletes the commit-marker rows older than a retention, or counts them
  marker-ddl  prints the SQL that creates a commit-marker table, for psql
  help        prints this text

"otelpgxtx <command> -h" prints a command's flags.
`

// run is the whole command, with its environment passed in so tests run it in-process.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitBad
	}
	switch args[0] {
	case "reconcile":
		return reconcileCmd(ctx, args[1:], stdin, stdout, stderr, getenv)
	case "prune":
		return pruneCmd(ctx, args[1:], stdout, stderr, getenv)
	case "marker-ddl":
		return markerDDLCmd(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitSettled
	}
	if strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "otelpgxtx: unknown flag %s: flags follow the command\n\n", args[0])
	} else {
		fmt.Fprintf(stderr, "otelpgxtx: unknown command %q\n\n", args[0])
	}
	fmt.Fprint(stderr, usage)
	return exitBad
}

// newFlags returns the flag set of the command name, whose usage text is text.
func newFlags(name, text string) *flag.FlagSet {
	fs := flag.NewFlagSet("otelpgxtx "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), text)
		var any bool
		fs.VisitAll(func(*flag.Flag) { any = true })
		if any {
			fmt.Fprintln(fs.Output(), "\nFlags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses args into fs. -h prints the command's usage on stdout (exit status
// 0); a flag it does not know is named on stderr, with the usage (2). ok says whether to
// go on.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case err == nil:
		return exitSettled, true
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return exitSettled, false
	}
	fmt.Fprintf(stderr, "%s: %v\n\n", fs.Name(), err)
	fs.SetOutput(stderr)
	fs.Usage()
	return exitBad, false
}

// dsnFlag adds -dsn to fs, for the command that asks the database.
func dsnFlag(fs *flag.FlagSet, what string) *string {
	return fs.String("dsn", "", "the database to "+what+", a PostgreSQL URL or key=value string (default $DATABASE_URL, else the PG* variables)")
}
