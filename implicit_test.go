package otelpgxtx

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// Implicit transactions against the real server: a write sent outside a transaction
// block, which PostgreSQL commits as soon as it has run, is a frame of its own, under
// real faults, on every way an application sends one.

// implicitText is in the SQL of every implicit write of these tests: the proxy takes the
// statements that hold it for commits (pgtest.Proxy.ImplicitCommits).
const implicitText = "/* implicit write */"

// implicitWay is one way an application sends an autocommit write of row id: plain pgx
// in each query mode, database/sql, a batch without BEGIN, a sqlc-style query on the
// pool.
type implicitWay struct {
	name  string
	write func(ctx context.Context, w *implicitSetup, id int) error
	// setup, if set, readies the pool's connection for write before a fault is armed.
	setup func(ctx context.Context, w *implicitSetup) error
}

var implicitWays = []implicitWay{
	{"pgx cache statement", pgxMode(pgx.QueryExecModeCacheStatement), nil},
	{"pgx cache describe", pgxMode(pgx.QueryExecModeCacheDescribe), nil},
	{"pgx describe exec", pgxMode(pgx.QueryExecModeDescribeExec), nil},
	{"pgx exec", pgxMode(pgx.QueryExecModeExec), nil},
	{"pgx simple protocol", pgxMode(pgx.QueryExecModeSimpleProtocol), nil},
	{"database/sql", func(ctx context.Context, w *implicitSetup, id int) error {
		_, err := w.db.ExecContext(ctx, w.insert(), id)
		return err
	}, nil},
	{"batch without BEGIN", func(ctx context.Context, w *implicitSetup, id int) error {
		b := &pgx.Batch{}
		b.Queue(w.insert(), id)
		b.Queue("update "+w.table+" set v = 1 where id = $1", id)
		return w.h.pool.SendBatch(ctx, b).Close()
	}, nil},
	{"sqlc-style query on the pool", func(ctx context.Context, w *implicitSetup, id int) error {
		_, err := sqlcQueries{db: w.h.pool}.CreateRow(ctx, w.table, id)
		return err
	}, nil},
	{"pgx prepared by name", func(ctx context.Context, w *implicitSetup, id int) error {
		return w.h.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
			if err := prepareImplicitInsert(ctx, w, c.Conn()); err != nil {
				return err
			}
			_, err := c.Exec(ctx, "implicit_insert", id)
			return err
		})
	}, func(ctx context.Context, w *implicitSetup) error {
		return w.h.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error { return prepareImplicitInsert(ctx, w, c.Conn()) })
	}},
}

// prepareImplicitInsert prepares w's insert on conn as "implicit_insert": on a connection
// that has it already, pgx answers without a word to the server.
func prepareImplicitInsert(ctx context.Context, w *implicitSetup, conn *pgx.Conn) error {
	_, err := conn.Prepare(ctx, "implicit_insert", w.insert())
	return err
}

// pgxMode is the way of pool.Exec in query mode m.
func pgxMode(m pgx.QueryExecMode) func(ctx context.Context, w *implicitSetup, id int) error {
	return func(ctx context.Context, w *implicitSetup, id int) error {
		_, err := w.h.pool.Exec(ctx, w.insert(), m, id)
		return err
	}
}

// sqlcQueries is what sqlc generates for a query, on the pool (its DBTX interface).
type sqlcQueries struct {
	db interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}
}

// CreateRow inserts row id and returns it, as a sqlc ":one" query with RETURNING.
func (q sqlcQueries) CreateRow(ctx context.Context, table string, id int) (int, error) {
	row := q.db.QueryRow(ctx, "insert into "+table+" (id, k) values ($1, $1) returning id "+implicitText, id)
	var got int
	err := row.Scan(&got)
	return got, err
}

// implicitSetup is one test's: a harness behind a proxy (one connection), references of
// mode, a table, and the database/sql handle on the same pool.
type implicitSetup struct {
	ctx    context.Context
	proxy  *pgtest.Proxy
	h      *harness
	db     *sql.DB
	table  string
	logs   *bytes.Buffer
	rec    *reconcile.Reconciler
	marker pgx.Identifier // the marker table, with the marker on
	// notices are the messages of the notices the pool's connections received, as pgconn
	// read them (the first 16; the rest are dropped).
	notices chan string
}

func newImplicit(t *testing.T, mode string, opts ...Option) *implicitSetup {
	t.Helper()
	return newImplicitOn(t, mode, "", opts...)
}

