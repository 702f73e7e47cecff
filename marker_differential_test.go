package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// diffMarker is the differential test's marker table, in a schema of its own on which the
// application's role (diffRole) has no privilege but what MarkerTableDDL grants.
var diffMarker = pgx.Identifier{"otelpgxtx_diff", "tx_marker"}

// diffRole is the application role of PostgREST's pattern: it may write the
// application's tables, nothing of the marker's.
const diffRole = "otelpgxtx_web"

// diffSetup creates what the patterns use, once per server.
var diffSetup = []string{
	"do $$ begin if not exists (select from pg_roles where rolname = '" + diffRole + "') then create role " + diffRole + " login; end if; end $$",
	"create table if not exists public.diff_app (id int primary key)",
	"grant select, insert on public.diff_app to " + diffRole,
	"create table if not exists public.diff_rls (id int primary key)",
	"alter table public.diff_rls enable row level security",
	"drop policy if exists diff_rls_insert on public.diff_rls",
	"create policy diff_rls_insert on public.diff_rls for insert to " + diffRole + " with check (id > 0)",
	"drop policy if exists diff_rls_select on public.diff_rls",
	"create policy diff_rls_select on public.diff_rls for select to " + diffRole + " using (true)",
	"grant select, insert on public.diff_rls to " + diffRole,
	"create or replace function public.diff_write(i int) returns void language sql security definer set search_path = public as 'insert into public.diff_app (id) values (i)'",
	"create table if not exists public.diff_parent (id int primary key)",
	"create table if not exists public.diff_child (parent int references public.diff_parent deferrable initially deferred)",
	// The rows of a run before this one (go test -count): the patterns' ids start afresh.
	"truncate public.diff_app, public.diff_rls, public.diff_child",
}

// diffPattern is one thing real applications do in a transaction: session statements run
// before it (and undone by diffReset after), then tx inside it, then COMMIT.
type diffPattern struct {
	name    string
	session []string
	tx      func(ctx context.Context, tx pgx.Tx, id int) error
	// table is where the pattern's row goes ("" for a temporary table: nothing durable).
	table string
	// readOnly: the transaction is read-only at COMMIT; the marker function inserts nothing.
	readOnly bool
	// unseen: the write is inside a function, which the tracer does not see: its plain
	// pgx COMMIT carries no reference (WithCommitReference says so).
	unseen bool
	// decide is the coordinator's decision ("commit" or "rollback") on the transaction
	// tx prepared (see prepares), made on another connection after COMMIT.
	decide string
}

// prepares returns a tx function running sqls (as execs), then PREPARE TRANSACTION of a
// gid of the row's id (two-phase commit: the coordinator decides after COMMIT).
func prepares(sqls ...string) func(context.Context, pgx.Tx, int) error {
	return func(ctx context.Context, tx pgx.Tx, id int) error {
		if err := execs(sqls...)(ctx, tx, id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, diffGID(id, "prepare transaction"))
		return err
	}
}

// diffGID is stmt (PREPARE TRANSACTION, COMMIT PREPARED, ROLLBACK PREPARED) of the gid of
// row id.
func diffGID(id int, stmt string) string { return fmt.Sprintf("%s 'diff_%d'", stmt, id) }

// execs returns a tx function running each statement, $1 the row's id where it appears.
func execs(sqls ...string) func(context.Context, pgx.Tx, int) error {
	return func(ctx context.Context, tx pgx.Tx, id int) error {
		for _, s := range sqls {
			var args []any
			if strings.Contains(s, "$1") {
				args = []any{id}
			}
			if _, err := tx.Exec(ctx, s, args...); err != nil {
				return err
			}
		}
		return nil
	}
}

const (
	diffInsert = "insert into public.diff_app (id) values ($1)"
	diffTemp   = "create temp table if not exists diff_tmp (id int)"
)

