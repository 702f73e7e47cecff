package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// wantStatementChildren asserts that the frame has statement spans (from otelpgx) as
// children whose query texts are want, in order — with transaction-control statements as
// events of the frame (the default), those of want as the frame's events instead (see
// wantControlEvents).
func wantStatementChildren(t *testing.T, h *harness, f tracetest.SpanStub, want ...string) {
	t.Helper()
	folded := h.controlEvents
	var spans, ops []string
	for _, w := range want {
		if folded && evidence.Classify(w).Control() {
			ops = append(ops, otelpgx.SQLOperationName(context.Background(), w))
		} else {
			spans = append(spans, w)
		}
	}
	var got []string
	kids := h.children(f)
	slices.SortFunc(kids, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	for _, c := range kids {
		if v, ok := attr(c, "db.query.text"); ok {
			got = append(got, v.AsString())
			// The statement spans are the CLIENT calls; the INTERNAL frame only groups them.
			if c.SpanKind != trace.SpanKindClient {
				t.Fatalf("statement span %q kind %v, want CLIENT", c.Name, c.SpanKind)
			}
		}
	}
	if !slices.Equal(got, spans) {
		t.Fatalf("statement children of the frame = %q, want %q", got, spans)
	}
	wantControlEvents(t, f, ops...)
}

func wantParent(t *testing.T, f tracetest.SpanStub, parent trace.Span) {
	t.Helper()
	if f.Parent.SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("frame parent = %v, want the test root span %v", f.Parent.SpanID(), parent.SpanContext().SpanID())
	}
}

// frameContract asserts what every frame span has whatever its outcome.
func frameContract(t *testing.T, f tracetest.SpanStub, depth int) {
	t.Helper()
	if f.Name != DefaultSpanName || f.SpanKind != trace.SpanKindInternal {
		t.Fatalf("frame span = %q kind %v, want %q INTERNAL", f.Name, f.SpanKind, DefaultSpanName)
	}
	wantAttr(t, f, "db.system.name", "postgresql")
	wantAttr(t, f, "db.namespace", "postgres")
	wantAttr(t, f, "server.address", "127.0.0.1")
	wantAttr(t, f, "tx.frame.depth", fmt.Sprint(depth))
	if id := attrString(t, f, OperationIDKey); len(id) != 32 {
		t.Fatalf("tx.operation_id = %q, want 32 hex digits", id)
	}
	if _, ok := attr(f, schema.ServerPortKey); !ok {
		t.Fatal("no server.port")
	}
}

func TestSpanCommitted(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 2, opts...)
		table := srv.NewTable(t, ctx, tableColumns)
		rctx, root := rootSpan(ctx, h)
		tx, err := h.pool.BeginTx(rctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		ins := "insert into " + table + " (id, k) values (1, 1)"
		mustExec(t, rctx, tx, ins)
		if err := tx.Commit(rctx); err != nil {
			t.Fatal(err)
		}
		root.End()

		f := onlyFrame(t, h)
		frameContract(t, f, 0)
		wantParent(t, f, root)
		wantAttr(t, f, "tx.outcome", "committed")
		wantAttr(t, f, "tx.phase", "committed")
		wantAttr(t, f, "tx.isolation", "repeatable read")
		wantEvents(t, f, "tx.phase.active", "tx.phase.committing", "tx.phase.committed")
		wantStatus(t, f, codes.Ok, "")
		// The literals are recorded as placeholders by default.
		wantStatementChildren(t, h, f, "begin isolation level repeatable read", "insert into "+table+" (id, k) values (?, ?)", "commit")
		if _, ok := attr(f, schema.ErrorTypeKey); ok {
			t.Fatal("a committed frame has error.type")
		}
		if !srv.RowExists(t, ctx, table, 1) {
			t.Fatal("row absent after a committed outcome")
		}
	})
}

func TestSpanStrictStatus(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	h := newHarness(t, "", 1, WithStatusMapping(StatusStrict), WithSpanName("checkout"))
	tx := mustBegin(t, ctx, h.pool)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	f := onlyFrame(t, h)
	if f.Name != "checkout" {
		t.Fatalf("name = %q", f.Name)
	}
	wantAttr(t, f, "tx.outcome", "committed")
	wantStatus(t, f, codes.Unset, "")
}