// newImplicitOn is newImplicit on the connection string base ("": the server through the
// proxy).
func newImplicitOn(t *testing.T, mode, base string, opts ...Option) *implicitSetup {
	t.Helper()
	w := &implicitSetup{ctx: pgtest.ContextFor(t), proxy: pgtest.ProxyFor(t, srv), logs: &bytes.Buffer{}, notices: make(chan string, 16)}
	// First, so that a caller's own OnNotice (a harnessConfig in opts) replaces it.
	opts = append([]Option{harnessConfig(func(c *pgxpool.Config) {
		c.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			select {
			case w.notices <- n.Message:
			default:
			}
		}
	})}, opts...)
	w.proxy.ImplicitCommits(implicitText)
	w.table = srv.NewTable(t, w.ctx, tableColumns)
	opts = append(opts, WithLogger(slog.New(slog.NewJSONHandler(w.logs, nil))))
	switch mode {
	case "xid":
		opts = append(opts, WithCommitReference())
	case "marker":
		w.marker = reconciletest.NewMarkerTable(t, w.ctx, srv.Exec)
		opts = append(opts, WithCommitMarker(w.marker))
	}
	if base == "" {
		base = w.proxy.ConnString(srv.ConnString())
	}
	w.h = newHarness(t, base, 1, opts...)
	if mode != "off" {
		// A connection's first implicit transaction carries the check of what the
		// references need; those after it, their reference.
		if _, err := w.h.pool.Exec(w.ctx, "update "+w.table+" set v = v where id = $1", -1); err != nil { // with an argument: the extended protocol
			t.Fatal(err)
		}
	}
	w.db = stdlib.OpenDBFromPool(w.h.pool)
	t.Cleanup(func() { _ = w.db.Close() })
	rec, err := reconcile.New(srv.Pool(t, w.ctx), reconcile.WithWait(20*time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	w.rec = rec
	return w
}

// insert is the write of row $1.
func (w *implicitSetup) insert() string {
	return "insert into " + w.table + " (id, k) values ($1, $1) " + implicitText
}

// pid is the backend of the pool's one connection.
func (w *implicitSetup) pid(t *testing.T) uint32 {
	t.Helper()
	c, err := w.h.pool.Acquire(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	return c.Conn().PgConn().PID()
}

// waitFatal waits until what the server sent before it ended the pool's connection has
// reached the client's socket, through the proxy.
func (w *implicitSetup) waitFatal(t *testing.T) {
	t.Helper()
	withConn(t, w.ctx, w.h, func(conn *pgx.Conn) {
		waitSocket(t, w.ctx, conn, func(n int, _ error) bool { return n > 0 })
	})
}

// implicitFrames returns the spans of implicit transactions' frames (tx.implicit), which
// are their statements' spans.
func (h *harness) implicitFrames() []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range h.exp.GetSpans() {
		if v, _ := attr(s, ImplicitKey); v.AsBool() {
			out = append(out, s)
		}
	}
	return out
}

// wantImplicitShape checks what an implicit frame on its statement's span (f) ended
// with o wrote there: committed, its outcome, kind and operation id and nothing of the
// rest of a frame (no phase event, no tx.phase, no tx.frame.depth); else the phase events
// of a frame, active and committing as the statement was handed over, then the last
// (tx.phase.<phase>), and a frame's attributes.
func wantImplicitShape(t *testing.T, f tracetest.SpanStub, o outcome.Outcome) {
	t.Helper()
	var phases []string
	for _, e := range eventNames(f) {
		if strings.HasPrefix(e, schema.EventPhasePrefix) {
			phases = append(phases, e)
		}
	}
	_, hasPhase := attr(f, PhaseKey)
	_, hasDepth := attr(f, FrameDepthKey)
	if _, ok := attr(f, OperationIDKey); !ok {
		t.Fatalf("%s implicit frame without %s: %v", o, OperationIDKey, f.Attributes)
	}
	if o == outcome.OutcomeCommitted {
		if len(phases) != 0 || hasPhase || hasDepth {
			t.Fatalf("committed implicit frame: phase events %v, tx.phase %v, tx.frame.depth %v: want none", phases, hasPhase, hasDepth)
		}
		return
	}
	if len(phases) != 3 || phases[0] != "tx.phase.active" || phases[1] != "tx.phase.committing" || !hasPhase || !hasDepth {
		t.Fatalf("%s implicit frame: phase events %v, tx.phase %v, tx.frame.depth %v", o, phases, hasPhase, hasDepth)
	}
	if v, _ := attr(f, PhaseKey); phases[2] != schema.EventPhasePrefix+v.AsString() {
		t.Fatalf("%s implicit frame: last phase event %s, tx.phase %s", o, phases[2], v.AsString())
	}
	for _, e := range f.Events {
		if strings.HasPrefix(e.Name, schema.EventPhasePrefix) && (e.Time.Before(f.StartTime) || e.Time.After(f.EndTime)) {
			t.Fatalf("%s implicit frame: %s at %v, outside its span (%v to %v)", o, e.Name, e.Time, f.StartTime, f.EndTime)
		}
	}
}

// implicitFault is a fault of an implicit write: hit runs while the write is on its way
// (sent, not yet answered), or arms what makes it fail; rows is how many rows of id the
// table may hold after it (the outcome decides which); want is the outcome.
type implicitFault struct {
	name   string
	arm    func(t *testing.T, w *implicitSetup, id int) // before the write
	hit    func(t *testing.T, w *implicitSetup, pid uint32)
	want   outcome.Outcome
	reason string
}

var implicitFaults = []implicitFault{
	{name: "none", want: outcome.OutcomeCommitted, reason: "committed"},
	{name: "unique violation", arm: func(t *testing.T, w *implicitSetup, id int) {
		mustOK(t, srv.Exec(w.ctx, fmt.Sprintf("insert into %s (id, k) values (%d, %d)", w.table, id+1, id)))
	}, want: outcome.OutcomeRolledBack, reason: "constraint_violation"},
	{name: "backend terminated while idle", arm: func(t *testing.T, w *implicitSetup, _ int) {
		pid := w.pid(t)
		mustOK(t, srv.Terminate(w.ctx, pid))
		mustOK(t, srv.WaitBackendGone(w.ctx, pid))
		w.waitFatal(t) // its FATAL waits in the socket
	}, want: outcome.OutcomeRolledBack, reason: "session_ended_before_commit"},
	{name: "server stopped (fast) and restarted while idle", arm: func(t *testing.T, w *implicitSetup, _ int) {
		// The pool's connection is held across the stop and the restart, so that the
		// pool's ping of a connection idle for over a second (pgxpool's ShouldPing) never
		// replaces it, however long the restart takes.
		c, err := w.h.pool.Acquire(w.ctx)
		mustOK(t, err)
		mustOK(t, srv.StopFast())     // its backend sends it FATAL 57P01 and ends
		mustOK(t, srv.Restart(w.ctx)) // the write goes to the old connection
		waitSocket(t, w.ctx, c.Conn(), func(n int, _ error) bool { return n > 0 })
		c.Release()
	}, want: outcome.OutcomeRolledBack, reason: "session_ended_before_commit"},
	{name: "proxy cut before the server read it", arm: func(t *testing.T, w *implicitSetup, _ int) { w.proxy.CutBeforeCommit() },
		want: outcome.OutcomeIndeterminate, reason: "connection_lost"},
	{name: "proxy cut after the server read it", arm: func(t *testing.T, w *implicitSetup, _ int) { w.proxy.CutAfterCommit() },
		want: outcome.OutcomeIndeterminate, reason: "connection_lost"},
	{name: "backend terminated while it waits for a lock", arm: lockRow, hit: func(t *testing.T, w *implicitSetup, pid uint32) {
		mustOK(t, srv.WaitForWaitEvent(w.ctx, pid, "transactionid"))
		mustOK(t, srv.Terminate(w.ctx, pid))
	}, want: outcome.OutcomeIndeterminate, reason: "server_fatal"},
	{name: "synchronous-replication wait ended early", arm: syncCommit, hit: func(t *testing.T, w *implicitSetup, pid uint32) {
		mustOK(t, srv.TerminateInSyncRep(w.ctx, pid))
	}, want: outcome.OutcomeIndeterminate},
	{name: "backend SIGKILLed in the synchronous-replication wait", arm: syncCommit, hit: func(t *testing.T, w *implicitSetup, pid uint32) {
		mustOK(t, srv.WaitForWaitEvent(w.ctx, pid, "SyncRep"))
		mustOK(t, srv.KillBackend(w.ctx, pid))
	}, want: outcome.OutcomeIndeterminate},
	{name: "server stopped immediately in the synchronous-replication wait", arm: syncCommit, hit: func(t *testing.T, w *implicitSetup, pid uint32) {
		mustOK(t, srv.WaitForWaitEvent(w.ctx, pid, "SyncRep"))
		mustOK(t, srv.StopImmediate())
		mustOK(t, srv.Restart(w.ctx))
	}, want: outcome.OutcomeIndeterminate},
}

// lockRow holds, in a transaction of another session left open until the test ends,
// row id's key: the write waits for that transaction.
func lockRow(t *testing.T, w *implicitSetup, id int) {
	t.Helper()
	c, err := pgx.Connect(w.ctx, srv.ConnString())
	mustOK(t, err)
	tx, err := c.Begin(w.ctx)
	mustOK(t, err)
	_, err = tx.Exec(w.ctx, fmt.Sprintf("insert into %s (id, k) values (%d, %d)", w.table, id, id+1))
	mustOK(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()); _ = c.Close(context.Background()) })
}

