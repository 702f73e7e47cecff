// Package reconciletest holds what the tests of the reconciler and of the instrumentation
// share on a real server: a reference with the answer it must get, the check of a list of
// them, and the creation of a commit-marker table. (The helpers every real-server test
// shares are pgtest's.)
package reconciletest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// Case is a reference and the resolution the reconciler must give it.
type Case struct {
	Name   string
	Ref    outcome.ReconciliationRef
	Want   reconcile.Status
	Reason string
}

// Check resolves every case with rec; an error is retried twice, since a pool's
// connections to a crashed server fail once each before the pool drops them.
func Check(t testing.TB, ctx context.Context, rec *reconcile.Reconciler, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		var got reconcile.Answer
		var err error
		for range 3 {
			if got, err = rec.Resolve(ctx, tc.Ref, trace.SpanContext{}); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.Name, err)
		}
		t.Logf("%s: %s: %s %q", tc.Name, tc.Ref, got.Status(), got.Reason())
		if got.Status() != tc.Want || got.Reason() != tc.Reason {
			t.Errorf("%s: Resolve = %s %q, want %s %q", tc.Name, got.Status(), got.Reason(), tc.Want, tc.Reason)
		}
	}
}

// CreateMarker runs MarkerTableDDL for table through exec (a server's Exec, or a
// connection's on another database).
func CreateMarker(t testing.TB, ctx context.Context, exec func(context.Context, string, ...any) error, table pgx.Identifier) {
	t.Helper()
	ddl, err := reconcile.MarkerTableDDL(table)
	if err != nil {
		t.Fatal(err)
	}
	if err := exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
}

// markerSeq makes each name NewMarkerTable gives unique in the process.
var markerSeq atomic.Int64

// NewMarkerTable creates a commit-marker table, new, through exec, and returns its name:
// public."m <n>", a space in it, so that a quoting mistake shows.
func NewMarkerTable(t testing.TB, ctx context.Context, exec func(context.Context, string, ...any) error) pgx.Identifier {
	t.Helper()
	name := pgx.Identifier{"public", fmt.Sprintf("m %d", markerSeq.Add(1))}
	CreateMarker(t, ctx, exec, name)
	return name
}
