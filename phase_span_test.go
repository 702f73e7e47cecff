package otelpgxtx

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// spanSettings are the two ways transaction-control statements are recorded: as events
// of their frame (the default) and as statement spans of their own; and the default again
// with the commit marker, so that every test of the span contract also shows that the
// library's call in COMMIT's write changes nothing of it (TestMain creates spanMarker).
var spanSettings = []struct {
	name string
	opts []Option
}{
	{"events", nil},
	{"spans", []Option{WithInnerSpans(InnerSpanTransactionControl)}},
	{"events with the commit marker", []Option{WithCommitMarker(spanMarker)}},
}

// spanMarker is the marker table of the span contract's commit-marker setting.
var spanMarker = pgx.Identifier{"public", "span_marker"}

// eachSpanSetting runs test once per setting of spanSettings, with its options.
func eachSpanSetting(t *testing.T, test func(t *testing.T, opts ...Option)) {
	for _, s := range spanSettings {
		t.Run(s.name, func(t *testing.T) { test(t, s.opts...) })
	}
}

// statementEvents returns the frame's events that stand for a statement (those with
// db.operation.name), in time order.
func statementEvents(f tracetest.SpanStub) []sdktrace.Event {
	evs := slices.Clone(f.Events)
	slices.SortStableFunc(evs, func(a, b sdktrace.Event) int { return a.Time.Compare(b.Time) })
	return slices.DeleteFunc(evs, func(e sdktrace.Event) bool {
		_, ok := eventAttr(e, schema.DBOperationNameKey)
		return !ok
	})
}