var diffPatterns = []diffPattern{
	{name: "plain insert", tx: execs(diffInsert), table: "diff_app"},
	{name: "SET LOCAL ROLE", tx: execs("set local role "+diffRole, diffInsert), table: "diff_app"},
	{name: "session SET ROLE", session: []string{"set role " + diffRole}, tx: execs(diffInsert), table: "diff_app"},
	{name: "SET SESSION AUTHORIZATION", session: []string{"set session authorization " + diffRole}, tx: execs(diffInsert), table: "diff_app"},
	{name: "SECURITY DEFINER function", tx: execs("set local role "+diffRole, "select public.diff_write($1)"), table: "diff_app", unseen: true},
	{name: "SET LOCAL search_path", tx: execs("set local search_path to pg_catalog", diffInsert), table: "diff_app"},
	{name: "session search_path", session: []string{"set search_path to pg_catalog"}, tx: execs(diffInsert), table: "diff_app"},
	{name: "set_config role and search_path", tx: execs("select set_config('role', '"+diffRole+"', true), set_config('search_path', 'pg_catalog', true)", diffInsert), table: "diff_app"},
	{name: "row security", tx: execs("set local role "+diffRole, "insert into public.diff_rls (id) values ($1)"), table: "diff_rls"},
	{name: "session read-only, temporary table", session: []string{diffTemp, "set default_transaction_read_only = on"},
		tx: execs("insert into diff_tmp values ($1)"), readOnly: true},
	{name: "SET SESSION CHARACTERISTICS read only, temporary table", session: []string{diffTemp, "set session characteristics as transaction read only"},
		tx: execs("insert into diff_tmp values ($1)"), readOnly: true},
	{name: "SET TRANSACTION READ ONLY, temporary table", session: []string{diffTemp},
		tx: execs("set transaction read only", "insert into diff_tmp values ($1)"), readOnly: true},
	{name: "read only after a write", session: []string{diffTemp},
		tx: execs("insert into diff_tmp values ($1)", "set transaction read only"), readOnly: true},
	{name: "tight statement_timeout", tx: execs("set local statement_timeout = '50ms'", diffInsert), table: "diff_app"},
	{name: "tight lock_timeout", tx: execs("set local lock_timeout = '1ms'", diffInsert), table: "diff_app"},
	{name: "failed statement swallowed", tx: func(ctx context.Context, tx pgx.Tx, id int) error {
		if err := execs(diffInsert)(ctx, tx, id); err != nil {
			return err
		}
		_, _ = tx.Exec(ctx, "select 1/0")
		return nil
	}, table: "diff_app"},
	{name: "prepared, then committed by its coordinator", tx: prepares(diffInsert), table: "diff_app", decide: "commit"},
	{name: "prepared, then rolled back by its coordinator", tx: prepares(diffInsert), table: "diff_app", decide: "rollback"},
	{name: "SET LOCAL ROLE, prepared, committed", tx: prepares("set local role "+diffRole, diffInsert), table: "diff_app", decide: "commit"},
	{name: "deferred constraint violated at COMMIT", tx: execs(diffInsert, "insert into public.diff_child values (0 - $1::int)"), table: "diff_app"},
}

// diffReset undoes a pattern's session statements.
var diffReset = []string{"reset session authorization", "reset role", "reset all", "discard temp"}

// diffMode is one way the transaction is made: plain pgx under a tracer with opts, or
// Run with policy.
type diffMode struct {
	name   string
	opts   []Option
	run    bool
	policy Policy
}

func diffModes() []diffMode {
	noRef := DefaultPolicy()
	noRef.CommitReference = false
	return []diffMode{
		{name: "plain pgx, off"},
		{name: "plain pgx, xid", opts: []Option{WithCommitReference()}},
		{name: "plain pgx, marker", opts: []Option{WithCommitMarker(diffMarker)}},
		{name: "Run, off", run: true, policy: noRef},
		{name: "Run, xid", run: true, policy: DefaultPolicy()},
		{name: "Run, marker", run: true, policy: markerPolicy(diffMarker)},
	}
}

