package frame

import (
	"strings"
)

// A statement the application prepared under a name of its own (pgx.Conn.Prepare) is run
// by that name, and pgx hands the tracer the name for the query's SQL, which says nothing
// of what it runs. Each connection keeps the SQL its names were prepared with, and a query
// run by name is judged by that SQL: a SELECT run by name begins no implicit transaction,
// an INSERT does, and may carry a reference. The inner tracer is still handed the name.

// NamedStatements are a connection's statements prepared by name: their SQL by name, as
// pgx keeps them. pgx's Deallocate calls no hook, so a name it dropped stays here: run
// again, pgx sends the name as SQL, which fails and writes nothing, whatever it is judged.
// Only the connection's user touches them, in the hooks.
type NamedStatements struct {
	sql map[string]string
	// preparing is the statement being prepared, kept by its End if the server took it
	// (a name prepared again with other SQL is refused and keeps its first SQL, in pgx as
	// here).
	preparing struct{ name, sql string }
}

// KeepsName reports whether a statement prepared as name with sql is run by its name: not
// an unnamed one, nor one pgx names after its SQL (name == sql), nor one of pgx's
// statement cache — all run by their SQL.
func KeepsName(name, sql string) bool {
	return name != "" && name != sql && !strings.HasPrefix(name, "stmtcache_")
}

// Start records that the statement name is being prepared with sql (keepsName's).
func (n *NamedStatements) Start(name, sql string) {
	n.preparing.name, n.preparing.sql = name, sql
}

// End keeps the statement being prepared, unless err says the server refused it, and
// reports whether it kept one.
func (n *NamedStatements) End(err error) bool {
	p := n.preparing
	n.preparing.name, n.preparing.sql = "", ""
	if p.name == "" || err != nil {
		return false
	}
	if n.sql == nil {
		n.sql = make(map[string]string)
	}
	n.sql[p.name] = p.sql
	return true
}

// Of returns the SQL of the statement prepared under the name sql, if there is one.
func (n *NamedStatements) Of(sql string) (string, bool) {
	real, ok := n.sql[sql]
	return real, ok
}
