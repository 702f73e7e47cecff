package otelpgxtx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/tracelog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// lockedBuffer is a log destination safe for the goroutines of a test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Planted secrets: every one is unique, and none is a word of the SQL around it.
const (
	secretRolePassword  = "hunter2-Secret"
	secretAlterPassword = "alter-Secret-77"
	secretCard          = "4111111111111111"
	secretEscape        = `esc-Secret\'s`
	secretDollar        = "dollar-Secret"
	secretTagged        = "tag-Secret"
	secretNumber        = "9876543210123"
	secretBits          = "1011011101111"
	secretHex           = "DEADBEEF5EC7"
	secretUnicode       = "uni-Secret"
	secretSimple        = "simple-Secret"
	secretParam         = "param-Secret"
	secretBadInt        = "int-Secret-42"
	secretBatch         = "batch-Secret-1"
	secretBatchParam    = "batch-param-Secret"
	secretOutOfRange    = "77777777777"
	secretCopyInline    = "copy-inline-Secret"
	secretCopyRow       = "copy-row-Secret"
	secretIndeterminate = "indeterminate-Secret"
	secretMessageOnly   = "msg-only-Secret"
	secretHook          = "hook-Secret"
	secretComment       = "comment-Secret"
)

// TestNoSecretsLeaveByDefault plants secrets in every way a statement can carry one —
// CREATE ROLE and ALTER ROLE passwords, literals of every kind over the simple and the
// extended protocol, parameters, batches, COPY with inline data and pgx's CopyFrom,
// server errors that quote the input, a post-commit hook error, an indeterminate commit
// (logged) and its reconciliation — and asserts that with the defaults none of them is in
// any exported span name, attribute, event, status or link, metric attribute or log
// record, while the statements are still recorded, with placeholders.
func TestNoSecretsLeaveByDefault(t *testing.T) {
	tel := runSecretWorkload(t, false)
	for _, s := range []string{secretRolePassword, secretAlterPassword, secretCard, `esc-Secret`, secretDollar,
		secretTagged, secretNumber, secretBits, secretHex, secretUnicode, secretSimple, secretParam, secretBadInt,
		secretBatch, secretBatchParam, secretOutOfRange, secretCopyInline, secretCopyRow, secretIndeterminate,
		secretMessageOnly, secretHook, secretComment} {
		if where := tel.find(s); where != "" {
			t.Errorf("secret %q left the process: %s", s, where)
		}
	}
	for _, want := range []string{
		"create role ", " login password ?", "select ? || ? || ? || ? || ?::text || $1::text",
		"select ?::int", "copy " /* the inline rows are cut */, "insert into ", "(id, note) values (?, ?)",
		"SQLSTATE 22P02", "SQLSTATE 22003", "(message redacted)",
		string(schema.DBQuerySummaryKey) + "=SELECT", string(schema.DBQuerySummaryKey) + "=CREATE ROLE", string(schema.DBQuerySummaryKey) + "=BATCH SELECT",
	} {
		if !strings.Contains(tel.spans, want) {
			t.Errorf("the exported spans lack %q", want)
		}
	}
	if !strings.Contains(tel.logs, "indeterminate") {
		t.Errorf("no indeterminate log record: %q", tel.logs)
	}
}

// TestSecretsWithOptIn: the same workload with WithRawQueryText, WithErrorMessages and
// otelpgx's WithIncludeQueryParameters records what the defaults withhold: the options
// work, and the default test above is not passing because nothing is recorded.
func TestSecretsWithOptIn(t *testing.T) {
	tel := runSecretWorkload(t, true)
	for _, s := range []string{secretRolePassword, secretAlterPassword, secretCard, secretDollar, secretTagged,
		secretNumber, secretBits, secretHex, secretUnicode, secretSimple, secretParam, secretBadInt, secretBatch,
		secretBatchParam, secretOutOfRange, secretCopyInline, secretIndeterminate, secretComment} {
		if tel.find(s) == "" {
			t.Errorf("secret %q is not recorded with the opt-in options", s)
		}
	}
	for _, s := range []string{secretMessageOnly, secretHook} { // only in error messages
		if !strings.Contains(tel.errorTexts, s) {
			t.Errorf("error text %q is not recorded with WithErrorMessages: %q", s, tel.errorTexts)
		}
	}
	if where := tel.find(secretCopyRow); where != "" {
		t.Errorf("a CopyFrom row value is recorded: %s", where)
	}
}

