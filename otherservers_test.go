package otelpgxtx

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Servers that speak PostgreSQL's protocol but are not PostgreSQL, as the scripted server
// (fakePG) plays them: what each reports at connection start, and the replies their
// documentation gives. None of them runs here: these tests hold the library to those
// documented replies, and the real PostgreSQL and PgBouncer tests to the real ones.

// startupCockroachDB is what CockroachDB reports at connection start: a PostgreSQL-like
// server_version and its own crdb_version.
var startupCockroachDB = [][2]string{
	{"server_version", "13.0.0"}, {"crdb_version", "CockroachDB CCL v24.1.0 (x86_64-pc-linux-gnu, built 2024/05/15, go1.22.2)"},
	{"server_encoding", "UTF8"}, {"client_encoding", "UTF8"}, {"DateStyle", "ISO, MDY"},
	{"integer_datetimes", "on"}, {"TimeZone", "UTC"}, {"standard_conforming_strings", "on"},
}

// fakeError is an ErrorResponse of severity sev and SQLSTATE code.
func fakeError(sev, code, msg string) *pgproto3.ErrorResponse {
	return &pgproto3.ErrorResponse{Severity: sev, SeverityUnlocalized: sev, Code: code, Message: msg}
}

// scripted is one instrumented connection to a scripted server, with the spans it made.
type scripted struct {
	fake *fakePG
	conn *pgx.Conn
	exp  *tracetest.InMemoryExporter
}

// newScripted connects an instrumented pgx connection to a fake server that reports
// startup (nil: PostgreSQL 16) and answers replies as scripted.
func newScripted(t *testing.T, startup [][2]string, replies map[string]fakeReply) *scripted {
	t.Helper()
	s := &scripted{fake: newFakePG(), exp: tracetest.NewInMemoryExporter()}
	s.fake.startup, s.fake.replies, s.fake.record = startup, replies, true
	cfg := fakePGConfig()
	cfg.DialFunc = func(context.Context, string, string) (net.Conn, error) { return s.fake, nil }
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(s.exp))
	if _, err := InstrumentConnConfig(cfg, WithTracerProvider(tp)); err != nil {
		t.Fatal(err)
	}
	var err error
	if s.conn, err = pgx.ConnectConfig(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.conn.Close(context.Background()) })
	return s
}

// frames returns the ended frame spans.
func (s *scripted) frames() []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range s.exp.GetSpans() {
		if _, ok := attr(sp, FrameDepthKey); ok {
			out = append(out, sp)
		}
	}
	return out
}

// frameSummary is tx.outcome, error.type and the phase events of a frame span.
func frameSummary(sp tracetest.SpanStub) string {
	o, _ := attr(sp, OutcomeKey)
	e, _ := attr(sp, schema.ErrorTypeKey)
	return o.String() + " " + e.String() + " [" + strings.Join(eventNames(sp), " ") + "]"
}

// seen returns the simple queries and function calls the fake received, under its lock.
func (s *scripted) seen() []string {
	s.fake.mu.Lock()
	defer s.fake.mu.Unlock()
	return slices.Clone(s.fake.seen)
}

// TestServerKindFromStartup: the connection's server kind comes from what the server
// reported at connection start, and costs nothing on the wire.
func TestServerKindFromStartup(t *testing.T) {
	for _, tc := range []struct {
		startup [][2]string
		want    classifier.ServerKind
	}{{nil, classifier.ServerPostgreSQL}, {startupCockroachDB, classifier.ServerCockroachDB}} {
		s := newScripted(t, tc.startup, nil)
		if _, err := s.conn.Exec(context.Background(), "begin"); err != nil {
			t.Fatal(err)
		}
		if got := frame.State(s.conn.PgConn()).Server(); got != tc.want {
			t.Errorf("server %v, want %v", got, tc.want)
		}
		if seen := s.seen(); !slices.Equal(seen, []string{"begin"}) {
			t.Errorf("the server was sent %q, want only the application's begin", seen)
		}
	}
}