func eventAttr(e sdktrace.Event, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range e.Attributes {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantControlEvents asserts that the frame's statement events are ops (db.operation.name),
// in order, each with a duration within the frame's.
func wantControlEvents(t *testing.T, f tracetest.SpanStub, ops ...string) {
	t.Helper()
	var got []string
	for _, e := range statementEvents(f) {
		v, _ := eventAttr(e, schema.DBOperationNameKey)
		got = append(got, v.AsString())
		d, ok := eventAttr(e, schema.StatementDurationKey)
		if took := d.AsFloat64(); !ok || took <= 0 || took > f.EndTime.Sub(f.StartTime).Seconds() {
			t.Fatalf("event %s of %s: tx.statement.duration %v (present %v), want within the frame's %v",
				e.Name, v.AsString(), took, ok, f.EndTime.Sub(f.StartTime))
		}
	}
	if !slices.Equal(got, ops) {
		t.Fatalf("statement events of the frame = %q, want %q", got, ops)
	}
}

// wantAnswer asserts how the frame records the answer to the transaction-control
// statement op: with events, the frame's event named event carries op and, if sqlState is
// not "", that SQLSTATE (else none); with spans, the frame has a statement span named op
// with that pgx.sql_state.
func wantAnswer(t *testing.T, h *harness, f tracetest.SpanStub, event, op, sqlState string) {
	t.Helper()
	if !h.controlEvents {
		for _, c := range h.children(f) {
			if v, _ := attr(c, otelpgx.SQLStateKey); c.Name == op && v.AsString() == sqlState {
				return
			}
		}
		t.Fatalf("no statement span %s with pgx.sql_state %q under the frame: %v", op, sqlState, names(h.children(f)))
	}
	for _, e := range statementEvents(f) {
		if v, _ := eventAttr(e, schema.DBOperationNameKey); e.Name != event || v.AsString() != op {
			continue
		}
		if v, _ := eventAttr(e, schema.DBResponseStatusKey); v.AsString() != sqlState {
			t.Fatalf("event %s of %s: db.response.status_code %q, want %q", event, op, v.AsString(), sqlState)
		}
		return
	}
	t.Fatalf("no event %s answering %s among %v", event, op, eventNames(f))
}

// TestControlEventsAnswers: with the default, each transaction-control statement is the
// event its answer makes, with its operation name, duration and SQLSTATE, and an event
// of its own where its answer makes none — BEGIN inside the transaction (a warning),
// savepoint statements that fail; the savepoint events carry their depth (in both
// settings); the statement spans left are the others.
func TestControlEventsAnswers(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 1, opts...)
		table := srv.NewTable(t, ctx, tableColumns)
		rctx, root := rootSpan(ctx, h)
		tx := mustBegin(t, rctx, h.pool)
		mustExec(t, rctx, tx, "begin") // already in one: the server warns, nothing changes
		sp1 := mustBegin(t, rctx, tx)  // savepoint sp_1
		sp2 := mustBegin(t, rctx, sp1) // savepoint sp_2
		mustExec(t, rctx, sp2, "insert into "+table+" (id, k) values (1, 1)")
		if err := sp2.Rollback(rctx); err != nil { // rollback to savepoint sp_2
			t.Fatal(err)
		}
		if err := sp1.Commit(rctx); err != nil { // release savepoint sp_1
			t.Fatal(err)
		}
		sp3 := mustBegin(t, rctx, tx) // savepoint sp_3, outermost again
		if err := sp3.Commit(rctx); err != nil {
			t.Fatal(err)
		}
		_, err := tx.Exec(rctx, "release savepoint nosuch")
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "3B001" {
			t.Fatalf("release of an unknown savepoint: %v, want 3B001", err)
		}
		if err := tx.Commit(rctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
			t.Fatalf("commit of a failed transaction: %v, want ErrTxCommitRollback", err)
		}
		root.End()

		f := onlyFrame(t, h)
		wantStatementChildren(t, h, f, "begin", "begin", "savepoint sp_1", "savepoint sp_2",
			"insert into "+table+" (id, k) values (?, ?)", "rollback to savepoint sp_2", "release savepoint sp_1",
			"savepoint sp_3", "release savepoint sp_3", "release savepoint nosuch", "commit")
		wantEvents(t, f, slices.Concat([]string{"tx.phase.active"}, h.eventsIfFolded(schema.EventStatement),
			[]string{"tx.savepoint.created", "tx.savepoint.created", "tx.savepoint.rolled_back", "tx.savepoint.released",
				"tx.savepoint.created", "tx.savepoint.released"},
			h.eventsIfFolded(schema.EventStatement), []string{"tx.phase.committing", "tx.phase.rolled_back"})...)
		wantAnswer(t, h, f, "tx.phase.active", "BEGIN", "")
		wantAnswer(t, h, f, schema.EventStatement, "RELEASE", "3B001")
		wantAnswer(t, h, f, "tx.phase.rolled_back", "COMMIT", "")
		var depths []int64
		for _, e := range f.Events {
			if v, ok := eventAttr(e, schema.SavepointDepthKey); ok {
				depths = append(depths, v.AsInt64())
			}
		}
		if !slices.Equal(depths, []int64{1, 2, 2, 1, 1, 1}) {
			t.Fatalf("tx.savepoint.depth of the savepoint events = %v, want [1 2 2 1 1 1]", depths)
		}
		wantAttr(t, f, "tx.outcome", "rolled_back")
	})
}

// eventsIfFolded returns names when the harness's control statements are events, else none.
func (h *harness) eventsIfFolded(names ...string) []string {
	if h.controlEvents {
		return names
	}
	return nil
}