// secretTelemetry is everything the workload exported, as text.
type secretTelemetry struct {
	spans, metrics, logs string
	errorTexts           string // status descriptions and exception messages
}

func (tel secretTelemetry) find(s string) string {
	for name, text := range map[string]string{"spans": tel.spans, "metrics": tel.metrics, "logs": tel.logs} {
		if i := strings.Index(text, s); i >= 0 {
			return fmt.Sprintf("in %s: …%s…", name, text[max(0, i-200):min(len(text), i+len(s)+50)])
		}
	}
	return ""
}

func runSecretWorkload(t *testing.T, optIn bool) secretTelemetry {
	ctx := pgtest.ContextFor(t)
	var logs lockedBuffer
	opts := []Option{WithLogger(slog.New(slog.NewJSONHandler(&logs, nil)))}
	if optIn {
		opts = append(opts, WithRawQueryText(), WithErrorMessages(),
			WithOtelpgxOptions(otelpgx.WithIncludeQueryParameters()))
	}
	h := newHarness(t, "", 2, opts...)
	seq := tableSeq.Add(1)
	table, role := fmt.Sprintf("t_secrets_%d", seq), fmt.Sprintf("r_secrets_%d", seq)
	if err := srv.Exec(ctx, "create table "+table+" (id int primary key, note text)"); err != nil {
		t.Fatal(err)
	}
	rctx, root := h.tp.Tracer("test").Start(ctx, "request")

	// Roles, literals of every kind over both protocols, and an error quoting the input.
	// The transaction rolls back: the role is never created.
	tx, err := h.pool.Begin(rctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec := func(sql string, args ...any) {
		t.Helper()
		if _, err := tx.Exec(rctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	mustExec("create role "+role+" login password '"+secretRolePassword+"'", pgx.QueryExecModeSimpleProtocol)
	mustExec("alter role " + role + " password '" + secretAlterPassword + "'")
	var got string
	err = tx.QueryRow(rctx, "select 'card "+secretCard+"' || E'"+strings.ReplaceAll(secretEscape, `\'`, `\\\'`)+"' || $$"+
		secretDollar+"$$ || $t$"+secretTagged+"$t$ || "+secretNumber+"::text || $1::text", secretParam).Scan(&got)
	if err != nil || !strings.Contains(got, secretCard) || !strings.Contains(got, `esc-Secret\'s`) {
		t.Fatalf("literal query: %q, %v", got, err)
	}
	mustExec("select B'"+secretBits+"', X'"+secretHex+"', U&'"+secretUnicode+"' /* "+secretComment+" */", pgx.QueryExecModeSimpleProtocol)
	mustExec("select '"+secretSimple+"'", pgx.QueryExecModeSimpleProtocol)
	if _, err := tx.Exec(rctx, "select '"+secretBadInt+"'::int"); err == nil || !strings.Contains(err.Error(), secretBadInt) {
		t.Fatalf("want the server to quote the bad input, got %v", err)
	}
	if err := tx.Rollback(rctx); err != nil {
		t.Fatal(err)
	}

	// A parameter the server quotes in its error: in no query text, only in the message.
	if _, err := h.pool.Exec(rctx, "select $1::int", secretMessageOnly); err == nil || !strings.Contains(err.Error(), secretMessageOnly) {
		t.Fatalf("want the server to quote the parameter, got %v", err)
	}

	// A batch whose last statement fails with a message quoting its value.
	tx, err = h.pool.Begin(rctx)
	if err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("select '" + secretBatch + "'")
	b.Queue("select $1::text", secretBatchParam)
	b.Queue("select '" + secretOutOfRange + "'::text::int4") // fails executing, not preparing
	if err := tx.SendBatch(rctx, b).Close(); err == nil || !strings.Contains(err.Error(), secretOutOfRange) {
		t.Fatalf("want the out-of-range error quoting the value, got %v", err)
	}
	if err := tx.Rollback(rctx); err != nil {
		t.Fatal(err)
	}

	// COPY: pgx's CopyFrom, and a psql script with inline rows sent as one simple query
	// (the server rejects the rows as SQL, quoting them).
	tx, err = h.pool.Begin(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := tx.CopyFrom(rctx, pgx.Identifier{table}, []string{"id", "note"}, pgx.CopyFromRows([][]any{{1, secretCopyRow}})); err != nil || n != 1 {
		t.Fatalf("CopyFrom: %d, %v", n, err)
	}
	if err := tx.Commit(rctx); err != nil {
		t.Fatal(err)
	}
	_, err = h.pool.Exec(rctx, "copy "+table+" (note, id) from stdin;\n"+secretCopyInline+"\t2\n\\.\n", pgx.QueryExecModeSimpleProtocol)
	if err == nil || !strings.Contains(err.Error(), "42601") {
		t.Fatalf("want a syntax error for inline COPY rows, got %v", err)
	}

	// A post-commit hook failing with an error that quotes data.
	res := Run(rctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
		return struct{}{}, AfterCommit(ctx, func(context.Context) error { return errors.New("mail to " + secretHook + " failed") })
	})
	if res.Outcome() != outcome.OutcomeCommittedWithPostCommitFailure {
		t.Fatalf("hook run: %s", res.Outcome())
	}

	// An indeterminate commit, logged, then reconciled.
	ind := Run(rctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
		if _, err := tx.Exec(ctx, "insert into "+table+" (id, note) values (10, '"+secretIndeterminate+"')"); err != nil {
			return struct{}{}, err
		}
		if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
			return struct{}{}, err
		}
		pid := tx.Conn().PgConn().PID()
		go func() {
			if err := srv.WaitForWaitEvent(ctx, pid, "SyncRep"); err == nil {
				_ = srv.Terminate(ctx, pid)
			}
		}()
		return struct{}{}, nil
	})
	indet, ok := ind.(outcome.Indeterminate[struct{}])
	if !ok {
		t.Fatalf("want an indeterminate outcome, got %s", ind.Outcome())
	}
	recOpts := []reconcile.Option{reconcile.WithTracerProvider(h.tp)}
	if optIn {
		recOpts = append(recOpts, reconcile.WithErrorMessages())
	}
	rec, err := reconcile.New(h.pool, recOpts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reconcile.Indeterminate(rctx, rec, indet); err != nil {
		t.Fatal(err)
	}
	root.End()

	return secretTelemetry{spans: h.spansText(), metrics: h.metricsText(t, ctx), logs: logs.String(), errorTexts: h.errorTexts()}
}

// spansText writes every exported span's name, attributes, events, status and links.
func (h *harness) spansText() string {
	var b strings.Builder
	for _, s := range h.exp.GetSpans() {
		fmt.Fprintf(&b, "span %q status=%q\n", s.Name, s.Status.Description)
		writeAttrs(&b, s.Attributes)
		for _, e := range s.Events {
			fmt.Fprintf(&b, " event %q\n", e.Name)
			writeAttrs(&b, e.Attributes)
		}
		for _, l := range s.Links {
			writeAttrs(&b, l.Attributes)
		}
	}
	return b.String()
}

// errorTexts returns the status descriptions and exception messages of the spans.
func (h *harness) errorTexts() string {
	var b strings.Builder
	for _, s := range h.exp.GetSpans() {
		b.WriteString(s.Status.Description + "\n")
		for _, e := range s.Events {
			for _, kv := range e.Attributes {
				if kv.Key == "exception.message" {
					b.WriteString(kv.Value.String() + "\n")
				}
			}
		}
	}
	return b.String()
}

func writeAttrs(b *strings.Builder, attrs []attribute.KeyValue) {
	for _, kv := range attrs {
		fmt.Fprintf(b, "  %s=%s\n", kv.Key, kv.Value.String())
	}
}

// metricsText writes the attributes of every collected data point.
func (h *harness) metricsText(t *testing.T, ctx context.Context) string {
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var sets []attribute.Set
			switch d := m.Data.(type) { // what this library and otelpgx record
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			default:
				t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
			}
			for _, s := range sets {
				fmt.Fprintf(&b, "metric %s\n", m.Name)
				writeAttrs(&b, s.ToSlice())
			}
		}
	}
	return b.String()
}

