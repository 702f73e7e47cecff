package main

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/reconciletest"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// TestCommandLine: help is asked for and given (exit 0, on standard output), the usage
// lists every command on a line of its own, and what the command does not know — a
// command, a flag before it or after it, the wrong number of arguments — is named on
// standard error with exit status 2.
func TestCommandLine(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		code, out, errOut := cli(t, ctx, "", args...)
		if code != exitSettled || errOut != "" || !strings.HasPrefix(out, "usage: otelpgxtx <command>") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", args, code, out, errOut)
		}
		for _, c := range []string{"reconcile", "prune", "marker-ddl", "help"} {
			if !strings.Contains(out, "\n  "+c+" ") {
				t.Errorf("%v: the usage has no line for %s:\n%s", args, c, out)
			}
		}
	}
	for _, c := range []string{"reconcile", "prune", "marker-ddl"} {
		code, out, errOut := cli(t, ctx, "", c, "-h")
		if code != exitSettled || errOut != "" || !strings.HasPrefix(out, "usage: otelpgxtx "+c) {
			t.Errorf("%s -h: exit %d, stdout %q, stderr %q; want 0 and its usage on stdout", c, code, out, errOut)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `otelpgxtx: unknown command "frobnicate"`},
		{[]string{"-dsn", "x", "reconcile"}, "otelpgxtx: unknown flag -dsn: flags follow the command"},
		{[]string{"prune", "-x"}, "otelpgxtx prune: flag provided but not defined: -x"},
		{[]string{"marker-ddl"}, "otelpgxtx marker-ddl: 0 arguments, want one table"},
		{[]string{"marker-ddl", "a.b", "c.d"}, "otelpgxtx marker-ddl: 2 arguments, want one table"},
	} {
		code, out, errOut := cli(t, ctx, "", tc.args...)
		if code != exitBad || out != "" || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "usage: otelpgxtx") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2, %q and the usage", tc.args, code, out, errOut, tc.want)
		}
	}
}

// TestPrune runs the pruning job on a real marker table: a dry run counts what would go
// and removes nothing; the run removes exactly that, says how many, and leaves the recent
// rows and the horizon that makes a reconciler answer marker_pruned, never aborted; a
// retention below the floor, a missing one, a malformed table and no database are refused
// with exit status 2, nothing removed.
func TestPrune(t *testing.T) {
	pgtest.LeakCheck(t)
	ctx := pgtest.ContextFor(t)
	pgtest.NoError(t, srv.Exec(ctx, "drop table if exists public.cli_prune cascade"))
	reconciletest.CreateMarker(t, ctx, srv.Exec, pgx.Identifier{"public", "cli_prune"})
	if err := srv.Exec(ctx, `insert into public.cli_prune (operation_id, created_at)
		select gen_random_uuid(), now() - interval '40 days' from generate_series(1, 3)
		union all select gen_random_uuid(), now() - interval '1 day' from generate_series(1, 2)`); err != nil {
		t.Fatal(err)
	}
	const horizonID = "'00000000-0000-0000-0000-000000000000'"
	rows := func() int {
		t.Helper()
		return srv.CountOf(t, ctx, "select count(*) from public.cli_prune where operation_id <> "+horizonID)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"prune", "-retention", "1h", "public.cli_prune"}, "-retention 1h0m0s is below 24h0m0s"},
		{[]string{"prune", "public.cli_prune"}, "-retention 0s is below 24h0m0s"},
		{[]string{"prune", "-retention", "720h", "Public.cli_prune"}, "malformed marker table"},
		{[]string{"prune", "-retention", "720h"}, "0 arguments, want one table"},
		{[]string{"prune", "-dsn", "postgres://nobody:s3cret@127.0.0.1:1/x", "-retention", "720h", "public.cli_prune"}, "connecting to the database"},
	} {
		code, out, errOut := cli(t, ctx, "", tc.args...)
		if code != exitBad || out != "" || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "s3cret") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
	if n := rows(); n != 5 {
		t.Fatalf("%d rows after the refused runs, want 5", n)
	}
	code, out, _ := cli(t, ctx, "", "prune", "-dry-run", "-retention", "720h", `"public"."cli_prune"`)
	if want := `would prune 3 marker rows of "public"."cli_prune" older than 720h0m0s (dry run: none removed)` + "\n"; code != exitSettled || out != want {
		t.Errorf("dry run: exit %d, %q; want 0, %q", code, out, want)
	}
	if n := rows(); n != 5 {
		t.Fatalf("%d rows after the dry run, want 5", n)
	}
	code, out, _ = cli(t, ctx, "", "prune", "-retention", "720h", "public.cli_prune")
	if want := "pruned 3 marker rows of public.cli_prune older than 720h0m0s\n"; code != exitSettled || out != want {
		t.Errorf("prune: exit %d, %q; want 0, %q", code, out, want)
	}
	if n := rows(); n != 2 {
		t.Fatalf("%d rows after pruning, want the 2 recent ones", n)
	}
	// The horizon: a reference checked before it, and not found, is unknown marker_pruned.
	if n := srv.CountOf(t, ctx, "select count(*) from public.cli_prune where operation_id = "+horizonID+
		" and created_at < now() - interval '29 days'"); n != 1 {
		t.Fatalf("%d horizon rows 30 days back, want 1", n)
	}
}