// controlMetrics runs a workload of every transaction-control statement — committed,
// rolled back, savepoints made, released, rolled back to, a failing one, a failing
// COMMIT — and returns otelpgx's duration histogram counts and error counts by attribute
// set, with the span ids of the duration exemplars of the queries' series.
func controlMetrics(t *testing.T, opts ...Option) (counts map[string]uint64, exemplars map[string]bool, h *harness) {
	ctx := pgtest.ContextFor(t)
	h = newHarness(t, "", 1, opts...)
	table := srv.NewTable(t, ctx, tableColumns)
	rctx, root := rootSpan(ctx, h)
	tx := mustBegin(t, rctx, h.pool)
	sp := mustBegin(t, rctx, tx)
	mustExec(t, rctx, sp, "insert into "+table+" (id, k) values (1, 1)")
	if err := sp.Rollback(rctx); err != nil {
		t.Fatal(err)
	}
	sp = mustBegin(t, rctx, tx)
	if err := sp.Commit(rctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(rctx, "rollback to savepoint nosuch"); err == nil {
		t.Fatal("rollback to an unknown savepoint succeeded")
	}
	if err := tx.Rollback(rctx); err != nil {
		t.Fatal(err)
	}
	tx = mustBegin(t, rctx, h.pool)
	mustExec(t, rctx, tx, "insert into "+table+" (id, k) values (2, 2)")
	if err := tx.Commit(rctx); err != nil {
		t.Fatal(err)
	}
	root.End()

	counts, exemplars = map[string]uint64{}, map[string]bool{}
	for name, data := range otelpgxMetrics(t, ctx, h) {
		switch d := data.(type) {
		case metricdata.Histogram[float64]:
			for _, dp := range d.DataPoints {
				counts[name+" "+dp.Attributes.Encoded(attribute.DefaultEncoder())] += dp.Count
			}
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				counts[name+" "+dp.Attributes.Encoded(attribute.DefaultEncoder())] += uint64(dp.Value)
			}
		}
	}
	for _, ex := range queryExemplars(t, ctx, h) {
		exemplars[string(ex.SpanID)] = true
	}
	return counts, exemplars, h
}

// otelpgxMetrics collects h's metrics and returns otelpgx's statement metrics by name.
func otelpgxMetrics(t *testing.T, ctx context.Context, h *harness) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "db.client.operation.duration" || m.Name == "db.client.operation.errors" {
				out[m.Name] = m.Data
			}
		}
	}
	return out
}

// queryExemplars returns the exemplars of otelpgx's duration metric for queries.
func queryExemplars(t *testing.T, ctx context.Context, h *harness) []metricdata.Exemplar[float64] {
	t.Helper()
	d, _ := otelpgxMetrics(t, ctx, h)["db.client.operation.duration"].(metricdata.Histogram[float64])
	var out []metricdata.Exemplar[float64]
	for _, dp := range d.DataPoints {
		if v, _ := dp.Attributes.Value(otelpgx.PGXOperationTypeKey); v.AsString() == "query" {
			out = append(out, dp.Exemplars...)
		}
	}
	return out
}

// sqlRecorder is an application's query tracer that notes the SQL of each query.
type sqlRecorder struct{ sqls []string }

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.sqls = append(r.sqls, data.SQL)
	return ctx
}

func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestControlEventsMetricsUnchanged: otelpgx's statement metrics count every
// transaction-control statement exactly as with their spans — the same series, the same
// counts, the failures too — and with the default their exemplars name the frame spans
// that hold their events, not spans that do not exist.
func TestControlEventsMetricsUnchanged(t *testing.T) {
	spans, spanExemplars, hs := controlMetrics(t, WithInnerSpans(InnerSpanTransactionControl))
	events, eventExemplars, he := controlMetrics(t)
	if len(spans) == 0 || !maps.Equal(spans, events) {
		t.Fatalf("otelpgx's metrics with the statements as events:\n\t%v\nas spans:\n\t%v", events, spans)
	}
	// 11 statements (one failed): the counts are the statements', whatever the setting.
	var n uint64
	for k, c := range events {
		if strings.HasPrefix(k, "db.client.operation.duration ") && strings.Contains(k, "pgx.operation.type=query") {
			n += c
		}
	}
	if n != 11 {
		t.Fatalf("duration data points: %d, want 11: %v", n, events)
	}
	spanNames := func(h *harness) map[string]string {
		m := map[string]string{}
		for _, s := range h.exp.GetSpans() {
			id := s.SpanContext.SpanID()
			m[string(id[:])] = s.Name
		}
		return m
	}
	for id := range eventExemplars {
		if name := spanNames(he)[id]; name != DefaultSpanName && name != "INSERT" {
			t.Errorf("with events, an exemplar names span %q, want a frame or the INSERT statement", name)
		}
	}
	for id := range spanExemplars {
		if spanNames(hs)[id] == "" {
			t.Errorf("with spans, an exemplar names no span")
		}
	}
}

