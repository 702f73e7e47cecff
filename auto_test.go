package otelpgxtx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// reconciled collects the callback's reconciliations, per operation id.
type reconciled struct {
	mu  sync.Mutex
	got map[outcome.OperationID][]Reconciliation
	ch  chan Reconciliation
}

func newReconciled() *reconciled {
	return &reconciled{got: map[outcome.OperationID][]Reconciliation{}, ch: make(chan Reconciliation, 64)}
}

func (r *reconciled) on(rec Reconciliation) {
	r.mu.Lock()
	r.got[rec.OperationID] = append(r.got[rec.OperationID], rec)
	r.mu.Unlock()
	r.ch <- rec
}

// reconcileCounts reads the reconciliations counter: resolution/reason → value, every
// series, zeros too.
func (h *harness) reconcileCounts(t *testing.T, ctx context.Context) (counts map[string]int64, histCount uint64, unresolved int64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	counts = map[string]int64{}
	unresolved = -1
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case metrics.MetricReconciliations:
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					res, _ := dp.Attributes.Value(ResolvedOutcomeKey)
					reason, _ := dp.Attributes.Value(schema.ErrorTypeKey)
					counts[res.AsString()+"/"+reason.AsString()] += dp.Value
				}
			case metrics.MetricReconciliationDuration:
				for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
					histCount += dp.Count
				}
			case metrics.MetricUnresolved:
				for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					unresolved = dp.Value
				}
			}
		}
	}
	return counts, histCount, unresolved
}

