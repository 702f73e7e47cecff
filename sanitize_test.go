package otelpgxtx

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/exaring/otelpgx"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/sanitize"
)

func TestSanitizeSQL(t *testing.T) {
	for _, tc := range []struct{ sql, want string }{
		{"select 1", "select ?"},
		{"select * from t where id = $1", "select * from t where id = $1"},
		{"create role app login password 'hunter2-Secret'", "create role app login password ?"},
		{"select 'it''s' || 'x'", "select ? || ?"},
		{`select E'it\'s \\ ok', e'\x41'`, "select ?, ?"},
		{"select $$a 'b' c$$, $tag$ $$ x $tag$", "select ?, ?"},
		{"select $é$ secret $é$", "select ?"},
		{"select 1.5, .5e-3, 10e+2, 0x1F, 1_000_000, 42::int", "select ?, ?, ?, ?, ?, ?::int"},
		{"select B'1010', X'1F', N'nat', U&'d\\0061t\\+000061'", "select ?, ?, ?, ?"},
		{`select U&"d\0061t" from "My ""T"""`, `select U&"d\0061t" from "My ""T"""`},
		{"select a$b, t1.c2, $1::text from t2", "select a$b, t1.c2, $1::text from t2"},
		{"select interval '1 day', date '2024-01-01'", "select interval ?, date ?"},
		{"-- name: GetUser :one\nselect 1", "\nselect ?"},
		{"select /* card 4111 /* nested */ */ 1", "select  ?"},
		{"select 1 -/**/-1", "select ? - -?"},
		{"select 'open", "select ?"},
		{"select 'a', 'b; drop", "select ?, ?"},
		{"select E'x\\'", "select ?"},
		{`select "unterminated`, "select ?"},
		{"select $q$ never closed", "select ?"},
		{"select $1, $ 2", "select $1, $ ?"},
		{"copy t from stdin", "copy t from stdin"},
		{"copy t (a) from stdin;\nS3cret\t1\n\\.\n", "copy t (a) from stdin;?"},
		{"COPY t FROM STDIN\nS3cret\n", "COPY t FROM STDIN\n?"},
		{"copy t from stdin with (format csv);\n", "copy t from stdin with (format csv);\n"},
		{"select 1; copy t to stdout;\nselect x", "select ?; copy t to stdout;\nselect x"},
		{"", ""},
	} {
		if got := sanitize.SanitizeSQL(tc.sql); got != tc.want {
			t.Errorf("sanitizeSQL(%q) = %q, want %q", tc.sql, got, tc.want)
		}
	}
}

func TestQuerySummary(t *testing.T) {
	for _, tc := range []struct{ sql, want string }{
		{"SELECT * FROM wuser_table where username = ?", "SELECT wuser_table"},
		{"INSERT INTO shipping_details (id, first_name) SELECT id, first_name FROM orders", "INSERT shipping_details SELECT orders"},
		{"select * from songs s, artists a where s.artist_id = a.id", "SELECT songs artists"},
		{"select * from orders o join order_details d on o.id = d.order_id", "SELECT orders order_details"},
		{"select * from songs where id in (select song_id from artists)", "SELECT songs SELECT artists"},
		{"update bench_kv set v = v + 1 where k = $1", "UPDATE bench_kv"},
		{"delete from public.t where k = 'x'", "DELETE public.t"},
		{"with x as (select k from a) update t set v = 1 from x", "SELECT a UPDATE t x"},
		{"select k from t for update", "SELECT t"},
		{"insert into t values (1) on conflict (k) do update set v = 2", "INSERT t"},
		{"select 1", "SELECT"},
		{"select 'secret' from only t", "SELECT t"},
		{"create role app login password 'hunter2'", "CREATE ROLE"},
		{"alter role app password 'hunter2'", "ALTER ROLE"},
		{"create table if not exists accounts (id int)", "CREATE TABLE accounts"},
		{"create or replace view v as select 1", "CREATE VIEW v"},
		{"truncate table t", "TRUNCATE TABLE t"},
		{"copy t (a, b) from stdin", "COPY t"},
		{"begin isolation level serializable", "BEGIN"},
		{"begin; insert into t values (1); commit", "BEGIN; INSERT t; COMMIT"},
		{"merge into t using s on t.k = s.k when matched then update set v = s.v", "MERGE t s"},
		{"", ""},
		{"'secret'", ""},
		{"hunter2 from t", ""},
		{"create hunter2 x", "CREATE"},
		{"copy t from stdin;\nS3cret\t1\n", "COPY t"},
	} {
		if got := sanitize.QuerySummary(sanitize.SanitizeSQL(tc.sql)); got != tc.want {
			t.Errorf("querySummary(%q) = %q, want %q", tc.sql, got, tc.want)
		}
	}
	long := "select * from " + strings.Repeat("a_long_table_name, ", 40) + "b"
	if got := sanitize.QuerySummary(sanitize.SanitizeSQL(long)); len(got) > sanitize.MaxSummary || !strings.HasPrefix(got, "SELECT a_long_table_name") {
		t.Errorf("querySummary of a long list = %q (%d bytes), want at most %d", got, len(got), sanitize.MaxSummary)
	}
}