// syncCommit makes the pool's connection wait for its synchronous standby at commit,
// which the test server names and never has.
func syncCommit(t *testing.T, w *implicitSetup, _ int) {
	t.Helper()
	mustOK(t, func() error { _, err := w.h.pool.Exec(w.ctx, "set synchronous_commit = on"); return err }())
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestImplicitTransactionFaults: on every way an application sends an autocommit write,
// under each fault, with the references off, the xid and the marker, the write's frame
// ends with the outcome the evidence proves, on the statement's own span (tx.implicit,
// its phases, its status: Unset when indeterminate), counted, logged when
// indeterminate, told to a Verdict; and no outcome contradicts the table: committed has
// the row, rolled_back has none.
func TestImplicitTransactionFaults(t *testing.T) {
	seen := map[string]int{}
	for _, fault := range implicitFaults {
		for _, way := range implicitWays {
			for _, mode := range refModes {
				t.Run(fault.name+"/"+way.name+"/"+mode, func(t *testing.T) {
					w := newImplicit(t, mode)
					const id = 1
					if way.setup != nil {
						mustOK(t, way.setup(w.ctx, w))
					}
					if fault.arm != nil {
						fault.arm(t, w, id)
					}
					pid := w.pid(t)
					ctx, root := rootSpan(w.ctx, w.h)
					vctx, v := NewVerdict(ctx)
					done := make(chan error, 1)
					go func() { done <- way.write(vctx, w, id) }()
					if fault.hit != nil {
						fault.hit(t, w, pid)
					}
					werr := <-done
					root.End()
					if strings.Contains(fault.name, "proxy cut") || fault.hit != nil {
						mustOK(t, srv.WaitBackendGone(w.ctx, pid)) // it ran what it read
					}
					res, err := v.Result()
					if err != nil {
						t.Fatalf("verdict: %v (write: %v)", err, werr)
					}
					if res.Outcome() != fault.want {
						t.Fatalf("verdict %s (%v), want %s; write: %v", res.Outcome(), res, fault.want, werr)
					}
					row := srv.CountOf(t, w.ctx, "select count(*) from "+w.table+" where id = $1", id) == 1
					if fault.name == "backend terminated while it waits for a lock" {
						row = false // the lock holder's row, not yet committed, is not visible
					}
					switch res.Outcome() {
					case outcome.OutcomeCommitted:
						if !row {
							t.Fatal("committed, and the row is not there")
						}
					case outcome.OutcomeRolledBack:
						if row {
							t.Fatal("rolled back, and the row is there")
						}
					}
					seen[fmt.Sprintf("%s/%s row=%v", fault.name, res.Outcome(), row)]++
					frames := w.h.implicitFrames()
					if len(frames) != 1 {
						t.Fatalf("%d implicit frames, want 1: %v", len(frames), names(w.h.exp.GetSpans()))
					}
					f := frames[0]
					if len(w.h.frames()) != 0 {
						t.Fatalf("a frame span of its own beside the statement's: %v", names(w.h.frames()))
					}
					wantAttr(t, f, string(OutcomeKey), fault.want.String())
					if fault.reason != "" && fault.want != outcome.OutcomeCommitted {
						wantAttr(t, f, "error.type", fault.reason)
					}
					wantCode := map[outcome.Outcome]codes.Code{outcome.OutcomeCommitted: codes.Ok,
						outcome.OutcomeRolledBack: codes.Error, outcome.OutcomeIndeterminate: codes.Unset}[fault.want]
					if f.Status.Code != wantCode {
						t.Fatalf("status %v, want %v", f.Status.Code, wantCode)
					}
					wantImplicitShape(t, f, fault.want)
					if fault.want == outcome.OutcomeIndeterminate {
						if n := strings.Count(w.logs.String(), MessageIndeterminate); n != 1 || !strings.Contains(w.logs.String(), `"tx.implicit":true`) {
							t.Fatalf("%d log records, want 1, with tx.implicit: %s", n, w.logs)
						}
						noRef, _ := attr(f, NoReferenceKey)
						_, hasRef := attr(f, ReconciliationRefKey)
						// The marker always has one where the write is an extended-protocol
						// Sync group; the xid, where its reply (flushed before the commit)
						// arrived; neither for a simple Query.
						switch {
						case mode == "off":
							if hasRef || noRef.AsString() != "" {
								t.Fatalf("references off: reference %v, no_reference %q", hasRef, noRef.AsString())
							}
						case way.name == "pgx simple protocol":
							if hasRef || noRef.AsString() != "simple_protocol" {
								t.Fatalf("simple protocol: reference %v, no_reference %q", hasRef, noRef.AsString())
							}
						case mode == "marker" && !hasRef, !hasRef && noRef.AsString() != "xid_lost":
							t.Fatalf("mode %s: reference %v, no_reference %q", mode, hasRef, noRef.AsString())
						}
						if hasRef {
							// The reference settles it, or says why not, and never against the row.
							ref, err := outcome.ParseReconciliationRef(attrString(t, f, ReconciliationRefKey))
							mustOK(t, err)
							got := resolveTwice(t, w.ctx, w.rec, ref, srv)
							if got.Status() == reconcile.Committed && !row || (got.Status() == reconcile.Aborted || got.Status() == reconcile.NoWrites) && row {
								t.Fatalf("reconciled %s %q, row %v", got.Status(), got.Reason(), row)
							}
							seen[fmt.Sprintf("%s/%s reconciled %s %s", fault.name, mode, got.Status(), got.Reason())]++
						} else if mode != "off" {
							seen[fmt.Sprintf("%s/%s no reference (%s)", fault.name, mode, noRef.AsString())]++
						}
					}
					counts := w.h.sums(t, w.ctx, metrics.MetricDuration, OutcomeKey, ImplicitKey)
					want := int64(1)
					if mode != "off" && fault.want == outcome.OutcomeCommitted {
						want++ // the warm-up write of newImplicit
					}
					if n := counts["tx.outcome="+fault.want.String()+",tx.implicit=true"]; n != want {
						t.Fatalf("counted %v, want one implicit %s", nonZero(counts), fault.want)
					}
				})
			}
		}
	}
	for k, n := range seen {
		t.Logf("%s: %d", k, n)
	}
}

// TestImplicitRetry: Retry around attempts of autocommit writes never applies one twice:
// a cut before or after the server read the write leaves it indeterminate — not run again
// with the xid, which an implicit transaction cannot carry (1 attempt); with the marker,
// settled: aborted and run again (2 attempts), or committed (1) —; a serialization
// failure is run again;
// an attempt that committed one write and then failed is committed_with_post_commit_failure,
// not run again.
func TestImplicitRetry(t *testing.T) {
	for _, c := range []struct{ mode, cut string }{{"xid", "before"}, {"xid", "after"}, {"marker", "before"}, {"marker", "after"}} {
		cut := c.cut
		t.Run(c.mode+" cut "+cut, func(t *testing.T) {
			w := newImplicit(t, c.mode)
			attempts := 0
			res, err := Retry(w.ctx, 3, func(ctx context.Context) error {
				attempts++
				if attempts == 1 {
					if cut == "after" {
						w.proxy.CutAfterCommit()
					} else {
						w.proxy.CutBeforeCommit()
					}
				}
				pid := w.pid(t)
				_, err := w.h.pool.Exec(ctx, w.insert(), 1)
				if attempts == 1 {
					mustOK(t, srv.WaitBackendGone(w.ctx, pid))
				}
				return err
			}, WithReconciler(w.rec), WithReconcileWait(5*time.Second))
			wantAttempts, wantRows, want := 1, map[string]int{"before": 0, "after": 1}[cut], outcome.OutcomeIndeterminate
			if c.mode == "marker" {
				wantRows, want = 1, outcome.OutcomeCommitted
				if cut == "before" {
					wantAttempts = 2
				}
			}
			if attempts != wantAttempts || res.Outcome() != want {
				t.Fatalf("%d attempts, %T %v: want %d, %s", attempts, res, err, wantAttempts, want)
			}
			if n := srv.CountOf(t, w.ctx, "select count(*) from "+w.table); n != wantRows {
				t.Fatalf("%d rows, want %d", n, wantRows)
			}
		})
	}
	t.Run("commit then a failure", func(t *testing.T) {
		w := newImplicit(t, "off")
		attempts := 0
		res, err := Retry(w.ctx, 3, func(ctx context.Context) error {
			attempts++
			if _, err := w.h.pool.Exec(ctx, w.insert(), 1); err != nil {
				return err
			}
			_, err := w.h.pool.Exec(ctx, w.insert(), 1) // a unique violation
			return err
		})
		if attempts != 1 || res.Outcome() != outcome.OutcomeCommittedWithPostCommitFailure {
			t.Fatalf("%d attempts, %T %v: want 1, committed_with_post_commit_failure", attempts, res, err)
		}
		var pgErr *pgconn.PgError
		if r := res.(outcome.CommittedWithPostCommitFailure[struct{}]); !errors.As(r.Failure(), &pgErr) || pgErr.Code != "23505" {
			t.Fatalf("failure %v, want the unique violation", r.Failure())
		}
		if n := srv.CountOf(t, w.ctx, "select count(*) from "+w.table); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
	})
	t.Run("serialization failure run again", func(t *testing.T) {
		w := newImplicit(t, "off")
		// The server's own 40001, raised by the write itself (a function it calls, which
		// cannot commit inside: a DO block or CALL could, and would be no proven rollback).
		mustOK(t, srv.Exec(w.ctx, "create function "+w.table+"_retry_me() returns int language plpgsql as "+
			"$$ begin raise exception using errcode = 'serialization_failure', message = 'retry me'; end $$"))
		attempts := 0
		res, err := Retry(w.ctx, 3, func(ctx context.Context) error {
			attempts++
			if attempts == 1 {
				_, err := w.h.pool.Exec(ctx, "insert into "+w.table+" (id, k) values ("+w.table+"_retry_me(), 1) "+implicitText)
				return err
			}
			_, err := w.h.pool.Exec(ctx, w.insert(), 1)
			return err
		})
		if attempts != 2 || res.Outcome() != outcome.OutcomeCommitted || err != nil {
			t.Fatalf("%d attempts, %T %v: want 2, committed", attempts, res, err)
		}
		if n := srv.CountOf(t, w.ctx, "select count(*) from "+w.table); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
	})
}

// TestImplicitClientFailureAfterCommit: a sqlc-style query whose reply came whole, clean,
// but whose Scan failed in the client: the implicit transaction committed (PostgreSQL
// answered it without an error and went idle), so the frame is
// committed_with_post_commit_failure, the row there; the Verdict says so.
func TestImplicitClientFailureAfterCommit(t *testing.T) {
	w := newImplicit(t, "off")
	vctx, v := NewVerdict(w.ctx)
	var wrong []string // an int does not scan into a slice of strings
	err := w.h.pool.QueryRow(vctx, "insert into "+w.table+" (id, k) values (1, 1) returning id "+implicitText).Scan(&wrong)
	if err == nil {
		t.Fatal("the scan succeeded")
	}
	res, verr := v.Result()
	if verr != nil || res.Outcome() != outcome.OutcomeCommittedWithPostCommitFailure {
		t.Fatalf("%T %v, want committed_with_post_commit_failure", res, verr)
	}
	if !srv.RowExists(t, w.ctx, w.table, 1) {
		t.Fatal("the row is not there")
	}
}

// TestImplicitReadsAndFilter: reads sent idle are no frames; WithImplicitFilter leaves
// out the writes it rejects; statements that cannot run in a transaction block run as
// without the library.
func TestImplicitReadsAndFilter(t *testing.T) {
	w := newImplicit(t, "off", WithImplicitFilter(func(_ context.Context, sql string) bool { return !strings.Contains(sql, "skip me") }))
	ctx, root := rootSpan(w.ctx, w.h)
	mustExec(t, ctx, w.h.pool, "select 1", "show server_version", "set application_name = 'x'")
	if _, err := w.h.pool.Exec(ctx, "insert into "+w.table+" (id, k) values (1, 1) /* skip me */"); err != nil {
		t.Fatal(err)
	}
	mustExec(t, ctx, w.h.pool, "vacuum "+w.table, "create index concurrently on "+w.table+" (v)")
	root.End()
	frames := w.h.implicitFrames()
	if len(frames) != 2 {
		t.Fatalf("%d implicit frames, want 2 (vacuum, create index): %v", len(frames), names(frames))
	}
	for _, f := range frames {
		wantAttr(t, f, string(OutcomeKey), "committed")
	}
}

// TestRetryOneTrace: a Retry call is one trace: the otelpgxtx.retry span (from the
// provider of the span in its context) is the ancestor of every attempt's frames, which
// carry tx.attempt; each attempt is an event with its outcome, the settling of the
// indeterminate one an event with the reconciler's answer; the span ends with the call's
// outcome. Here the first attempt's COMMIT is cut before the server read it (settled
// aborted by the xid), the second commits, and an autocommit write of each attempt is a
// frame of the same trace.
func TestRetryOneTrace(t *testing.T) {
	w := newImplicit(t, "xid")
	ctx, root := rootSpan(w.ctx, w.h)
	attempts := 0
	res, err := Retry(ctx, 3, func(ctx context.Context) error {
		attempts++
		if _, err := w.h.pool.Exec(ctx, "insert into "+w.table+" (id, k) values ($1, $1)", 100+attempts); err != nil {
			return err
		}
		if attempts == 1 {
			w.proxy.CutBeforeCommit()
		}
		return pgx.BeginFunc(ctx, w.h.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "insert into "+w.table+" (id, k) values (1, 1)")
			return err
		})
	}, WithReconciler(w.rec), WithReconcileWait(5*time.Second))
	root.End()
	// The first attempt committed its autocommit write, then its transaction's commit
	// was lost; settled aborted, beside a commit: committed_with_post_commit_failure,
	// never run again.
	if attempts != 1 || res.Outcome() != outcome.OutcomeCommittedWithPostCommitFailure {
		t.Fatalf("%d attempts, %T %v: want 1, committed_with_post_commit_failure", attempts, res, err)
	}
	var retry tracetest.SpanStub
	for _, s := range w.h.exp.GetSpans() {
		if s.Name == schema.SpanNameRetry {
			retry = s
		}
	}
	if retry.Name == "" {
		t.Fatalf("no %s span: %v", schema.SpanNameRetry, names(w.h.exp.GetSpans()))
	}
	if retry.Parent.SpanID() != root.SpanContext().SpanID() {
		t.Fatal("the Retry span is not the caller's span's child")
	}
	frames := append(w.h.frames(), w.h.implicitFrames()...)
	if len(frames) != 2 {
		t.Fatalf("%d frames, want 2", len(frames))
	}
	for _, f := range frames {
		if f.SpanContext.TraceID() != retry.SpanContext.TraceID() {
			t.Fatal("a frame of another trace")
		}
		wantAttr(t, f, string(AttemptKey), "1")
	}
	wantEvents(t, retry, schema.EventRetryAttempt, schema.EventRetrySettled)
	wantAttr(t, retry, string(OutcomeKey), "committed_with_post_commit_failure")
	if n := srv.CountOf(t, w.ctx, "select count(*) from "+w.table); n != 1 {
		t.Fatalf("%d rows, want 1: the autocommit write once", n)
	}

	// Alone, the lost commit is settled aborted, and the attempt runs again.
	w.h.exp.Reset()
	attempts = 0
	ctx, root = rootSpan(w.ctx, w.h)
	res, err = Retry(ctx, 3, func(ctx context.Context) error {
		attempts++
		if attempts == 1 {
			w.proxy.CutBeforeCommit()
		}
		return pgx.BeginFunc(ctx, w.h.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "insert into "+w.table+" (id, k) values (2, 2)")
			return err
		})
	}, WithReconciler(w.rec), WithReconcileWait(5*time.Second))
	root.End()
	if attempts != 2 || res.Outcome() != outcome.OutcomeCommitted || err != nil {
		t.Fatalf("%d attempts, %T %v: want 2, committed", attempts, res, err)
	}
	for _, s := range w.h.exp.GetSpans() {
		if s.Name == schema.SpanNameRetry {
			retry = s
		}
	}
	wantEvents(t, retry, schema.EventRetryAttempt, schema.EventRetrySettled, schema.EventRetryAttempt)
	if v, _ := attr(tracetest.SpanStub{Attributes: retry.Events[1].Attributes}, ResolvedOutcomeKey); v.AsString() != "aborted" {
		t.Fatalf("settled %v, want aborted", retry.Events[1].Attributes)
	}
	wantAttr(t, retry, string(OutcomeKey), "committed")
	wantAttr(t, retry, string(AttemptKey), "2")
	if retry.Status.Code != codes.Ok {
		t.Fatalf("status %v", retry.Status.Code)
	}
	for i, f := range w.h.frames() {
		wantAttr(t, f, string(AttemptKey), fmt.Sprint(i+1))
		if f.SpanContext.TraceID() != retry.SpanContext.TraceID() {
			t.Fatal("a frame of another trace")
		}
	}
}