// TestControlEventsExemplarsNameTheFrame: the exemplars of otelpgx's duration metric for
// a transaction of BEGIN and COMMIT alone name its frame span, which holds their events
// (the SDK keeps an exemplar only for a measurement in a sampled span's context).
func TestControlEventsExemplarsNameTheFrame(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1)
	rctx, root := rootSpan(ctx, h)
	tx := mustBegin(t, rctx, h.pool)
	if err := tx.Commit(rctx); err != nil {
		t.Fatal(err)
	}
	root.End()
	f := onlyFrame(t, h)
	exemplars := queryExemplars(t, ctx, h)
	for _, ex := range exemplars {
		if id := f.SpanContext.SpanID(); string(ex.SpanID) != string(id[:]) {
			t.Errorf("an exemplar names span %x, want the frame %s", ex.SpanID, id)
		}
	}
	if len(exemplars) == 0 {
		t.Fatal("no exemplar for BEGIN and COMMIT")
	}
}

// TestControlEventsNotWhereNoFrameHoldsThem: statements outside a recorded frame keep
// their spans with the default: a frame the filter rejected (the statements are otelpgx's
// as without this package), a COMMIT with no transaction, and a batch that holds BEGIN and
// COMMIT (its span and its queries' spans stay: a batch is one call).
func TestControlEventsNotWhereNoFrameHoldsThem(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1, WithFilter(func(_ context.Context, begin string) bool { return begin != "begin read only" }))
	rctx, root := rootSpan(ctx, h)
	tx, err := h.pool.BeginTx(rctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(rctx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(rctx, "commit"); err != nil { // no transaction: a warning
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue("select 1")
	b.Queue("commit")
	if err := h.pool.SendBatch(rctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	root.End()
	var stmts []string
	for _, s := range h.exp.GetSpans() {
		if v, ok := attr(s, "db.query.text"); ok {
			stmts = append(stmts, s.Name+" "+v.AsString())
		}
	}
	slices.Sort(stmts)
	want := []string{"BEGIN begin", "BEGIN begin read only", "COMMIT commit", "COMMIT commit", "COMMIT commit", "SELECT select ?"}
	if !slices.Equal(stmts, want) {
		t.Fatalf("statement spans %q, want %q", stmts, want)
	}
	f := onlyFrame(t, h) // the batch's
	wantControlEvents(t, f)
	wantAttr(t, f, "tx.outcome", "committed")
}

// TestControlEventsOwnTracer: a tracer of the application's gets every statement, BEGIN
// and COMMIT too, as pgx gives it, whatever the default; and asking for events or spans
// with it is an error, as WithoutInnerSpans is.
func TestControlEventsOwnTracer(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	rec := &sqlRecorder{}
	h := newHarness(t, "", 1, WithInnerTracer(rec))
	tx := mustBegin(t, ctx, h.pool)
	sp := mustBegin(t, ctx, tx)
	if err := sp.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.sqls; !slices.Equal(got, []string{"begin", "savepoint sp_1", "release savepoint sp_1", "commit"}) {
		t.Fatalf("the application's tracer got %q", got)
	}
	wantControlEvents(t, onlyFrame(t, h))
	cfg := h.pool.Config().ConnConfig.Copy()
	cfg.Tracer = nil
	if _, err := InstrumentConnConfig(cfg, WithInnerTracer(rec), WithInnerSpans(InnerSpanTransactionControl)); err == nil {
		t.Fatal("WithInnerSpans with a tracer of the application's: no error")
	}
}

// TestControlEventsDatabaseSQL: database/sql's BeginTx and Commit through stdlib are pgx's
// BEGIN and COMMIT, and are events of the frame like any other.
func TestControlEventsDatabaseSQL(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 1, opts...)
		db := stdlib.OpenDBFromPool(h.pool)
		defer db.Close()
		rctx, root := rootSpan(ctx, h)
		tx, err := db.BeginTx(rctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(rctx, "select 1"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		root.End()
		f := onlyFrame(t, h)
		wantStatementChildren(t, h, f, "begin isolation level serializable", "select ?", "commit")
		wantAttr(t, f, "tx.outcome", "committed")
	})
}
