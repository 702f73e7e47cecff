package otelpgxtx

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// refHarness is an instrumented pool of one connection through a proxy, with commit
// references on as opts say, and the log the library writes.
type refHarness struct {
	*harness
	proxy *pgtest.Proxy
	rec   *pgtest.Recording // the proxy's conversations from the start
	logs  *lockedBuffer
}

func newRefHarness(t *testing.T, base string, opts ...Option) *refHarness {
	t.Helper()
	proxy := pgtest.ProxyFor(t, srv)
	rec := proxy.Record()
	logs := &lockedBuffer{}
	opts = append([]Option{WithLogger(slog.New(slog.NewJSONHandler(logs, nil)))}, opts...)
	h := &refHarness{harness: newHarness(t, proxy.ConnString(base), 1, opts...), proxy: proxy, rec: rec, logs: logs}
	wantTLS(t, h.pool, strings.Contains(base, "sslmode=verify-full"))
	return h
}

// wantTLS checks that pool's connections are TLS, or not, as the transport says: a test
// over "tls" that fell back to plain TCP would prove nothing about TLS.
func wantTLS(t *testing.T, pool *pgxpool.Pool, want bool) {
	t.Helper()
	c, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	_, isTLS := c.Conn().PgConn().Conn().(*wire.Conn).NetConn().(*tls.Conn)
	if isTLS != want {
		t.Fatalf("connection is TLS: %v, want %v", isTLS, want)
	}
}

// plainInsert is a plain pgx transaction that inserts id into table and commits, with
// arm called right before COMMIT.
func plainInsert(ctx context.Context, pool *pgxpool.Pool, table string, id int, arm func(pgx.Tx)) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id) values ($1)", table), id); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	if arm != nil {
		arm(tx)
	}
	return tx.Commit(ctx)
}

// refOf returns a span's reference, parsed, and whether it has one.
func refOf(t *testing.T, s tracetest.SpanStub) (outcome.ReconciliationRef, bool) {
	t.Helper()
	v, ok := attr(s, ReconciliationRefKey)
	if !ok {
		return outcome.ReconciliationRef{}, false
	}
	ref, err := outcome.ParseReconciliationRef(v.AsString())
	if err != nil {
		t.Fatal(err)
	}
	return ref, true
}

// lastFrame returns the frame span that started last.
func lastFrame(t *testing.T, h *harness) tracetest.SpanStub {
	t.Helper()
	fs := h.frames()
	if len(fs) == 0 {
		t.Fatal("no frame span")
	}
	return fs[len(fs)-1]
}

// TestPlainReference: with WithCommitReference, a plain pgx transaction's COMMIT carries
// the xid read in the same write: the frame's reference names the xid that wrote the row,
// the commit takes as many round trips as without the option (counted at the proxy), and
// an indeterminate commit (the proxy cuts after COMMIT) is reconciled from it.
func TestPlainReference(t *testing.T) {
	overTransports(t, overPlainReference)
}