// TestImplicitInterplayModel: seeded, replayable sequences that mix on one pool what an
// application does — autocommit writes in every way, transactions committed and rolled
// back, reads, a proxy cut before or after a write's or a COMMIT's reaches the server —
// each step made with a Verdict of its own. After each step: every frame ended (no idle
// connection holds one), each transaction's outcome agrees with its rows (committed: all
// there; rolled back: none), and the step's Verdict is the attempt algebra's answer over
// its transactions. OTELPGXTX_IMPLICIT_SEED replays a sequence.
func TestImplicitInterplayModel(t *testing.T) {
	seed := testSeed(t, "OTELPGXTX_IMPLICIT_SEED")
	r := rand.New(rand.NewPCG(seed, 0))
	w := newImplicit(t, "off")
	id := 0
	seen := map[string]int{}
	for step := range 40 {
		vctx, v := NewVerdict(w.ctx)
		type txn struct{ ids []int } // the rows of one transaction of the step
		var txns []txn
		kind := r.IntN(4)
		commit := r.IntN(3) > 0
		cut := ""
		// A cut only where a write or a COMMIT will pass the proxy, so that it fires.
		if r.IntN(5) == 0 && (kind < 2 || kind == 2 && commit) {
			cut = []string{"before", "after"}[r.IntN(2)]
			if cut == "before" {
				w.proxy.CutBeforeCommit()
			} else {
				w.proxy.CutAfterCommit()
			}
		}
		pid := w.pid(t)
		cuts := w.proxy.Cuts()
		var err error
		switch kind {
		case 0: // an autocommit write, in a random way
			id++
			way := implicitWays[r.IntN(len(implicitWays))]
			err = way.write(vctx, w, id)
			txns = append(txns, txn{ids: []int{id}})
			seen["autocommit "+way.name]++
		case 1: // two autocommit writes, the second a duplicate of the first one's key half the time
			id += 2
			first, second := id-1, id
			if r.IntN(2) == 0 {
				second = first
			}
			_, err = w.h.pool.Exec(vctx, w.insert(), first)
			txns = append(txns, txn{ids: []int{first}})
			if err == nil {
				_, err = w.h.pool.Exec(vctx, w.insert(), second)
				if second != first {
					txns = append(txns, txn{ids: []int{second}})
				} else {
					txns = append(txns, txn{})
				}
			}
			seen["two autocommit writes"]++
		case 2: // a transaction of two writes, committed or rolled back
			id += 2
			err = pgx.BeginFunc(vctx, w.h.pool, func(tx pgx.Tx) error {
				for _, k := range []int{id - 1, id} {
					if _, err := tx.Exec(vctx, "insert into "+w.table+" (id, k) values ($1, $1)", k); err != nil {
						return err
					}
				}
				if !commit {
					return errors.New("rolled back on purpose")
				}
				return nil
			})
			txns = append(txns, txn{ids: []int{id - 1, id}})
			seen[fmt.Sprintf("transaction commit=%v", commit)]++
		case 3: // a read: no frame
			_, err = w.h.pool.Exec(vctx, "select count(*) from "+w.table)
			seen["read"]++
		}
		if cut != "" {
			if w.proxy.Cuts() != cuts+1 {
				t.Fatalf("step %d: the cut did not fire", step)
			}
			mustOK(t, srv.WaitBackendGone(w.ctx, pid)) // it ran what it read
		}
		// Each transaction against its rows.
		res, verr := v.Result()
		if kind == 3 {
			if verr == nil {
				t.Fatalf("step %d: a verdict for a read: %v", step, res)
			}
			continue
		}
		if verr != nil {
			t.Fatalf("step %d (kind %d, cut %q): no verdict: %v (err %v)", step, kind, cut, verr, err)
		}
		present := 0
		all := 0
		for _, x := range txns {
			for _, k := range x.ids {
				all++
				if srv.CountOf(t, w.ctx, "select count(*) from "+w.table+" where id = $1", k) == 1 {
					present++
				}
			}
		}
		switch res.Outcome() {
		case outcome.OutcomeCommitted:
			if present != all {
				t.Fatalf("step %d (kind %d, cut %q): committed, %d of %d rows", step, kind, cut, present, all)
			}
		case outcome.OutcomeRolledBack:
			if present != 0 {
				t.Fatalf("step %d (kind %d, cut %q): rolled back, %d of %d rows", step, kind, cut, present, all)
			}
		case outcome.OutcomeCommittedWithPostCommitFailure:
			if present == 0 {
				t.Fatalf("step %d (kind %d, cut %q): committed_with_post_commit_failure, no row", step, kind, cut)
			}
		}
		seen[fmt.Sprintf("verdict %s cut=%q", res.Outcome(), cut)]++
		w.h.wantNoFrames(t, w.ctx)
	}
	for k, n := range seen {
		t.Logf("%s: %d", k, n)
	}
}