func TestSanitizerCache(t *testing.T) {
	var z sanitize.Sanitizer
	sql := "select * from t where k = 'x' and v = $1"
	first := z.Get(sql)
	if first.Text != "select * from t where k = ? and v = $1" || first.Summary[0].Value.AsString() != "SELECT t" ||
		first.Set.Kinds() != evidence.OtherSet {
		t.Fatalf("get = %q %v %b", first.Text, first.Summary, first.Set)
	}
	// The hooks take a statement's kinds from the cache: they must be its own.
	if set := z.Get("commit; begin").Set; set != evidence.Classify("commit; begin") || !set.Commits() || !set.Has(evidence.Begin) {
		t.Errorf("get(commit; begin).set = %b, want %b", set, evidence.Classify("commit; begin"))
	}
	if allocs := testing.AllocsPerRun(100, func() { z.Get(sql) }); allocs != 0 {
		t.Errorf("a cached statement costs %v allocations, want 0", allocs)
	}
	// otelpgx's span name of the sanitized text, which it is given: otelpgx's own answer,
	// from the cache at no allocation once the text is there, where otelpgx allocates.
	ctx := context.Background()
	if got, want := z.OperationName(ctx, first.Text), otelpgx.SQLOperationName(ctx, first.Text); got != want || got != "SELECT" {
		t.Errorf("operationName(%q) = %q, otelpgx's is %q", first.Text, got, want)
	}
	if allocs := testing.AllocsPerRun(100, func() { z.OperationName(ctx, first.Text) }); allocs != 0 {
		t.Errorf("a cached operation name costs %v allocations, want 0", allocs)
	}
	if allocs := testing.AllocsPerRun(100, func() { otelpgx.SQLOperationName(ctx, first.Text) }); allocs == 0 {
		t.Error("otelpgx.SQLOperationName no longer allocates: the cache of operation names may be redundant")
	}
	for i := range sanitize.SanitizeCacheEntries + 10 {
		z.Get(fmt.Sprintf("select %d", i))
	}
	if n := len(z.M); n > sanitize.SanitizeCacheEntries {
		t.Errorf("cache holds %d entries, want at most %d", n, sanitize.SanitizeCacheEntries)
	}
	big := strings.Repeat("x", sanitize.MaxCachedSQL-20)
	for i := range 2 * sanitize.SanitizeCacheBytes / sanitize.MaxCachedSQL {
		z.Get(fmt.Sprintf("select '%s' /* %d */", big, i))
	}
	total := 0
	for k, v := range z.M {
		total += v.Size(k)
	}
	if total != z.Bytes || total > sanitize.SanitizeCacheBytes {
		t.Errorf("cache holds %d bytes of text (counted %d), want at most %d", total, z.Bytes, sanitize.SanitizeCacheBytes)
	}
	huge := "select '" + strings.Repeat("x", sanitize.MaxCachedSQL) + "'"
	if got := z.Get(huge).Text; got != "select ?" {
		t.Errorf("huge statement sanitized to %q", got)
	}
	if _, cached := z.M[huge]; cached {
		t.Error("a statement longer than maxCachedSQL was cached")
	}
}

// secretAlphabet is what planted literal values are made of in the fuzz test: upper case
// letters and digits never occur in its SQL skeletons (keywords and identifiers are
// lower case, parameters are removed before the check), and quotes, backslashes and
// dollars test the escapes.
const secretAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\\$\"; -/*\n"

// skeletonTokens are the SQL the fuzz test plants literals between.
var skeletonTokens = []string{"select", "from", "t", "where", "k", "=", "(", ")", ",", ";", "insert", "into",
	"values", "update", "set", "$1", "$2", "::", "text", "||", "-", "+", "*", "/", "e", "b", "x", "u", "n", "&",
	"a$b", `"quoted id"`, `"q""d"`, "-- comment\n", "/* c /* nested */ */", "create", "role", "password",
	"interval", "date", "copy", "stdin", "\n", ".", "join", "on", "as", "and", "or", "like", "?"}