// TestCommitAnswerOnOtherServers: each documented reply to COMMIT, on CockroachDB and on a
// server that claims to be PostgreSQL. 40003 (CockroachDB's "result is ambiguous") is
// indeterminate wherever it comes from; an ERROR that proves a rollback on PostgreSQL
// (which cannot raise one after its commit record) proves nothing on CockroachDB, which
// raises XXA00 for a transaction that committed; a FATAL 25P03 is PostgreSQL's
// idle-in-transaction timeout only on PostgreSQL.
func TestCommitAnswerOnOtherServers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		startup [][2]string
		reply   fakeReply
		want    string
	}{
		{"cockroachdb/ambiguous", startupCockroachDB, fakeReply{err: fakeError("ERROR", "40003", "result is ambiguous (error=rpc error)"), status: 'I'},
			"indeterminate completion_unknown [tx.phase.active tx.phase.committing tx.phase.unknown]"},
		{"postgresql/40003", nil, fakeReply{err: fakeError("ERROR", "40003", "statement completion unknown"), status: 'I'},
			"indeterminate completion_unknown [tx.phase.active tx.phase.committing tx.phase.unknown]"},
		{"cockroachdb/committed with schema change failure", startupCockroachDB, fakeReply{err: fakeError("ERROR", "XXA00", "transaction committed but schema change aborted"), status: 'I'},
			"indeterminate server_error [tx.phase.active tx.phase.committing tx.phase.unknown]"},
		{"cockroachdb/unique violation", startupCockroachDB, fakeReply{err: fakeError("ERROR", "23505", "duplicate key value"), status: 'I'},
			"indeterminate server_error [tx.phase.active tx.phase.committing tx.phase.unknown]"},
		{"postgresql/unique violation", nil, fakeReply{err: fakeError("ERROR", "23505", "duplicate key value"), status: 'I'},
			"rolled_back constraint_violation [tx.phase.active tx.phase.committing tx.phase.rolled_back]"},
		{"cockroachdb/retry error", startupCockroachDB, fakeReply{err: fakeError("ERROR", "40001", "restart transaction: TransactionRetryWithProtoRefreshError"), status: 'I'},
			"rolled_back serialization_failure [tx.phase.active tx.phase.committing tx.phase.rolled_back]"},
		{"cockroachdb/25P03", startupCockroachDB, fakeReply{err: fakeError("FATAL", "25P03", "idle in transaction timeout")},
			"indeterminate server_fatal [tx.phase.active tx.phase.committing tx.phase.unknown]"},
		{"postgresql/25P03", nil, fakeReply{err: fakeError("FATAL", "25P03", "terminating connection due to idle-in-transaction timeout")},
			"rolled_back idle_in_transaction_timeout [tx.phase.active tx.phase.committing tx.phase.rolled_back]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted(t, tc.startup, map[string]fakeReply{"commit": tc.reply})
			ctx := context.Background()
			tx, err := s.conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "insert into t values (1)"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err == nil {
				t.Fatal("the scripted COMMIT succeeded")
			}
			fs := s.frames()
			if len(fs) != 1 || frameSummary(fs[0]) != tc.want {
				var got []string
				for _, f := range fs {
					got = append(got, frameSummary(f))
				}
				t.Fatalf("frames %q, want [%s]", got, tc.want)
			}
		})
	}
}