func TestSpanDeliberateRollback(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 1, opts...)
		table := srv.NewTable(t, ctx, tableColumns)
		tx := mustBegin(t, ctx, h.pool)
		mustExec(t, ctx, tx, "insert into "+table+" (id, k) values (1, 1)")
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		f := onlyFrame(t, h)
		frameContract(t, f, 0)
		wantAttr(t, f, "tx.outcome", "rolled_back")
		wantAttr(t, f, "tx.phase", "rolled_back")
		wantEvents(t, f, "tx.phase.active", "tx.phase.rolled_back")
		wantStatus(t, f, codes.Unset, "")
		if srv.RowExists(t, ctx, table, 1) {
			t.Fatal("row present after rollback")
		}
	})
}

func TestSpanRollbackAfterStatementError(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 1, opts...)
		tx := mustBegin(t, ctx, h.pool)
		if _, err := tx.Exec(ctx, "select 1/0"); err == nil {
			t.Fatal("division by zero succeeded")
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		f := onlyFrame(t, h)
		wantAttr(t, f, "tx.outcome", "rolled_back")
		wantAttr(t, f, "db.response.status_code", "22012")
		wantAttr(t, f, "error.type", "server_error")
		wantStatus(t, f, codes.Error, schema.StatusDescriptionRolledBack)
	})
}

func TestSpanDeferredConstraintAtCommit(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 1, opts...)
		table := srv.NewTable(t, ctx, tableColumns)
		if err := srv.Exec(ctx, "insert into "+table+" (id, k) values (1, 7)"); err != nil {
			t.Fatal(err)
		}
		tx := mustBegin(t, ctx, h.pool)
		if _, err := tx.Exec(ctx, "insert into "+table+" (id, k) values (2, 7)"); err != nil {
			t.Fatal(err) // deferred: the violation waits for COMMIT
		}
		err := tx.Commit(ctx)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Fatalf("commit error = %v, want 23505", err)
		}
		f := onlyFrame(t, h)
		frameContract(t, f, 0)
		wantAttr(t, f, "tx.outcome", "rolled_back")
		wantAttr(t, f, "tx.retryable", "false")
		wantAttr(t, f, "db.response.status_code", "23505")
		wantAttr(t, f, "error.type", "constraint_violation")
		wantEvents(t, f, "tx.phase.active", "tx.phase.committing", "tx.phase.rolled_back")
		wantAnswer(t, h, f, "tx.phase.rolled_back", "COMMIT", "23505")
		wantStatus(t, f, codes.Error, schema.StatusDescriptionRolledBack)
		if srv.RowExists(t, ctx, table, 2) {
			t.Fatal("row present after a rollback at COMMIT")
		}
	})
}

// serializationFailureAtCommit runs the classic write-skew pair under SERIALIZABLE: both
// read what the other writes; the second COMMIT fails with 40001.
func serializationFailureAtCommit(t *testing.T, ctx context.Context, h *harness, table string) error {
	t.Helper()
	if err := srv.Exec(ctx, "insert into "+table+" (id, k, v) values (1, 1, 1), (2, 2, 2)"); err != nil {
		t.Fatal(err)
	}
	opts := pgx.TxOptions{IsoLevel: pgx.Serializable}
	tx1, err := h.pool.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	tx2, err := h.pool.BeginTx(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		tx  pgx.Tx
		sql string
	}{
		{tx1, "select sum(v) from " + table + " where k = 1"},
		{tx2, "select sum(v) from " + table + " where k = 2"},
		{tx1, "update " + table + " set v = v + 1 where k = 2"},
		{tx2, "update " + table + " set v = v + 1 where k = 1"},
	} {
		if _, err := step.tx.Exec(ctx, step.sql); err != nil {
			t.Fatalf("%s: %v", step.sql, err)
		}
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return tx2.Commit(ctx)
}

func TestSpanSerializationFailureAtCommit(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 2, opts...)
		table := srv.NewTable(t, ctx, tableColumns)
		err := serializationFailureAtCommit(t, ctx, h, table)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
			t.Fatalf("second commit error = %v, want 40001", err)
		}
		fs := h.frames()
		if len(fs) != 2 {
			t.Fatalf("want 2 frames, got %d", len(fs))
		}
		var failed tracetest.SpanStub
		for _, f := range fs {
			if v, _ := attr(f, OutcomeKey); v.AsString() == "rolled_back" {
				failed = f
			}
		}
		wantAttr(t, failed, "tx.retryable", "true")
		wantAttr(t, failed, "error.type", "serialization_failure")
		wantAttr(t, failed, "db.response.status_code", "40001")
		wantAttr(t, failed, "tx.isolation", "serializable")
		wantEvents(t, failed, "tx.phase.active", "tx.phase.committing", "tx.phase.rolled_back")
		wantAnswer(t, h, failed, "tx.phase.rolled_back", "COMMIT", "40001")
		wantStatus(t, failed, codes.Error, schema.StatusDescriptionRolledBack)
	})
}

