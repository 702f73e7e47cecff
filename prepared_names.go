package otelpgxtx

import (
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/evidence"
)

// A statement the application prepared under a name of its own (pgx.Conn.Prepare) is run
// by that name, and pgx hands the tracer the name for the query's SQL, which says nothing
// of what it runs. Each connection keeps the SQL its names were prepared with, and a query
// run by name is judged by that SQL: a SELECT run by name begins no implicit transaction,
// an INSERT does, and may carry a reference. The inner tracer is still handed the name.

// namedStatements are a connection's statements prepared by name: their SQL by name, as
// pgx keeps them. Only the connection's user touches them, in the hooks.
type namedStatements struct {
	sql map[string]string
	// preparing is the statement being prepared, kept by its End if the server took it
	// (a name prepared again with other SQL is refused and keeps its first SQL, in pgx as
	// here).
	preparing struct{ name, sql string }
}

// keepsName reports whether a statement prepared as name with sql is run by its name: not
// an unnamed one, nor one pgx names after its SQL (name == sql), nor one of pgx's
// statement cache — all run by their SQL.
func keepsName(name, sql string) bool {
	return name != "" && name != sql && !strings.HasPrefix(name, "stmtcache_")
}

// anyNamed: some connection of the tracer has a statement prepared by name, which the
// hooks look up; until then a query's SQL is taken as it is, with no lookup.
type anyNamed struct{ atomic.Bool }

// prepareStarted records, on conn, that the statement name is being prepared with sql.
func (t *core) prepareStarted(conn *pgx.Conn, name, sql string) {
	if !keepsName(name, sql) {
		return
	}
	if st := t.connStateOf(conn); st != nil {
		st.named.preparing.name, st.named.preparing.sql = name, sql
	}
}

// prepareEnded keeps, on conn, the statement being prepared, unless err says the server
// refused it.
func (t *core) prepareEnded(conn *pgx.Conn, err error) {
	st := madeStateOf(conn)
	if st == nil || st.named.preparing.name == "" {
		return
	}
	p := st.named.preparing
	st.named.preparing.name, st.named.preparing.sql = "", ""
	if err != nil {
		return
	}
	if st.named.sql == nil {
		st.named.sql = make(map[string]string)
	}
	st.named.sql[p.name] = p.sql
	t.named.Store(true)
}

// statementOf returns what a query of sql, whose kinds are set, runs on conn: the SQL and
// kinds of the statement prepared under the name sql, if there is one; else sql and set.
func (t *core) statementOf(conn *pgx.Conn, sql string, set evidence.Set) (string, evidence.Set) {
	if !t.named.Load() {
		return sql, set
	}
	if st := madeStateOf(conn); st != nil {
		if real, ok := st.named.sql[sql]; ok {
			return real, t.sanitized.get(real).set
		}
	}
	return sql, set
}