// TestImplicitReferenceChangesNothing: what the application sees of its autocommit
// writes — results, RowsAffected, RETURNING rows, errors (SQLSTATE) — and the round trips
// they take are the same with the references off, the xid and the marker, over TCP, TLS
// and PgBouncer, for patterns an
// application has: inserts by every query mode, a batch, a failing insert, a read-only
// session (refused, and a temporary table, allowed), an UPDATE that matches nothing, and
// statements that cannot run in a transaction block (VACUUM, CREATE INDEX CONCURRENTLY),
// which must work as without the library.
func TestImplicitReferenceChangesNothing(t *testing.T) {
	type step struct {
		name string
		do   func(ctx context.Context, w *implicitSetup) string
	}
	exec := func(sql string, args ...any) func(ctx context.Context, w *implicitSetup) string {
		return func(ctx context.Context, w *implicitSetup) string {
			tag, err := w.h.pool.Exec(ctx, strings.ReplaceAll(sql, "T", w.table), args...)
			return seenOf(tag.String(), err)
		}
	}
	steps := []step{
		{"insert", exec("insert into T (id, k) values ($1, $1)", 1)},
		{"insert, describe exec", exec("insert into T (id, k) values ($1, $1)", pgx.QueryExecModeDescribeExec, 2)},
		{"insert, exec", exec("insert into T (id, k) values ($1, $1)", pgx.QueryExecModeExec, 3)},
		{"insert, simple protocol", exec("insert into T (id, k) values ($1, $1)", pgx.QueryExecModeSimpleProtocol, 4)},
		{"insert returning", func(ctx context.Context, w *implicitSetup) string {
			var id int
			err := w.h.pool.QueryRow(ctx, "insert into "+w.table+" (id, k) values ($1, $1) returning id * 10", 5).Scan(&id)
			return seenOf(fmt.Sprint(id), err)
		}},
		{"batch", func(ctx context.Context, w *implicitSetup) string {
			b := &pgx.Batch{}
			b.Queue("insert into "+w.table+" (id, k) values ($1, $1)", 6)
			b.Queue("update "+w.table+" set v = 7 where id = $1", 6)
			br := w.h.pool.SendBatch(ctx, b)
			t1, e1 := br.Exec()
			t2, e2 := br.Exec()
			return seenOf(t1.String()+"/"+t2.String(), errors.Join(e1, e2, br.Close()))
		}},
		{"unique violation", exec("insert into T (id, k) values ($1, $1)", 1)},
		{"update of nothing", exec("update T set v = 1 where id = $1", -5)},
		{"read-only session: refused", func(ctx context.Context, w *implicitSetup) string {
			c, err := w.h.pool.Acquire(ctx)
			if err != nil {
				return err.Error()
			}
			defer c.Release()
			mustExec(t, ctx, c.Conn(), "create temporary table if not exists implicit_temp (id int)", "set default_transaction_read_only = on")
			defer mustExec(t, ctx, c.Conn(), "set default_transaction_read_only = off")
			_, err = c.Exec(ctx, "insert into "+w.table+" (id, k) values ($1, $1)", 8)
			tag, err2 := c.Exec(ctx, "insert into implicit_temp values ($1)", 9)
			return seenOf("", err) + " | temporary: " + seenOf(tag.String(), err2)
		}},
		{"vacuum", exec("vacuum T")},
		{"create index concurrently", exec("create index concurrently if not exists T_v on T (v)")},
		{"database/sql", func(ctx context.Context, w *implicitSetup) string {
			r, err := w.db.ExecContext(ctx, "insert into "+w.table+" (id, k) values ($1, $1)", 10)
			if err != nil {
				return seenOf("", err)
			}
			n, _ := r.RowsAffected()
			return fmt.Sprint(n)
		}},
	}
	ctx := pgtest.ContextFor(t)
	bouncer := pgtest.PgBouncerFor(t, ctx, srv, "session", 1)
	for _, base := range []struct{ name, conn string }{{"tcp", ""}, {"tls", "tls"}, {"pgbouncer", bouncer.ConnString()}} {
		t.Run(base.name, func(t *testing.T) {
			var first map[string]string
			var firstTrips int64
			for _, mode := range refModes {
				conn := base.conn
				if conn == "tls" {
					conn = pgtest.ProxyFor(t, srv).ConnString(srv.TLSConnString())
				}
				w := newImplicitOn(t, mode, conn)
				mustExec(t, w.ctx, w.h.pool, "select 1") // the connection is made before the count
				w.proxy.ResetRoundTrips()
				got := map[string]string{}
				for _, s := range steps {
					got[s.name] = s.do(w.ctx, w)
				}
				trips := w.proxy.RoundTrips()
				if first == nil {
					first, firstTrips = got, trips
				} else {
					for _, s := range steps {
						if got[s.name] != first[s.name] {
							t.Errorf("%s, %s: the application saw %q; with the references off %q", mode, s.name, got[s.name], first[s.name])
						}
					}
					if base.conn == "" && trips != firstTrips {
						t.Errorf("%s: %d round trips; with the references off %d", mode, trips, firstTrips)
					}
				}
				if base.conn == "" {
					t.Logf("%s: %d round trips", mode, trips)
				}
				_ = w.db.Close()
				w.h.pool.Close() // its server connection goes back to PgBouncer's pool of one
			}
			for _, s := range steps {
				t.Logf("%s: %s", s.name, first[s.name])
			}
		})
	}
}

