package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/poolmetrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// badCall is one call of the exported API with a bad argument.
type badCall struct {
	// name is the function or method as its package declares it, qualified by the
	// package outside the root one: "Run", "Tracer.Check", "reconcile.Reconciler.Resolve".
	name string
	// call makes the call and returns its error, which must wrap ErrInvalidArgument; for a
	// function that returns no error (safe), call checks its answer itself and returns
	// nil, and the call must only not panic.
	call func() error
	safe bool
}

// badArgumentsAllowed are the exported functions and methods that take a pointer,
// interface, function or context but have no entry in the table, each with why.
var badArgumentsAllowed = map[string]string{
	// pgx's hooks: pgx and pgxpool call them with their own non-nil connection, pool and
	// context; an application does not call them.
	"Tracer.TraceAcquireEnd": "pgx hook", "Tracer.TraceAcquireStart": "pgx hook",
	"Tracer.TraceBatchEnd": "pgx hook", "Tracer.TraceBatchQuery": "pgx hook", "Tracer.TraceBatchStart": "pgx hook",
	"Tracer.TraceConnectEnd": "pgx hook", "Tracer.TraceConnectStart": "pgx hook",
	"Tracer.TraceCopyFromEnd": "pgx hook", "Tracer.TraceCopyFromStart": "pgx hook",
	"Tracer.TracePrepareEnd": "pgx hook", "Tracer.TracePrepareStart": "pgx hook",
	"Tracer.TraceQueryEnd": "pgx hook", "Tracer.TraceQueryStart": "pgx hook", "Tracer.TraceRelease": "pgx hook",
	// Methods of interfaces the application implements: no code of the library's behind them.
	"DB.BeginTx": "interface method", "reconcile.Querier.QueryRow": "interface method",
	// nil has a documented meaning: the default.
	"WithLogger":           "nil: slog.Default()",
	"WithSpanNameCtxFunc":  "nil: WithSpanName's fixed name",
	"reconcile.WithLogger": "nil: slog.Default()",
}

