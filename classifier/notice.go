package classifier

import (
	"github.com/jackc/pgx/v5/pgconn"
)

//go:generate go run ./internal/mogen -o committedlocally_gen.go

// CommittedLocallyNotice reports whether n is the WARNING PostgreSQL sends when it stops
// waiting for synchronous replication of a commit that is already in its local WAL:
//
//   - 57P01 "canceling the wait for synchronous replication and terminating connection
//     due to administrator command" (the backend is being terminated), recognised by its
//     code alone, since no other WARNING carries 57P01;
//   - 01000 "canceling wait for synchronous replication due to user request" (a cancel
//     request), recognised by its detail "The transaction has already committed locally,
//     but might not have been replicated to the standby.", because 01000 is the code of
//     every plain WARNING, a trigger's RAISE WARNING included. The detail is recognised in
//     every language of PostgreSQL 15's message catalogs (lc_messages), whose
//     translations go generate extracts into a table, when the client encoding is UTF8
//     (pgx needs it for its own text handling; a UTF-8 database gives it by default). A
//     language the database encoding cannot represent arrives as question marks: the
//     fact is then lost, never invented.
func CommittedLocallyNotice(n *pgconn.Notice) bool {
	if n == nil {
		return false
	}
	s := n.SeverityUnlocalized
	if s == "" {
		s = n.Severity
	}
	if s != "WARNING" {
		return false
	}
	switch n.Code {
	case sqlStateAdminShutdown:
		return true
	case sqlStateWarning:
		_, ok := committedLocallyDetails[n.Detail]
		return ok
	}
	return false
}
