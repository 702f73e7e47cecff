package classifier_test

import (
	"testing"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// TestServerOf: what each server reports at connection start (ParameterStatus) says
// which rules apply; the values are those the servers document or send.
func TestServerOf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   classifier.ServerKind
	}{
		{"PostgreSQL 15", map[string]string{"server_version": "15.18 (Debian 15.18-0+deb12u1)"}, classifier.ServerPostgreSQL},
		{"PostgreSQL 17", map[string]string{"server_version": "17.2"}, classifier.ServerPostgreSQL},
		{"CockroachDB", map[string]string{"server_version": "13.0.0", "crdb_version": "CockroachDB CCL v24.1.0 (x86_64-pc-linux-gnu, built 2024/05/15 21:28:29, go1.22.2)"}, classifier.ServerCockroachDB},
		{"YugabyteDB", map[string]string{"server_version": "11.2-YB-2.20.1.0-b0"}, classifier.ServerOther},
		{"Materialize", map[string]string{"server_version": "9.5.0", "mz_version": "v0.100.0"}, classifier.ServerOther},
		{"not a version", map[string]string{"server_version": "SomeDB 1.0"}, classifier.ServerOther},
		{"nothing reported", map[string]string{}, classifier.ServerUnknown},
	} {
		if got := classifier.ServerOf(func(k string) string { return tc.params[k] }); got != tc.want {
			t.Errorf("%s: ServerOf = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestServerOfRealServer: the test server, a real PostgreSQL 15, is identified as one.
func TestServerOfRealServer(t *testing.T) {
	ctx := realCtx(t)
	c := realConnect(t, ctx, srv.ConnString(), nil)
	if got := classifier.ServerOf(c.PgConn().ParameterStatus); got != classifier.ServerPostgreSQL {
		t.Fatalf("ServerOf(the test server, server_version %q) = %v", c.PgConn().ParameterStatus("server_version"), got)
	}
}

// TestClassifyOtherServers: the rules that rest on PostgreSQL's own behaviour make no
// classification determinate on another server. 40003 is unknown on every server.
func TestClassifyOtherServers(t *testing.T) {
	c := outcome.PhaseCommitting
	for _, server := range []classifier.ServerKind{classifier.ServerUnknown, classifier.ServerCockroachDB, classifier.ServerOther} {
		f := classifier.Facts{Server: server}
		closed := classifier.Facts{Server: server, ConnClosed: true}
		ended := classifier.Facts{Server: server, ConnClosed: true, SessionEndedBeforeCommit: true}
		notSent := classifier.Facts{Server: server, ConnClosed: true, CommitNotSent: true}
		runClassifyCases(t, []classifyCase{
			{server.String() + "/40003", c, pgErr("ERROR", "ERROR", "40003"), f, want{unknown, false, false, "40003", classifier.ReasonCompletionUnknown}},
			{server.String() + "/XXA00 (committed, schema change failed)", c, pgErr("ERROR", "ERROR", "XXA00"), f, want{unknown, false, false, "XXA00", classifier.ReasonServerError}},
			{server.String() + "/deferred unique violation", c, pgErr("ERROR", "ERROR", "23505"), f, want{unknown, false, false, "23505", classifier.ReasonServerError}},
			{server.String() + "/serialization failure", c, pgErr("ERROR", "ERROR", "40001"), f, want{rolledBack, true, false, "40001", classifier.ReasonSerializationFailure}},
			{server.String() + "/class 40", c, pgErr("ERROR", "ERROR", "40000"), f, want{rolledBack, false, false, "40000", classifier.ReasonServerError}},
			{server.String() + "/25P03 FATAL", c, pgErr("FATAL", "FATAL", "25P03"), closed, want{unknown, false, false, "25P03", classifier.ReasonServerFatal}},
			{server.String() + "/FATAL waiting before COMMIT", c, pgErr("FATAL", "FATAL", "57P01"), ended, want{unknown, false, false, "57P01", classifier.ReasonServerFatal}},
			{server.String() + "/COMMIT never sent", c, errNetOp, notSent, want{rolledBack, true, false, "", classifier.ReasonCommitNotSent}},
			{server.String() + "/ROLLBACK tag", c, nil, classifier.Facts{Server: server, RollbackTag: true}, want{rolledBack, false, false, "", classifier.ReasonCommitRollback}},
		})
	}
	pg := classifier.Facts{Server: classifier.ServerPostgreSQL}
	runClassifyCases(t, []classifyCase{
		{"postgresql/40003", c, pgErr("ERROR", "ERROR", "40003"), pg, want{unknown, false, false, "40003", classifier.ReasonCompletionUnknown}},
	})
}
