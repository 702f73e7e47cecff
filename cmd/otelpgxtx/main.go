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
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
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

const reconcileUsage = `usage: otelpgxtx reconcile [-dsn URL] [-wait duration] [-terminate] [-assert-marker table] [reference|operation-id ...]

Without arguments, reads references, operation ids or the library's JSON log records from
standard input, one per line. Only a reference settles anything: an operation id or a log
record without one stays unknown (no_reference), unless -assert-marker names the
commit-marker table that the operations given as arguments wrote with their COMMIT.
Exit status: 0 all settled, 1 some unknown, 2 bad input or no database.
`

const markerDDLUsage = `usage: otelpgxtx marker-ddl table

Prints the SQL that creates the commit-marker table ("schema"."name", or schema.name for
lower-case names), for psql.
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
	return settle(ctx, items, *dsn, opts, markerTable, stdout, stderr)
}

// markerDDLCmd prints reconcile.MarkerTableDDL's statement for the table an operator
// names, so that the runbook's table is the library's, never a copy of its SQL that drifts.
func markerDDLCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("marker-ddl", markerDDLUsage)
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "otelpgxtx marker-ddl: %d arguments, want one table\n\n", fs.NArg())
		fs.SetOutput(stderr)
		fs.Usage()
		return exitBad
	}
	parts, err := markertable.Parse(fs.Arg(0))
	if err == nil {
		var ddl string
		if ddl, err = reconcile.MarkerTableDDL(parts); err == nil {
			fmt.Fprintln(stdout, strings.TrimRight(ddl, "; \n")+";")
			return exitSettled
		}
	}
	fmt.Fprintln(stderr, "otelpgxtx marker-ddl:", err)
	return exitBad
}

// readItems parses the arguments, or standard input when there are none, and returns
// the items with a message for each input that is not one.
func readItems(args []string, stdin io.Reader) (items []item, bad []string) {
	add := func(where, text string) {
		text = strings.TrimSpace(text)
		if text == "" {
			return
		}
		it, err := parseItem(text)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", where, err))
			return
		}
		items = append(items, it)
	}
	if len(args) > 0 {
		for i, a := range args {
			add(fmt.Sprintf("argument %d", i+1), a)
		}
		for i := range items {
			items[i].argument = true
		}
	} else {
		sc := bufio.NewScanner(stdin)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for n := 1; sc.Scan(); n++ {
			add(fmt.Sprintf("line %d", n), sc.Text())
		}
		if err := sc.Err(); err != nil {
			bad = append(bad, fmt.Sprintf("reading standard input: %v", err))
		}
	}
	return items, bad
}

// settle asks the database at dsn about each item, prints one line for each, and
// returns the exit status.
func settle(ctx context.Context, items []item, dsn string, opts []reconcile.Option, markerTable pgx.Identifier, stdout, stderr io.Writer) int {
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

// item is one thing to reconcile: a reference, and the operation id and span it came with.
type item struct {
	ref    outcome.ReconciliationRef
	hasRef bool
	// argument: given on the command line; record: a JSON log record.
	argument, record bool
	// byMarker: settled by the -assert-marker table alone.
	byMarker bool
	op       outcome.OperationID
	link     trace.SpanContext
}

// asserted reports whether -assert-marker applies to it: a bare operation id given as an
// argument (never one read from standard input, nor one that came with a reference).
func (it item) asserted() bool { return it.argument && !it.record && !it.hasRef }

// dedupe answers each transaction once, whatever the input repeats: a log query returns
// both the indeterminate record and the pending-at-shutdown record of one operation, and
// a reference may come alone and in a record. Items are one transaction when they have the
// same reference, or the same operation id and at most one of them a reference; the first
// keeps its place and gains what the others add (a reference, an operation id, a span).
func dedupe(items []item) []item {
	var out []item
	for _, it := range items {
		i := slices.IndexFunc(out, it.sameTransaction)
		if i < 0 {
			out = append(out, it)
			continue
		}
		o := &out[i]
		if !o.hasRef && it.hasRef {
			o.ref, o.hasRef = it.ref, true
		}
		if o.op.IsZero() {
			o.op = it.op
		}
		if !o.link.IsValid() {
			o.link = it.link
		}
	}
	return out
}

// sameTransaction reports whether it and o stand for one transaction (see dedupe).
func (it item) sameTransaction(o item) bool {
	if it.hasRef && o.hasRef {
		return it.ref.String() == o.ref.String()
	}
	return !it.op.IsZero() && it.op == o.op
}

// line formats the answer for it, in one format whatever the input: "-" stands for what
// the input did not give.
func (it item) line(res reconcile.Answer) string {
	ref, op := "-", "-"
	if it.hasRef {
		ref = it.ref.String()
	}
	switch {
	case !it.op.IsZero():
		op = it.op.String()
	case it.ref.HasMarker():
		op = it.ref.Operation.String()
	}
	var b strings.Builder
	b.WriteString("ref=" + ref + " operation=" + op + " resolved=" + res.Status().String())
	switch {
	case !it.hasRef && !it.byMarker:
		b.WriteString(" reason=" + reconcile.ReasonNoReference)
	case res.Reason() != "":
		b.WriteString(" reason=" + res.Reason())
	}
	return b.String()
}

// parseItem reads a reference, an operation id, or a JSON log record carrying them.
func parseItem(text string) (item, error) {
	switch {
	case strings.HasPrefix(text, "{"):
		return parseRecord(text)
	case strings.HasPrefix(text, "pg:"):
		ref, err := outcome.ParseReconciliationRef(text)
		return item{ref: ref, hasRef: true}, err
	}
	op, err := outcome.ParseOperationID(text)
	if err != nil {
		return item{}, fmt.Errorf("%q is neither a reconciliation reference (pg:<system identifier>/<timeline>/<xid8>[/<server start>]), "+
			"an operation id (32 hex digits) nor a JSON log record", text)
	}
	return item{op: op}, nil
}

// parseRecord reads one of the library's JSON log records.
func parseRecord(text string) (item, error) {
	var rec map[string]any
	if err := json.Unmarshal([]byte(text), &rec); err != nil {
		return item{}, fmt.Errorf("not a JSON log record: %v", err)
	}
	str := func(k string) string { s, _ := rec[k].(string); return s }
	it := item{record: true}
	ref, op := str(string(schema.ReconciliationRefKey)), str(string(schema.OperationIDKey))
	if ref == "" && op == "" {
		return item{}, fmt.Errorf("the JSON record has neither %s nor %s", schema.ReconciliationRefKey, schema.OperationIDKey)
	}
	if ref != "" {
		r, err := outcome.ParseReconciliationRef(ref)
		if err != nil {
			return item{}, err
		}
		it.ref, it.hasRef = r, true
	}
	if op != "" {
		id, err := outcome.ParseOperationID(op)
		if err != nil {
			return item{}, fmt.Errorf("%s: %w", schema.OperationIDKey, err)
		}
		it.op = id
	}
	tid, err1 := trace.TraceIDFromHex(str("trace_id"))
	sid, err2 := trace.SpanIDFromHex(str("span_id"))
	if err1 == nil && err2 == nil {
		it.link = trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	}
	return it, nil
}

// keyValuePassword matches a password in a key=value connection string.
var keyValuePassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// redact removes the DSN's password from msg, whatever form the DSN has; the connection
// error of pgx already omits it, and this keeps it so whatever the error says.
func redact(msg, dsn string) string {
	var secrets []string
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			secrets = append(secrets, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
	}
	for _, m := range keyValuePassword.FindAllStringSubmatch(dsn, -1) {
		secrets = append(secrets, strings.Trim(m[2], "'"))
	}
	if cfg, err := pgx.ParseConfig(dsn); err == nil && cfg.Password != "" {
		secrets = append(secrets, cfg.Password)
	}
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return keyValuePassword.ReplaceAllString(msg, "${1}xxxxx")
}
