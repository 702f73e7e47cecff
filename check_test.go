package otelpgxtx

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// wantOwnPrefix fails t unless err's text begins with its package's name, pkg, and names
// no other package of the module.
func wantOwnPrefix(t *testing.T, what string, err error, pkg string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", what)
		return
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, pkg+": ") {
		t.Errorf("%s: %q does not begin with %q", what, msg, pkg+": ")
	}
	for _, other := range []string{"otelpgxtx", "outcome", "reconcile", "classifier"} {
		if other != pkg && strings.Contains(msg, other+": ") {
			t.Errorf("%s: %q holds the prefix %q of another package", what, msg, other+": ")
		}
	}
}

// TestTracerCheck: Check reports, at a service's start, each setup fault that would
// otherwise turn a connection's references off with a log record at its first
// transaction, on the real server: a marker table that does not exist (naming how to
// make it), a marker function that is not MarkerTableDDL's, and a server that reports a
// version below 13 (through the test proxy); it passes with the references as set up,
// and asks nothing without them.
func TestTracerCheck(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	pool := srv.Pool(t, ctx)
	marker := reconciletest.NewMarkerTable(t, ctx, srv.Exec)
	fake := pgx.Identifier{"public", "fake_marker_" + strings.ToLower(t.Name())}
	// Dropped first: a run before this one (go test -count) made them on this server.
	pgtest.NoError(t, srv.Exec(ctx, "drop function if exists "+fake.Sanitize()+"(uuid); drop table if exists "+fake.Sanitize()+";"+
		"create table "+fake.Sanitize()+" (operation_id uuid primary key);"+
		"create function "+fake.Sanitize()+"(uuid) returns text language sql as $$ select 'm' $$"))
	for _, c := range []struct {
		name string
		opts []Option
		want string // a part of the error; "" for none
	}{
		{"no references", nil, ""},
		{"the xid", []Option{WithCommitReference()}, ""},
		{"the marker", []Option{WithCommitMarker(marker)}, ""},
		{"a missing marker table", []Option{WithCommitMarker(pgx.Identifier{"public", "no_such_marker"})}, "otelpgxtx marker-ddl"},
		{"a function not MarkerTableDDL's", []Option{WithCommitMarker(fake)}, "not the SECURITY DEFINER function"},
	} {
		tracer := mustTracer(t, c.opts...)
		err := tracer.Check(ctx, pool)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want nil", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		case c.want != "":
			wantOwnPrefix(t, c.name, err, "otelpgxtx")
			t.Logf("%s: %v", c.name, err)
		}
	}

	proxy := pgtest.ProxyFor(t, srv)
	proxy.ReportVersion("12.22")
	conn, err := pgx.Connect(ctx, proxy.ConnString(srv.ConnString()))
	pgtest.NoError(t, err)
	defer conn.Close(context.Background())
	if err := mustTracer(t, WithCommitReference()).Check(ctx, conn); err == nil || !strings.Contains(err.Error(), "older than 13") {
		t.Errorf("a server that reports 12.22: %v, want older than 13", err)
	}

	var nilTracer *Tracer
	for name, err := range map[string]error{
		"nil tracer": nilTracer.Check(ctx, pool),
		"nil db":     mustTracer(t, WithCommitReference()).Check(ctx, nil),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
		wantOwnPrefix(t, name, err, "otelpgxtx")
	}
}

// TestErrorPrefixes: an error says the package it comes from, and no other: a marker
// table refused by the tracer's option, by the reconciler's DDL and pruning, and a
// malformed reference given to the reconciler.
func TestErrorPrefixes(t *testing.T) {
	_, err := newTracer([]Option{WithCommitMarker(pgx.Identifier{"tx_marker"})})
	wantOwnPrefix(t, "WithCommitMarker", err, "otelpgxtx")
	_, err = reconcile.MarkerTableDDL(pgx.Identifier{"tx_marker"})
	wantOwnPrefix(t, "MarkerTableDDL", err, "reconcile")
	_, err = reconcile.New(nil)
	wantOwnPrefix(t, "reconcile.New", err, "reconcile")
	p := DefaultPolicy()
	p.CommitMarker = pgx.Identifier{"", "x"}
	res := Run(context.Background(), &pgx.Conn{}, p, func(context.Context, pgx.Tx) (int, error) { return 0, nil })
	rb, ok := res.(outcome.DeterminateRollback[int])
	if !ok {
		t.Fatalf("Run with a bad marker table: %T, want a rollback", res)
	}
	wantOwnPrefix(t, "Policy.CommitMarker", rb.Cause(), "otelpgxtx")
}
