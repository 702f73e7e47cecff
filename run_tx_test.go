package otelpgxtx

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// escaped are the handles a Run function let out: its tx, a savepoint begun on it, a
// savepoint of that, a Nested call's tx, and the large-object values of each.
type escaped struct {
	names   []string
	handles []pgx.Tx
}

func (e *escaped) add(name string, tx pgx.Tx) {
	e.names = append(e.names, name)
	e.handles = append(e.handles, tx)
}

// useAfterEnd calls every method of tx (and of its LargeObjects) and returns the errors,
// by method; a method that returned no error is an entry with a nil error.
func useAfterEnd(ctx context.Context, tx pgx.Tx) map[string]error {
	errs := map[string]error{}
	_, errs["Exec"] = tx.Exec(ctx, "select 1")
	rows, err := tx.Query(ctx, "select 1")
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	errs["Query"] = err
	var n int
	errs["QueryRow"] = tx.QueryRow(ctx, "select 1").Scan(&n)
	_, errs["Prepare"] = tx.Prepare(ctx, "escaped", "select 1")
	_, errs["CopyFrom"] = tx.CopyFrom(ctx, pgx.Identifier{"escaped"}, []string{"id"}, pgx.CopyFromRows([][]any{{1}}))
	b := &pgx.Batch{}
	b.Queue("select 1")
	errs["SendBatch"] = tx.SendBatch(ctx, b).Close()
	_, errs["Begin"] = tx.Begin(ctx)
	errs["Commit"] = tx.Commit(ctx)
	errs["Rollback"] = tx.Rollback(ctx)
	lo := tx.LargeObjects()
	_, errs["LargeObjects.Create"] = lo.Create(ctx, 0)
	_, errs["LargeObjects.Open"] = lo.Open(ctx, 1, pgx.LargeObjectModeRead)
	errs["LargeObjects.Unlink"] = lo.Unlink(ctx, 1)
	if c := tx.Conn(); c != nil {
		errs["Conn"] = fmt.Errorf("Conn() = %p after the end, want nil", c)
	}
	return errs
}

// TestRunEscapedHandles lets every kind of handle escape a Run function and uses each
// after Run returned, on every commit path: references on and off, a pool and a single
// connection, commit, rollback and panic. Every use fails with an error wrapping
// pgx.ErrTxClosed, and the connection receives nothing: after the uses, the client's
// next bytes at a recording proxy are those of a marker query. With references, pgx's own
// Tx object (which LargeObjects is bound to) was never closed, and the savepoint from
// tx.Begin was not wrapped: both still ran statements on the pooled connection. Closing
// pgx's Tx object is no statement: the tracers never see it.
func TestRunEscapedHandles(t *testing.T) {
	for _, withRef := range []bool{true, false} {
		for _, pooled := range []bool{true, false} {
			for _, end := range []string{"commit", "rollback", "panic"} {
				t.Run(fmt.Sprintf("references %v pooled %v %s", withRef, pooled, end), func(t *testing.T) {
					testEscapedHandles(t, withRef, pooled, end)
				})
			}
		}
	}
}

func testEscapedHandles(t *testing.T, withRef, pooled bool, end string) {
	ctx := pgtest.ContextFor(t)
	proxy := pgtest.ProxyFor(t, srv)
	rec := proxy.Record()
	table := srv.NewTable(t, ctx, tableColumns)
	inner := &innerCounter{}
	h := newHarness(t, proxy.ConnString(srv.ConnString()), 1, WithInnerTracer(inner))
	var db DB = h.pool
	if !pooled {
		cfg, err := pgx.ParseConfig(proxy.ConnString(srv.ConnString()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := InstrumentConnConfig(cfg, WithTracerProvider(h.tp), WithInnerTracer(inner)); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		db = conn
	}
	p := DefaultPolicy()
	p.CommitReference = withRef
	p.MaxAttempts = 1
	var esc escaped
	fn := func(ctx context.Context, tx pgx.Tx) (int, error) {
		esc.add("tx", tx)
		sp, err := tx.Begin(ctx)
		if err != nil {
			return 0, err
		}
		esc.add("savepoint", sp)
		sp2, err := sp.Begin(ctx)
		if err != nil {
			return 0, err
		}
		esc.add("savepoint of savepoint", sp2)
		np := p
		np.Propagation = Nested
		Run(ctx, db, np, func(ctx context.Context, ntx pgx.Tx) (int, error) {
			esc.add("nested", ntx)
			return 0, nil
		})
		if _, err := insertFn(table, 1)(ctx, tx); err != nil {
			return 0, err
		}
		switch end {
		case "rollback":
			return 0, errors.New("roll back")
		case "panic":
			panic("escape")
		}
		return 1, nil
	}
	var res outcome.Result[int]
	func() {
		defer func() {
			if pv := recover(); pv != nil && end != "panic" {
				t.Fatalf("panic: %v", pv)
			}
		}()
		res = Run(ctx, db, p, fn)
	}()
	if end == "commit" && res.Outcome() != outcome.OutcomeCommitted {
		t.Fatalf("result = %T %+v", res, res)
	}
	if len(esc.handles) != 4 {
		t.Fatalf("%d handles escaped, want 4", len(esc.handles))
	}
	convs := rec.Conversations()
	if len(convs) != 1 {
		t.Fatalf("%d connections", len(convs))
	}
	before := convs[0].ClientBytes() // Run's last reply came back: all it sent is here
	starts := inner.starts
	for i, tx := range esc.handles {
		for method, err := range useAfterEnd(ctx, tx) {
			if !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("%s.%s after Run: %v, want an error wrapping pgx.ErrTxClosed", esc.names[i], method, err)
			}
		}
	}
	const marker = "select 'marker'"
	var err error
	if pooled {
		_, err = h.pool.Exec(ctx, marker)
	} else {
		_, err = db.(*pgx.Conn).Exec(ctx, marker)
	}
	if err != nil {
		t.Fatal(err)
	}
	after := convs[0].ClientBytes()
	want := append([]byte{'Q', 0, 0, 0, 0}, marker+"\x00"...)
	binary.BigEndian.PutUint32(want[1:5], uint32(len(want)-1))
	if got := after[len(before):]; !bytes.Equal(got, want) {
		t.Fatalf("after Run the client sent %q, want only the marker %q", got, want)
	}
	if inner.starts != starts+1 { // the marker's
		t.Fatalf("%d statements traced after Run, want only the marker", inner.starts-starts)
	}
	if inner.doneCtxStarts != 0 {
		t.Fatalf("the inner tracer saw %d statements start with a cancelled context: Run's closing of pgx's Tx", inner.doneCtxStarts)
	}
	if end == "commit" != srv.RowExists(t, ctx, table, 1) {
		t.Fatalf("row present %v after %s", !(end == "commit"), end)
	}
}