// plantLiteral returns a literal of a random kind whose value is made of payload bytes,
// written so that PostgreSQL's lexer reads it as one literal.
func plantLiteral(r *rand.Rand, payload []byte) string {
	var value strings.Builder
	value.WriteByte('S') // every literal has a byte the check can see
	for _, c := range payload {
		value.WriteByte(secretAlphabet[int(c)%len(secretAlphabet)])
	}
	v := value.String()
	digits := func(keep string) string {
		var d strings.Builder
		for _, c := range payload {
			d.WriteByte(keep[int(c)%len(keep)])
		}
		return "1" + d.String()
	}
	switch r.IntN(9) {
	case 0:
		return "'" + strings.ReplaceAll(v, "'", "''") + "'"
	case 1:
		esc := strings.ReplaceAll(v, `\`, `\\`)
		if r.IntN(2) == 0 {
			esc = strings.ReplaceAll(esc, "'", `\'`)
		} else {
			esc = strings.ReplaceAll(esc, "'", "''")
		}
		return []string{"E", "e"}[r.IntN(2)] + "'" + esc + "'"
	case 2:
		return "$$" + strings.ReplaceAll(v, "$", "") + "$$"
	case 3:
		return "$tg$" + v + "$tg$"
	case 4:
		n := digits("0123456789")
		switch r.IntN(4) {
		case 1:
			n += "." + digits("0123456789")
		case 2:
			n += "e-" + digits("0123456789")
		case 3:
			n = "." + n
		}
		return n
	case 5:
		return []string{"B", "b"}[r.IntN(2)] + "'" + digits("01") + "'"
	case 6:
		return []string{"X", "x"}[r.IntN(2)] + "'" + digits("0123456789ABCDEF") + "'"
	case 7:
		return []string{"U&", "u&"}[r.IntN(2)] + "'" + strings.ReplaceAll(v, "'", "''") + "'"
	}
	return []string{"N", "n"}[r.IntN(2)] + "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// FuzzSanitize: arbitrary text never panics and sanitizes idempotently; SQL built from
// skeleton tokens with literals planted at random token positions sanitizes to text
// with none of the literals' bytes, and its summary holds only skeleton words.
func FuzzSanitize(f *testing.F) {
	for _, s := range []string{"select 'a''b'", `E'\''`, "$$x$$", "$a$x$a$", "U&'x'", "B'1'", "1e5", "/* /* */", "'unterminated", "$1$a$", "a$b$c$"} {
		f.Add(s, uint64(1), []byte("seed"))
	}
	f.Fuzz(func(t *testing.T, raw string, seed uint64, payload []byte) {
		once := sanitize.SanitizeSQL(raw)
		if twice := sanitize.SanitizeSQL(once); twice != once {
			t.Fatalf("not idempotent: %q → %q → %q", raw, once, twice)
		}
		sanitize.QuerySummary(once)
		// The span name otelpgx is given is its own, from text it was handed sanitized or raw.
		for _, z := range []*sanitize.Sanitizer{{}, {Raw: true}} {
			given := z.InnerSQL(raw, z.Get(raw))
			for range 2 { // filling the cache, then from it
				if got, want := z.OperationName(context.Background(), given), otelpgx.SQLOperationName(context.Background(), given); got != want {
					t.Fatalf("raw %v: operationName(%q) = %q, otelpgx's is %q", z.Raw, given, got, want)
				}
			}
		}

		r := rand.New(rand.NewPCG(seed, seed>>1))
		var sql strings.Builder
		var skeleton strings.Builder
		n := 1 + r.IntN(12)
		for i := range n {
			if i > 0 {
				sql.WriteByte(' ')
			}
			if r.IntN(3) == 0 && len(payload) > 0 {
				k := 1 + r.IntN(len(payload))
				sql.WriteString(plantLiteral(r, payload[:k]))
				payload = payload[k:]
				continue
			}
			tok := skeletonTokens[r.IntN(len(skeletonTokens))]
			skeleton.WriteString(strings.ToLower(tok) + " ")
			sql.WriteString(tok)
		}
		got := sanitize.SanitizeSQL(sql.String())
		check := strings.NewReplacer("$1", "", "$2", "").Replace(got)
		if i := strings.IndexAny(check, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\\"); i >= 0 {
			t.Fatalf("literal byte %q survived: %q → %q", check[i], sql.String(), got)
		}
		if again := sanitize.SanitizeSQL(got); again != got {
			t.Fatalf("not idempotent: %q → %q → %q", sql.String(), got, again)
		}
		for _, w := range strings.FieldsFunc(sanitize.QuerySummary(got), func(c rune) bool { return c == ' ' || c == ';' || c == '.' }) {
			if !strings.Contains(skeleton.String(), strings.ToLower(w)) {
				t.Fatalf("summary word %q of %q is not from the skeleton", w, sql.String())
			}
		}
	})
}

// BenchmarkSanitize is the sanitizer's own cost per statement: cold (tokenized, with its
// summary) and cached (what a repeated statement costs).
func BenchmarkSanitize(b *testing.B) {
	const sql = "insert into accounts (id, owner, balance) values ($1, 'alice@example.com', 100.50) on conflict (id) do update set balance = accounts.balance + 1"
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s := sanitize.SanitizeSQL(sql)
			sanitize.QuerySummary(s)
		}
	})
	b.Run("cached", func(b *testing.B) {
		var z sanitize.Sanitizer
		z.Get(sql)
		b.ReportAllocs()
		for b.Loop() {
			z.Get(sql)
		}
	})
	b.Run("cached/parallel", func(b *testing.B) {
		var z sanitize.Sanitizer
		z.Get(sql)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				z.Get(sql)
			}
		})
	})
}