// TestCockroachRestartProtocol: CockroachDB's client retry protocol (its documentation's,
// and cockroach-go's): SAVEPOINT cockroach_restart, the work, RELEASE SAVEPOINT
// cockroach_restart — where CockroachDB commits — then COMMIT, which only ends the block.
// The RELEASE is the frame's commit: committing before it is sent, committed on its
// success (with no second frame for the rest of the block), indeterminate on 40003, and a
// retryable rollback on a retry error, after which ROLLBACK TO SAVEPOINT starts the next
// attempt, a frame of its own. On PostgreSQL the same statements are an ordinary
// savepoint.
func TestCockroachRestartProtocol(t *testing.T) {
	const release = "release savepoint cockroach_restart"
	for _, tc := range []struct {
		name    string
		startup [][2]string
		replies []fakeReply // to each RELEASE in turn
		want    []string
	}{
		{"cockroachdb/committed", startupCockroachDB, []fakeReply{{tag: "RELEASE", status: 'T'}},
			[]string{"committed  [tx.phase.active tx.savepoint.created tx.phase.committing tx.phase.committed]"}},
		{"cockroachdb/ambiguous", startupCockroachDB, []fakeReply{{err: fakeError("ERROR", "40003", "result is ambiguous"), status: 'E'}},
			[]string{"indeterminate completion_unknown [tx.phase.active tx.savepoint.created tx.phase.committing tx.phase.unknown]"}},
		{"cockroachdb/retried", startupCockroachDB, []fakeReply{{err: fakeError("ERROR", "40001", "restart transaction"), status: 'E'}, {tag: "RELEASE", status: 'T'}},
			[]string{"rolled_back serialization_failure [tx.phase.active tx.savepoint.created tx.phase.committing tx.phase.rolled_back]",
				"committed  [tx.phase.active tx.phase.committing tx.phase.committed]"}},
		{"postgresql/a savepoint like any other", nil, []fakeReply{{tag: "RELEASE", status: 'T'}},
			[]string{"committed  [tx.phase.active tx.savepoint.created tx.savepoint.released tx.phase.committing tx.phase.committed]"}},
		{"postgresql/40003 on the release", nil, []fakeReply{{err: fakeError("ERROR", "40003", "statement completion unknown"), status: 'E'}},
			[]string{"indeterminate completion_unknown [tx.phase.active tx.savepoint.created tx.phase.committing tx.phase.unknown]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted(t, tc.startup, map[string]fakeReply{
				"savepoint cockroach_restart":             {tag: "SAVEPOINT", status: 'T'},
				"rollback to savepoint cockroach_restart": {tag: "ROLLBACK", status: 'T'},
			})
			ctx := context.Background()
			tx, err := s.conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "savepoint cockroach_restart"); err != nil {
				t.Fatal(err)
			}
			for i, r := range tc.replies {
				s.fake.mu.Lock()
				s.fake.replies[release] = r
				s.fake.mu.Unlock()
				if _, err := tx.Exec(ctx, "insert into t values (1)"); err != nil {
					t.Fatal(err)
				}
				_, err := tx.Exec(ctx, release)
				if err == nil {
					break
				}
				if i == len(tc.replies)-1 || !strings.Contains(err.Error(), "40001") {
					break
				}
				if _, err := tx.Exec(ctx, "rollback to savepoint cockroach_restart"); err != nil {
					t.Fatal(err)
				}
			}
			_ = tx.Commit(ctx)
			var got []string
			for _, f := range s.frames() {
				got = append(got, frameSummary(f))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("frames\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// TestRunOnCockroachDB: Run never sends its identity read to a server that is not
// PostgreSQL (commit references are off: the xid read and the marker are PostgreSQL's),
// and an ambiguous COMMIT is Indeterminate, never retried, without a reference; an
// ambiguous statement inside fn (here a RELEASE that CockroachDB committed at) is too.
func TestRunOnCockroachDB(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		replies map[string]fakeReply
		stmt    string
	}{
		{"COMMIT", map[string]fakeReply{"commit": {err: fakeError("ERROR", "40003", "result is ambiguous"), status: 'I'}}, "insert into t values (1)"},
		{"a statement in fn", map[string]fakeReply{"release savepoint cockroach_restart": {err: fakeError("ERROR", "40003", "result is ambiguous"), status: 'E'}},
			"release savepoint cockroach_restart"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted(t, startupCockroachDB, tc.replies)
			calls := 0
			res := Run(ctx, s.conn, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
				calls++
				_, err := tx.Exec(ctx, tc.stmt)
				return 1, err
			})
			ind, ok := res.(outcome.Indeterminate[int])
			if !ok || calls != 1 {
				t.Fatalf("Run: %T %v after %d calls, want Indeterminate after 1", res, res, calls)
			}
			if _, hasRef := ind.Reference(); hasRef {
				t.Error("a reference from a server that is not PostgreSQL")
			}
			for _, q := range s.seen() {
				if strings.Contains(q, "pg_control_system") || q == "FunctionCall" {
					t.Errorf("the identity read or the xid read was sent: %q", s.seen())
				}
			}
			if fs := s.frames(); len(fs) != 1 || !strings.HasPrefix(frameSummary(fs[0]), "indeterminate completion_unknown") {
				t.Errorf("frames %v", fs)
			}
		})
	}
}