// TestAutoReconcile: a Run commit with a commit marker cut by the proxy after COMMIT is reconciled in the
// background to committed, and a plain pgx commit cut the same way (it has no reference)
// ends unknown with reason no_reference; the callback gets each exactly once, each
// attempt is a tx.reconcile span linked to its frame, and the metrics count them, every
// series born at 0.
func TestAutoReconcile(t *testing.T) {
	pgtest.LeakCheck(t) // first: it runs after every cleanup below
	ctx := pgtest.ContextFor(t)
	db := srv.Pool(t, ctx)
	rec := newReconciled()
	proxy := pgtest.ProxyFor(t, srv)
	var logs bytes.Buffer
	h := newHarness(t, proxy.ConnString(srv.ConnString()), 2, WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))),
		withAutoReconcile(t, db, WithOnReconciled(rec.on)))
	t.Cleanup(func() { _ = h.tracer.Close(context.Background()) })
	counts, _, unresolved := h.reconcileCounts(t, ctx)
	if len(counts) != 12 || unresolved != 0 {
		t.Fatalf("at start: %v series (want 12, all 0), unresolved %d", counts, unresolved)
	}
	for k, v := range counts {
		if v != 0 {
			t.Fatalf("at start %s = %d", k, v)
		}
	}
	table := srv.NewTable(t, ctx, tableColumns)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)

	// The proxy cuts before the xid arrives: the commit marker is the reference.
	res := Run(ctx, h.pool, markerPolicy(marker), func(ctx context.Context, tx pgx.Tx) (int, error) {
		proxy.CutAfterCommit()
		return insertFn(table, 1)(ctx, tx)
	})
	ind, ok := res.(outcome.Indeterminate[int])
	if !ok {
		t.Fatalf("Run: %T %v", res, res)
	}
	if _, ok := ind.Reference(); !ok {
		t.Fatal("Run's indeterminate result has no reference")
	}
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "insert into "+table+" values (2)"); err != nil {
		t.Fatal(err)
	}
	proxy.CutAfterCommit()
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the cut commit succeeded")
	}

	// The background attempt races the cut backend, which may not have run the COMMIT
	// that reached it yet: then the fence wins and aborted is the truth. Either answer
	// must be what the database ends with.
	answers := map[outcome.OperationID]string{}
	for range 2 {
		r := <-rec.ch
		key := r.Answer.Status().String() + "/" + r.Answer.Reason()
		want := "unknown/" + reconcile.ReasonNoReference
		if r.OperationID == ind.OperationID() {
			want = "committed/"
			if key == "aborted/" {
				want = key
			}
		}
		if key != want || r.Attempts < 1 || r.TraceParent == "" {
			t.Fatalf("reconciliation %+v: %s, want %s", r, key, want)
		}
		answers[r.OperationID] = key
	}
	if err := srv.WaitQuiet(ctx); err != nil {
		t.Fatal(err)
	}
	if committed := answers[ind.OperationID()] == "committed/"; srv.RowExists(t, ctx, table, 1) != committed {
		t.Fatalf("reconciled %s, but the row's presence is %v", answers[ind.OperationID()], !committed)
	}
	if _, _, unresolved := h.reconcileCounts(t, ctx); unresolved != 0 {
		t.Errorf("unresolved gauge %d once both are settled, want 0", unresolved)
	}
	if err := h.tracer.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// A frame that ends indeterminate after Close is not lost: logged for the operator,
	// and handed to the callback, unknown with reason stopped, on a goroutine of its own.
	late := Run(ctx, h.pool, markerPolicy(marker), func(ctx context.Context, tx pgx.Tx) (int, error) {
		proxy.CutAfterCommit()
		return insertFn(table, 3)(ctx, tx)
	})
	if _, ok := late.(outcome.Indeterminate[int]); !ok {
		t.Fatalf("Run after Close: %T %v", late, late)
	}
	select {
	case r := <-rec.ch:
		if r.OperationID != late.OperationID() || r.Answer.Reason() != reconcile.ReasonStopped {
			t.Fatalf("after Close: %+v, want %s stopped", r, late.OperationID())
		}
	case <-ctx.Done():
		t.Fatal("a frame ending after Close did not reach the callback")
	}
	if !strings.Contains(logs.String(), `"msg":"`+MessagePendingAtShutdown+`"`) || !strings.Contains(logs.String(), late.OperationID().String()) {
		t.Fatalf("no shutdown record for %s in the log:\n%s", late.OperationID(), logs.String())
	}
	rec.mu.Lock()
	for id, rs := range rec.got {
		if len(rs) != 1 {
			t.Errorf("operation %s reconciled %d times", id, len(rs))
		}
	}
	rec.mu.Unlock()

	// Each frame has its tx.reconcile spans, linked to it.
	frames := map[string]string{} // frame span id → operation id
	for _, f := range h.frames() {
		if v, _ := attr(f, OutcomeKey); v.AsString() == outcome.OutcomeIndeterminate.String() {
			frames[f.SpanContext.SpanID().String()] = attrString(t, f, OperationIDKey)
		}
	}
	linked := map[string]int{}
	for _, s := range h.exp.GetSpans() {
		if s.Name != SpanNameReconcile {
			continue
		}
		if len(s.Links) != 1 {
			t.Fatalf("tx.reconcile span with %d links", len(s.Links))
		}
		// The frames were begun on a context without a span: each attempt is a child of
		// its frame span, in the frame's trace.
		if l := s.Links[0].SpanContext; s.Parent.TraceID() != l.TraceID() || s.Parent.SpanID() != l.SpanID() {
			t.Fatalf("tx.reconcile parent %v, want its frame span %v", s.Parent, l)
		}
		op, isFrame := frames[s.Links[0].SpanContext.SpanID().String()]
		if !isFrame || attrString(t, s, OperationIDKey) != op {
			t.Fatalf("tx.reconcile span linked to %v, not to its indeterminate frame", s.Links[0].SpanContext)
		}
		linked[op]++
	}
	if len(frames) != 3 || len(linked) != 2 {
		t.Fatalf("%d indeterminate frames, %d with tx.reconcile spans", len(frames), len(linked))
	}

	counts, hist, _ := h.reconcileCounts(t, ctx)
	wantCounts := map[string]int64{answers[ind.OperationID()]: 1, "unknown/" + reconcile.ReasonNoReference: 1, "unknown/" + reconcile.ReasonStopped: 1}
	for k, v := range counts {
		if v != wantCounts[k] {
			t.Errorf("reconciliations %s = %d, want %d", k, v, wantCounts[k])
		}
	}
	if hist != 3 {
		t.Errorf("duration histogram count %d, want 3", hist)
	}
}

