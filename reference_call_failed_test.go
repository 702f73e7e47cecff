package otelpgxtx

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// TestCommitReplyLostAfterCallFailed: the marker's call ahead of COMMIT fails with an
// ERROR (a real lock timeout: another session holds a lock on the marker table), so the
// transaction is aborted when the server reads COMMIT; a real TCP proxy then passes the
// call's reply and cuts the connection before COMMIT's (CutBetweenReplies). The frame is
// rolled back, not indeterminate: the ERROR proves that COMMIT rolled back, and the row
// is absent. Without the lock the same cut leaves COMMIT unknown, its marker the answer:
// the rule, not the fault, settles it. For the tracer (plain pgx) and Run. The soak of
// issue 40 found these as Run results with the marker and no reference (the call's
// serialization failure, then a lost connection).
func TestCommitReplyLostAfterCallFailed(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	for _, mode := range []string{"pgx", "Run"} {
		for _, locked := range []bool{true, false} {
			name := mode + map[bool]string{true: "/call fails", false: "/call succeeds"}[locked]
			t.Run(name, func(t *testing.T) {
				ctx := pgtest.ContextFor(t)
				var opts []Option
				if mode == "pgx" {
					opts = append(opts, WithCommitMarker(marker))
				}
				h := newRefHarness(t, srv.ConnString(), opts...)
				table := srv.NewTable(t, ctx, tableColumns)
				release := func() {}
				if locked {
					release = holdMarkerLock(t, ctx, marker)
				}
				body := func(ctx context.Context, tx pgx.Tx) (int, error) {
					if _, err := tx.Exec(ctx, "set local lock_timeout = '100ms'"); err != nil {
						return 0, err
					}
					n, err := insertFn(table, 1)(ctx, tx)
					h.proxy.CutBetweenReplies()
					return n, err
				}
				if mode == "pgx" {
					if err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error { _, err := body(ctx, tx); return err }); err == nil {
						t.Fatal("the cut COMMIT succeeded")
					}
				} else {
					res := Run(ctx, h.pool, markerPolicy(marker), body)
					want := outcome.OutcomeRolledBack
					if !locked {
						want = outcome.OutcomeIndeterminate
					}
					if res.Outcome() != want {
						t.Fatalf("Run: %T %v, want %s", res, res, want)
					}
				}
				if cuts := h.proxy.Cuts(); cuts != 1 {
					t.Fatalf("%d cuts, want 1", cuts)
				}
				frames := h.frames()
				last := frames[len(frames)-1]
				release()
				if err := srv.WaitQuiet(ctx); err != nil {
					t.Fatal(err)
				}
				present := srv.RowExists(t, ctx, table, 1)
				if !locked {
					wantAttr(t, last, string(OutcomeKey), "indeterminate")
					if ref, ok := refOf(t, last); !ok || !ref.HasMarker() {
						t.Fatalf("the unknown COMMIT has reference %v (%v), want its marker", ref, ok)
					}
					if !present {
						t.Fatal("the COMMIT that passed the proxy did not commit")
					}
					return
				}
				wantAttr(t, last, string(OutcomeKey), "rolled_back")
				wantAttr(t, last, "error.type", classifier.ReasonServerError)
				wantAttr(t, last, string(schema.DBResponseStatusKey), "55P03")
				if present {
					t.Fatal("row present after a COMMIT of an aborted transaction")
				}
			})
		}
	}
}

// holdMarkerLock has another session hold a SHARE lock on the marker table until release
// (or the test's end), so that the marker's insert waits for it.
func holdMarkerLock(t *testing.T, ctx context.Context, marker pgx.Identifier) (release func()) {
	t.Helper()
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = tx.Rollback(context.Background())
			_ = conn.Close(context.Background())
		})
	}
	t.Cleanup(release)
	if _, err := tx.Exec(ctx, "lock table "+marker.Sanitize()+" in share mode"); err != nil {
		t.Fatal(err)
	}
	return release
}