// TestMarkerNeverChangesCommit is the differential test of the commit references: every
// pattern of diffPatterns, made with the references off, with the xid read and with the
// marker, through plain pgx and through Run, over TCP, TLS and PgBouncer, ends the same
// for the application — COMMIT's error (its SQLSTATE), whether the row is there, and
// Run's result — and with the marker a committed transaction's reference names the
// marker exactly when the transaction was not read-only.
func TestMarkerNeverChangesCommit(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	for _, s := range diffSetup {
		if err := srv.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	ddl, err := reconcile.MarkerTableDDL(diffMarker)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	bases := []struct{ name, conn string }{{"tcp", srv.ConnString()}, {"tls", srv.TLSConnString()}}
	bouncer := pgtest.PgBouncerFor(t, ctx, srv, "session", 1)
	bases = append(bases, struct{ name, conn string }{"pgbouncer", bouncer.ConnString()})
	id := 1000000
	for _, b := range bases {
		t.Run(b.name, func(t *testing.T) {
			seen := map[string]string{} // plain pgx or Run, and the pattern → what the first mode saw
			for _, m := range diffModes() {
				h := newHarness(t, b.conn, 1, m.opts...)
				for _, p := range diffPatterns {
					id++
					got := diffRun(t, ctx, h, m, p, id)
					key := fmt.Sprint(m.run, p.name)
					if want, ok := seen[key]; !ok {
						seen[key] = got
					} else if got != want {
						t.Errorf("%s, %s: the application saw %q; with the references off it saw %q", m.name, p.name, got, want)
					}
					if m.name == "plain pgx, marker" && strings.HasPrefix(got, "commit ok") {
						frames := h.frames()
						ref, ok := refOf(t, frames[len(frames)-1])
						if p.unseen && ok || !p.unseen && (!ok || ref.HasMarker() == p.readOnly) {
							t.Errorf("%s, %s: reference %v (%v); want a marker %v", m.name, p.name, ref, ok, !p.readOnly && !p.unseen)
						}
					}
				}
				h.pool.Close() // its server connection goes back to PgBouncer's pool
			}
			for _, p := range diffPatterns {
				t.Logf("%s: plain pgx: %s; Run: %s", p.name, seen[fmt.Sprint(false, p.name)], seen[fmt.Sprint(true, p.name)])
			}
		})
	}
}

// diffRun makes pattern p's transaction in mode m with row id and says what the
// application saw.
func diffRun(t *testing.T, ctx context.Context, h *harness, m diffMode, p diffPattern, id int) string {
	t.Helper()
	for _, s := range p.session {
		if _, err := h.pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %s: %v", p.name, s, err)
		}
	}
	var saw string
	if m.run {
		res := Run(ctx, h.pool, m.policy, func(ctx context.Context, tx pgx.Tx) (int, error) {
			return id, p.tx(ctx, tx, id)
		})
		saw = fmt.Sprintf("%T", res)
		if rb, ok := res.(outcome.DeterminateRollback[int]); ok {
			saw += " " + diffErr(rb.Cause())
		}
	} else {
		tx, err := h.pool.Begin(ctx)
		if err != nil {
			t.Fatalf("%s: begin: %v", p.name, err)
		}
		if err := p.tx(ctx, tx, id); err != nil {
			_ = tx.Rollback(ctx)
			t.Fatalf("%s: %v", p.name, err)
		}
		saw = "commit " + diffErr(tx.Commit(ctx))
	}
	if p.decide != "" {
		// The coordinator's decision, on a connection of its own: the marker row, if
		// written, commits or rolls back with the prepared transaction.
		if err := srv.Exec(ctx, diffGID(id, p.decide+" prepared")); err != nil {
			t.Fatalf("%s: %s prepared: %v", p.name, p.decide, err)
		}
		if m.name == "plain pgx, marker" {
			want := p.decide == "commit"
			frames := h.frames()
			if ref, ok := refOf(t, frames[len(frames)-1]); !ok || srv.CountOf(t, ctx,
				"select count(*) from "+diffMarker.Sanitize()+" where operation_id = $1::uuid", ref.Operation.String()) == 1 != want {
				t.Errorf("%s: the marker row of %v is not there exactly when the coordinator committed", p.name, ref)
			}
		}
	}
	for _, s := range diffReset {
		if _, err := h.pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %s: %v", p.name, s, err)
		}
	}
	if p.table != "" {
		saw += fmt.Sprintf(", row %v", srv.CountOf(t, ctx, "select count(*) from public."+p.table+" where id = $1", id) == 1)
	}
	return saw
}