// seenByInner records what a user's inner tracer is handed.
type seenByInner struct {
	mu   sync.Mutex
	seen []string
}

func (s *seenByInner) add(format string, args ...any) {
	s.mu.Lock()
	s.seen = append(s.seen, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *seenByInner) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.add("query %q args %v", d.SQL, d.Args)
	return ctx
}

func (s *seenByInner) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	s.add("query end %v", d.Err)
}

func (s *seenByInner) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		s.add("batch start %q args %v", q.SQL, q.Arguments)
	}
	return ctx
}

func (s *seenByInner) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.add("batch query %q %v", d.SQL, d.Err)
}

func (s *seenByInner) TraceBatchEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	s.add("batch end %v", d.Err)
}

func (s *seenByInner) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.seen, "\n")
}

// TestApplicationTracerSeesWhatPgxGives: a tracer of the application's own (pgx's
// tracelog, already on the connection config when it is instrumented) is handed exactly
// what pgx hands it without this package — the SQL with its literals, the server's
// message, pgx's statement name — and the library's own statement spans stay sanitized
// (there are none here: the application's tracer takes otelpgx's place).
func TestApplicationTracerSeesWhatPgxGives(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	for _, tc := range []struct {
		name      string
		opts      []Option
		sanitized bool
	}{{"as is", nil, false}, {"WithSanitizedInnerTracer", []Option{WithSanitizedInnerTracer()}, true}} {
		t.Run(tc.name, func(t *testing.T) {
			logged := &tracelogRecords{}
			cfg, err := pgx.ParseConfig(srv.ConnString())
			if err != nil {
				t.Fatal(err)
			}
			cfg.Tracer = &tracelog.TraceLog{Logger: logged, LogLevel: tracelog.LogLevelTrace}
			if _, err := InstrumentConnConfig(cfg, tc.opts...); err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.WithoutCancel(ctx))
			if _, err := conn.Exec(ctx, "select '"+secretSimple+"'::int, $1::text", "arg-visible"); err == nil {
				t.Fatal("want the invalid input error")
			}
			b := &pgx.Batch{}
			b.Queue("select '" + secretBatch + "'")
			if err := conn.SendBatch(ctx, b).Close(); err != nil {
				t.Fatal(err)
			}
			seen := logged.text()
			raw := []string{"select '" + secretSimple + "'::int, $1::text", `invalid input syntax for type integer: "` + secretSimple + `"`,
				"select '" + secretBatch + "'", "name=stmtcache_"}
			clean := []string{"select ?::int, $1::text", "SQLSTATE 22P02", "select ?", "name=stmtcache "}
			want, never := raw, []string{"select ?", "(message redacted)"}
			if tc.sanitized {
				want, never = clean, []string{secretSimple, secretBatch, "stmtcache_"}
			}
			for _, w := range append(want, "arg-visible") {
				if !strings.Contains(seen, w) {
					t.Errorf("the application's tracer was not handed %q:\n%s", w, seen)
				}
			}
			for _, n := range never {
				if strings.Contains(seen, n) {
					t.Errorf("the application's tracer was handed %q:\n%s", n, seen)
				}
			}
		})
	}
}

