package otelpgxtx

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// Two-phase commit (PREPARE TRANSACTION) against the real server, whose pgtest
// configuration allows 10 prepared transactions: a prepared frame is participating and
// waits for its coordinator, a lost reply to PREPARE is indeterminate and never replayed,
// and the references (xid, marker) follow the prepared transaction's fate.

// refModes are the three ways a plain pgx COMMIT (or PREPARE) can carry a reference.
var refModes = []string{"off", "xid", "marker"}

// twoPhase is one test's setup: a harness behind a proxy with the references of mode, a
// table, the marker table, and a reconciler on the server itself.
type twoPhase struct {
	ctx    context.Context
	proxy  *pgtest.Proxy
	h      *harness
	table  string
	marker pgx.Identifier
	rec    *reconcile.Reconciler
	logs   *bytes.Buffer
	gids   []string
	pid    uint32 // the backend of the last transaction prepare began
}

func newTwoPhase(t *testing.T, mode string) *twoPhase {
	t.Helper()
	return newTwoPhaseOn(t, mode, srv.ConnString())
}

// newTwoPhaseOn is newTwoPhase through the proxy to base, the server's connection string
// (srv.TLSConnString: over TLS, which the proxy ends and reopens).
func newTwoPhaseOn(t *testing.T, mode, base string) *twoPhase {
	t.Helper()
	tp := &twoPhase{ctx: pgtest.ContextFor(t), proxy: pgtest.ProxyFor(t, srv), logs: &bytes.Buffer{}}
	tp.table = srv.NewTable(t, tp.ctx, tableColumns)
	tp.marker = reconciletest.NewMarkerTable(t, tp.ctx, srv.Exec)
	opts := []Option{WithLogger(slog.New(slog.NewJSONHandler(tp.logs, nil)))}
	switch mode {
	case "xid":
		opts = append(opts, WithCommitReference())
	case "marker":
		opts = append(opts, WithCommitMarker(tp.marker))
	}
	tp.h = newHarness(t, tp.proxy.ConnString(base), 2, opts...)
	rec, err := reconcile.New(srv.Pool(t, tp.ctx), reconcile.WithWait(20*time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	tp.rec = rec
	t.Cleanup(func() {
		// A prepared transaction outlives its session: none may outlive the test.
		for _, gid := range tp.gids {
			if tp.prepared(t, gid) {
				_ = srv.Exec(context.WithoutCancel(tp.ctx), "rollback prepared '"+gid+"'")
			}
		}
	})
	return tp
}

// gid returns a global transaction identifier of the test's own.
func (tp *twoPhase) gid(t *testing.T) string {
	g := fmt.Sprintf("%s_%d", strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()), len(tp.gids))
	tp.gids = append(tp.gids, g)
	return g
}

// prepared reports whether gid is a prepared transaction of the server.
func (tp *twoPhase) prepared(t *testing.T, gid string) bool {
	t.Helper()
	return srv.CountOf(t, context.WithoutCancel(tp.ctx), "select count(*) from pg_prepared_xacts where gid = $1", gid) == 1
}

// prepare runs, in ctx, the transaction of the tests: BEGIN, an INSERT of id, PREPARE
// TRANSACTION gid, then pgx's COMMIT (which the server answers with a warning: no
// transaction is in progress). It returns PREPARE's error.
func (tp *twoPhase) prepare(ctx context.Context, id int, gid string) error {
	tx, err := tp.h.pool.Begin(ctx)
	if err != nil {
		return err
	}
	tp.pid = tx.Conn().PgConn().PID()
	if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id, k) values (%d, %d)", tp.table, id, id)); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	_, err = tx.Exec(ctx, "prepare transaction '"+gid+"'")
	cerr := tx.Commit(ctx)
	if err == nil {
		err = cerr
	}
	return err
}