func overPlainReference(t *testing.T, base string) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	with := newRefHarness(t, base, WithCommitReference())
	without := newRefHarness(t, base)
	trips := func(h *refHarness, id int) int64 {
		h.proxy.ResetRoundTrips()
		if err := plainInsert(ctx, h.pool, table, id, nil); err != nil {
			t.Fatal(err)
		}
		return h.proxy.RoundTrips()
	}
	// The first transaction of each connection: connect, and with the option the identity
	// check, which goes ahead of BEGIN in BEGIN's own write.
	first, firstWithout := trips(with, 1), trips(without, 2)
	if first != firstWithout {
		t.Errorf("first transaction: %d round trips with the option, %d without", first, firstWithout)
	}
	n, nWithout := trips(with, 3), trips(without, 4)
	t.Logf("round trips per transaction: %d with the option, %d without (first: %d, %d)", n, nWithout, first, firstWithout)
	if n != nWithout {
		t.Errorf("%d round trips with the option, %d without", n, nWithout)
	}
	for i, id := range []int{1, 3} {
		ref, ok := refOf(t, with.frames()[i])
		if !ok {
			t.Fatalf("frame %d has no reference", i)
		}
		wantWrittenBy(t, ctx, table, id, ref.XID)
	}
	if _, ok := refOf(t, without.frames()[0]); ok {
		t.Error("a reference without the option")
	}

	// COMMIT waits for the (phantom) synchronous standby and its backend is terminated:
	// indeterminate, with the reference that the xid read brought before COMMIT answered.
	if err := plainInsert(ctx, with.pool, table, 5, func(tx pgx.Tx) { terminateInSyncRepWait(t, ctx, tx) }); err == nil {
		t.Fatal("the terminated commit succeeded")
	}
	last := lastFrame(t, with.harness)
	wantAttr(t, last, "tx.outcome", "indeterminate")
	ref, ok := refOf(t, last)
	if !ok {
		t.Fatal("the indeterminate frame has no reference")
	}
	if err := srv.WaitQuiet(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(without.pool, reconcile.WithWait(5*time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	res, err := rec.Resolve(ctx, ref, trace.SpanContext{})
	if err != nil {
		t.Fatal(err)
	}
	if committed := srv.RowExists(t, ctx, table, 5); res.Status() != reconcile.Committed || !committed {
		t.Fatalf("reconciled %v (%s), row present %v; want committed and present", res.Status(), res.Reason(), committed)
	}
	wantWrittenBy(t, ctx, table, 5, ref.XID)
	if !strings.Contains(with.logs.String(), ref.String()) {
		t.Errorf("the indeterminate log record has no reference %s:\n%s", ref, with.logs.String())
	}
}

// TestPlainMarker: with WithCommitMarker, the operation id goes out as the first statement
// of COMMIT's Query: one message, as many round trips as without; a commit cut before any
// reply still has its marker reference (xid 0), which reconciles aborted, fenced; one cut
// after COMMIT reconciles committed.
func TestPlainMarker(t *testing.T) {
	overTransports(t, overPlainMarker)
}

func overPlainMarker(t *testing.T, base string) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	h := newRefHarness(t, base, WithCommitMarker(marker))
	without := newRefHarness(t, base)
	for id := 1; id <= 2; id++ {
		h.proxy.ResetRoundTrips()
		without.proxy.ResetRoundTrips()
		if err := plainInsert(ctx, h.pool, table, id, nil); err != nil {
			t.Fatal(err)
		}
		if err := plainInsert(ctx, without.pool, table, 10+id, nil); err != nil {
			t.Fatal(err)
		}
		if a, b := h.proxy.RoundTrips(), without.proxy.RoundTrips(); a != b {
			t.Errorf("transaction %d: %d round trips with the marker, %d without", id, a, b)
		}
	}
	ref, ok := refOf(t, h.frames()[1])
	if !ok || !ref.HasMarker() || ref.XID == 0 {
		t.Fatalf("committed frame's reference %v %v, want a marker and its xid", ref, ok)
	}
	wantWrittenBy(t, ctx, table, 2, ref.XID)
	if n := srv.CountOf(t, ctx, "select count(*) from "+marker.Sanitize()+" where operation_id = $1", ref.Operation.String()); n != 1 {
		t.Fatalf("%d marker rows for %s", n, ref.Operation)
	}

	rec, err := reconcile.New(without.pool, reconcile.WithWait(5*time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cut  func(pgx.Tx)
		id   int
		want reconcile.Status
	}{{"before", func(pgx.Tx) { h.proxy.CutBeforeCommit() }, 20, reconcile.Aborted}, {"after", func(pgx.Tx) { h.proxy.CutAfterCommit() }, 21, reconcile.Committed}} {
		if err := plainInsert(ctx, h.pool, table, tc.id, tc.cut); err == nil {
			t.Fatalf("cut %s: the commit succeeded", tc.name)
		}
		ref, ok := refOf(t, lastFrame(t, h.harness))
		if !ok || !ref.HasMarker() {
			t.Fatalf("cut %s: reference %v %v, want a marker reference", tc.name, ref, ok)
		}
		if err := srv.WaitQuiet(ctx); err != nil {
			t.Fatal(err)
		}
		res, err := rec.Resolve(ctx, ref, trace.SpanContext{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status() != tc.want || srv.RowExists(t, ctx, table, tc.id) != (tc.want == reconcile.Committed) {
			t.Fatalf("cut %s: reconciled %v (%s), row present %v", tc.name, res.Status(), res.Reason(), srv.RowExists(t, ctx, table, tc.id))
		}
	}
}

// TestPlainReferenceLeavesTheRestAlone: with the option on, what the library adds nothing
// to is on the wire exactly as without it — a read-only transaction, one that wrote
// nothing, a batch with COMMIT, COMMIT AND CHAIN, BEGIN and COMMIT in one string, a
// rollback — once the connection's identity check is done, but for the xid read after the
// first write statement of a transaction, which is all it adds (COMMIT AND CHAIN's and the
// rollback's transactions, each a lone statement, and a string that begins the
// transaction and writes, "begin; insert …").
func TestPlainReferenceLeavesTheRestAlone(t *testing.T) {
	overTransports(t, overPlainReferenceLeavesTheRestAlone)
}

func overPlainReferenceLeavesTheRestAlone(t *testing.T, base string) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	work := func(pool *pgxpool.Pool) {
		// A write transaction first: its BEGIN carries the identity check with the option.
		if err := plainInsert(ctx, pool, table, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	untouched := func(pool *pgxpool.Pool) {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, ctx, tx, "select 1")
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		tx, err = pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, ctx, tx, "select 2", "set local work_mem = '8MB'")
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		tx, err = pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b := &pgx.Batch{}
		b.Queue(fmt.Sprintf("insert into %s (id) values (2)", table))
		b.Queue("commit")
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, ctx, conn, "begin", fmt.Sprintf("insert into %s (id) values (3)", table), "commit and chain",
			"select 4", "commit",
			fmt.Sprintf("begin; insert into %s (id) values (5); commit", table),
			"begin", fmt.Sprintf("insert into %s (id) values (6)", table), "rollback",
			fmt.Sprintf("begin; insert into %s (id) values (7)", table), "commit")
		conn.Release()
	}
	record := func(opts ...Option) []byte {
		if err := srv.Exec(ctx, "truncate "+table); err != nil {
			t.Fatal(err)
		}
		h := newRefHarness(t, base, opts...)
		work(h.pool)
		convs := h.rec.Conversations()
		if len(convs) != 1 {
			t.Fatalf("%d connections, want 1", len(convs))
		}
		before := len(convs[0].ClientBytes())
		untouched(h.pool)
		return convs[0].ClientBytes()[before:]
	}
	plain, with := record(), record(WithCommitReference())
	want := plain
	call := xidReadCall(t, ctx)
	for _, sql := range []string{"insert into %s (id) values (3)", "insert into %s (id) values (6)", "begin; insert into %s (id) values (7)"} {
		q, err := (&pgproto3.Query{String: fmt.Sprintf(sql, table)}).Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(want, q)
		if i < 0 {
			t.Fatalf("%q not found in %q", q, want)
		}
		want = slices.Concat(want[:i+len(q)], call, want[i+len(q):])
	}
	if !bytes.Equal(want, with) {
		t.Fatalf("client bytes with the option are not those without it and three xid reads:\nwant %q\nwith %q", want, with)
	}
	t.Logf("%d client bytes, identical but for the %d-byte xid read after the two lone writes and the string that began and wrote", len(plain), len(call))
}

// xidReadCall is the xid read's FunctionCall on the test server.
func xidReadCall(t *testing.T, ctx context.Context) []byte {
	t.Helper()
	oid := srv.CountOf(t, ctx, "select 'pg_catalog.pg_current_xact_id_if_assigned()'::pg_catalog.regprocedure::pg_catalog.oid::int")
	call, err := (&pgproto3.FunctionCall{Function: uint32(oid)}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	return call
}

// roleFor creates a login role named after prefix that may write table, and returns the
// test server's connection string as that role.
func roleFor(t *testing.T, ctx context.Context, prefix, table string) string {
	t.Helper()
	role := fmt.Sprintf("%s_%d", prefix, tableSeq.Add(1))
	if err := srv.Exec(ctx, "create role "+role+" login; grant all on table "+table+" to "+role); err != nil {
		t.Fatal(err)
	}
	return strings.Replace(srv.ConnString(), "postgres@", role+"@", 1)
}

// TestPlainReferenceCheckFails: a role that may not read the cluster identity turns commit
// references off for its connection, with one log record, at the first BEGIN; its
// transactions commit as without the option, without a reference.
func TestPlainReferenceCheckFails(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	base := roleFor(t, ctx, "noref", table)
	revokeIdentity(t, ctx)
	h := newRefHarness(t, base, WithCommitReference())
	for id := 1; id <= 3; id++ {
		if err := plainInsert(ctx, h.pool, table, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := refOf(t, lastFrame(t, h.harness)); ok {
		t.Error("a reference though the identity check failed")
	}
	if n := strings.Count(h.logs.String(), "commit references are off for this connection"); n != 1 {
		t.Fatalf("%d log records, want 1:\n%s", n, h.logs.String())
	}
	if !strings.Contains(h.logs.String(), "42501") {
		t.Errorf("the log record does not say why (SQLSTATE 42501):\n%s", h.logs.String())
	}
}

// terminateInSyncRepWait has tx's COMMIT, about to be sent, wait for the phantom
// synchronous standby, and terminates its backend there.
func terminateInSyncRepWait(t *testing.T, ctx context.Context, tx pgx.Tx) {
	t.Helper()
	var pid uint32 // the backend's: through PgBouncer the connection's PID is PgBouncer's
	if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := srv.TerminateInSyncRep(ctx, pid); err != nil {
			t.Error(err)
		}
	}()
}

// TestPlainReferenceAsyncMessages: with the xid read or the marker in COMMIT's write, the
// server's asynchronous messages still reach the application, whole and in order: the
// NOTICEs a deferred trigger raises while COMMIT runs, the NOTIFY the transaction sent
// (delivered with COMMIT's reply), and the "committed locally" WARNING of a
// synchronous-replication wait that is cancelled, which the classifier needs: that frame
// is committed, tx.commit.committed_locally, with its reference.
func TestPlainReferenceAsyncMessages(t *testing.T) {
	overTransports(t, func(t *testing.T, base string) {
		for _, mode := range []string{"xid", "marker"} {
			t.Run(mode, func(t *testing.T) { plainReferenceAsyncMessages(t, base, mode) })
		}
	})
}

func plainReferenceAsyncMessages(t *testing.T, base, mode string) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	if err := srv.Exec(ctx, fmt.Sprintf(`create function %[1]s_notice() returns trigger language plpgsql as $$
		begin raise notice 'n1 %%', new.id; raise notice 'n2 %%', new.id; return null; end $$;
		create constraint trigger %[1]s_t after insert on %[1]s deferrable initially deferred
		for each row execute function %[1]s_notice()`, table)); err != nil {
		t.Fatal(err)
	}
	opt := WithCommitReference()
	if mode == "marker" {
		opt = WithCommitMarker(reconciletest.NewMarkerTable(t, ctx, srv.Exec))
	}
	pgtest.LeakCheck(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	cfg, err := pgxpool.ParseConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	var mu sync.Mutex
	var got []string
	note := func(s string) { mu.Lock(); got = append(got, s); mu.Unlock() }
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { note("notice " + n.Message) }
	cfg.ConnConfig.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { note("notify " + n.Payload) }
	if _, err := InstrumentPool(cfg, WithTracerProvider(tp), opt); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for id := 1; id <= 2; id++ { // the first BEGIN carries the identity check
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, ctx, tx, "listen ch", fmt.Sprintf("insert into %s (id) values (%d)", table, id), fmt.Sprintf("notify ch, 'p%d'", id))
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	want := []string{"notice n1 1", "notice n2 1", "notify p1", "notice n1 2", "notice n2 2", "notify p2"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the application got %q, want %q", got, want)
	}
	mu.Unlock()

	// The synchronous-replication wait cancelled: the WARNING arrives before COMMIT's
	// tag, and the frame is committed locally.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, ctx, tx, fmt.Sprintf("insert into %s (id) values (3)", table), "set local synchronous_commit = on")
	pid := tx.Conn().PgConn().PID()
	go func() {
		if err := srv.WaitForWaitEvent(ctx, pid, "SyncRep"); err != nil {
			t.Error(err)
			return
		}
		if err := srv.Cancel(ctx, pid); err != nil {
			t.Error(err)
		}
	}()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var frames []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if _, ok := attr(s, FrameDepthKey); ok {
			frames = append(frames, s)
		}
	}
	if len(frames) != 3 {
		t.Fatalf("%d frames", len(frames))
	}
	for i, f := range frames {
		wantAttr(t, f, string(OutcomeKey), "committed")
		ref, ok := refOf(t, f)
		if !ok || mode == "marker" && !ref.HasMarker() {
			t.Fatalf("frame %d: reference %v %v", i, ref, ok)
		}
		wantWrittenBy(t, ctx, table, i+1, ref.XID)
	}
	wantAttr(t, frames[2], string(CommittedLocallyKey), "true")
}

// TestPlainReferenceThroughPgBouncer: plain pgx commit references through a real
// PgBouncer in transaction mode, over one server connection that three client
// connections take turns on: the identity check ahead of a client's first BEGIN and the
// xid read (a FunctionCall) or the marker ahead of its COMMIT go to whichever server
// connection the transaction gets, and each reference names the xid that wrote its row;
// a COMMIT whose backend is terminated in its synchronous-replication wait, which
// PgBouncer reports as its own FATAL, is indeterminate with a reference that reconciles
// committed through PgBouncer. Each reference is marked pooled: the identity check's
// backend is not the one pgx was told of, so it may not be the transaction's.
func TestPlainReferenceThroughPgBouncer(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	bouncer := pgtest.PgBouncerFor(t, ctx, srv, "transaction", 1)
	for _, mode := range []string{"xid", "marker"} {
		t.Run(mode, func(t *testing.T) {
			table := srv.NewTable(t, ctx, tableColumns)
			opt := WithCommitReference()
			if mode == "marker" {
				opt = WithCommitMarker(reconciletest.NewMarkerTable(t, ctx, srv.Exec))
			}
			h := newHarness(t, bouncer.ConnString()+"&default_query_exec_mode=exec", 3, opt)
			held := acquireConns(t, ctx, h.pool, 3)
			for id := 1; id <= 6; id++ {
				tx, err := held[id%3].Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				mustExec(t, ctx, tx, fmt.Sprintf("insert into %s (id) values (%d)", table, id))
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			tx, err := held[0].Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, ctx, tx, fmt.Sprintf("insert into %s (id) values (7)", table))
			terminateInSyncRepWait(t, ctx, tx)
			if err := tx.Commit(ctx); err == nil {
				t.Fatal("the terminated commit succeeded")
			}
			for _, c := range held {
				c.Release()
			}
			frames := h.frames()
			if len(frames) != 7 {
				t.Fatalf("%d frames", len(frames))
			}
			for i, f := range frames {
				ref, ok := refOf(t, f)
				if !ok || mode == "marker" && !ref.HasMarker() || !ref.Pooled {
					t.Fatalf("frame %d: reference %v %v, want one marked pooled", i, ref, ok)
				}
				if i < 6 {
					wantAttr(t, f, string(OutcomeKey), "committed")
					wantWrittenBy(t, ctx, table, i+1, ref.XID)
				}
			}
			last := frames[6]
			wantAttr(t, last, string(OutcomeKey), "indeterminate")
			ref, _ := refOf(t, last)
			if err := srv.WaitQuiet(ctx); err != nil {
				t.Fatal(err)
			}
			rec, err := reconcile.New(h.pool, reconcile.WithWait(5*time.Second, 10*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			res, err := rec.Resolve(ctx, ref, trace.SpanContext{})
			if err != nil || res.Status() != reconcile.Committed || !srv.RowExists(t, ctx, table, 7) {
				t.Fatalf("reconciled %v (%s), %v; row present %v", res.Status(), res.Reason(), err, srv.RowExists(t, ctx, table, 7))
			}
		})
	}
}

// TestPlainMarkerSerializationFailure: a SERIALIZABLE transaction doomed by another's
// commit fails at its next statement — with the marker, the insert ahead of COMMIT
// instead of COMMIT. The application sees what it sees without the marker: COMMIT fails
// with 40001 and the connection is idle and usable (pgx closes one left inside a failed
// transaction), and the frame is a retryable rollback. pgx's own
// TestTxCommitSerializationFailure found this (make test-pgx, marker mode).
func TestPlainMarkerSerializationFailure(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns) + "_sums"
	if err := srv.Exec(ctx, "create table "+table+" (num int)"); err != nil { // no key: the two do not wait on each other
		t.Fatal(err)
	}
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	for _, opts := range [][]Option{nil, {WithCommitMarker(marker)}} {
		h := newHarness(t, srv.ConnString(), 2, opts...)
		conns := acquireConns(t, ctx, h.pool, 2)
		c2 := conns[1]
		var txs []pgx.Tx
		for _, c := range conns {
			tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
			if err != nil {
				t.Fatal(err)
			}
			txs = append(txs, tx)
		}
		for _, tx := range txs {
			mustExec(t, ctx, tx, fmt.Sprintf("insert into %s (num) select coalesce(sum(num), 0) + 1 from %s", table, table))
		}
		if err := txs[0].Commit(ctx); err != nil {
			t.Fatal(err)
		}
		err := txs[1].Commit(ctx)
		if !strings.Contains(fmt.Sprint(err), "40001") || c2.Conn().IsClosed() || c2.Conn().PgConn().TxStatus() != 'I' {
			t.Fatalf("options %d: commit %v; closed %v, status %c; want 40001 on an idle connection", len(opts), err, c2.Conn().IsClosed(), c2.Conn().PgConn().TxStatus())
		}
		mustExec(t, ctx, c2, "select 1")
		for _, c := range conns {
			c.Release()
		}
		f := lastFrame(t, h)
		wantAttr(t, f, string(OutcomeKey), "rolled_back")
		wantAttr(t, f, string(RetryableKey), "true")
	}
}

// TestPooledReferenceAfterRestart: behind PgBouncer a client connection outlives a server
// restart, and with it the identity its check read; its next transaction runs on the
// restarted server. That COMMIT, terminated in its synchronous-replication wait after its
// commit record, is indeterminate with a reference naming the old incarnation and an xid
// of the new one, at or above the restart's checkpoint boundary. The row is there: the
// reconciler must not answer aborted by the boundary, and with the reference marked
// pooled it does not; the same reference without the mark is answered aborted, which is
// what a reference through a pooler got before it was marked.
func TestPooledReferenceAfterRestart(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	bouncer := pgtest.PgBouncerFor(t, ctx, srv, "transaction", 1)
	table := srv.NewTable(t, ctx, tableColumns)
	h := newHarness(t, bouncer.ConnString()+"&default_query_exec_mode=exec", 1, WithCommitReference())
	conn, err := h.pool.Acquire(ctx) // the one client connection, held throughout
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	insert := func(id int) pgx.Tx {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, ctx, tx, fmt.Sprintf("insert into %s (id) values (%d)", table, id))
		return tx
	}
	if err := insert(1).Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// PgBouncer's server connection died with the server: it may fail the first statement.
	if err := conn.Ping(ctx); err != nil {
		t.Logf("first ping after the restart: %v", err)
	}
	if conn.Conn().IsClosed() {
		t.Fatal("PgBouncer closed the client connection: the identity was not carried over the restart")
	}
	tx := insert(2)
	terminateInSyncRepWait(t, ctx, tx)
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the terminated commit succeeded")
	}
	frames := h.frames()
	last := frames[len(frames)-1]
	wantAttr(t, last, string(OutcomeKey), "indeterminate")
	ref, ok := refOf(t, last)
	if !ok || !ref.Pooled {
		t.Fatalf("reference %v (%v), want one marked pooled", ref, ok)
	}
	if err := srv.WaitQuiet(ctx); err != nil {
		t.Fatal(err)
	}
	if !srv.RowExists(t, ctx, table, 2) {
		t.Fatal("the commit terminated after its commit record is not there")
	}
	rec, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithWait(time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	unmarked := ref
	unmarked.Pooled = false
	for _, tc := range []struct {
		ref    outcome.ReconciliationRef
		want   reconcile.Status
		reason string
	}{
		{ref, reconcile.Unknown, reconcile.ReasonServerRestarted},
		{unmarked, reconcile.Aborted, ""}, // the boundary, wrong for this transaction
	} {
		got, err := rec.Resolve(ctx, tc.ref, trace.SpanContext{})
		t.Logf("%s: %s %q", tc.ref, got.Status(), got.Reason())
		if err != nil || got.Status() != tc.want || got.Reason() != tc.reason {
			t.Errorf("Resolve(%s) = %s %q, %v; want %s %q", tc.ref, got.Status(), got.Reason(), err, tc.want, tc.reason)
		}
	}
}

// TestPlainReferenceConnectionCut: plain pgx with WithCommitReference, the connection
// cut by a proxy as COMMIT passes — after it (the server committed) and before it (the
// server never read it). The xid read after the transaction's INSERT, in the INSERT's own
// write, brought the xid before COMMIT was written, so both frames end indeterminate with
// a reference naming the INSERT's xid, and automatic reconciliation and the reconciler
// settle them: committed, row present; aborted, row absent. Cut before COMMIT with the
// server's side left open (the server not told, the transaction idle in it), the answer is
// in_progress until a reconciler with WithTerminate ends the backend: aborted, and
// automatic reconciliation, which asks again, answers aborted too. Over TCP, TLS and PgBouncer
// (transaction pooling, the proxy between the client and PgBouncer), where the reference
// is pooled and the xid's status still answers.
func TestPlainReferenceConnectionCut(t *testing.T) {
	overTransports(t, func(t *testing.T, base string) { plainReferenceConnectionCut(t, base, nil) })
	t.Run("pgbouncer", func(t *testing.T) {
		bouncer := pgtest.PgBouncerFor(t, pgtest.ContextFor(t), srv, "transaction", 2)
		proxy, err := pgtest.NewProxy(strings.TrimPrefix(strings.Split(bouncer.ConnString(), "/postgres?")[0], "postgres://postgres@"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxy.Close() })
		plainReferenceConnectionCut(t, bouncer.ConnString()+"&default_query_exec_mode=exec", proxy)
	})
}

// plainReferenceConnectionCut runs TestPlainReferenceConnectionCut on base, through proxy
// (nil: a new one in front of the test server).
func plainReferenceConnectionCut(t *testing.T, base string, proxy *pgtest.Proxy) {
	ctx := pgtest.ContextFor(t)
	pgtest.LeakCheck(t) // registered first, so it runs after the tracer's Close
	table := srv.NewTable(t, ctx, tableColumns)
	answers := make(chan Reconciliation, 2)
	opts := []Option{WithCommitReference(), withAutoReconcile(t, srv.Pool(t, ctx),
		WithOnReconciled(func(r Reconciliation) { answers <- r }), WithRetryBackoff(10*time.Millisecond, 100*time.Millisecond))}
	var h *refHarness
	if proxy == nil {
		h = newRefHarness(t, base, opts...)
	} else {
		logs := &lockedBuffer{}
		opts = append(opts, WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
		h = &refHarness{harness: newHarness(t, proxy.ConnString(base), 1, opts...), proxy: proxy, logs: logs}
	}
	t.Cleanup(func() { _ = h.tracer.Close(context.Background()) })
	rec, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithWait(10*time.Second, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// The client gone, the server not told: the transaction stays open, in progress,
	// until a reconciler that may end its backend does (reconcile.WithTerminate).
	short, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithWait(50*time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	fence, err := reconcile.New(srv.Pool(t, ctx), reconcile.WithWait(50*time.Millisecond, 10*time.Millisecond), reconcile.WithTerminate())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		cut       func()
		id        int
		want      reconcile.Status
		committed bool
		held      bool
	}{
		{"after COMMIT", h.proxy.CutAfterCommit, 1, reconcile.Committed, true, false},
		{"before COMMIT", h.proxy.CutBeforeCommit, 2, reconcile.Aborted, false, false},
		{"before COMMIT, the server not told", h.proxy.HoldBeforeCommit, 3, reconcile.Aborted, false, true},
	} {
		resolve := func(ref outcome.ReconciliationRef) reconcile.Answer {
			t.Helper()
			r := rec
			if c.held {
				if res, err := short.Resolve(ctx, ref, trace.SpanContext{}); err != nil || res.Reason() != reconcile.ReasonInProgress {
					t.Fatalf("%s: without a fence %v %q, %v; want unknown in_progress", c.name, res.Status(), res.Reason(), err)
				}
				r = fence
			}
			res, err := r.Resolve(ctx, ref, trace.SpanContext{})
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		var xid uint64
		err := plainInsert(ctx, h.pool, table, c.id, func(tx pgx.Tx) {
			if err := tx.QueryRow(ctx, "select pg_catalog.pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
				t.Fatal(err)
			}
			c.cut()
		})
		if err == nil {
			t.Fatalf("%s: the commit through a cut connection succeeded", c.name)
		}
		last := lastFrame(t, h.harness)
		wantAttr(t, last, "tx.outcome", "indeterminate")
		ref, ok := refOf(t, last)
		if !ok || ref.XID != xid || ref.Pooled != (proxy != nil) {
			t.Fatalf("%s: the indeterminate frame's reference %v (present %v), want xid %d, pooled behind PgBouncer", c.name, ref, ok, xid)
		}
		if !strings.Contains(h.logs.String(), ref.String()) {
			t.Errorf("%s: the indeterminate log record, what the command reads, has no reference %s", c.name, ref)
		}
		res := resolve(ref)
		if present := srv.RowExists(t, ctx, table, c.id); res.Status() != c.want || present != c.committed {
			t.Fatalf("%s: reconciled %v (%s), row present %v", c.name, res.Status(), res.Reason(), present)
		}
		select {
		case r := <-answers:
			if r.Answer.Status() != c.want {
				t.Fatalf("%s: automatic reconciliation answered %v (%s)", c.name, r.Answer.Status(), r.Answer.Reason())
			}
		case <-ctx.Done():
			t.Fatalf("%s: automatic reconciliation never answered", c.name)
		}

		// Run on the same tracer: its COMMIT carries nothing either, and its result the
		// same reference.
		id := c.id + 10
		res2 := Run(ctx, h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (uint64, error) {
			var xid uint64
			if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id) values (%d)", table, id)); err != nil {
				return 0, err
			}
			err := tx.QueryRow(ctx, "select pg_catalog.pg_current_xact_id()::text::bigint").Scan(&xid)
			c.cut()
			return xid, err
		})
		ind, ok := res2.(outcome.Indeterminate[uint64])
		if !ok {
			t.Fatalf("%s: Run gave %T (%v)", c.name, res2, res2)
		}
		rref, ok := ind.Reference()
		if !ok || rref.XID == 0 {
			t.Fatalf("%s: Run's indeterminate result has reference %v (present %v)", c.name, rref, ok)
		}
		if res := resolve(rref); res.Status() != c.want || srv.RowExists(t, ctx, table, id) != c.committed {
			t.Fatalf("%s: Run's reference reconciled %v (%s), row present %v", c.name, res.Status(), res.Reason(), srv.RowExists(t, ctx, table, id))
		}
		<-answers
	}
}

// TestXIDReadWithCancelRequests: on a connection whose context watcher sends cancel
// requests (pgconn's CancelRequestContextWatcherHandler), a cancel request sent for a
// statement could land on the xid read that follows it and abort the transaction, so the
// read follows only a statement whose context can never be cancelled; with a cancellable
// one it goes with COMMIT, as before. Both transactions commit with their reference. On
// pgconn's default watcher (a deadline, no cancel request) the read follows the statement
// whatever its context.
func TestXIDReadWithCancelRequests(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	for _, cancels := range []bool{true, false} {
		cfg, err := pgx.ParseConfig(srv.ConnString())
		if err != nil {
			t.Fatal(err)
		}
		if cancels {
			cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
				return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, CancelRequestDelay: time.Second, DeadlineDelay: 2 * time.Second}
			}
		}
		exp := tracetest.NewInMemoryExporter()
		if _, err := InstrumentConnConfig(cfg, WithCommitReference(), WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		st := frame.State(conn.PgConn())
		for i, stmtCtx := range []context.Context{ctx, context.WithoutCancel(ctx)} {
			id := 10*len(exp.GetSpans()) + i + 1
			if cancels {
				id += 1000
			}
			tx, err := conn.Begin(stmtCtx)
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, stmtCtx, tx, fmt.Sprintf("insert into %s (id) values (%d)", table, id))
			early := st.Refs.Reading() != nil || st.Frame().CommitRef.XID() != 0
			if want := !cancels || stmtCtx.Done() == nil; early != want {
				t.Fatalf("cancel requests %v, context cancellable %v: the xid read followed the insert %v, want %v",
					cancels, stmtCtx.Done() != nil, early, want)
			}
			if err := tx.Commit(stmtCtx); err != nil {
				t.Fatal(err)
			}
		}
		for i, s := range exp.GetSpans() {
			if _, isFrame := attr(s, FrameDepthKey); !isFrame {
				continue
			}
			if ref, ok := refOf(t, s); !ok || ref.XID == 0 {
				t.Fatalf("cancel requests %v, frame %d: reference %v %v", cancels, i, ref, ok)
			}
		}
		_ = conn.Close(ctx)
	}
}

// TestXIDReadRefusedAfterCheck: the privilege to call the xid read's function revoked after
// the connection's check, so that the read after the INSERT fails for real (42501): the
// failure aborts the transaction, as a failed statement would, COMMIT answers ROLLBACK, and
// the frame is rolled back with the read's SQLSTATE as its cause — an error pgconn never
// saw, which the frame would otherwise not name.
func TestXIDReadRefusedAfterCheck(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	h := newRefHarness(t, roleFor(t, ctx, "xidrevoked", table), WithCommitReference())
	if err := plainInsert(ctx, h.pool, table, 1, nil); err != nil {
		t.Fatal(err)
	}
	if ref, ok := refOf(t, lastFrame(t, h.harness)); !ok || ref.XID == 0 {
		t.Fatalf("the first transaction's reference %v %v", ref, ok)
	}
	t.Cleanup(func() {
		if err := srv.Exec(context.WithoutCancel(ctx), "grant execute on function pg_catalog.pg_current_xact_id_if_assigned() to public"); err != nil {
			t.Error(err)
		}
	})
	if err := srv.Exec(ctx, "revoke execute on function pg_catalog.pg_current_xact_id_if_assigned() from public"); err != nil {
		t.Fatal(err)
	}
	vctx, v := NewVerdict(ctx)
	if err := plainInsert(vctx, h.pool, table, 2, nil); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("COMMIT after the refused read: %v, want pgx.ErrTxCommitRollback", err)
	}
	wantAttr(t, lastFrame(t, h.harness), string(OutcomeKey), "rolled_back")
	res, err := v.Result()
	rb, ok := res.(outcome.DeterminateRollback[struct{}])
	if pgErr, isPg := errors.AsType[*pgconn.PgError](rb.Cause()); err != nil || !ok || !isPg || pgErr.Code != "42501" {
		t.Fatalf("the verdict %T %v (%v), want a rollback caused by the read's 42501", res, res, err)
	}
	if srv.RowExists(t, ctx, table, 2) {
		t.Fatal("row 2 is there")
	}
}

// TestReferenceWithEvictedStatements: pgx closes the statements its cache evicted in a
// write of its own, just before the next statement's — here BEGIN's and COMMIT's, with a
// cache of one statement. The check ahead of BEGIN and the marker's call ahead of COMMIT
// wait for their statement's write, so the frame has its reference. (The soak found
// connections never checked, and marker calls never sent, this way.)
func TestReferenceWithEvictedStatements(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	table := srv.NewTable(t, ctx, tableColumns)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	for i, tc := range []struct {
		name   string
		opt    Option
		warmUp bool // a transaction first, which checks the connection: only COMMIT's case is left
	}{{"xid, the check ahead of BEGIN", WithCommitReference(), false},
		{"marker, the check ahead of BEGIN", WithCommitMarker(marker), false},
		{"marker, the call ahead of COMMIT", WithCommitMarker(marker), true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRefHarness(t, srv.ConnString()+"&statement_cache_capacity=1", tc.opt)
			if tc.warmUp {
				if err := plainInsert(ctx, h.pool, table, 100+i, nil); err != nil {
					t.Fatal(err)
				}
			}
			conn, err := h.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			// Two statements with arguments: the second evicts the first, closed at BEGIN.
			for _, q := range []string{"select $1::int", "select $1::text"} {
				if _, err := conn.Exec(ctx, q, "1"); err != nil {
					t.Fatal(err)
				}
			}
			closedBefore := closedStatements(h.rec.Conversations()[0].ClientBytes())
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The INSERT's statement evicts the last one, closed at COMMIT.
			if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id) values ($1)", table), i); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if n := closedStatements(h.rec.Conversations()[0].ClientBytes()) - closedBefore; n != 2 {
				t.Fatalf("pgx closed %d evicted statements, want 2 (at BEGIN and at COMMIT)", n)
			}
			ref, ok := refOf(t, lastFrame(t, h.harness))
			if withMarker := strings.HasPrefix(tc.name, "marker"); !ok || ref.XID == 0 || ref.HasMarker() != withMarker {
				t.Fatalf("reference %v %v, want the xid (and a marker: %v)", ref, ok, withMarker)
			}
			wantWrittenBy(t, ctx, table, i, ref.XID)
		})
	}
}

// closedStatements counts the Close messages for prepared statements in b, a client's
// bytes after the startup message (plain TCP): pgx closes those its statement cache
// evicted.
func closedStatements(b []byte) int {
	n := 0
	b = b[binary.BigEndian.Uint32(b):]
	for len(b) >= 5 {
		l := int(binary.BigEndian.Uint32(b[1:5]))
		if b[0] == 'C' && l > 4 && b[5] == 'S' {
			n++
		}
		b = b[min(1+l, len(b)):]
	}
	return n
}