// diffErr is what an application sees of a COMMIT's error: ok, pgx's rollback, a SQLSTATE.
func diffErr(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return "rollback"
	case errors.As(err, &pgErr):
		return "sqlstate " + pgErr.Code
	}
	return err.Error()
}

// diffAutocommit is one autocommit pattern: what real applications send outside a
// transaction block, each an implicit transaction, after session statements (undone by
// diffReset). It returns everything the application sees: results, RowsAffected,
// RETURNING rows, errors (SQLSTATE and message).
type diffAutocommit struct {
	name    string
	session []string
	run     func(ctx context.Context, pool *pgxpool.Pool, id int) string
}

// diffSeen is what the application sees of a command's result and error.
func diffSeen(tag pgconn.CommandTag, err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Sprintf("%q: %s %s", tag.String(), pgErr.Code, pgErr.Message)
	}
	return fmt.Sprintf("%q: %v", tag.String(), err)
}

// diffRows is what the application sees of a query's rows.
func diffRows(rows pgx.Rows) string {
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		out = append(out, fmt.Sprint(vals, err))
	}
	rows.Close()
	return fmt.Sprint(out, " ", diffSeen(rows.CommandTag(), rows.Err()))
}

var diffAutocommits = []diffAutocommit{
	{name: "pool.Exec insert", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, diffInsert, id))
	}},
	{name: "pool.Exec insert, exec mode", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, diffInsert, pgx.QueryExecModeExec, id))
	}},
	{name: "pool.Exec insert, describe exec mode", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, diffInsert, pgx.QueryExecModeDescribeExec, id))
	}},
	{name: "QueryRow insert returning", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		var got int
		err := pool.QueryRow(ctx, "insert into public.diff_app (id) values ($1) returning id", id).Scan(&got)
		return fmt.Sprint(got, " ", diffSeen(pgconn.CommandTag{}, err))
	}},
	{name: "insert returning several rows", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		rows, err := pool.Query(ctx, "insert into public.diff_app (id) select $1::int * 10 + g from generate_series(1, 3) g returning id, 'x'::text", id)
		if err != nil {
			return diffSeen(pgconn.CommandTag{}, err)
		}
		return diffRows(rows)
	}},
	{name: "update of no row", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, "update public.diff_app set id = id where id = $1", -id))
	}},
	{name: "batch of two inserts", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		b := &pgx.Batch{}
		b.Queue(diffInsert, id)
		b.Queue("insert into public.diff_app (id) values ($1::int + 1)", id)
		br := pool.SendBatch(ctx, b)
		first := diffSeen(br.Exec())
		second := diffSeen(br.Exec())
		return first + "; " + second + "; " + diffSeen(pgconn.CommandTag{}, br.Close())
	}},
	{name: "batch whose second insert fails", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		b := &pgx.Batch{}
		b.Queue(diffInsert, id)
		b.Queue(diffInsert, id)
		br := pool.SendBatch(ctx, b)
		first := diffSeen(br.Exec())
		second := diffSeen(br.Exec())
		return first + "; " + second + "; " + diffSeen(pgconn.CommandTag{}, br.Close())
	}},
	{name: "unique violation", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		first := diffSeen(pool.Exec(ctx, diffInsert, id))
		return first + "; " + diffSeen(pool.Exec(ctx, diffInsert, id))
	}},
	{name: "deferred constraint violated at the implicit commit", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, "insert into public.diff_child values (0 - $1::int)", id))
	}},
	{name: "read-only session", session: []string{"set default_transaction_read_only = on"}, run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, diffInsert, id))
	}},
	{name: "notice", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, "insert into public.diff_app (id) values (public.diff_notice($1))", id))
	}},
	{name: "VACUUM, extended protocol", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		rows, err := pool.Query(ctx, "vacuum public.diff_app")
		if err != nil {
			return diffSeen(pgconn.CommandTag{}, err)
		}
		return diffRows(rows)
	}},
	{name: "CREATE INDEX CONCURRENTLY, extended protocol", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		rows, err := pool.Query(ctx, "create index concurrently diff_app_cic on public.diff_app (id)")
		if err != nil {
			return diffSeen(pgconn.CommandTag{}, err)
		}
		return diffRows(rows)
	}},
	{name: "VACUUM, simple protocol", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, "vacuum public.diff_app"))
	}},
	{name: "CREATE DATABASE, extended protocol", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		rows, err := pool.Query(ctx, "create database diff_created")
		got := diffSeen(pgconn.CommandTag{}, err)
		if err == nil {
			got = diffRows(rows)
		}
		return got + "; " + diffSeen(pool.Exec(ctx, "drop database diff_created"))
	}},
	{name: "CREATE DATABASE, simple protocol", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, "create database diff_created")) + "; " + diffSeen(pool.Exec(ctx, "drop database diff_created"))
	}},
	// Statements, strings and batches that commit more than once (the lxid read rides ahead
	// of a CALL or DO, and is read again after one failed).
	{name: "CALL that commits inside, then fails, extended protocol", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, "call public.diff_commit_fail($1)", id))
	}},
	{name: "CALL that commits inside and succeeds, extended protocol", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, "call public.diff_commit_ok($1)", id))
	}},
	{name: "CALL that fails with no commit, simple protocol", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, "call public.diff_fail_only($1)", pgx.QueryExecModeSimpleProtocol, id))
	}},
	{name: "CALL that fails with no commit, database/sql", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		res, err := db.ExecContext(ctx, "call public.diff_fail_only($1)", id)
		if err != nil {
			return diffSeen(pgconn.CommandTag{}, err)
		}
		n, err := res.RowsAffected()
		return fmt.Sprint(n, err)
	}},
	{name: "DO that commits inside, then fails", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, fmt.Sprintf("do $$ begin insert into public.diff_app values (%d); commit; "+
			"raise exception using errcode = '40001', message = 'after its commit'; end $$", id)))
	}},
	{name: "string: insert, commit, insert, 1/0", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		return diffSeen(pool.Exec(ctx, fmt.Sprintf("insert into public.diff_app values (%d); commit; insert into public.diff_app values (%d); select 1/0", id, id+1)))
	}},
	{name: "batch: begin, insert, commit, insert, 1/0", run: func(ctx context.Context, pool *pgxpool.Pool, id int) string {
		b := &pgx.Batch{}
		b.Queue("begin")
		b.Queue(diffInsert, id)
		b.Queue("commit")
		b.Queue("insert into public.diff_app (id) values ($1::int + 1)", id)
		b.Queue("select 1/0")
		return diffSeen(pgconn.CommandTag{}, pool.SendBatch(ctx, b).Close())
	}},
}