// frame returns the only frame span with tx.outcome want.
func (tp *twoPhase) frame(t *testing.T, want string) (f struct {
	attrs func(string) string
	code  codes.Code
}) {
	t.Helper()
	n := 0
	for _, s := range tp.h.frames() {
		if v, _ := attr(s, OutcomeKey); v.AsString() == want {
			n++
			f.code = s.Status.Code
			f.attrs = func(k string) string {
				v, _ := attr(s, attribute.Key(k))
				return v.String()
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d %s frames, want 1 (outcomes %v)", n, want, tp.h.outcomes())
	}
	return f
}

// TestTwoPhasePrepared: a transaction prepared by PREPARE TRANSACTION ends its frame
// participating, status Unset, tx.prepared — never rolled_back, which the coordinator's
// COMMIT PREPARED would contradict — with the references off, the xid and the marker; the
// Verdict says Participating. Asked while prepared, reconciliation answers unknown
// (prepared); after the coordinator's decision, what it decided. The marker row commits
// or rolls back with the prepared transaction.
func TestTwoPhasePrepared(t *testing.T) {
	for _, mode := range refModes {
		for _, commit := range []bool{true, false} {
			name := mode + "/rollback prepared"
			if commit {
				name = mode + "/commit prepared"
			}
			t.Run(name, func(t *testing.T) {
				tp := newTwoPhase(t, mode)
				gid := tp.gid(t)
				vctx, v := NewVerdict(tp.ctx)
				if err := tp.prepare(vctx, 1, gid); err != nil {
					t.Fatal(err)
				}
				if res, err := v.Result(); err != nil || res.Outcome() != outcome.OutcomeParticipating {
					t.Fatalf("verdict %v %v, want participating", res, err)
				}
				f := tp.frame(t, "participating")
				if f.code != codes.Unset || f.attrs("tx.prepared") != "true" || f.attrs("error.type") != "" {
					t.Fatalf("frame status %v, tx.prepared %q, error.type %q", f.code, f.attrs("tx.prepared"), f.attrs("error.type"))
				}
				if !tp.prepared(t, gid) || srv.RowExists(t, tp.ctx, tp.table, 1) {
					t.Fatal("not prepared, or visible before its coordinator decided")
				}
				if n := tp.h.sums(t, tp.ctx, metrics.MetricDuration, OutcomeKey, RollbackKey)["tx.outcome=participating"]; n != 1 {
					t.Fatalf("%s participating = %d, want 1", metrics.MetricDuration, n)
				}
				ref := f.attrs(string(ReconciliationRefKey))
				if (ref != "") != (mode != "off") {
					t.Fatalf("mode %s: reference %q", mode, ref)
				}
				var parsed outcome.ReconciliationRef
				if ref != "" {
					var err error
					if parsed, err = outcome.ParseReconciliationRef(ref); err != nil {
						t.Fatal(err)
					}
				}
				if mode == "xid" {
					if got, err := tp.rec.Resolve(tp.ctx, parsed, trace.SpanContext{}); err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonPrepared {
						t.Fatalf("while prepared: %s %q %v, want unknown prepared", got.Status(), got.Reason(), err)
					}
				}
				decision := "rollback prepared '" + gid + "'"
				if commit {
					decision = "commit prepared '" + gid + "'"
				}
				if err := srv.Exec(tp.ctx, decision); err != nil {
					t.Fatal(err)
				}
				if srv.RowExists(t, tp.ctx, tp.table, 1) != commit {
					t.Fatalf("row after %s: %v", decision, !commit)
				}
				if mode == "marker" {
					if n := srv.CountOf(t, tp.ctx, "select count(*) from "+tp.marker.Sanitize()); (n == 1) != commit {
						t.Fatalf("%d marker rows after %s", n, decision)
					}
				}
				if ref != "" {
					want := reconcile.Aborted
					if commit {
						want = reconcile.Committed
					}
					if got, err := tp.rec.Resolve(tp.ctx, parsed, trace.SpanContext{}); err != nil || got.Status() != want {
						t.Fatalf("after %s: %s %q %v, want %s", decision, got.Status(), got.Reason(), err, want)
					}
				}
				if strings.Contains(tp.logs.String(), "indeterminate") {
					t.Fatalf("a log record for a prepared frame: %s", tp.logs)
				}
			})
		}
	}
}

// TestTwoPhasePrepareReplyLost: the proxy cuts the connection as PREPARE TRANSACTION
// passes, after the server read it (it prepares) and before (it never does). Either way
// the client cannot tell: the frame is indeterminate, not retryable, with one log record,
// and Retry (with a reconciler) never runs the attempt again while the transaction may be
// prepared: after the cut after PREPARE the row is in the database exactly once, after
// the coordinator's COMMIT PREPARED. A cut before PREPARE is settled aborted where the
// frame has a reference, and Retry then runs the attempt again, once.
func TestTwoPhasePrepareReplyLost(t *testing.T) {
	for _, mode := range refModes {
		for _, after := range []bool{true, false} {
			name := mode + "/cut before prepare"
			if after {
				name = mode + "/cut after prepare"
			}
			t.Run(name, func(t *testing.T) {
				tp := newTwoPhase(t, mode)
				attempts := 0
				var gids []string
				res, err := Retry(tp.ctx, 3, func(ctx context.Context) error {
					attempts++
					gid := tp.gid(t)
					gids = append(gids, gid)
					if attempts == 1 {
						if after {
							tp.proxy.CutAfterCommit()
						} else {
							tp.proxy.CutBeforeCommit()
						}
					}
					err := tp.prepare(ctx, 1, gid)
					if attempts == 1 {
						// The backend the proxy cut runs what it read, then exits: only then
						// is what it did there to be seen.
						if err := srv.WaitBackendGone(tp.ctx, tp.pid); err != nil {
							t.Fatal(err)
						}
					}
					return err
				}, WithReconciler(tp.rec), WithReconcileWait(0))
				f := tp.frame(t, "indeterminate")
				if f.attrs("tx.retryable") != "" || f.code != codes.Unset {
					t.Fatalf("indeterminate frame: tx.retryable %q, status %v", f.attrs("tx.retryable"), f.code)
				}
				if n := strings.Count(tp.logs.String(), MessageIndeterminate); n != 1 {
					t.Fatalf("%d log records of the indeterminate frame, want 1: %s", n, tp.logs)
				}
				// Aborted, settled by the xid or the marker: before PREPARE reached the server;
				// or, with the marker, after, when the reconciler's fence took the marker's key
				// before the backend ran the call ahead of PREPARE, which then failed, so that
				// the transaction aborted for certain (a race both sides of which are right).
				settled := !after && mode != "off" || after && mode == "marker" && !tp.prepared(t, gids[0])
				wantAttempts := 1
				if settled {
					wantAttempts = 2
				}
				if attempts != wantAttempts {
					t.Fatalf("%d attempts, want %d (result %T, %v)", attempts, wantAttempts, res, err)
				}
				switch {
				case after && !settled:
					if _, ok := res.(outcome.Indeterminate[struct{}]); !ok {
						t.Fatalf("result %T %v, want Indeterminate", res, err)
					}
					if !tp.prepared(t, gids[0]) {
						t.Fatal("the server did not prepare the transaction the proxy cut after")
					}
					if ind := res.(outcome.Indeterminate[struct{}]); mode == "xid" {
						ae, ok := errors.AsType[*reconcile.AnswerError](ind.Cause())
						if !ok || ae.Answer.Reason() != reconcile.ReasonPrepared && ae.Answer.Reason() != reconcile.ReasonInProgress {
							t.Fatalf("cause %v, want the answer prepared (or in_progress, asked before the backend ran PREPARE)", ind.Cause())
						}
						// Asked once the backend is done: prepared, at once.
						got, err := reconcile.Indeterminate(tp.ctx, tp.rec, ind)
						if err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonPrepared {
							t.Fatalf("asked again: %s %q %v, want unknown prepared", got.Status(), got.Reason(), err)
						}
					}
					if err := srv.Exec(tp.ctx, "commit prepared '"+gids[0]+"'"); err != nil {
						t.Fatal(err)
					}
				case tp.prepared(t, gids[0]):
					t.Fatal("prepared, and run again")
				}
				if settled {
					if res.Outcome() != outcome.OutcomeParticipating || !tp.prepared(t, gids[1]) {
						t.Fatalf("second attempt: %T %v", res, err)
					}
					if err := srv.Exec(tp.ctx, "commit prepared '"+gids[1]+"'"); err != nil {
						t.Fatal(err)
					}
				}
				want := 1
				if !after && !settled {
					want = 0 // aborted, and not retried: nothing could tell
				}
				if n := srv.CountOf(t, tp.ctx, "select count(*) from "+tp.table); n != want {
					t.Fatalf("%d rows, want %d: a double application", n, want)
				}
			})
		}
	}
}

// TestTwoPhaseRun: Run models a function that prepares its transaction: Participating,
// no AfterCommit hook, never run again; Indeterminate with the function's error when it
// failed after PREPARE.
func TestTwoPhaseRun(t *testing.T) {
	tp := newTwoPhase(t, "xid")
	for _, failAfter := range []bool{false, true} {
		gid := tp.gid(t)
		calls, hooks := 0, 0
		res := Run(tp.ctx, tp.h.pool, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
			calls++
			if err := AfterCommit(ctx, func(context.Context) error { hooks++; return nil }); err != nil {
				return 0, err
			}
			if _, err := insertFn(tp.table, len(tp.gids))(ctx, tx); err != nil {
				return 0, err
			}
			if _, err := tx.Exec(ctx, "prepare transaction '"+gid+"'"); err != nil {
				return 0, err
			}
			if failAfter {
				return 0, errFnAfterPrepare
			}
			return 1, nil
		})
		want := outcome.OutcomeParticipating
		if failAfter {
			want = outcome.OutcomeIndeterminate
		}
		if res.Outcome() != want || calls != 1 || hooks != 0 || !tp.prepared(t, gid) {
			t.Fatalf("fail after %v: %T %v, %d calls, %d hooks, prepared %v", failAfter, res, res, calls, hooks, tp.prepared(t, gid))
		}
		if ind, ok := res.(outcome.Indeterminate[int]); ok && ind.Cause() != errFnAfterPrepare {
			t.Fatalf("cause %v, want the function's error", ind.Cause())
		}
	}
}

var errFnAfterPrepare = fmt.Errorf("the function failed after PREPARE TRANSACTION")

// TestTwoPhaseDatabaseSQL: database/sql's transaction, prepared, is participating too,
// with the references off, the xid and the marker.
func TestTwoPhaseDatabaseSQL(t *testing.T) {
	for _, mode := range refModes {
		t.Run(mode, func(t *testing.T) {
			tp := newTwoPhase(t, mode)
			db := stdlib.OpenDBFromPool(tp.h.pool)
			defer db.Close()
			gid := tp.gid(t)
			vctx, v := NewVerdict(tp.ctx)
			tx, err := db.BeginTx(vctx, &sql.TxOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(vctx, "insert into "+tp.table+" (id, k) values (1, 1)"); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(vctx, "prepare transaction '"+gid+"'"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if res, err := v.Result(); err != nil || res.Outcome() != outcome.OutcomeParticipating {
				t.Fatalf("verdict %T %v, want participating", res, err)
			}
			if f := tp.frame(t, "participating"); f.attrs("tx.prepared") != "true" || !tp.prepared(t, gid) {
				t.Fatal("database/sql: not a prepared frame")
			}
			if err := srv.Exec(tp.ctx, "commit prepared '"+gid+"'"); err != nil || !srv.RowExists(t, tp.ctx, tp.table, 1) {
				t.Fatalf("commit prepared: %v", err)
			}
		})
	}
}

// TestEndedUnobservedNotRolledBack: a transaction committed or rolled back past the tracer
// (through the PgConn) is found at the connection's next statement, release or close, and
// is never a rollback the library cannot prove. The connection follows what pgconn reads
// (every instrumented one does, references or not), and the frame ends as the server
// said: committed after its COMMIT, rolled back after its ROLLBACK; where the replies do
// not tell (a ROLLBACK TO SAVEPOINT and a COMMIT in one string), it is indeterminate
// (ended_unobserved), and the xid, where the frame has it, settles it.
func TestEndedUnobservedNotRolledBack(t *testing.T) {
	for _, mode := range []string{"off", "xid"} {
		for _, end := range []string{"commit", "rollback", "savepoint s; rollback to savepoint s; commit"} {
			for _, found := range []string{"next statement", "release", "close"} {
				t.Run(mode+"/"+end+"/"+found, func(t *testing.T) {
					tp := newTwoPhase(t, mode)
					pc, err := tp.h.pool.Acquire(tp.ctx)
					if err != nil {
						t.Fatal(err)
					}
					mustExec(t, tp.ctx, pc.Conn(), "begin", "insert into "+tp.table+" (id, k) values (1, 1)")
					if _, err := pc.Conn().PgConn().Exec(tp.ctx, end).ReadAll(); err != nil {
						t.Fatal(err)
					}
					switch found {
					case "next statement":
						mustExec(t, tp.ctx, pc.Conn(), "select 1")
						pc.Release()
					case "release":
						pc.Release()
					case "close":
						if err := pc.Hijack().Close(tp.ctx); err != nil {
							t.Fatal(err)
						}
					}
					committed := end != "rollback"
					want := "indeterminate"
					switch {
					case strings.Contains(end, ";"):
					case committed:
						want = "committed"
					default:
						want = "rolled_back"
					}
					f := tp.frame(t, want)
					if f.attrs("tx.retryable") == "true" {
						t.Fatal("a transaction ended past the tracer is retryable")
					}
					if want == "rolled_back" && f.attrs("tx.rollback") != "deliberate" {
						t.Fatalf("tx.rollback %q, want deliberate: the application's ROLLBACK", f.attrs("tx.rollback"))
					}
					if want != "indeterminate" {
						return
					}
					if f.attrs("error.type") != "ended_unobserved" {
						t.Fatalf("error.type %q", f.attrs("error.type"))
					}
					if mode == "off" {
						return
					}
					ref, err := outcome.ParseReconciliationRef(f.attrs(string(ReconciliationRefKey)))
					if err != nil {
						t.Fatal(err)
					}
					wantAnswer := reconcile.Aborted
					if committed {
						wantAnswer = reconcile.Committed
					}
					if got, err := tp.rec.Resolve(tp.ctx, ref, trace.SpanContext{}); err != nil || got.Status() != wantAnswer {
						t.Fatalf("%s %q %v, want %s", got.Status(), got.Reason(), err, wantAnswer)
					}
				})
			}
		}
	}
}

// TestEveryWriteTakesAReference: a transaction whose only write is CopyFrom, a SELECT …
// FOR UPDATE or a SELECT … INTO, or that ends with COMMIT AND CHAIN, gets the reference
// of its mode; the marker row and the xid settle it committed.
func TestEveryWriteTakesAReference(t *testing.T) {
	for _, mode := range []string{"xid", "marker"} {
		for _, shape := range []string{"copy from", "select for update", "select into", "commit and chain"} {
			t.Run(mode+"/"+shape, func(t *testing.T) {
				tp := newTwoPhase(t, mode)
				mustExec(t, tp.ctx, tp.h.pool, "insert into "+tp.table+" (id, k) values (7, 7)")
				withConn(t, tp.ctx, tp.h, func(c *pgx.Conn) {
					mustExec(t, tp.ctx, c, "begin")
					switch shape {
					case "copy from":
						if _, err := c.CopyFrom(tp.ctx, pgx.Identifier{tp.table}, []string{"id", "k"}, pgx.CopyFromRows([][]any{{1, 1}})); err != nil {
							t.Fatal(err)
						}
					case "select for update":
						mustExec(t, tp.ctx, c, "select * from "+tp.table+" where id = 7 for update")
					case "select into":
						mustExec(t, tp.ctx, c, "select * into temp t_into from "+tp.table)
					case "commit and chain":
						mustExec(t, tp.ctx, c, "insert into "+tp.table+" (id, k) values (1, 1)", "commit and chain")
					}
					mustExec(t, tp.ctx, c, "commit")
				})
				ref := frameRef(t, tp.h, "committed")
				if mode == "marker" && !ref.HasMarker() || mode == "xid" && ref.XID == 0 {
					t.Fatalf("reference %s, want the %s", ref, mode)
				}
				if got, err := tp.rec.Resolve(tp.ctx, ref, trace.SpanContext{}); err != nil || got.Status() != reconcile.Committed {
					t.Fatalf("%s %q %v, want committed", got.Status(), got.Reason(), err)
				}
			})
		}
	}
}

// TestTwoPhaseCoordinator: COMMIT PREPARED and ROLLBACK PREPARED, sent outside a
// transaction block, are frames of their own, with the outcomes of a COMMIT: committed,
// rolled_back (deliberate), or indeterminate when the reply is lost — cut before the
// server read the statement (the transaction still prepared) or after (decided). With the
// references on, the check their write carries reads the prepared transaction's xid: when
// its reply arrived (the proxy cuts between the two replies), the reference settles the
// lost decision both ways.
func TestTwoPhaseCoordinator(t *testing.T) {
	faults := []struct {
		name string
		arm  func(*pgtest.Proxy)
		// sent: the server read the decision; ref: the check's reply arrived.
		sent, ref bool
	}{
		{"answered", nil, true, true},
		{"cut before", (*pgtest.Proxy).CutBeforeCommit, false, false},
		{"cut between replies", (*pgtest.Proxy).CutBetweenReplies, true, true},
		{"cut after", (*pgtest.Proxy).CutAfterCommit, true, false},
	}
	for _, mode := range refModes {
		for _, commit := range []bool{true, false} {
			for _, fault := range faults {
				decision := "rollback prepared"
				if commit {
					decision = "commit prepared"
				}
				t.Run(mode+"/"+decision+"/"+fault.name, func(t *testing.T) {
					tp := newTwoPhase(t, mode)
					gid := tp.gid(t)
					if err := srv.Exec(tp.ctx, fmt.Sprintf("begin; insert into %s (id, k) values (1, 1); prepare transaction '%s'", tp.table, gid)); err != nil {
						t.Fatal(err)
					}
					if fault.arm != nil {
						fault.arm(tp.proxy)
					}
					vctx, v := NewVerdict(tp.ctx)
					pc, err := tp.h.pool.Acquire(tp.ctx)
					if err != nil {
						t.Fatal(err)
					}
					pid := pc.Conn().PgConn().PID()
					_, err = pc.Exec(vctx, decision+" '"+gid+"'")
					pc.Release()
					if fault.arm != nil {
						// The backend the proxy cut runs what it read, then exits.
						if err := srv.WaitBackendGone(tp.ctx, pid); err != nil {
							t.Fatal(err)
						}
					}
					res, verr := v.Result()
					if verr != nil {
						t.Fatal(verr)
					}
					// With the references off the write carries the decision alone: its reply is
					// the first, and the cut between replies comes after it.
					answered := fault.arm == nil || mode == "off" && fault.name == "cut between replies"
					want := "indeterminate"
					switch {
					case answered && commit:
						want = "committed"
					case answered:
						want = "rolled_back"
					}
					if res.Outcome().String() != want || (err == nil) != answered {
						t.Fatalf("verdict %T, error %v; want %s", res, err, want)
					}
					f := tp.frame(t, want)
					if want == "rolled_back" && f.attrs("tx.rollback") != "deliberate" {
						t.Fatalf("ROLLBACK PREPARED answered: tx.rollback %q", f.attrs("tx.rollback"))
					}
					if got := tp.prepared(t, gid); got == fault.sent {
						t.Fatalf("prepared after the decision: %v, want %v", got, !fault.sent)
					}
					if srv.RowExists(t, tp.ctx, tp.table, 1) != (commit && fault.sent) {
						t.Fatal("the row is not where the decision put it")
					}
					ref := f.attrs(string(ReconciliationRefKey))
					if wantRef := mode != "off" && fault.ref; (ref != "") != wantRef {
						t.Fatalf("reference %q, want one: %v", ref, wantRef)
					}
					if ref == "" {
						return
					}
					parsed, err := outcome.ParseReconciliationRef(ref)
					if err != nil || parsed.HasMarker() {
						t.Fatalf("reference %s (%v): want the prepared transaction's xid alone", ref, err)
					}
					wantAnswer := reconcile.Aborted
					if commit {
						wantAnswer = reconcile.Committed
					}
					if got, err := tp.rec.Resolve(tp.ctx, parsed, trace.SpanContext{}); err != nil || got.Status() != wantAnswer {
						t.Fatalf("%s %q %v, want %s", got.Status(), got.Reason(), err, wantAnswer)
					}
				})
			}
		}
	}
}

// TestTwoPhasePrepareRefused: the server's error in reply to PREPARE TRANSACTION (its gid
// already in use) is its word that the transaction rolled back — "If the PREPARE
// TRANSACTION command fails for any reason, it becomes a ROLLBACK" — so the frame is
// rolled_back, the row is not there, and only the first transaction stays prepared.
func TestTwoPhasePrepareRefused(t *testing.T) {
	tp := newTwoPhase(t, "xid")
	gid := tp.gid(t)
	if err := tp.prepare(tp.ctx, 1, gid); err != nil {
		t.Fatal(err)
	}
	vctx, v := NewVerdict(tp.ctx)
	err := tp.prepare(vctx, 2, gid)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "42710" {
		t.Fatalf("second PREPARE with the same gid: %v, want 42710", err)
	}
	res, verr := v.Result()
	if verr != nil || res.Outcome() != outcome.OutcomeRolledBack {
		t.Fatalf("verdict %T %v, want a rollback", res, verr)
	}
	if f := tp.frame(t, "rolled_back"); f.attrs("tx.rollback") != "failure" {
		t.Fatalf("tx.rollback %q", f.attrs("tx.rollback"))
	}
	if err := srv.Exec(tp.ctx, "commit prepared '"+gid+"'"); err != nil {
		t.Fatal(err)
	}
	if !srv.RowExists(t, tp.ctx, tp.table, 1) || srv.RowExists(t, tp.ctx, tp.table, 2) {
		t.Fatal("the refused PREPARE's row is there, or the first one's is not")
	}
}

// TestTwoPhasePrepareBackendFaults: PREPARE TRANSACTION waiting for synchronous
// replication (its record flushed locally, like a COMMIT's), its backend then ended by a
// real fault, with the xid reference. Terminated: the server warns the record is durable
// locally but not replicated, and ends the session — as for a COMMIT, indeterminate, with
// tx.commit.committed_locally. SIGKILLed: the postmaster recovers in place (same start
// time, same timeline) and replays the PREPARE's record; stopped immediately and started
// again: the same after a restart; the reply was lost: indeterminate. Each way the
// transaction is prepared, and reconciliation, asked after the fault (when the xid could
// be handed out again), answers prepared — never aborted, which the coordinator's COMMIT
// PREPARED would contradict — and after COMMIT PREPARED, committed, or unknown where the
// xid alone cannot rule out a reuse (crash_recovered, server_restarted).
func TestTwoPhasePrepareBackendFaults(t *testing.T) {
	for _, fault := range []struct {
		name string
		hit  func(ctx context.Context, pid uint32) error
		want string
	}{
		{"synchronous-replication wait ended early", srv.TerminateInSyncRep, "indeterminate"},
		{"SIGKILLed in the synchronous-replication wait", func(ctx context.Context, pid uint32) error {
			if err := srv.WaitForWaitEvent(ctx, pid, "SyncRep"); err != nil {
				return err
			}
			return srv.KillBackend(ctx, pid)
		}, "indeterminate"},
		{"server stopped immediately in the synchronous-replication wait", func(ctx context.Context, pid uint32) error {
			if err := srv.WaitForWaitEvent(ctx, pid, "SyncRep"); err != nil {
				return err
			}
			if err := srv.StopImmediate(); err != nil {
				return err
			}
			return srv.Restart(ctx)
		}, "indeterminate"},
	} {
		t.Run(fault.name, func(t *testing.T) {
			tp := newTwoPhase(t, "xid")
			gid := tp.gid(t)
			vctx, v := NewVerdict(tp.ctx)
			tx, err := tp.h.pool.Begin(vctx)
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, vctx, tx, "set local synchronous_commit = on", "insert into "+tp.table+" (id, k) values (1, 1)")
			pid := tx.Conn().PgConn().PID()
			done := make(chan error, 1)
			go func() {
				_, err := tx.Exec(vctx, "prepare transaction '"+gid+"'")
				done <- err
			}()
			if err := fault.hit(tp.ctx, pid); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err == nil {
				t.Fatal("PREPARE answered though its backend was ended")
			}
			_ = tx.Rollback(vctx)
			if res, err := v.Result(); err != nil || res.Outcome().String() != fault.want {
				t.Fatalf("verdict %T %v, want %s", res, err, fault.want)
			}
			f := tp.frame(t, fault.want)
			if !tp.prepared(t, gid) {
				t.Fatal("the transaction is not prepared")
			}
			ref, err := outcome.ParseReconciliationRef(f.attrs(string(ReconciliationRefKey)))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := tp.rec.Resolve(tp.ctx, ref, trace.SpanContext{}); err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonPrepared {
				t.Fatalf("%s %q %v, want unknown prepared", got.Status(), got.Reason(), err)
			}
			if err := srv.Exec(tp.ctx, "commit prepared '"+gid+"'"); err != nil {
				t.Fatal(err)
			}
			got, err := tp.rec.Resolve(tp.ctx, ref, trace.SpanContext{})
			if err != nil || got.Status() != reconcile.Committed && got.Reason() != reconcile.ReasonCrashRecovered && got.Reason() != reconcile.ReasonServerRestarted {
				t.Fatalf("after COMMIT PREPARED: %s %q %v, want committed (or unknown: a reuse not ruled out)", got.Status(), got.Reason(), err)
			}
			t.Logf("after COMMIT PREPARED: %s %s", got.Status(), got.Reason())
		})
	}
}

// TestTwoPhaseFailover: a transaction prepared on the primary of a real pair with
// synchronous replication (its PREPARE acknowledged, so the standby has it), then the
// primary crashed and the standby promoted: the new primary still holds it prepared, and
// reconciliation of the frame's xid reference, asked there (a later timeline, where xids
// may be handed out again), answers prepared; after the coordinator's COMMIT PREPARED on
// the new primary, the row is there and the answer is never aborted.
func TestTwoPhaseFailover(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	c := startCluster(t, ctx)
	h := newHarness(t, c.ConnString(), 1, WithCommitReference())
	vctx, v := NewVerdict(ctx)
	tx, err := h.pool.Begin(vctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, vctx, tx, "insert into t values (1)", "prepare transaction 'failover_g'")
	_ = tx.Commit(vctx)
	if res, err := v.Result(); err != nil || res.Outcome() != outcome.OutcomeParticipating {
		t.Fatalf("verdict %T %v, want participating", res, err)
	}
	ref := frameRef(t, h, "participating")
	if err := c.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	rec := clusterReconciler(t, ctx, c)
	if got, err := rec.Resolve(ctx, ref, trace.SpanContext{}); err != nil || got.Status() != reconcile.Unknown || got.Reason() != reconcile.ReasonPrepared {
		t.Fatalf("after the failover: %s %q %v, want unknown prepared", got.Status(), got.Reason(), err)
	}
	// The new primary's synchronous standby is the old primary, down: the decision waits
	// only for the local flush.
	conn, err := c.Primary().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	mustExec(t, ctx, conn, "set synchronous_commit = local", "commit prepared 'failover_g'")
	if !clusterRowExists(t, ctx, c, 1) {
		t.Fatal("the prepared row is not on the new primary after COMMIT PREPARED")
	}
	got, err := rec.Resolve(ctx, ref, trace.SpanContext{})
	if err != nil || got.Status() == reconcile.Aborted {
		t.Fatalf("after COMMIT PREPARED on the new primary: %s %q %v", got.Status(), got.Reason(), err)
	}
	t.Logf("after COMMIT PREPARED on the new primary: %s %s", got.Status(), got.Reason())
}

// TestTwoPhaseCommitPreparedBackendFaults: COMMIT PREPARED, sent idle (a frame of its
// own), waiting for synchronous replication after its commit record is flushed locally,
// its backend then ended by a real fault, with the references off and the xid (read ahead
// of the decision from pg_prepared_xacts); and a backend terminated while the session was
// idle, before the decision was written. In the wait: indeterminate; the transaction is no
// longer prepared and its row is there (after crash recovery, or the restart), and its
// reference, asked then, answers committed — or unknown where the xid alone cannot rule out
// a reuse (crash_recovered, server_restarted) —, never aborted. Terminated while idle: the
// FATAL was waiting before the decision left, so the decision never ran
// (session_ended_before_commit), yet the frame is indeterminate, not rolled back: the
// transaction is still prepared, its coordinator's to decide; no row.
func TestTwoPhaseCommitPreparedBackendFaults(t *testing.T) {
	inWait := func(fault func(ctx context.Context, pid uint32) error) func(ctx context.Context, pid uint32) error {
		return func(ctx context.Context, pid uint32) error {
			if err := srv.WaitForWaitEvent(ctx, pid, "SyncRep"); err != nil {
				return err
			}
			return fault(ctx, pid)
		}
	}
	for _, fault := range []struct {
		name string
		idle func(ctx context.Context, pid uint32) error // before the decision is sent
		hit  func(ctx context.Context, pid uint32) error // while it waits
		want string
	}{
		{"backend terminated while idle", func(ctx context.Context, pid uint32) error {
			if err := srv.Terminate(ctx, pid); err != nil {
				return err
			}
			return srv.WaitBackendGone(ctx, pid)
		}, nil, "indeterminate"},
		{"synchronous-replication wait ended early", nil, srv.TerminateInSyncRep, "indeterminate"},
		{"SIGKILLed in the synchronous-replication wait", nil, inWait(srv.KillBackend), "indeterminate"},
		{"server stopped immediately in the synchronous-replication wait", nil, inWait(func(ctx context.Context, _ uint32) error {
			if err := srv.StopImmediate(); err != nil {
				return err
			}
			return srv.Restart(ctx)
		}), "indeterminate"},
	} {
		for _, mode := range []string{"off", "xid"} {
			t.Run(fault.name+"/"+mode, func(t *testing.T) {
				tp := newTwoPhase(t, mode)
				gid := tp.gid(t)
				mustOK(t, srv.Exec(tp.ctx, fmt.Sprintf("begin; insert into %s (id, k) values (1, 1); prepare transaction '%s'", tp.table, gid)))
				pc, err := tp.h.pool.Acquire(tp.ctx)
				mustOK(t, err)
				defer pc.Release()
				pid := pc.Conn().PgConn().PID()
				if fault.hit != nil {
					_, err := pc.Exec(tp.ctx, "set synchronous_commit = on")
					mustOK(t, err)
				}
				if fault.idle != nil {
					mustOK(t, fault.idle(tp.ctx, pid))
					waitSocket(t, tp.ctx, pc.Conn(), func(n int, _ error) bool { return n > 0 }) // the FATAL came
				}
				vctx, v := NewVerdict(tp.ctx)
				done := make(chan error, 1)
				go func() {
					_, err := pc.Exec(vctx, "commit prepared '"+gid+"'")
					done <- err
				}()
				if fault.hit != nil {
					mustOK(t, fault.hit(tp.ctx, pid))
				}
				if err := <-done; err == nil {
					t.Fatal("COMMIT PREPARED answered though its backend was ended")
				}
				res, err := v.Result()
				if err != nil || res.Outcome().String() != fault.want {
					t.Fatalf("verdict %T %v, want %s", res, err, fault.want)
				}
				f := tp.frame(t, fault.want)
				committed := fault.hit != nil // each fault in the wait came after the commit record
				if tp.prepared(t, gid) == committed || srv.RowExists(t, tp.ctx, tp.table, 1) != committed {
					t.Fatalf("prepared %v, row %v; want the decision %v", tp.prepared(t, gid), srv.RowExists(t, tp.ctx, tp.table, 1), committed)
				}
				ref := f.attrs(string(ReconciliationRefKey))
				if !committed {
					if got := f.attrs("error.type"); got != "session_ended_before_commit" {
						t.Fatalf("error.type %q, want session_ended_before_commit", got)
					}
					if ref != "" {
						t.Fatalf("a reference %q from a session that had ended", ref)
					}
					return
				}
				if (ref != "") != (mode == "xid") {
					t.Fatalf("mode %s: reference %q", mode, ref)
				}
				if ref == "" {
					return
				}
				parsed, err := outcome.ParseReconciliationRef(ref)
				mustOK(t, err)
				got, err := tp.rec.Resolve(tp.ctx, parsed, trace.SpanContext{})
				if err != nil || got.Status() == reconcile.Aborted || got.Status() == reconcile.NoWrites ||
					got.Status() == reconcile.Unknown && got.Reason() != reconcile.ReasonCrashRecovered && got.Reason() != reconcile.ReasonServerRestarted {
					t.Fatalf("reconciled %s %q %v, want committed (or unknown: a reuse not ruled out)", got.Status(), got.Reason(), err)
				}
				t.Logf("reconciled %s %s", got.Status(), got.Reason())
			})
		}
	}
}
