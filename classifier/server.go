package classifier

import "strings"

// ServerKind is the kind of server that answered, as far as the rules need to know it. Some
// rules rest on how PostgreSQL itself behaves (it cannot raise an ERROR after its commit
// record; its idle-in-transaction timeout always fires before COMMIT is read; its backend
// reads nothing after a FATAL), and pgx also talks to servers that speak PostgreSQL's
// protocol but commit differently. Those rules make a classification determinate only for
// [ServerPostgreSQL]; the zero value, [ServerUnknown], keeps only the rules every server
// keeps, so that a caller who never says which server it is gets no classification the
// evidence cannot prove.
type ServerKind uint8

const (
	// ServerUnknown: not identified; only the rules that hold for every server apply.
	ServerUnknown ServerKind = iota
	// ServerPostgreSQL: a server that reports a PostgreSQL server_version and none of the
	// parameters other servers are known to add (see [ServerOf]).
	ServerPostgreSQL
	// ServerCockroachDB: a server that reports crdb_version. It answers a COMMIT whose
	// fate it does not know with ERROR 40003 ("result is ambiguous"), and one that
	// committed only in part with XXA00; RELEASE SAVEPOINT cockroach_restart is its
	// commit.
	ServerCockroachDB
	// ServerOther: a server that identifies as something other than PostgreSQL or
	// CockroachDB (YugabyteDB, Materialize, …): only the rules every server keeps apply.
	ServerOther
)

// String returns postgresql, cockroachdb, other or unknown.
func (s ServerKind) String() string {
	switch s {
	case ServerPostgreSQL:
		return "postgresql"
	case ServerCockroachDB:
		return "cockroachdb"
	case ServerOther:
		return "other"
	}
	return "unknown"
}

// ServerOf identifies the server from the parameters it reported at connection start
// (ParameterStatus, as pgconn's ParameterStatus returns them; "" when not reported), which
// costs no round trip. A server that reports a server_version beginning with a number
// and none of crdb_version, mz_version, or a server_version naming YugabyteDB ("-YB-") is
// taken for PostgreSQL: a server that claims to be PostgreSQL gets PostgreSQL's rules, so
// the claim is the limit of what this can tell. A pooler in between (PgBouncer) passes on
// the server's own parameters. A nil param reports nothing: ServerUnknown.
func ServerOf(param func(name string) string) ServerKind {
	switch {
	case param == nil:
		return ServerUnknown
	case param("crdb_version") != "":
		return ServerCockroachDB
	case param("mz_version") != "":
		return ServerOther
	}
	v := param("server_version")
	switch {
	case v == "":
		return ServerUnknown
	case v[0] < '0' || v[0] > '9', strings.Contains(v, "-YB-"):
		return ServerOther
	}
	return ServerPostgreSQL
}