// syncRepTerminate makes COMMIT wait for the phantom synchronous standby, terminates the
// backend while it waits, and returns the xid and the commit error.
func syncRepTerminate(t *testing.T, ctx context.Context, conn *pgx.Conn, table string, id int) (xid uint64, commitErr error) {
	t.Helper()
	tx := mustBegin(t, ctx, conn)
	if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id, k) values (%d, %d)", table, id, id)); err != nil {
		t.Fatal(err)
	}
	mustExec(t, ctx, tx, "set local synchronous_commit = on")
	if err := tx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	pid := conn.PgConn().PID()
	done := make(chan error, 1)
	go func() { done <- tx.Commit(ctx) }()
	if err := srv.TerminateInSyncRep(ctx, pid); err != nil {
		t.Fatal(err)
	}
	return xid, <-done
}

func TestSpanIndeterminateSyncRepTerminated(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 1, opts...)
		table := srv.NewTable(t, ctx, tableColumns)
		pc, err := h.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		xid, commitErr := syncRepTerminate(t, ctx, pc.Conn(), table, 1)
		pc.Release()
		if commitErr == nil {
			t.Fatal("commit succeeded after its backend was terminated")
		}
		f := onlyFrame(t, h)
		frameContract(t, f, 0)
		wantAttr(t, f, "tx.outcome", "indeterminate")
		wantAttr(t, f, "tx.phase", "unknown")
		wantAttr(t, f, "tx.commit.committed_locally", "true")
		wantEvents(t, f, "tx.phase.active", "tx.phase.committing", "tx.phase.unknown")
		wantStatus(t, f, codes.Unset, "")
		// Ground truth: the commit record was in local WAL.
		if st, ok, err := srv.XactStatus(ctx, xid); err != nil || !ok || st != "committed" {
			t.Fatalf("pg_xact_status = %q %v %v, want committed", st, ok, err)
		}
		if !srv.RowExists(t, ctx, table, 1) {
			t.Fatal("row absent")
		}
	})
}

func TestSpanIndeterminateProxyCut(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		for _, tc := range []struct {
			name    string
			arm     func(*pgtest.Proxy)
			present bool
		}{
			{"after commit", (*pgtest.Proxy).CutAfterCommit, true},
			{"before commit", (*pgtest.Proxy).CutBeforeCommit, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := pgtest.ContextFor(t)
				proxy := pgtest.ProxyFor(t, srv)
				h := newHarness(t, proxy.ConnString(srv.ConnString()), 1, opts...)
				table := srv.NewTable(t, ctx, tableColumns)
				tx := mustBegin(t, ctx, h.pool)
				mustExec(t, ctx, tx, "insert into "+table+" (id, k) values (1, 1)")
				tc.arm(proxy)
				if err := tx.Commit(ctx); err == nil {
					t.Fatal("commit through a cut connection succeeded")
				}
				f := onlyFrame(t, h)
				// Whether or not the server got COMMIT, the client cannot know: indeterminate.
				wantAttr(t, f, "tx.outcome", "indeterminate")
				wantAttr(t, f, "error.type", "connection_lost")
				wantEvents(t, f, "tx.phase.active", "tx.phase.committing", "tx.phase.unknown")
				wantStatus(t, f, codes.Unset, "")
				if err := srv.WaitQuiet(ctx); err != nil { // the cut backend may still be committing
					t.Fatal(err)
				}
				if got := srv.RowExists(t, ctx, table, 1); got != tc.present {
					t.Fatalf("row present = %v, want %v", got, tc.present)
				}
			})
		}
	})
}

