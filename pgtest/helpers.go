package pgtest

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The helpers a test of any package of the module uses on its server, each written once:
// they fail the test where Server's methods return an error (NoError).

// TestTimeout bounds every server interaction of a test (ContextFor).
const TestTimeout = 2 * time.Minute

// ContextFor is Context(tb, TestTimeout): the context of a test's server interactions.
func ContextFor(tb testing.TB) context.Context { return Context(tb, TestTimeout) }

// NoError fails tb's test with err when err is not nil.
func NoError(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// ProxyFor returns a Proxy to s, closed when tb's test ends; a proxy that fails to close
// fails the test.
func ProxyFor(tb testing.TB, s *Server) *Proxy {
	tb.Helper()
	p, err := NewProxy(fmt.Sprintf("%s:%d", s.Host(), s.Port()))
	NoError(tb, err)
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("proxy Close: %v", err)
		}
	})
	return p
}

// tableSeq makes each name NewTable gives unique in the process.
var tableSeq atomic.Int64

// NewTable creates a table of columns, new on s, named after tb's test (which a failed
// test's leftovers can be found by), and returns its name.
func (s *Server) NewTable(tb testing.TB, ctx context.Context, columns string) string {
	tb.Helper()
	ident := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_' // a plain identifier, whatever the test's name holds
	}, strings.ToLower(tb.Name()))
	name := fmt.Sprintf("t_%s_%d", ident, tableSeq.Add(1))
	if len(name) > 60 {
		name = fmt.Sprintf("t_%d", tableSeq.Add(1))
	}
	s.FreshTable(tb, ctx, name, columns)
	return name
}

// FreshTable (re)creates table on s with columns, so that a test using a fixed name runs
// again (-count) against the same server.
func (s *Server) FreshTable(tb testing.TB, ctx context.Context, table, columns string) {
	tb.Helper()
	NoError(tb, s.Exec(ctx, "drop table if exists "+table+"; create table "+table+" ("+columns+")"))
}

// RowExists reports whether table on s has a row whose id is id.
func (s *Server) RowExists(tb testing.TB, ctx context.Context, table string, id int) bool {
	tb.Helper()
	return s.CountOf(tb, ctx, "select count(*) from "+table+" where id = $1", id) > 0
}

// CountOf is Count, for a test.
func (s *Server) CountOf(tb testing.TB, ctx context.Context, query string, args ...any) int {
	tb.Helper()
	n, err := s.Count(ctx, query, args...)
	NoError(tb, err)
	return n
}

// Settled is WaitXactSettled, for a test: the status of xid once it has settled.
func (s *Server) Settled(tb testing.TB, ctx context.Context, xid uint64) string {
	tb.Helper()
	st, err := s.WaitXactSettled(ctx, xid)
	NoError(tb, err)
	return st
}
