package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/reconcile"
)

const reconcileUsage = `usage: otelpgxtx reconcile [-dsn URL] [-wait duration] [-terminate] [-assert-marker table] [reference|operation-id ...]

Without arguments, reads references, operation ids or the library's JSON log records from
standard input, one per line. Only a reference settles anything: an operation id or a log
record without one stays unknown (no_reference), unless -assert-marker names the
commit-marker table that the operations given as arguments wrote with their COMMIT. The
records of a crash recovery (pgrecovery:…, or the log record that carries one) are
evidence for the references, kept from the server's next checkpoint on.
Exit status: 0 all settled, 1 some unknown, 2 bad input or no database.
`

// reconcileCmd is otelpgxtx reconcile.
func reconcileCmd(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := newFlags("reconcile", reconcileUsage)
	dsn := dsnFlag(fs, "ask")
	wait := fs.Duration("wait", 5*time.Second, "how long to wait for a transaction still in progress")
	terminate := fs.Bool("terminate", false, "end the backend that still holds a transaction in progress after -wait, so that the server settles it (reconcile.WithTerminate: needs pg_signal_backend or the backend's role; a client that had not lost its connection loses its transaction)")
	assertMarker := fs.String("assert-marker", "", `asserts that every operation id given as an argument was committed with a marker in this table ("schema"."name", or schema.name for lower-case names), so that its marker row settles it; an id it does not find is fenced and answered aborted`)
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	var markerTable pgx.Identifier
	if *assertMarker != "" {
		parts, err := markertable.Parse(*assertMarker)
		if err != nil {
			fmt.Fprintln(stderr, "otelpgxtx reconcile: -assert-marker:", err)
			return exitBad
		}
		markerTable = parts
	}
	if *dsn == "" {
		*dsn = getenv("DATABASE_URL")
	}
	items, bad := readItems(fs.Args(), stdin)
	if len(bad) > 0 {
		for _, b := range bad {
			fmt.Fprintln(stderr, "otelpgxtx reconcile:", b)
		}
		return exitBad
	}
	items, recoveries := splitRecoveries(items)
	if len(items) == 0 {
		fmt.Fprintln(stderr, "otelpgxtx reconcile: nothing to reconcile")
		return exitBad
	}
	items = dedupe(items)
	if markerTable != nil && !slices.ContainsFunc(items, item.asserted) {
		// Said, not ignored: the operator believes the flag settles something.
		fmt.Fprintln(stderr, "otelpgxtx reconcile: -assert-marker applies only to operation ids given as arguments, "+
			"and there is none; the inputs are answered without it")
	}
	opts := []reconcile.Option{reconcile.WithWait(*wait, 50*time.Millisecond)}
	if *terminate {
		opts = append(opts, reconcile.WithTerminate())
	}
	return settle(ctx, items, recoveries, *dsn, opts, markerTable, stdout, stderr)
}

// splitRecoveries takes the crash recoveries out of items: evidence, not questions.
func splitRecoveries(items []item) (rest []item, recoveries []reconcile.Recovery) {
	for _, it := range items {
		if it.recovery != nil {
			recoveries = append(recoveries, *it.recovery)
			continue
		}
		rest = append(rest, it)
	}
	return rest, recoveries
}

// settle asks the database at dsn about each item, with the crash recoveries given as
// evidence, prints one line for each, and returns the exit status.
func settle(ctx context.Context, items []item, recoveries []reconcile.Recovery, dsn string, opts []reconcile.Option, markerTable pgx.Identifier, stdout, stderr io.Writer) int {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		fmt.Fprintln(stderr, "otelpgxtx reconcile: connecting to the database:", redact(err.Error(), dsn))
		return exitBad
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rec, err := reconcile.New(conn, opts...)
	if err != nil {
		fmt.Fprintln(stderr, "otelpgxtx reconcile:", err)
		return exitBad
	}
	for _, r := range recoveries {
		rec.Remember(r)
	}
	code := exitSettled
	for _, it := range items {
		res := reconcile.Answer{}
		switch {
		case it.hasRef:
			res, err = rec.Resolve(ctx, it.ref, it.link)
		case markerTable != nil && it.asserted():
			// The operator asserted that this operation wrote a marker (see -assert-marker).
			res, err = rec.ResolveAssertedMarker(ctx, markerTable, it.op, it.link)
			it.byMarker = true
		}
		if err != nil {
			fmt.Fprintln(stderr, "otelpgxtx reconcile:", redact(err.Error(), dsn))
			return exitBad
		}
		fmt.Fprintln(stdout, it.line(res))
		if res.Status() == reconcile.Unknown {
			code = exitUnknown
		}
	}
	return code
}