func TestAutoReconcileOptions(t *testing.T) {
	rec, err := reconcile.New(srvQuerier{})
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]Option{
		"nil reconciler": WithAutoReconcile(nil),
		"queue 0":        WithAutoReconcile(rec, WithQueue(0, 1)),
		"workers 0":      WithAutoReconcile(rec, WithQueue(1, 0)),
		"backoff":        WithAutoReconcile(rec, WithRetryBackoff(time.Second, time.Millisecond)),
	} {
		tr, err := newTracer([]Option{o})
		if !errors.Is(err, ErrInvalidArgument) || tr.a.Auto != nil {
			t.Errorf("%s: accepted (%v)", name, err)
		}
	}
	// Without the option, Close does nothing.
	if err := mustTracer(t).Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// srvQuerier is a Querier that is never asked: the options above are refused first.
type srvQuerier struct{}

func (srvQuerier) QueryRow(context.Context, string, ...any) pgx.Row { return nil }

// TestAutoReconcileStartsOnDemand: a tracer with automatic reconciliation runs no
// goroutine until a frame ends indeterminate, so that one that is never closed, and never
// saw an indeterminate commit, leaves none behind (pgtest.LeakCheck, with no Close).
func TestAutoReconcileStartsOnDemand(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	db := srv.Pool(t, ctx)
	h := newHarness(t, "", 1, withAutoReconcile(t, db)) // its LeakCheck runs after the pool's Close
	table := srv.NewTable(t, ctx, tableColumns)
	commitOne(t, ctx, h, table, 1)
	if h.tracer.a.Auto == nil || h.tracer.a.Auto.Started {
		t.Fatal("the reconciler's workers started without an indeterminate frame")
	}
}

// TestUnresolvedGaugesShared: automatic reconcilers of two tracers on one meter provider
// with the same attributes report one series, the sum of their pending frames and the
// oldest age (with a callback each, the last observation would win); another attribute
// set is a series of its own, and the series goes once every member has left.
func TestUnresolvedGaugesShared(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(ctx) }()
	meter := mp.Meter(ScopeName)
	set := attribute.NewSet(schema.DBSystemPostgreSQL)
	other := attribute.NewSet(schema.DBSystemPostgreSQL, attribute.String("db.namespace", "b"))
	leaveA := metrics.UnresolvedGauges.Join(meter, set, func() (int, time.Duration) { return 2, 3 * time.Second })
	leaveB := metrics.UnresolvedGauges.Join(meter, set, func() (int, time.Duration) { return 1, 5 * time.Second })
	leaveC := metrics.UnresolvedGauges.Join(meter, other, func() (int, time.Duration) { return 7, time.Second })
	collect := func() map[string]string {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Gauge[int64]:
					for _, dp := range d.DataPoints {
						got[m.Name+" "+dp.Attributes.Encoded(attribute.DefaultEncoder())] = fmt.Sprint(dp.Value)
					}
				case metricdata.Gauge[float64]:
					for _, dp := range d.DataPoints {
						got[m.Name+" "+dp.Attributes.Encoded(attribute.DefaultEncoder())] = fmt.Sprint(dp.Value)
					}
				}
			}
		}
		return got
	}
	enc := func(s attribute.Set) string { return s.Encoded(attribute.DefaultEncoder()) }
	want := map[string]string{
		metrics.MetricUnresolved + " " + enc(set): "3", metrics.MetricUnresolvedAge + " " + enc(set): "5",
		metrics.MetricUnresolved + " " + enc(other): "7", metrics.MetricUnresolvedAge + " " + enc(other): "1",
	}
	if got := collect(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("two members and another set: %v, want %v", got, want)
	}
	leaveB()
	leaveC()
	want = map[string]string{metrics.MetricUnresolved + " " + enc(set): "2", metrics.MetricUnresolvedAge + " " + enc(set): "3"}
	if got := collect(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("one member left: %v, want %v", got, want)
	}
	leaveA()
	if got := collect(); len(got) != 0 {
		t.Fatalf("every member left: %v, want no series", got)
	}
}