// TestBadArguments calls every exported function and method of the library's packages
// that can be given a bad argument (nil context, typed nil pool or connection, nil
// option or function, a key of the library's own) and wants an error wrapping
// ErrInvalidArgument, never a panic; a refused option leaves the config as it was. The
// table is held to the sources: a new exported function taking a pointer, interface,
// function or context fails the test until it has an entry or a reason in
// badArgumentsAllowed.
func TestBadArguments(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	rec, err := reconcile.New(srv.Pool(t, ctx))
	if err != nil {
		t.Fatal(err)
	}
	someErr := errors.New("boom")
	ref, err := outcome.NewReconciliationRef(7, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	ind, err := outcome.NewIndeterminate[int](outcome.NewOperationID(), someErr, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var nilCtx context.Context
	var nilRec *reconcile.Reconciler
	noop := func(context.Context, pgx.Tx) (int, error) { return 0, nil }
	runCause := func(r outcome.Result[int]) error {
		if rb, ok := r.(outcome.DeterminateRollback[int]); ok && rb.Phase() == outcome.PhaseNotStarted {
			return rb.Cause()
		}
		return fmt.Errorf("Run returned %T %v, want a rollback in not_started", r, r)
	}
	tracer, err := InstrumentConnConfig(connConfig(t), WithCommitReference())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tracer.Close(context.Background()) })

	calls := []badCall{
		{name: "InstrumentPool", call: func() error { _, err := InstrumentPool(nil); return err }},
		{name: "InstrumentPool", call: func() error {
			cfg, err := pgxpool.ParseConfig(srv.ConnString())
			if err != nil {
				return err
			}
			_, err = InstrumentPool(cfg, WithOtelpgxOptions(nil))
			if cfg.ConnConfig.Tracer != nil || cfg.BeforeClose != nil || cfg.ConnConfig.AfterNetConnect != nil {
				t.Error("InstrumentPool with a refused option changed the config")
			}
			return err
		}},
		{name: "InstrumentConnConfig", call: func() error { _, err := InstrumentConnConfig(nil); return err }},
		{name: "WithOtelpgxOptions", call: refused(t, WithOtelpgxOptions(otelpgx.WithFullSQLInSpanName(), nil))},
		{name: "WithTracerProvider", call: refused(t, WithTracerProvider((*sdktrace.TracerProvider)(nil)))},
		{name: "WithMeterProvider", call: refused(t, WithMeterProvider((*sdkmetric.MeterProvider)(nil)))},
		{name: "WithInnerTracer", call: refused(t, WithInnerTracer((*otelpgx.Tracer)(nil)))},
		{name: "WithSpanAttributes", call: refused(t, WithSpanAttributes(OutcomeKey.String("x")))},
		{name: "WithMeterAttributes", call: refused(t, WithMeterAttributes(ImplicitKey.Bool(true)))},
		{name: "WithFilter", call: refused(t, WithFilter(nil))},
		{name: "WithImplicitFilter", call: refused(t, WithImplicitFilter(nil))},
		{name: "WithExpectedErrors", call: refused(t, WithExpectedErrors(CallerCanceled, nil))},
		{name: "WithAutoReconcile", call: refused(t, WithAutoReconcile(nil))},
		{name: "WithOnReconciled", call: refused(t, WithAutoReconcile(rec, WithOnReconciled(nil)))},
		{name: "WithQueue", call: refused(t, WithAutoReconcile(rec, WithQueue(0, 1)))},
		{name: "WithRetryBackoff", call: refused(t, WithAutoReconcile(rec, WithRetryBackoff(0, time.Second)))},
		{name: "WithCommitMarker", call: refused(t, WithCommitMarker(nil))},
		{name: "WithPoolName", call: refused(t, WithPoolName(""))},
		{name: "WithSpanName", call: refused(t, WithSpanName(""))},
		{name: "WithStatusMapping", call: refused(t, WithStatusMapping(9))},
		{name: "WithInnerSpans", call: refused(t, WithInnerSpans(InnerSpan(99)))},
		{name: "WithoutInnerSpans", call: refused(t, WithoutInnerSpans(InnerSpan(99)))},

		{name: "Run", call: func() error { return runCause(Run(nilCtx, srv.Pool(t, ctx), DefaultPolicy(), noop)) }},
		{name: "Run", call: func() error { return runCause(Run(ctx, (*pgxpool.Pool)(nil), DefaultPolicy(), noop)) }},
		{name: "Run", call: func() error { return runCause(Run(ctx, (*pgx.Conn)(nil), DefaultPolicy(), noop)) }},
		{name: "Run", call: func() error { return runCause(Run[int](ctx, srv.Pool(t, ctx), DefaultPolicy(), nil)) }},
		{name: "Begin", call: func() error { _, _, err := Begin(nilCtx, srv.Pool(t, ctx), pgx.TxOptions{}); return err }},
		{name: "Begin", call: func() error { _, _, err := Begin(ctx, (*pgx.Conn)(nil), pgx.TxOptions{}); return err }},
		{name: "AfterCommit", call: func() error { return AfterCommit(nilCtx, func(context.Context) error { return nil }) }},
		{name: "AfterCommit", call: func() error { return AfterCommit(ctx, nil) }},
		{name: "Retry", call: func() error { _, err := Retry(nilCtx, 1, func(context.Context) error { return nil }); return err }},
		{name: "Retry", call: func() error { _, err := Retry(ctx, 1, nil); return err }},
		{name: "WithReconciler", call: func() error {
			_, err := Retry(ctx, 1, func(context.Context) error { return nil }, WithReconciler(nil))
			return err
		}},
		{name: "WithReconcileWait", call: func() error {
			_, err := Retry(ctx, 1, func(context.Context) error { return nil }, WithReconcileWait(-1))
			return err
		}},
		{name: "NewVerdict", call: func() error { _, v := NewVerdict(nilCtx); _, err := v.Result(); return err }},
		{name: "Verdict.Result", call: func() error { _, err := (*Verdict)(nil).Result(); return err }},
		{name: "Tracer.Check", call: func() error { return tracer.Check(nilCtx, srv.Pool(t, ctx)) }},
		{name: "Tracer.Check", call: func() error { return tracer.Check(ctx, nil) }},
		{name: "Tracer.Check", call: func() error { return tracer.Check(ctx, (*pgxpool.Pool)(nil)) }},
		{name: "Tracer.Check", call: func() error { return tracer.Check(ctx, (*pgx.Conn)(nil)) }},
		{name: "Tracer.Check", call: func() error { return (*Tracer)(nil).Check(ctx, srv.Pool(t, ctx)) }},
		{name: "Tracer.Close", call: func() error { return tracer.Close(nilCtx) }},
		{name: "CallerCanceled", safe: true, call: func() error {
			if CallerCanceled(nilCtx, context.Canceled) {
				return errors.New("CallerCanceled(nil, context.Canceled) = true")
			}
			return nil
		}},

		{name: "reconcile.New", call: func() error { _, err := reconcile.New(nil); return err }},
		{name: "reconcile.New", call: func() error { _, err := reconcile.New((*pgxpool.Pool)(nil)); return err }},
		{name: "reconcile.WithTracerProvider", call: func() error {
			_, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithTracerProvider((*sdktrace.TracerProvider)(nil)))
			return err
		}},
		{name: "reconcile.WithWait", call: func() error {
			_, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithWait(-1, 0))
			return err
		}},
		{name: "reconcile.Indeterminate", call: func() error { _, err := reconcile.Indeterminate(nilCtx, rec, ind); return err }},
		{name: "reconcile.Indeterminate", call: func() error { _, err := reconcile.Indeterminate(ctx, nilRec, ind); return err }},
		{name: "reconcile.Reconciler.Resolve", call: func() error { _, err := rec.Resolve(nilCtx, ref, trace.SpanContext{}); return err }},
		{name: "reconcile.Reconciler.Resolve", call: func() error { _, err := nilRec.Resolve(ctx, ref, trace.SpanContext{}); return err }},
		{name: "reconcile.Reconciler.ResolveOperation", call: func() error {
			_, err := rec.ResolveOperation(nilCtx, ind.OperationID(), nil, trace.SpanContext{})
			return err
		}},
		{name: "reconcile.Reconciler.ResolveOperation", call: func() error {
			_, err := nilRec.ResolveOperation(ctx, ind.OperationID(), &ref, trace.SpanContext{})
			return err
		}},
		{name: "reconcile.Reconciler.ResolveAssertedMarker", call: func() error {
			_, err := rec.ResolveAssertedMarker(nilCtx, pgx.Identifier{"app", "tx_marker"}, ind.OperationID(), trace.SpanContext{})
			return err
		}},
		{name: "reconcile.Reconciler.ResolveAssertedMarker", call: func() error {
			_, err := nilRec.ResolveAssertedMarker(ctx, pgx.Identifier{"app", "tx_marker"}, ind.OperationID(), trace.SpanContext{})
			return err
		}},
		{name: "reconcile.Reconciler.Remember", safe: true, call: func() error {
			nilRec.Remember(reconcile.Recovery{NextXID: 1})
			return nil
		}},
		{name: "reconcile.PruneMarkers", call: func() error {
			_, err := reconcile.PruneMarkers(nilCtx, srv.Pool(t, ctx), pgx.Identifier{"app", "tx_marker"}, time.Hour)
			return err
		}},
		{name: "reconcile.PruneMarkers", call: func() error {
			_, err := reconcile.PruneMarkers(ctx, (*pgx.Conn)(nil), pgx.Identifier{"app", "tx_marker"}, time.Hour)
			return err
		}},
		{name: "reconcile.MarkerTableDDL", call: func() error { _, err := reconcile.MarkerTableDDL(nil); return err }},
		{name: "reconcile.AnswerError.Error", safe: true, call: func() error { _ = (*reconcile.AnswerError)(nil).Error(); return nil }},
		{name: "reconcile.AnswerError.Unwrap", safe: true, call: func() error {
			if (*reconcile.AnswerError)(nil).Unwrap() != nil {
				return errors.New("a nil *AnswerError unwraps to an error")
			}
			return nil
		}},

		{name: "outcome.NewDeterminateRollback", call: func() error {
			_, err := outcome.NewDeterminateRollback[int](ind.OperationID(), outcome.PhaseActive, nil, false)
			return err
		}},
		{name: "outcome.NewIndeterminate", call: func() error {
			_, err := outcome.NewIndeterminate[int](ind.OperationID(), nil, nil, false)
			return err
		}},
		{name: "outcome.NewCommittedWithPostCommitFailure", call: func() error {
			_, err := outcome.NewCommittedWithPostCommitFailure(ind.OperationID(), 1, nil)
			return err
		}},
		{name: "outcome.Indeterminate.Cause", safe: true, call: func() error { _ = outcome.Indeterminate[int]{}.Cause(); return nil }},
		{name: "outcome.DeterminateRollback.Cause", safe: true, call: func() error { _ = outcome.DeterminateRollback[int]{}.Cause(); return nil }},
		{name: "outcome.CommittedWithPostCommitFailure.Failure", safe: true, call: func() error {
			_ = outcome.CommittedWithPostCommitFailure[int]{}.Failure()
			return nil
		}},

		{name: "classifier.ServerOf", safe: true, call: func() error {
			if k := classifier.ServerOf(nil); k != classifier.ServerUnknown {
				return fmt.Errorf("ServerOf(nil) = %v, want unknown", k)
			}
			return nil
		}},
		{name: "classifier.CommittedLocallyNotice", safe: true, call: func() error {
			if classifier.CommittedLocallyNotice(nil) {
				return errors.New("CommittedLocallyNotice(nil) = true")
			}
			return nil
		}},
		{name: "classifier.CompletionUnknown", safe: true, call: func() error {
			if classifier.CompletionUnknown(nil) {
				return errors.New("CompletionUnknown(nil) = true")
			}
			return nil
		}},
		{name: "classifier.Classify", safe: true, call: func() error {
			_ = classifier.Classify(outcome.PhaseCommitting, nil, classifier.Facts{})
			return nil
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			panicked, err := callSafely(c.call)
			switch {
			case panicked != nil:
				t.Fatalf("panicked: %v", panicked)
			case c.safe && err != nil:
				t.Fatal(err)
			case !c.safe && !errors.Is(err, ErrInvalidArgument):
				t.Fatalf("error %v, want one wrapping ErrInvalidArgument", err)
			}
		})
	}

	t.Run("own keys", func(t *testing.T) {
		for _, k := range []attribute.Key{OutcomeKey, PhaseKey, OperationIDKey, FrameDepthKey, PropagationKey,
			IsolationKey, AccessModeKey, AttemptKey, ReconciliationXIDKey, ReconciliationRefKey, NoReferenceKey,
			ImplicitKey, PreparedKey, CommittedLocallyKey, RetryableKey, ResolvedOutcomeKey, RollbackKey,
			schema.ParticipantOutcomeKey, schema.SavepointNameKey, schema.SavepointDepthKey, schema.StatementDurationKey,
			schema.DBSystemNameKey, schema.DBNamespaceKey, schema.DBResponseStatusKey, schema.DBOperationNameKey, schema.DBQuerySummaryKey,
			schema.ServerAddressKey, schema.ServerPortKey, schema.ErrorTypeKey, poolmetrics.PoolNameKey, poolmetrics.ConnectionStateKey} {
			for name, o := range map[string]Option{"WithSpanAttributes": WithSpanAttributes(k.String("x")),
				"WithMeterAttributes": WithMeterAttributes(attribute.String("team", "a"), k.String("x"))} {
				err := refused(t, o)()
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), string(k)) {
					t.Errorf("%s(%s): %v, want an error wrapping ErrInvalidArgument naming the key", name, k, err)
				}
			}
		}
		if _, err := InstrumentConnConfig(connConfig(t), WithSpanAttributes(attribute.String("service.team", "a")),
			WithMeterAttributes(attribute.String("deployment.environment.name", "test"))); err != nil {
			t.Errorf("an attribute of the application's own: %v", err)
		}
	})

	t.Run("every function has an entry", func(t *testing.T) {
		have := map[string]bool{}
		for _, c := range calls {
			have[c.name] = true
		}
		listed, all := exportedFuncs(t)
		for _, name := range listed {
			if !have[name] && badArgumentsAllowed[name] == "" {
				t.Errorf("%s takes a pointer, interface, function or context: add a bad-argument call of it "+
					"to TestBadArguments, or say in badArgumentsAllowed why it has none", name)
			}
		}
		// Both lists stay true: no entry for a name that is gone or takes only values.
		for name := range badArgumentsAllowed {
			if !slices.Contains(listed, name) {
				t.Errorf("badArgumentsAllowed names %s, which is not an exported function taking a reference", name)
			}
		}
		for name := range have {
			if !slices.Contains(all, name) {
				t.Errorf("the table calls %s, which is not an exported function or method", name)
			}
		}
	})
}