func TestSpanNestedSuspendedOuter(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 2, opts...)
		table := srv.NewTable(t, ctx, tableColumns)
		rctx, root := rootSpan(ctx, h)
		octx, outer, err := Begin(rctx, h.pool, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, octx, outer, "insert into "+table+" (id, k) values (1, 1)")
		ictx, inner, err := Begin(octx, h.pool, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, ictx, inner, "insert into "+table+" (id, k) values (2, 2)")
		if err := inner.Commit(ictx); err != nil {
			t.Fatal(err)
		}
		if err := outer.Rollback(octx); err != nil {
			t.Fatal(err)
		}
		root.End()
		fs := h.frames()
		if len(fs) != 2 {
			t.Fatalf("want 2 frames, got %d", len(fs))
		}
		o, i := fs[0], fs[1]
		frameContract(t, o, 0)
		frameContract(t, i, 1)
		wantParent(t, o, root)
		if i.Parent.SpanID() != o.SpanContext.SpanID() {
			t.Fatal("inner frame is not a child of the outer frame span")
		}
		wantEvents(t, o, "tx.phase.active", "tx.suspended", "tx.resumed", "tx.phase.rolled_back")
		wantEvents(t, i, "tx.phase.active", "tx.phase.committing", "tx.phase.committed")
		wantAttr(t, i, "tx.outcome", "committed")
		wantAttr(t, o, "tx.outcome", "rolled_back")
		if srv.RowExists(t, ctx, table, 1) || !srv.RowExists(t, ctx, table, 2) {
			t.Fatal("want the inner row kept and the outer row gone")
		}
	})
}

func TestSpanSavepoints(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 1, opts...)
		table := srv.NewTable(t, ctx, tableColumns)
		tx := mustBegin(t, ctx, h.pool)
		sp := mustBegin(t, ctx, tx)
		mustExec(t, ctx, sp, "insert into "+table+" (id, k) values (1, 1)")
		if err := sp.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		sp2 := mustBegin(t, ctx, tx)
		mustExec(t, ctx, sp2, "insert into "+table+" (id, k) values (2, 2)")
		if err := sp2.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		f := onlyFrame(t, h)
		wantEvents(t, f, "tx.phase.active", "tx.savepoint.created", "tx.savepoint.rolled_back",
			"tx.savepoint.created", "tx.savepoint.released", "tx.phase.committing", "tx.phase.committed")
		var spNames []string
		for _, e := range f.Events {
			for _, kv := range e.Attributes {
				if kv.Key == schema.SavepointNameKey {
					spNames = append(spNames, kv.Value.AsString())
				}
			}
		}
		if !slices.Equal(spNames, []string{"sp_1", "sp_1", "sp_2", "sp_2"}) {
			t.Fatalf("savepoint names = %v", spNames)
		}
		wantAttr(t, f, "tx.outcome", "committed")
		if srv.RowExists(t, ctx, table, 1) || !srv.RowExists(t, ctx, table, 2) {
			t.Fatal("savepoint rollback/release not as expected in the table")
		}
	})
}

