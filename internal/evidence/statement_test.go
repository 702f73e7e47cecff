package evidence

import (
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want Set
	}{
		{"begin", 1 << Begin},
		{"  BEGIN  ", 1 << Begin},
		{"begin isolation level serializable read only deferrable", 1 << Begin},
		{"Begin Work", 1 << Begin},
		{"BEGIN TRANSACTION;", 1 << Begin},
		{"START TRANSACTION ISOLATION LEVEL REPEATABLE READ", 1 << Begin},
		{"start", 1 << Other},
		{"/* leading */ -- comment\n begin", 1 << Begin},
		{"/* nested /* comment */ still */ commit", 1 << Commit},
		{"commit", 1 << Commit},
		{"COMMIT WORK", 1 << Commit},
		{"end", 1 << Commit},
		{"END TRANSACTION", 1 << Commit},
		{"commit and chain", 1 << CommitChain},
		{"COMMIT AND NO CHAIN", 1 << Commit},
		{"commit prepared 'x'", 1 << CommitPrepared},
		{"COMMIT PREPARED 'x';", 1 << CommitPrepared},
		{"end prepared 'x'", 1 << Commit}, // not PostgreSQL's: the server refuses it
		{"prepare transaction 'g1'", 1 << Prepare},
		{"PREPARE TRANSACTION 'it''s; commit'", 1 << Prepare},
		{"insert into t values (1); prepare transaction 'g'", 1 << Prepare},
		{"prepare q as insert into t values (1)", 1 << Other},
		{"prepare transactions as select 1", 1 << Other},
		{"rollback", 1 << Rollback},
		{"ABORT", 1 << Rollback},
		{"rollback work", 1 << Rollback},
		{"rollback and chain", 1 << RollbackChain},
		{"rollback prepared 'x'", 1 << RollbackPrepared},
		{"abort prepared 'x'", 1 << Rollback}, // not PostgreSQL's: the server refuses it
		{"savepoint sp_1", 1 << Savepoint},
		{"release savepoint sp_1", 1 << Release},
		{"RELEASE sp_1", 1 << Release},
		{"rollback to savepoint sp_1", 1 << RollbackTo},
		{"ROLLBACK TRANSACTION TO sp_1", 1 << RollbackTo},
		{"select 1", 1 << Other},
		{"select 'commit'", 1 << Other},
		{"beginning", 1 << Other},
		{"committed", 1 << Other},
		{"endless", 1 << Other},
		{"insert into t values ('begin; commit')", 1 << Other},
		{"select $$; commit $$", 1 << Other},
		{"select $a$ ; commit; $a$, $1", 1 << Other},
		{`select "a;b"; select 2`, 1 << Other},
		{"select E'it\\'s; commit'", 1 << Other},
		{"select 1 -- ; commit\n", 1 << Other},
		{"begin; insert into t values (1); commit", 1<<Begin | 1<<Commit},
		{"insert into t values (1); commit;", 1 << Commit},
		{"select 1; rollback", 1 << Rollback},
		{"do $$ begin perform 1; end $$", 1 << Other},
		{"", 1 << Other},
		{";;;", 1 << Other},
	} {
		if got := Classify(tc.sql).Kinds(); got != tc.want {
			t.Errorf("Classify(%q) = %b, want %b", tc.sql, got, tc.want)
		}
	}
}

// TestStatementFlags: whether a string may write (so that its transaction may have an xid
// to reference), and whether it holds one statement (so that a COMMIT in it is a lone one).
func TestStatementFlags(t *testing.T) {
	for _, tc := range []struct {
		sql            string
		writes, single bool
	}{
		{"commit", false, true},
		{"commit;", false, true},
		{"begin", false, true},
		{"select * from t", false, true},
		{"select * into t2 from t", true, true},
		{"SELECT a INTO TEMP t2 FROM t", true, true},
		{"select * from t for update", true, true},
		{"select * from t where id = 1 FOR NO KEY UPDATE skip locked", true, true},
		{"select * from t for share", true, true},
		{"select * from t for key share nowait", true, true},
		{"select substring(s from 1 for 2) from t", false, true},
		{"select (select 1 into x) ", false, true},
		{"select 'for update', \"into\" from t", false, true},
		{"select 1 -- for update\n", false, true},
		{"select 1; select 2 for update", true, false},
		{"select * from t for update; commit", true, false},
		{"SHOW transaction_isolation", false, true},
		{"set local synchronous_commit = on", false, true},
		{"  /* c */ values (1)", false, true},
		{"insert into t values (1)", true, true},
		{"update t set v = 1", true, true},
		{"with x as (delete from t returning *) select * from x", true, true},
		{"copy t from stdin", true, true},
		{"call p()", true, true},
		{"lock table t", true, true},
		{"select 1; commit", false, false},
		{"insert into t values (1); commit", true, false},
		{"begin; insert into t values (1); commit", true, false},
		{"savepoint a", false, true},
		{"", false, true},
	} {
		set := Classify(tc.sql)
		if set.Writes() != tc.writes || set.Single() != tc.single {
			t.Errorf("Classify(%q): writes %v single %v, want %v %v", tc.sql, set.Writes(), set.Single(), tc.writes, tc.single)
		}
	}
}

