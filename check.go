package otelpgxtx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/reference"
)

// Check asks db what the tracer's commit references need ([WithCommitReference],
// [WithCommitMarker]) and returns what is wrong, so that a service can stop at its start
// where, unchecked, each connection would turn its references off at its first
// transaction, with a warning log record: a server that is a standby, older than
// PostgreSQL 13 or not PostgreSQL; a role that may not read the cluster identity or call
// the xid read; a marker table or function that is missing or not the ones
// reconcile.MarkerTableDDL makes. Give it the pool the tracer instruments, or a connection
// to the same database as the same role. It runs the query each connection's own check
// runs, once, outside any transaction; without references it asks nothing and returns nil.
// An error says what to fix; a nil context or db (a typed nil pool or connection too) is
// an error wrapping [ErrInvalidArgument].
func (t *Tracer) Check(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) error {
	switch {
	case t == nil:
		return invalid("Tracer.Check: nil *Tracer")
	case ctx == nil:
		return invalid("Tracer.Check: nil context")
	case db == nil:
		return invalid("Tracer.Check: nil db")
	case pg.IsNilHandle(db):
		return invalid("Tracer.Check: nil %T", db)
	}
	refs := t.a.Cfg.References()
	if refs.Mode == reference.None {
		return nil
	}
	// A connection's own check starts from what the server reported at connection start;
	// so does this one, where db is one.
	var conn *pgx.Conn
	switch d := db.(type) {
	case *pgxpool.Pool:
		pc, err := d.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("otelpgxtx: Tracer.Check: %w", err)
		}
		defer pc.Release()
		conn = pc.Conn()
		db = conn
	case *pgx.Conn:
		conn = d
	}
	if conn != nil {
		pg := conn.PgConn()
		if classifier.ServerOf(pg.ParameterStatus) != classifier.ServerPostgreSQL {
			return errors.New("otelpgxtx: Tracer.Check: the server is not PostgreSQL: commit references are PostgreSQL's, and stay off")
		}
		if why := reference.TooOld(pg.ParameterStatus("server_version")); why != "" {
			return fmt.Errorf("otelpgxtx: Tracer.Check: %s: commit references stay off", why)
		}
	}
	marker := ""
	if refs.Mode == reference.Marker {
		marker = refs.Marker
	}
	sql, n := reference.CheckQuery(marker)
	row := make([][]byte, n)
	dest := make([]any, n)
	for i := range row {
		dest[i] = &row[i]
	}
	if err := db.QueryRow(ctx, sql).Scan(dest...); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42883" { // undefined_function
			return fmt.Errorf("otelpgxtx: Tracer.Check: the server lacks a function the references call (PostgreSQL %d or later is needed): %w", reference.MinServerMajor, err)
		}
		return fmt.Errorf("otelpgxtx: Tracer.Check: the identity check failed: %w", err)
	}
	if wrong := reference.CheckAnswer(row, marker); wrong != "" {
		return errors.New("otelpgxtx: Tracer.Check: " + wrong)
	}
	return nil
}