// resolveTwice resolves ref with rec, then again once s, the server rec asks, has handed
// out xids after it — those a crash or a failover may hand out again, the reference's among
// them — and fails unless both answers are the same; it returns the answer.
func resolveTwice(t *testing.T, ctx context.Context, rec *reconcile.Reconciler, ref outcome.ReconciliationRef, s *pgtest.Server) reconcile.Answer {
	t.Helper()
	got, err := rec.Resolve(ctx, ref, trace.SpanContext{})
	mustOK(t, err)
	for range 3 {
		mustOK(t, s.Exec(ctx, "select pg_catalog.pg_current_xact_id()"))
	}
	again, err := rec.Resolve(ctx, ref, trace.SpanContext{})
	mustOK(t, err)
	if again.Status() != got.Status() || again.Reason() != got.Reason() {
		t.Fatalf("reconciled %s %q, then after more xids %s %q", got.Status(), got.Reason(), again.Status(), again.Reason())
	}
	return got
}

// seenOf is what an application sees of a statement: its tag or result, or its error's
// SQLSTATE.
func seenOf(result string, err error) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		return "error " + pgErr.Code
	case err != nil:
		return "error " + err.Error()
	}
	return result
}

// TestImplicitFailover: an autocommit write, and a batch of two without BEGIN, that waits
// for its synchronous standby (the standby down) when the primary crashes and the standby
// is promoted: committed locally on the old primary, never replicated, so not on the new
// one. The frame is indeterminate, and its reference, asked on the new primary, never says
// committed: the marker's absence says aborted (no row is there); the xid, from the old
// timeline, aborted once a checkpoint of the new one bounds it (reconcile's decide; the
// runs here all answered so), else unknown.
func TestImplicitFailover(t *testing.T) {
	for _, mode := range []string{"xid", "marker"} {
		for _, way := range []string{"statement", "batch"} {
			testImplicitFailover(t, mode, way)
		}
	}
}

// testImplicitFailover is one case of TestImplicitFailover.
func testImplicitFailover(t *testing.T, mode, way string) {
	t.Run(mode+"/"+way, func(t *testing.T) {
		ctx := pgtest.ContextFor(t)
		c := startCluster(t, ctx)
		marker := pgx.Identifier{"public", "implicit_failover_marker"}
		ddl, err := reconcile.MarkerTableDDL(marker)
		mustOK(t, err)
		mustOK(t, c.Primary().Exec(ctx, ddl))
		opt := WithCommitReference()
		if mode == "marker" {
			opt = WithCommitMarker(marker)
		}
		h := newHarness(t, c.ConnString(), 1, opt)
		// The connection's first implicit transaction carries the check.
		if _, err := h.pool.Exec(ctx, "update t set id = id where id = $1", -1); err != nil {
			t.Fatal(err)
		}
		var pid uint32
		withConn(t, ctx, h, func(c *pgx.Conn) { pid = c.PgConn().PID() })
		mustOK(t, c.Standby().StopImmediate())
		rctx, root := rootSpan(ctx, h) // the statement's span, the frame's, needs a recording parent
		defer root.End()
		vctx, v := NewVerdict(rctx)
		done := make(chan error, 1)
		go func() {
			if way == "batch" {
				b := &pgx.Batch{}
				b.Queue("insert into t values ($1)", 1)
				b.Queue("insert into t values ($1)", 2)
				done <- h.pool.SendBatch(vctx, b).Close()
				return
			}
			_, err := h.pool.Exec(vctx, "insert into t values ($1)", 1)
			done <- err
		}()
		mustOK(t, c.Primary().WaitForWaitEvent(ctx, pid, "SyncRep"))
		mustOK(t, c.Promote(ctx))
		if err := <-done; err == nil {
			t.Fatal("the write answered though its primary crashed")
		}
		if res, err := v.Result(); err != nil || res.Outcome() != outcome.OutcomeIndeterminate {
			t.Fatalf("verdict %T %v, want indeterminate", res, err)
		}
		frames := h.implicitFrames()
		if len(frames) == 0 {
			t.Fatal("no implicit frame span")
		}
		f := frames[len(frames)-1]
		ref, ok := refOf(t, f)
		if !ok {
			t.Fatalf("no reference: %v", f.Attributes)
		}
		if clusterRowExists(t, ctx, c, 1) || clusterRowExists(t, ctx, c, 2) {
			t.Fatal("a write never replicated is on the promoted standby")
		}
		// The promotion requests the new timeline's first checkpoint and does not wait for
		// it; made, it bounds the lost xid, asked again after it is handed out again.
		mustOK(t, c.Primary().Exec(ctx, "checkpoint"))
		got := resolveTwice(t, ctx, clusterReconciler(t, ctx, c), ref, c.Primary())
		switch {
		case got.Status() == reconcile.Committed:
			t.Fatalf("reconciled committed on the new primary, where the row is not")
		case mode == "marker" && got.Status() != reconcile.Aborted:
			t.Fatalf("marker: %s %q, want aborted", got.Status(), got.Reason())
		}
		t.Logf("%s/%s: %s %s", mode, way, got.Status(), got.Reason())
	})
}