// TestReferencesOffWhenIdentityRefused: a server that claims to be PostgreSQL but has no
// pg_control_system() (it answers the identity read with 42883, undefined_function, as a
// PostgreSQL-compatible server without it does) refuses the identity read, which runs
// outside any transaction: references turn off for the connection, Run commits without a
// reference, and nothing of the library's is sent again.
func TestReferencesOffWhenIdentityRefused(t *testing.T) {
	ctx := context.Background()
	s := newScripted(t, nil, map[string]fakeReply{
		identitySQL: {err: fakeError("ERROR", "42883", "unknown function: pg_control_system()")},
	})
	for range 2 {
		res := Run(ctx, s.conn, DefaultPolicy(), func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, "insert into t values (1)")
			return 1, err
		})
		if _, ok := res.(outcome.Committed[int]); !ok {
			t.Fatalf("Run: %T %v", res, res)
		}
	}
	identity, calls := 0, 0
	for _, q := range s.seen() {
		switch {
		case q == identitySQL:
			identity++
		case q == "FunctionCall":
			calls++
		}
	}
	if identity != 1 || calls != 0 {
		t.Fatalf("identity reads %d (want 1, outside a transaction), xid reads %d (want 0): %q", identity, calls, s.seen())
	}
	if seen := s.seen(); seen[0] != identitySQL {
		t.Fatalf("the identity read was not the first thing sent, before BEGIN: %q", seen)
	}
}

// TestCommittedLocallyOnlyFromPostgreSQL: the "committed locally" warnings are
// PostgreSQL's texts and codes; the same WARNING from another server sets no
// tx.commit.committed_locally.
func TestCommittedLocallyOnlyFromPostgreSQL(t *testing.T) {
	warning := &pgproto3.NoticeResponse{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "01000",
		Message: "canceling wait for synchronous replication due to user request",
		Detail:  "The transaction has already committed locally, but might not have been replicated to the standby."}
	for _, tc := range []struct {
		name    string
		startup [][2]string
		local   bool
	}{{"postgresql", nil, true}, {"cockroachdb", startupCockroachDB, false}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted(t, tc.startup, map[string]fakeReply{"commit": {notices: []*pgproto3.NoticeResponse{warning}, tag: "COMMIT", status: 'I'}})
			ctx := context.Background()
			tx, err := s.conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			fs := s.frames()
			if len(fs) != 1 {
				t.Fatalf("%d frames", len(fs))
			}
			_, local := attr(fs[0], CommittedLocallyKey)
			if local != tc.local || !strings.HasPrefix(frameSummary(fs[0]), "committed ") {
				t.Fatalf("%s, committed locally %v; want committed, %v", frameSummary(fs[0]), local, tc.local)
			}
		})
	}
}

// TestUnobservedCommitOnOtherServers: a COMMIT sent on the PgConn, past the tracer, on
// CockroachDB and on PostgreSQL as the scripted server plays them. Answered FATAL, after
// which the connection is closed with nothing pgconn read telling what it did, the frame
// ends indeterminate (ended_unobserved) on either server, never the rollback a session's
// end mid-transaction looks like: the rule reads what was written (a statement past the
// hooks), not the server's kind. Answered COMMIT, it ends committed on either. The real
// server's faults are TestUnobservedCommitFaults'.
func TestUnobservedCommitOnOtherServers(t *testing.T) {
	for _, server := range []struct {
		name    string
		startup [][2]string
	}{{"postgresql", nil}, {"cockroachdb", startupCockroachDB}} {
		for _, tc := range []struct {
			name  string
			reply fakeReply
			want  string
		}{
			{"fatal", fakeReply{err: fakeError("FATAL", "57P01", "terminating connection due to administrator command")},
				"indeterminate ended_unobserved [tx.phase.active tx.phase.committing tx.phase.unknown]"},
			{"committed", fakeReply{tag: "COMMIT", status: 'I'},
				"committed  [tx.phase.active tx.phase.committing tx.phase.committed]"},
		} {
			t.Run(server.name+"/"+tc.name, func(t *testing.T) {
				s := newScripted(t, server.startup, map[string]fakeReply{"commit": tc.reply})
				ctx := context.Background()
				if _, err := s.conn.Exec(ctx, "begin"); err != nil {
					t.Fatal(err)
				}
				if _, err := s.conn.Exec(ctx, "insert into t values (1)"); err != nil {
					t.Fatal(err)
				}
				_, err := s.conn.PgConn().Exec(ctx, "commit").ReadAll()
				if (err == nil) != (tc.reply.err == nil) {
					t.Fatalf("COMMIT past the tracer: %v", err)
				}
				_ = s.conn.Close(ctx)
				var got []string
				for _, f := range s.frames() {
					got = append(got, frameSummary(f))
				}
				if !slices.Equal(got, []string{tc.want}) {
					t.Fatalf("frames %q, want [%s]", got, tc.want)
				}
			})
		}
	}
}
