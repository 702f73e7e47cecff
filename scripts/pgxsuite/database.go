package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"

	"github.com/txevidence/otelpgxtx/pgtest"
	"github.com/txevidence/otelpgxtx/reconcile"
	"github.com/txevidence/otelpgxtx/scripts/pgxsuite/probe"
)

// database is the pgtest server the runs share, with a template database set up by pgx's
// own testsetup/postgresql_setup.sql, and a PgBouncer in front of it.
type database struct {
	srv      *pgtest.Server
	bouncer  *pgtest.PgBouncer
	template string
	runs     int
}

// templateDB is the database pgx's setup script prepares; each run gets a copy of it, so
// that what one run's tests leave behind cannot change another's.
const templateDB = "pgx_template"

// bouncerPoolSize is PgBouncer's server connections per database and user: enough for
// the 10 concurrent connections of pgx's TestPgbouncerQueryExecModes.
const bouncerPoolSize = 20

// startDatabase starts the server and PgBouncer and runs pgx's setup script, found in
// the pgx module at pgxDir.
func startDatabase(ctx context.Context, pgxDir string) (*database, error) {
	srv, err := pgtest.Start()
	if err != nil {
		return nil, fmt.Errorf("pgxsuite: pgx's tests need a throw-away PostgreSQL server, which could not be started:\n%w\n"+
			"If PostgreSQL is not installed, install it, e.g. `apt-get install postgresql` on Debian/Ubuntu", err)
	}
	db := &database{srv: srv, template: templateDB}
	if err := db.setup(ctx, pgxDir); err != nil {
		return nil, errors.Join(err, db.Close())
	}
	// Session pooling: pgx's TestPgbouncerQueryExecModes runs every query exec mode,
	// including the statement cache, which in transaction pooling needs PgBouncer 1.21's
	// max_prepared_statements; session pooling works with any PgBouncer.
	db.bouncer, err = pgtest.StartPgBouncer(ctx, srv, "session", bouncerPoolSize)
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	return db, nil
}

// setup creates the template database and runs pgx's setup script in it with psql, as
// pgx's CI does (the script uses psql's \set and \gexec).
func (db *database) setup(ctx context.Context, pgxDir string) error {
	if err := db.srv.Exec(ctx, "create database "+db.template); err != nil {
		return err
	}
	psql, err := findPsql()
	if err != nil {
		return err
	}
	script := filepath.Join(pgxDir, "testsetup", "postgresql_setup.sql")
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", script, db.connString(db.template))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = withoutPG(os.Environ())
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgxsuite: %s -f %s: %w\n%s", psql, script, err, out.Bytes())
	}
	// The marker mode's commit-marker table and function, which any role may call: pgx's
	// tests' roles need no privilege of their own.
	ddl, err := reconcile.MarkerTableDDL(probe.MarkerTable)
	if err != nil {
		return err
	}
	cmd = exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", ddl, db.connString(db.template))
	out.Reset()
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = withoutPG(os.Environ())
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgxsuite: creating the marker table: %w\n%s", err, out.Bytes())
	}
	return nil
}

// fresh creates a new database from the template for one run and returns its name.
func (db *database) fresh(ctx context.Context) (string, error) {
	db.runs++
	name := fmt.Sprintf("pgx_test_%d", db.runs)
	return name, db.srv.Exec(ctx, fmt.Sprintf("create database %s template %s", name, db.template))
}

// env is the PGX_TEST_* environment of a run on database name: the variables the root,
// pgxpool and stdlib tests read and this machine can serve.
func (db *database) env(name string) []string {
	u, _ := url.Parse(db.bouncer.ConnString()) // pgtest makes it; it parses
	u.Path = "/" + name
	return []string{
		"PGX_TEST_DATABASE=" + db.connString(name),
		"PGX_TEST_PGBOUNCER_CONN_STRING=" + u.String(),
	}
}

// connString is a keyword/value connection string for the superuser on database name.
func (db *database) connString(name string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable", db.srv.Host(), db.srv.Port(), name)
}

// Close stops PgBouncer and the server.
func (db *database) Close() error {
	var err error
	if db.bouncer != nil {
		err = db.bouncer.Close()
	}
	return errors.Join(err, db.srv.Close())
}

// findPsql finds psql on PATH or beside Debian's versioned server programs.
func findPsql() (string, error) {
	if p, err := exec.LookPath("psql"); err == nil {
		return p, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
	if len(dirs) > 0 {
		return dirs[0], nil
	}
	return "", errors.New("pgxsuite: psql not found on PATH nor in /usr/lib/postgresql/*/bin; it runs pgx's setup script: install it, e.g. `apt-get install postgresql-client`")
}

// withoutPG drops PG* variables (PGHOST, PGDATABASE, …), which would redirect psql and
// pgx's tests, and PGX_TEST_* ones, which a run sets itself.
func withoutPG(env []string) []string {
	var out []string
	for _, kv := range env {
		if len(kv) >= 2 && kv[:2] == "PG" {
			continue
		}
		out = append(out, kv)
	}
	return out
}