// TestImplicitAutoReconcile: automatic reconciliation settles an implicit transaction's
// indeterminate commit as an explicit one's: with the marker, a cut after the server read
// the write is answered committed, one before it aborted, each once, to the callback. The
// reconciler's connections wait until the cut backend ran what it read: asked earlier, its
// fence wins the race with the write still in the backend's socket, and the answer is
// aborted — soundly, the write then failing on the fenced marker — which would make this
// test's ground truth depend on timing.
func TestImplicitAutoReconcile(t *testing.T) {
	for _, cut := range []string{"before", "after"} {
		t.Run(cut, func(t *testing.T) {
			answers := make(chan Reconciliation, 4)
			ctx := pgtest.ContextFor(t)
			ran := make(chan struct{}) // closed once the cut backend is gone
			var gated atomic.Bool
			cfg, err := pgxpool.ParseConfig(srv.ConnString())
			mustOK(t, err)
			cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
				if gated.Load() {
					select {
					case <-ran:
					case <-ctx.Done():
						return false, ctx.Err()
					}
				}
				return true, nil
			}
			recPool, err := pgxpool.NewWithConfig(ctx, cfg)
			mustOK(t, err)
			t.Cleanup(recPool.Close)
			rec, err := reconcile.New(recPool, reconcile.WithWait(20*time.Millisecond, time.Millisecond))
			mustOK(t, err)
			w := newImplicit(t, "marker", WithAutoReconcile(rec, WithOnReconciled(func(r Reconciliation) { answers <- r })))
			t.Cleanup(func() { _ = w.h.tracer.Close(context.Background()) })
			if cut == "before" {
				w.proxy.CutBeforeCommit()
			} else {
				w.proxy.CutAfterCommit()
			}
			pid := w.pid(t)
			vctx, v := NewVerdict(w.ctx)
			gated.Store(true)
			if _, err := w.h.pool.Exec(vctx, w.insert(), 1); err == nil {
				t.Fatal("the write answered through the cut")
			}
			mustOK(t, srv.WaitBackendGone(w.ctx, pid))
			close(ran)
			res, err := v.Result()
			if err != nil || res.Outcome() != outcome.OutcomeIndeterminate {
				t.Fatalf("verdict %T %v, want indeterminate", res, err)
			}
			var got Reconciliation
			select {
			case got = <-answers:
			case <-w.ctx.Done():
				t.Fatal("no answer")
			}
			want := map[string]reconcile.Status{"before": reconcile.Aborted, "after": reconcile.Committed}[cut]
			if got.OperationID != res.OperationID() || got.Answer.Status() != want {
				t.Fatalf("answer %s %q for %s, want %s for %s", got.Answer.Status(), got.Answer.Reason(), got.OperationID, want, res.OperationID())
			}
			if row := srv.RowExists(t, w.ctx, w.table, 1); row != (want == reconcile.Committed) {
				t.Fatalf("row %v, answer %s", row, want)
			}
		})
	}
}

// TestImplicitReferenceNoWrites: an implicit transaction that wrote nothing (an UPDATE of
// no row: no xid) is settled no_writes by its reference, as an explicit one is; cut after
// the server read it, the marker's reference settles it too (its absence: nothing of the
// transaction is there). (With arguments: pgx sends Exec without any in the simple
// protocol.)
func TestImplicitReferenceNoWrites(t *testing.T) {
	for _, mode := range []string{"xid", "marker"} {
		t.Run(mode, func(t *testing.T) {
			w := newImplicit(t, mode)
			w.proxy.CutAfterCommit()
			ctx, root := rootSpan(w.ctx, w.h)
			_, err := w.h.pool.Exec(ctx, "update "+w.table+" set v = 1 where id = $1 "+implicitText, -1)
			root.End()
			if err == nil {
				t.Fatal("the cut did not fire")
			}
			if len(w.h.implicitFrames()) != 1 {
				t.Fatalf("frames: %v", names(w.h.exp.GetSpans()))
			}
			f := w.h.implicitFrames()[0]
			ref, ok := refOf(t, f)
			if mode == "xid" {
				if ok {
					t.Fatalf("a reference whose xid never came: %+v", ref)
				}
				return
			}
			if !ok {
				t.Fatal("no reference")
			}
			answer, err := w.rec.Resolve(w.ctx, ref, trace.SpanContext{})
			if err != nil || answer.Status() != reconcile.Aborted && answer.Status() != reconcile.NoWrites {
				t.Fatalf("%v %v", answer, err)
			}
		})
	}
	// Answered: the xid read found none.
	for _, mode := range []string{"xid", "marker"} {
		w := newImplicit(t, mode)
		ctx, root := rootSpan(w.ctx, w.h)
		if _, err := w.h.pool.Exec(ctx, "update "+w.table+" set v = 1 where id = $1", -1); err != nil {
			t.Fatal(err)
		}
		root.End()
		ref, ok := refOf(t, w.h.implicitFrames()[0])
		if !ok || ref.XID != 0 || ref.MarkerTable != "" {
			t.Fatalf("%s: reference %+v, %v: want the no-writes reference", mode, ref, ok)
		}
		answer, err := w.rec.Resolve(w.ctx, ref, trace.SpanContext{})
		if err != nil || answer.Status() != reconcile.NoWrites {
			t.Fatalf("%s: %v %v", mode, answer, err)
		}
	}
}

// TestImplicitReferenceCallFails: the marker function dropped after the connection
// checked it: the call inside the implicit transaction fails, which aborts it; pgconn is
// given the call's error after the statement's completion, where PostgreSQL puts a failed
// implicit commit's, so pgx reports the write failed; the frame is rolled_back, and the
// row is not there.
func TestImplicitReferenceCallFails(t *testing.T) {
	w := newImplicit(t, "marker")
	mustOK(t, srv.Exec(w.ctx, "drop function "+w.marker.Sanitize()+"(uuid)"))
	vctx, v := NewVerdict(w.ctx)
	_, err := w.h.pool.Exec(vctx, w.insert(), 1)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42883" {
		t.Fatalf("write: %v, want the call's 42883", err)
	}
	res, verr := v.Result()
	if verr != nil || res.Outcome() != outcome.OutcomeRolledBack {
		t.Fatalf("%T %v, want rolled_back", res, verr)
	}
	if srv.RowExists(t, w.ctx, w.table, 1) {
		t.Fatal("rolled back, and the row is there")
	}
	// The connection goes on.
	if _, err := w.h.pool.Exec(w.ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
}

// TestImplicitNoReferenceReasons: an indeterminate implicit transaction without a
// reference says why: the connection's first, which carried the check ("unchecked"); a
// statement that may not run in a transaction block ("no_transaction_block"); a write
// sent as a simple Query ("simple_protocol"); the xid's reply lost with the commit's
// ("xid_lost").
func TestImplicitNoReferenceReasons(t *testing.T) {
	w := newImplicit(t, "xid")
	cold := newHarness(t, w.proxy.ConnString(srv.ConnString()), 1, WithCommitReference())
	for _, c := range []struct {
		name, want string
		h          *harness
		write      func(ctx context.Context, h *harness) error
	}{
		{"the connection's first", "unchecked", cold, func(ctx context.Context, h *harness) error {
			_, err := h.pool.Exec(ctx, w.insert(), 1)
			return err
		}},
		{"VACUUM", "no_transaction_block", w.h, func(ctx context.Context, h *harness) error {
			_, err := h.pool.Exec(ctx, "vacuum "+w.table+" "+implicitText, pgx.QueryExecModeExec)
			return err
		}},
		{"simple protocol", "simple_protocol", w.h, func(ctx context.Context, h *harness) error {
			_, err := h.pool.Exec(ctx, w.insert(), pgx.QueryExecModeSimpleProtocol, 2)
			return err
		}},
		{"the xid's reply lost", "xid_lost", w.h, func(ctx context.Context, h *harness) error {
			_, err := h.pool.Exec(ctx, w.insert(), 3)
			return err
		}},
	} {
		if c.want != "unchecked" { // the last case's cut took the connection: check the next one
			_, err := c.h.pool.Exec(w.ctx, "update "+w.table+" set v = v where id = $1", -1)
			mustOK(t, err)
		}
		var pid uint32
		withConn(t, w.ctx, c.h, func(conn *pgx.Conn) { pid = conn.PgConn().PID() })
		c.h.exp.Reset()
		w.proxy.CutAfterCommit()
		ctx, root := rootSpan(w.ctx, c.h)
		if err := c.write(ctx, c.h); err == nil {
			t.Fatalf("%s: the write answered through the cut", c.name)
		}
		root.End()
		mustOK(t, srv.WaitBackendGone(w.ctx, pid))
		frames := c.h.implicitFrames()
		if len(frames) != 1 {
			t.Fatalf("%s: %d implicit frames", c.name, len(frames))
		}
		wantAttr(t, frames[0], string(OutcomeKey), "indeterminate")
		wantAttr(t, frames[0], string(NoReferenceKey), c.want)
	}
}