// TestCommitsInside: the statements that may commit inside when they run alone, outside a
// transaction block; in a string of several, which runs in an implicit transaction block,
// none may (a CALL or DO is atomic there, and the others are refused); a batch keeps what
// each of its queries says.
func TestCommitsInside(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want bool
	}{
		{"call p($1)", true},
		{"CALL s.p()", true},
		{"/* job */ do $$ begin commit; end $$", true},
		{"vacuum", true},
		{"VACUUM (analyze) t, u", true},
		{"analyze t, u", true},
		{"analyse", true},
		{"cluster", true},
		{"reindex schema s", true},
		{"create index concurrently i on t (v)", true},
		{"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS i ON t (v)", true},
		{"drop index concurrently i", true},
		{"alter table t detach partition p concurrently", true},
		{"create index i on t (v)", false},
		{"create table concurrently_named (v int)", false},
		{"create index i on t ((\"concurrently\"))", false},
		{"refresh materialized view concurrently m", false},
		{"insert into t values ('call')", false},
		{"select p()", false},
		{"commit", false},
		{"call p(); call q()", false},
		{"insert into t values (1); call p()", false},
	} {
		if got := Classify(tc.sql).CommitsInside(); got != tc.want {
			t.Errorf("Classify(%q).CommitsInside() = %v, want %v", tc.sql, got, tc.want)
		}
	}
	if !Together(Classify("insert into t values (1)") | Classify("call p()")).CommitsInside() {
		t.Error("a batch with a CALL: CommitsInside false")
	}
	if Classify("call p()").Kinds() != OtherSet {
		t.Error("CALL's kinds are not Other's")
	}
}

// TestImplicitStrings: which strings sent idle are an implicit transaction: a write, alone
// or with others, and a string with COMMIT or ROLLBACK in it and no BEGIN; not a BEGIN's
// string, a PREPARE TRANSACTION's, nor transaction control alone.
func TestImplicitStrings(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want bool
	}{
		{"insert into t values (1)", true},
		{"insert into t values (1); commit; insert into t values (2)", true},
		{"insert into t values (1); rollback", true},
		{"call p()", true},
		{"commit", false},
		{"select 1; commit", false},
		{"begin; insert into t values (1); commit", false},
		{"insert into t values (1); prepare transaction 'g'", false},
		{"commit prepared 'g'", false},
	} {
		if got := Classify(tc.sql).Implicit(); got != tc.want {
			t.Errorf("Classify(%q).Implicit() = %v, want %v", tc.sql, got, tc.want)
		}
	}
}

func TestBeginOptions(t *testing.T) {
	for _, tc := range []struct{ sql, iso, access string }{
		{"begin", "", ""},
		{"begin isolation level serializable read only deferrable", "serializable", "read only"},
		{"BEGIN ISOLATION LEVEL REPEATABLE READ", "repeatable read", ""},
		{"start transaction read write, isolation level read committed", "read committed", "read write"},
		{"begin transaction isolation level read uncommitted", "read uncommitted", ""},
		{"begin read only", "", "read only"},
		{"begin not deferrable", "", ""},
	} {
		_, rest := classifyOne(tc.sql)
		iso, access := beginOptions(rest)
		if iso != tc.iso || access != tc.access {
			t.Errorf("beginOptions(%q) = %q %q, want %q %q", tc.sql, iso, access, tc.iso, tc.access)
		}
	}
}

func TestGID(t *testing.T) {
	for sql, want := range map[string]string{
		"prepare transaction 'g1'":              "'g1'",
		"COMMIT PREPARED 'it''s; ok' ":          "'it''s; ok'",
		"rollback prepared /* c */ 'x'":         "'x'",
		"commit prepared E'x'":                  "",
		"commit prepared $$x$$":                 "",
		"commit prepared 'unterminated":         "",
		"commit prepared":                       "",
		"select 'g1'":                           "",
		"prepare transaction 'a' -- trailing\n": "'a'",
	} {
		if got := GID(sql); got != want {
			t.Errorf("GID(%q) = %q, want %q", sql, got, want)
		}
	}
}

func TestSavepointName(t *testing.T) {
	for sql, want := range map[string]string{
		"savepoint sp_1":                 "sp_1",
		"release savepoint sp_2":         "sp_2",
		"RELEASE x":                      "x",
		"rollback to savepoint sp_3":     "sp_3",
		"ROLLBACK WORK TO SAVEPOINT a_b": "a_b",
		"savepoint sp_4;":                "sp_4",
		`savepoint "my sp"`:              `"my sp"`,
		`release savepoint "a;b"`:        `"a;b"`,
		"savepoint /* why */ sp_5":       "sp_5",
	} {
		if got := SavepointName(sql); got != want {
			t.Errorf("SavepointName(%q) = %q, want %q", sql, got, want)
		}
	}
}

func TestClassifyAllocatesNothing(t *testing.T) {
	sqls := []string{"select * from t where id = $1", "begin isolation level serializable", "commit", "insert into t values (1); commit"}
	if n := testing.AllocsPerRun(100, func() {
		for _, s := range sqls {
			Classify(s)
		}
	}); n != 0 {
		t.Fatalf("Classify allocates %v times per run", n)
	}
}

// FuzzClassifyStatements: arbitrary SQL text never panics, and a string with no
// transaction keyword at all never yields a transaction kind.
func FuzzClassifyStatements(f *testing.F) {
	for _, s := range []string{"begin", "commit and chain", "select $$;$$; commit", "/* /* */ end", "rollback to sp", "E'\\';commit", "start transaction", "$1;$a$"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		set := Classify(sql)
		if set == 0 {
			t.Fatalf("empty set for %q", sql)
		}
		_, rest := classifyOne(sql)
		beginOptions(rest)
		SavepointName(sql)
		if !containsTxKeyword(sql) && set.Kinds() != 1<<Other {
			t.Fatalf("%q has no transaction keyword but classified as %b", sql, set)
		}
	})
}

func containsTxKeyword(sql string) bool {
	low := strings.ToLower(sql)
	for _, k := range []string{"begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release"} {
		if strings.Contains(low, k) {
			return true
		}
	}
	return false
}