// refused returns a call that instruments a fresh connection config with o and returns
// the error, failing t if the refused option left anything of the tracer in the config.
func refused(t *testing.T, o Option) func() error {
	return func() error {
		cfg := connConfig(t)
		_, err := InstrumentConnConfig(cfg, o)
		if err != nil && (cfg.Tracer != nil || cfg.AfterNetConnect != nil || cfg.OnNotice != nil) {
			t.Error("a refused option left a tracer or a hook in the config")
		}
		return err
	}
}

// connConfig is a connection config of the test server's, not instrumented.
func connConfig(t *testing.T) *pgx.ConnConfig {
	cfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// callSafely calls call and returns what it panicked with, and its error.
func callSafely(call func() error) (panicked any, err error) {
	defer func() { panicked = recover() }()
	return nil, call()
}

// exportedFuncs lists the exported functions and methods of the library's packages (the
// root one, reconcile, outcome, classifier; pgtest is a test harness, whose helpers fail
// the test they are given): all of them, and refs, those that take a parameter other
// than a plain value — a pointer (a pointer receiver too), interface, function, context,
// slice or map, or any named type not known here to be a plain value.
func exportedFuncs(t *testing.T) (refs, all []string) {
	t.Helper()
	values := map[string]bool{
		"bool": true, "int": true, "int64": true, "uint8": true, "uint32": true, "uint64": true, "string": true,
		"float64": true, "T": true, "time.Duration": true, "Phase": true, "OperationID": true, "Outcome": true,
		"outcome.Phase": true, "outcome.OperationID": true, "outcome.ReconciliationRef": true, "Evidence": true,
		"InnerSpan": true, "StatusMapping": true, "Propagation": true, "Policy": true, "Facts": true, "Recovery": true,
		"pgx.TxOptions": true, "trace.SpanContext": true,
	}
	var out []string
	for _, dir := range []string{".", "reconcile", "outcome", "classifier"} {
		prefix := ""
		if dir != "." {
			prefix = dir + "."
		}
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			file, err := parser.ParseFile(fset, f, src, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(file, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.FuncDecl:
					if !n.Name.IsExported() {
						return false
					}
					name := n.Name.Name
					if n.Recv != nil {
						recv := recvName(n.Recv.List[0].Type)
						if !ast.IsExported(recv) {
							return false
						}
						name = recv + "." + name
						all = append(all, prefix+name)
						if isPointer(n.Recv.List[0].Type) {
							out = append(out, prefix+name) // a nil receiver is a bad argument too
							return false
						}
					}
					if n.Recv == nil {
						all = append(all, prefix+name)
					}
					if takesReference(src, fset, n.Type, values) {
						out = append(out, prefix+name)
					}
					return false
				case *ast.TypeSpec:
					// The methods of an exported interface are called on the application's
					// implementations (or the library's own, each listed above as a method).
					if it, ok := n.Type.(*ast.InterfaceType); ok && n.Name.IsExported() {
						for _, m := range it.Methods.List {
							if ft, ok := m.Type.(*ast.FuncType); ok && len(m.Names) > 0 && m.Names[0].IsExported() && takesReference(src, fset, ft, values) {
								out = append(out, prefix+n.Name.Name+"."+m.Names[0].Name)
							}
						}
					}
				}
				return true
			})
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) < 40 || len(all) < 100 {
		t.Fatalf("found only %d functions taking references of %d: the walk is broken", len(out), len(all))
	}
	return out, all
}

// takesReference reports whether ft has a parameter whose type, as written in src, is
// not among values.
func takesReference(src []byte, fset *token.FileSet, ft *ast.FuncType, values map[string]bool) bool {
	for _, p := range ft.Params.List {
		typ := p.Type
		if e, ok := typ.(*ast.Ellipsis); ok {
			typ = e.Elt
		}
		if ix, ok := typ.(*ast.IndexExpr); ok { // outcome.Indeterminate[T] is a value
			if _, ok := ix.X.(*ast.SelectorExpr); ok {
				continue
			}
		}
		if !values[string(src[fset.Position(typ.Pos()).Offset:fset.Position(typ.End()).Offset])] {
			return true
		}
	}
	return false
}

// recvName is the name of a receiver's type: T of T, *T, T[P] and *T[P].
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// isPointer reports a pointer receiver.
func isPointer(e ast.Expr) bool {
	_, ok := e.(*ast.StarExpr)
	return ok
}