// TestImplicitPreparedByName: a statement the application prepared under a name, run by
// that name (pgx hands the tracer the name), is judged by the SQL it was prepared with: a
// SELECT makes no implicit transaction, an INSERT does — in a batch too — and carries the
// marker; a name prepared again with other SQL, which the server refuses, keeps its first
// SQL; the inner tracer's span still names what pgx gave it. A cut after the server read
// the write leaves it indeterminate, settled committed by its marker, and the row is
// there.
func TestImplicitPreparedByName(t *testing.T) {
	w := newImplicit(t, "marker")
	withConn(t, w.ctx, w.h, func(conn *pgx.Conn) {
		_, err := conn.Prepare(w.ctx, "read_row", "select k from "+w.table+" where id = $1")
		mustOK(t, err)
		_, err = conn.Prepare(w.ctx, "write_row", w.insert())
		mustOK(t, err)
		if _, err := conn.Prepare(w.ctx, "write_row", "select 1"); err == nil {
			t.Fatal("a name prepared again with other SQL was taken")
		}
		// The proxy forgets a name whose Parse the server refused: the cut's write has a
		// name of its own.
		_, err = conn.Prepare(w.ctx, "cut_row", w.insert())
		mustOK(t, err)
	})
	w.h.exp.Reset()
	ctx, root := rootSpan(w.ctx, w.h)
	var k int
	if err := w.h.pool.QueryRow(ctx, "read_row", 1).Scan(&k); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("read by name: %v", err)
	}
	if n := len(w.h.implicitFrames()); n != 0 {
		t.Fatalf("a read run by name made %d implicit frames", n)
	}
	vctx, v := NewVerdict(ctx)
	if _, err := w.h.pool.Exec(vctx, "write_row", 1); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("write_row", 2)
	mustOK(t, w.h.pool.SendBatch(vctx, b).Close())
	res, err := v.Result()
	if err != nil || res.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("verdict %v %v, want committed", res, err)
	}
	frames := w.h.implicitFrames()
	if len(frames) != 2 {
		t.Fatalf("%d implicit frames, want 2 (the write and the batch): %v", len(frames), names(w.h.exp.GetSpans()))
	}
	for _, f := range frames {
		wantAttr(t, f, string(OutcomeKey), "committed")
		if _, ok := refOf(t, f); !ok {
			t.Fatalf("%s: no marker on a write run by name", f.Name)
		}
	}
	if q, _ := attr(frames[0], "db.query.text"); q.AsString() != "write_row" {
		t.Fatalf("the statement span's db.query.text %q, want the name pgx gave", q.AsString())
	}
	// Under a cut after the server read it: indeterminate, settled by its marker once the
	// backend ran what it read (asked before, the reconciler's fence would win: aborted).
	w.h.exp.Reset()
	pid := w.pid(t)
	w.proxy.CutAfterCommit()
	if _, err := w.h.pool.Exec(ctx, "cut_row", 3); err == nil {
		t.Fatal("the write answered through the cut")
	}
	root.End()
	mustOK(t, srv.WaitBackendGone(w.ctx, pid))
	frames = w.h.implicitFrames()
	if len(frames) != 1 {
		t.Fatalf("%d implicit frames after the cut, want 1", len(frames))
	}
	wantAttr(t, frames[0], string(OutcomeKey), "indeterminate")
	ref, ok := refOf(t, frames[0])
	if !ok {
		t.Fatal("no marker")
	}
	got, err := w.rec.Resolve(w.ctx, ref, trace.SpanContext{})
	if err != nil || got.Status() != reconcile.Committed || !srv.RowExists(t, w.ctx, w.table, 3) {
		t.Fatalf("reconciled %v %v, row there %v; want committed and the row", got, err, srv.RowExists(t, w.ctx, w.table, 3))
	}
}

// TestPreparedNamesKept: which names a connection keeps (pgx's statement cache and
// unnamed statements are run by their SQL), and a refused preparation keeps nothing.
func TestPreparedNamesKept(t *testing.T) {
	for _, c := range []struct {
		name, sql string
		keep      bool
	}{
		{"", "insert into t values (1)", false},
		{"insert into t values (1)", "insert into t values (1)", false},
		{"stmtcache_0123abcd", "insert into t values (1)", false},
		{"write_row", "insert into t values (1)", true},
	} {
		if got := frame.KeepsName(c.name, c.sql); got != c.keep {
			t.Errorf("keepsName(%q, %q) = %v, want %v", c.name, c.sql, got, c.keep)
		}
	}
}

// TestImplicitFrameSpans: asked for (WithImplicitFrameSpans), or with a tracer of the
// application's, an implicit transaction's frame has a span of its own, as an explicit
// one's: "transaction", tx.implicit, its phases and outcome, the statement's span (if any)
// its child. With WithImplicitFrameSpans and no span in the caller's context — where
// otelpgx starts none, so the default frame has no span — the frame span is a root span;
// a cut after the server read the write leaves it indeterminate, status Unset, with its
// marker.
func TestImplicitFrameSpans(t *testing.T) {
	t.Run("asked outside any trace", func(t *testing.T) {
		w := newImplicit(t, "marker", WithImplicitFrameSpans())
		w.h.exp.Reset()
		if _, err := w.h.pool.Exec(w.ctx, w.insert(), 1); err != nil { // no span in w.ctx
			t.Fatal(err)
		}
		pid := w.pid(t)
		w.proxy.CutAfterCommit()
		if _, err := w.h.pool.Exec(w.ctx, w.insert(), 2); err == nil {
			t.Fatal("the write answered through the cut")
		}
		mustOK(t, srv.WaitBackendGone(w.ctx, pid))
		frames := w.h.frames()
		if len(frames) != 2 {
			t.Fatalf("%d frame spans, want 2: %v", len(frames), names(w.h.exp.GetSpans()))
		}
		for i, want := range []string{"committed", "indeterminate"} {
			f := frames[i]
			if f.Name != "transaction" || f.Parent.IsValid() {
				t.Fatalf("frame %d: %q, parent %v: want a root transaction span", i, f.Name, f.Parent.SpanID())
			}
			wantAttr(t, f, string(OutcomeKey), want)
			if v, _ := attr(f, ImplicitKey); !v.AsBool() {
				t.Fatalf("frame %d without tx.implicit", i)
			}
			if ev := eventNames(f); len(ev) < 3 || ev[0] != "tx.phase.active" || ev[1] != "tx.phase.committing" {
				t.Fatalf("frame %d: events %v", i, ev)
			}
			children := 0
			for _, s := range w.h.exp.GetSpans() {
				if s.Parent.SpanID() == f.SpanContext.SpanID() && s.Name == "INSERT" {
					children++
				}
			}
			if children != 1 {
				t.Fatalf("frame %d: %d INSERT statement spans under it, want 1", i, children)
			}
		}
		if frames[1].Status.Code != codes.Unset {
			t.Fatalf("indeterminate frame status %v, want Unset", frames[1].Status.Code)
		}
		ref, ok := refOf(t, frames[1])
		if !ok {
			t.Fatal("no marker on the indeterminate frame")
		}
		got, err := w.rec.Resolve(w.ctx, ref, trace.SpanContext{})
		if err != nil || got.Status() != reconcile.Committed || !srv.RowExists(t, w.ctx, w.table, 2) {
			t.Fatalf("reconciled %v %v; want committed and the row", got, err)
		}
	})
	t.Run("the application tracer", func(t *testing.T) {
		rec := &sqlRecorder{}
		w := newImplicit(t, "off", WithInnerTracer(rec))
		w.h.exp.Reset()
		ctx, root := rootSpan(w.ctx, w.h)
		if _, err := w.h.pool.Exec(ctx, w.insert(), 1); err != nil {
			t.Fatal(err)
		}
		root.End()
		frames := w.h.frames()
		if len(frames) != 1 || frames[0].Name != "transaction" || frames[0].Parent.SpanID() != root.SpanContext().SpanID() {
			t.Fatalf("frames %v, want one transaction span under the root", names(frames))
		}
		wantAttr(t, frames[0], string(OutcomeKey), "committed")
		if v, _ := attr(frames[0], ImplicitKey); !v.AsBool() {
			t.Fatal("no tx.implicit")
		}
		if !slices.Contains(rec.sqls, w.insert()) {
			t.Fatalf("the application's tracer got %q", rec.sqls)
		}
	})
}