// TestSpanConcurrentFrames runs 64 goroutines over one pool: every frame's events and
// statement spans must belong to its own transaction.
func TestSpanConcurrentFrames(t *testing.T) {
	eachSpanSetting(t, func(t *testing.T, opts ...Option) {
		ctx := pgtest.ContextFor(t)
		h := newHarness(t, "", 8, opts...)
		table := srv.NewTable(t, ctx, tableColumns)
		const workers, perWorker = 64, 5
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				for i := range perWorker {
					id := w*perWorker + i
					wctx, span := h.tp.Tracer("test").Start(ctx, fmt.Sprintf("worker-%d", id))
					tx, err := h.pool.Begin(wctx)
					if err != nil {
						errs <- err
						return
					}
					_, err = tx.Exec(wctx, fmt.Sprintf("insert into %s (id, k) values (%d, %d)", table, id, id))
					if err == nil && id%3 == 0 {
						err = tx.Rollback(wctx)
					} else if err == nil {
						err = tx.Commit(wctx)
					}
					span.End()
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		parents := map[trace.SpanID]string{}
		for _, s := range h.exp.GetSpans() {
			if strings.HasPrefix(s.Name, "worker-") {
				parents[s.SpanContext.SpanID()] = strings.TrimPrefix(s.Name, "worker-")
			}
		}
		fs := h.frames()
		if len(fs) != workers*perWorker {
			t.Fatalf("frames = %d, want %d", len(fs), workers*perWorker)
		}
		for _, f := range fs {
			id := parents[f.Parent.SpanID()]
			if id == "" {
				t.Fatal("frame not parented to its worker span")
			}
			var n int
			fmt.Sscan(id, &n)
			ins := fmt.Sprintf("insert into %s (id, k) values (?, ?)", table) // literals sanitized
			// The frames end concurrently, each writing its attributes through one of
			// endSpan's pooled slices: none may carry another's, nor any left over.
			if f.DroppedAttributes != 0 {
				t.Fatalf("frame dropped %d attributes", f.DroppedAttributes)
			}
			if n%3 == 0 {
				wantEvents(t, f, "tx.phase.active", "tx.phase.rolled_back")
				wantStatementChildren(t, h, f, "begin", ins, "rollback")
				wantAttr(t, f, "tx.outcome", "rolled_back")
				wantAttr(t, f, "tx.retryable", "false")
			} else {
				wantEvents(t, f, "tx.phase.active", "tx.phase.committing", "tx.phase.committed")
				wantStatementChildren(t, h, f, "begin", ins, "commit")
				wantAttr(t, f, "tx.outcome", "committed")
				if v, ok := attr(f, RetryableKey); ok {
					t.Fatalf("committed frame has tx.retryable %v", v.String())
				}
			}
		}
		for id, n := range h.ends.ends {
			if n != 1 {
				t.Fatalf("span %v ended %d times", id, n)
			}
		}
	})
}

// TestSpanImplicitPrepareStaysUnderItsStatement: pgx prepares a statement with arguments
// inside the query call; the prepare belongs to that query's span, not beside it: by
// default an event of it, with WithInnerSpans(InnerSpanPrepare) a span under it.
func TestSpanImplicitPrepareStaysUnderItsStatement(t *testing.T) {
	for _, spans := range []bool{false, true} {
		t.Run(fmt.Sprintf("spans=%v", spans), func(t *testing.T) {
			var opts []Option
			if spans {
				opts = append(opts, WithInnerSpans(InnerSpanPrepare))
			}
			ctx := pgtest.ContextFor(t)
			h := newHarness(t, "", 1, opts...)
			rctx, root := rootSpan(ctx, h)
			tx := mustBegin(t, rctx, h.pool)
			var n int
			if err := tx.QueryRow(rctx, "select $1::int + 1", 41).Scan(&n); err != nil || n != 42 {
				t.Fatalf("n = %d, %v", n, err)
			}
			if err := tx.Commit(rctx); err != nil {
				t.Fatal(err)
			}
			root.End()
			f := onlyFrame(t, h)
			wantStatementChildren(t, h, f, "begin", "select $1::int + ?", "commit")
			var query tracetest.SpanStub
			for _, c := range h.children(f) {
				if v, _ := attr(c, "db.query.text"); v.AsString() == "select $1::int + ?" {
					query = c
				}
			}
			kids := h.children(query)
			if spans {
				if len(kids) != 1 || len(query.Events) != 0 {
					t.Fatalf("the query span has %d children and events %v, want its prepare span and no event", len(kids), eventNames(query))
				}
				return
			}
			if len(kids) != 0 || !slices.Equal(eventNames(query), []string{schema.EventPrepare}) {
				t.Fatalf("the query span has %d children and events %v, want its prepare event", len(kids), eventNames(query))
			}
			e := query.Events[0]
			name, _ := eventAttr(e, otelpgx.PrepareStmtNameKey)
			took, _ := eventAttr(e, schema.StatementDurationKey)
			if name.AsString() != "stmtcache" || took.AsFloat64() <= 0 || took.AsFloat64() > query.EndTime.Sub(query.StartTime).Seconds() {
				t.Fatalf("prepare event attributes %v: want pgx.prepare_stmt.name stmtcache and a duration within the query's", e.Attributes)
			}
		})
	}
}