// TestMarkerNeverChangesAutocommit is the differential test of the implicit
// transactions' references: every autocommit pattern, with the references off, with the
// xid read and with the marker, over TCP, TLS and PgBouncer (session and transaction
// pooling), gives the application exactly the same results, errors, notices and rows; and
// with the references on, a committed write's frame has its reference.
func TestMarkerNeverChangesAutocommit(t *testing.T) {
	ctx := pgtest.ContextFor(t)
	setup := append(append([]string{}, diffSetup...),
		"create or replace function public.diff_notice(i int) returns int language plpgsql as $$ begin raise notice 'writing %', i; return i; end $$",
		"create or replace procedure public.diff_commit_fail(i int) language plpgsql as $$ begin insert into public.diff_app values (i); commit; "+
			"insert into public.diff_app values (i + 1); raise exception using errcode = '40001', message = 'after its commit'; end $$",
		"create or replace procedure public.diff_commit_ok(i int) language plpgsql as $$ begin insert into public.diff_app values (i); commit; "+
			"insert into public.diff_app values (i + 1); end $$",
		"create or replace procedure public.diff_fail_only(i int) language plpgsql as $$ begin insert into public.diff_app values (i); "+
			"raise exception using errcode = '23505', message = 'no commit inside'; end $$")
	for _, s := range setup {
		mustOK(t, srv.Exec(ctx, s))
	}
	ddl, err := reconcile.MarkerTableDDL(diffMarker)
	mustOK(t, err)
	mustOK(t, srv.Exec(ctx, ddl))
	bases := []struct{ name, conn string }{{"tcp", srv.ConnString()}, {"tls", srv.TLSConnString()},
		{"pgbouncer session", pgtest.PgBouncerFor(t, ctx, srv, "session", 1).ConnString()},
		// pgx's statement cache names statements on a server connection that outlives the
		// client's in transaction pooling: the exec mode there.
		{"pgbouncer transaction", pgtest.PgBouncerFor(t, ctx, srv, "transaction", 1).ConnString() + "&default_query_exec_mode=exec"}}
	for _, b := range bases {
		t.Run(b.name, func(t *testing.T) {
			seen := map[string]string{}
			for _, m := range []struct {
				name string
				opts []Option
			}{{"off", nil}, {"xid", []Option{WithCommitReference()}}, {"marker", []Option{WithCommitMarker(diffMarker)}}} {
				var notices []string
				onNotice := harnessConfig(func(c *pgxpool.Config) {
					c.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Severity+" "+n.Message) }
				})
				// The same rows for each mode.
				mustOK(t, srv.Exec(ctx, "truncate public.diff_app, public.diff_child"))
				mustOK(t, srv.Exec(ctx, "drop index if exists public.diff_app_cic"))
				h := newHarness(t, b.conn, 1, append(m.opts, onNotice)...)
				id := 2000000
				// The connection's first write carries its check: a write of its own.
				if _, err := h.pool.Exec(ctx, diffInsert, id); err != nil {
					t.Fatal(err)
				}
				for _, p := range diffAutocommits {
					id += 100
					for _, s := range p.session {
						if _, err := h.pool.Exec(ctx, s); err != nil {
							t.Fatal(err)
						}
					}
					h.exp.Reset()
					notices = nil
					rctx, root := rootSpan(ctx, h)
					got := p.run(rctx, h.pool, id)
					root.End()
					for _, s := range diffReset {
						if _, err := h.pool.Exec(ctx, s); err != nil {
							t.Fatal(err)
						}
					}
					got += fmt.Sprintf(" notices %q, rows %d", notices,
						srv.CountOf(t, ctx, "select count(*) from public.diff_app where id in ($1, $1 + 1) or id between $1 * 10 + 1 and $1 * 10 + 3", id))
					if want, ok := seen[p.name]; !ok {
						seen[p.name] = got
					} else if got != want {
						t.Errorf("%s, %s: the application saw\n%s\nwith the references off\n%s", m.name, p.name, got, want)
					}
					if m.name != "off" && (p.name == "pool.Exec insert" || p.name == "batch of two inserts") {
						frames := h.implicitFrames()
						if len(frames) != 1 {
							t.Fatalf("%s, %s: %d implicit frames", m.name, p.name, len(frames))
						}
						if ref, ok := refOf(t, frames[0]); !ok || ref.XID == 0 || ref.HasMarker() != (m.name == "marker") {
							t.Errorf("%s, %s: reference %+v, %v", m.name, p.name, ref, ok)
						}
					}
				}
				h.pool.Close()
			}
			for _, p := range diffAutocommits {
				t.Logf("%s: %s", p.name, seen[p.name])
			}
		})
	}
}