// tracelogRecords is a tracelog.Logger that keeps every record as a line of text.
type tracelogRecords struct {
	mu    sync.Mutex
	lines []string
}

func (l *tracelogRecords) Log(_ context.Context, _ tracelog.LogLevel, msg string, data map[string]any) {
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	line := msg
	for _, k := range keys {
		line += fmt.Sprintf(" %s=%v", k, data[k])
	}
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
}

func (l *tracelogRecords) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// TestSanitizedInnerTracerBatchCopy: with WithSanitizedInnerTracer a tracer of the
// application's, in otelpgx's place, is handed sanitized SQL in a copy of the batch (the
// caller's batch is unchanged) and redacted errors; the statement arguments reach it
// unchanged, as they reach the default otelpgx tracer (which records them only with
// otelpgx.WithIncludeQueryParameters).
func TestSanitizedInnerTracerBatchCopy(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	inner := &seenByInner{}
	h := newHarness(t, "", 1, WithInnerTracer(inner), WithSanitizedInnerTracer())
	if _, err := h.pool.Exec(ctx, "select '"+secretSimple+"'::int, $1::text", "arg-visible"); err == nil {
		t.Fatal("want the invalid input error")
	}
	b := &pgx.Batch{}
	b.Queue("select '" + secretBatch + "'")
	if err := h.pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if b.QueuedQueries[0].SQL != "select '"+secretBatch+"'" {
		t.Fatalf("the caller's batch was changed: %q", b.QueuedQueries[0].SQL)
	}
	seen := inner.text()
	for _, s := range []string{secretSimple, secretBatch} {
		if strings.Contains(seen, s) {
			t.Errorf("the inner tracer was handed %q:\n%s", s, seen)
		}
	}
	for _, want := range []string{`query "select ?::int, $1::text" args [arg-visible]`, "SQLSTATE 22P02", `batch start "select ?"`, `batch query "select ?"`} {
		if !strings.Contains(seen, want) {
			t.Errorf("the inner tracer was not handed %q:\n%s", want, seen)
		}
	}
}
