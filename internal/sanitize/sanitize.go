package sanitize

import (
	"context"
	"strings"
	"sync"

	"github.com/exaring/otelpgx"
	"go.opentelemetry.io/otel/attribute"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/internal/sqltext"
)

// SanitizeSQL returns sql with every literal replaced by "?" and every comment by a
// space; keywords, identifiers and $n parameters stay as written. From a quote that does
// not close, everything is replaced: text that cannot be read is never passed through.
// The lines after COPY … FROM STDIN are the rows of a script (psql's inline data),
// never SQL: they are replaced too. It returns sql itself when there is nothing to
// replace.
func SanitizeSQL(sql string) string {
	var out []byte // nil until the first replacement
	first, isCopy, stdin := true, false, false
	for i := 0; i < len(sql); {
		kind, end := sqltext.Next(sql, i)
		if stdin && (kind == sqltext.Other && sql[i] == ';' || kind == sqltext.Space && strings.IndexByte(sql[i:end], '\n') >= 0) {
			if rest := sql[end:]; strings.TrimLeft(rest, " \t\n\r\f\v") != "" {
				out = append(append(copied(out, sql, i), sql[i:end]...), '?')
				return string(out)
			}
		}
		switch {
		case kind == sqltext.Word && first:
			first, isCopy = false, evidence.IsKeyword(sql[i:end], "copy")
		case kind == sqltext.Word && isCopy && evidence.IsKeyword(sql[i:end], "stdin"):
			stdin = true
		case kind == sqltext.Other && sql[i] == ';':
			first, isCopy = true, false
		}
		switch kind {
		case sqltext.Literal, sqltext.Unterminated:
			out = append(copied(out, sql, i), '?')
		case sqltext.Comment:
			out = copied(out, sql, i)
			// A space keeps the neighbours apart: "-/**/-" must not become a comment.
			if n := len(out); n > 0 && !sqltext.IsSpace(out[n-1]) {
				out = append(out, ' ')
			}
		default:
			if out != nil {
				out = append(out, sql[i:end]...)
			}
		}
		i = end
	}
	if out == nil {
		return sql
	}
	return string(out)
}

// copied returns out, or when it is nil a new buffer holding sql[:i]: the text before
// the first replacement.
func copied(out []byte, sql string, i int) []byte {
	if out != nil {
		return out
	}
	return append(make([]byte, 0, len(sql)), sql[:i]...)
}

// MaxSummary bounds db.query.summary, as the semantic conventions recommend.
const MaxSummary = 255

// QuerySummary returns db.query.summary for sql as the database semantic conventions
// describe it: each statement's operations and the tables they act on, in order ("SELECT
// orders", "INSERT shipping_details SELECT orders"), never a literal. A statement that
// is not a query or a change of rows is summarised by its leading keywords ("CREATE
// ROLE", "BEGIN").
// sql must be sanitized text: the summary is made of its words.
func QuerySummary(sql string) string {
	var b summaryBuilder
	for i := 0; i < len(sql); {
		kind, end := sqltext.Next(sql, i)
		b.token(kind, sql[i:end])
		if kind == sqltext.Unterminated {
			break
		}
		i = end
	}
	return b.String()
}

// summaryBuilder reads one statement after another, token by token.
type summaryBuilder struct {
	out       []byte
	inStmt    bool   // a statement's first word was read
	op        string // its first word, lower case
	prev      string // the previous significant token, lower case for keywords
	dml       bool   // the statement reads or changes rows
	ddl       bool   // CREATE, ALTER, DROP …: the object's kind follows
	target    bool   // the next name is a target
	inName    bool   // a name was just written: ".next" continues it
	depth     int    // parenthesis depth
	fromDepth int    // the depth of the FROM list whose commas name further targets
	fromList  bool   // inside a FROM list
}

// summaryClause holds the keywords that end a FROM list's run of names.
var summaryClause = map[string]bool{"where": true, "group": true, "order": true, "limit": true,
	"having": true, "window": true, "union": true, "intersect": true, "except": true, "on": true,
	"returning": true, "for": true, "offset": true, "fetch": true, "set": true, "values": true,
	"select": true, "join": true, "natural": true, "inner": true, "left": true, "right": true,
	"full": true, "cross": true, "outer": true, "do": true, "default": true, "conflict": true}

// summaryDDLNoise holds the DDL words that say neither the object's kind nor its name.
var summaryDDLNoise = map[string]bool{"or": true, "replace": true, "if": true, "not": true,
	"exists": true, "temp": true, "temporary": true, "unlogged": true, "unique": true,
	"concurrently": true, "global": true, "local": true, "recursive": true, "only": true}

// summaryCommands are the words that start PostgreSQL's commands: only these start a
// statement's summary.
var summaryCommands = wordSet("abort alter analyze begin call checkpoint close cluster comment commit copy " +
	"create deallocate declare delete discard do drop end execute explain fetch grant import insert " +
	"listen load lock merge move notify prepare reassign refresh reindex release reset revoke rollback " +
	"savepoint security select set show start table truncate unlisten update vacuum values with")

// summaryDDLWords are the object kinds (and GRANT's privileges) that follow a DDL verb.
var summaryDDLWords = wordSet("role user group function procedure routine schema database extension type " +
	"trigger policy domain aggregate operator materialized foreign server publication subscription " +
	"tablespace collation conversion cast rule event statistics default system large language " +
	"transform owned access method wrapper data select insert update delete all usage execute " +
	"references truncate connect temporary privileges")

func wordSet(words string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(words) {
		m[w] = true
	}
	return m
}

// summaryDDLKinds are the object kinds whose name is a target.
var summaryDDLKinds = map[string]bool{"table": true, "view": true, "index": true, "sequence": true}

func (b *summaryBuilder) token(kind sqltext.Kind, text string) {
	switch kind {
	case sqltext.Space, sqltext.Comment:
		b.inName = false
		return
	case sqltext.Word, sqltext.QuotedIdent:
		b.word(kind, text)
		return
	}
	if b.inName && text == "." {
		b.out = append(b.out, '.')
		b.prev = text
		return
	}
	b.inName = false
	switch text {
	case ";":
		*b = summaryBuilder{out: b.out}
	case "(":
		b.depth++
		b.target = false
	case ")":
		b.depth--
		if b.depth < b.fromDepth {
			b.fromList = false
		}
	case ",":
		if b.fromList && b.depth == b.fromDepth {
			b.target = true
		}
	}
	b.prev = text
}

func (b *summaryBuilder) word(kind sqltext.Kind, text string) {
	lower := ""
	if kind == sqltext.Word && len(text) <= 16 {
		lower = strings.ToLower(text)
	}
	if b.inName { // the rest of a qualified name: schema.table
		b.out = append(b.out, text...)
		b.inName, b.prev = false, lower
		return
	}
	if !b.inStmt {
		b.startStatement(lower, text)
		b.prev = lower
		return
	}
	if b.ddl {
		b.ddlWord(lower, text)
		return
	}
	prev := b.prev
	b.prev = lower
	if !b.dml || b.dmlKeyword(lower, prev) {
		return
	}
	if b.target {
		b.name(text)
		b.target = false
	}
}

func (b *summaryBuilder) startStatement(lower, text string) {
	b.inStmt, b.op = true, lower
	if !summaryCommands[lower] {
		b.op = "" // not a command: a typo, or data; nothing of it is summarised
		return
	}
	if len(b.out) > 0 {
		b.out = append(b.out, ';')
	}
	switch lower {
	case "select", "insert", "update", "delete", "merge", "with", "values", "table", "copy", "call":
		b.dml = true
	case "create", "alter", "drop", "truncate", "comment", "grant", "revoke":
		b.ddl = true
	}
	if lower != "with" {
		b.append(strings.ToUpper(text))
	}
	b.target = lower == "update" || lower == "table" || lower == "copy" || lower == "call" || lower == "truncate"
}

// ddlWord reads the words after CREATE, ALTER, DROP …: the object's kind, then for a
// table-like object its name; the definition that follows is not summarised.
func (b *summaryBuilder) ddlWord(lower, text string) {
	switch {
	case summaryDDLNoise[lower]:
		return // leaves prev alone: CREATE OR REPLACE VIEW still reads VIEW as the kind
	case summaryDDLKinds[lower]:
		b.append(strings.ToUpper(text))
		b.target = true
	case b.target:
		b.name(text)
		b.ddl = false
	case summaryDDLWords[lower] && isDDLVerb(b.prev):
		b.append(strings.ToUpper(text)) // ROLE, FUNCTION, MATERIALIZED …
	default:
		b.ddl = false
	}
	b.prev = lower
}

// isDDLVerb reports whether w may be followed by (more of) an object's kind.
func isDDLVerb(w string) bool {
	switch w {
	case "create", "alter", "drop", "comment", "grant", "revoke", "materialized", "foreign", "event", "truncate":
		return true
	}
	return false
}

// dmlKeyword reads a keyword of a statement that reads or changes rows and reports
// whether the word was one that names no target.
func (b *summaryBuilder) dmlKeyword(lower, prev string) bool {
	if lower == "" {
		return false
	}
	if summaryClause[lower] {
		b.target, b.fromList = false, false
	}
	switch lower {
	case "select":
		b.append("SELECT")
	case "insert", "update", "delete", "merge":
		if prev == "(" || prev == ")" {
			b.append(strings.ToUpper(lower))
			b.target = lower == "update"
		}
	case "from":
		b.target, b.fromList, b.fromDepth = true, true, b.depth
	case "into", "join":
		b.target = true
	case "using":
		b.target = prev != ")" // MERGE … USING source, DELETE … USING other
	case "only", "lateral", "as":
	default:
		return summaryClause[lower]
	}
	return true
}

func (b *summaryBuilder) name(text string) {
	b.append(text)
	b.inName = true
	if b.op == "copy" || b.op == "call" {
		b.dml = false // COPY t FROM STDIN: only the table
	}
}

// append adds a space-separated word, unless the summary would grow past maxSummary.
func (b *summaryBuilder) append(w string) {
	if len(b.out)+1+len(w) > MaxSummary {
		return
	}
	if len(b.out) > 0 {
		b.out = append(b.out, ' ')
	}
	b.out = append(b.out, w...)
}

// String returns the summary built so far.
func (b *summaryBuilder) String() string { return string(b.out) }

// Sanitized is what the tracer knows of one SQL string: what its statements do to the
// transaction, and what it records of it.
type Sanitized struct {
	Set     evidence.Set         // evidence.Classify of the SQL string
	Text    string               // the sanitized query text
	Summary []attribute.KeyValue // db.query.summary, ready for SetAttributes; nil if none
	// Op is otelpgx.SQLOperationName of what the inner tracer is given of the SQL string
	// (see operationName); only cached entries have it.
	Op string
}

// Bounds of the sanitizer's cache: it keeps up to this many SQL strings (pgx's own
// statement cache holds 512 per connection), of at most maxCachedSQL bytes each and
// sanitizeCacheBytes in all.
const (
	SanitizeCacheEntries = 4096
	MaxCachedSQL         = 8 << 10
	SanitizeCacheBytes   = 4 << 20
)

// Sanitizer caches what the tracer knows of each SQL string (see sanitized), so that a
// repeated statement costs one map lookup and no allocation, for its kinds and its text
// alike. It is safe for concurrent use.
type Sanitizer struct {
	mu    sync.RWMutex
	M     map[string]*Sanitized
	Bytes int // the text the cache holds: SQL strings and the sanitized ones that differ
	// Raw: the inner tracer is given the SQL as written ([WithRawQueryText]).
	Raw bool
}

// Size is what caching sql and s costs in text.
func (s *Sanitized) Size(sql string) int {
	if s.Text == sql {
		return len(sql) // sanitizeSQL returned sql itself
	}
	return len(sql) + len(s.Text)
}

// Get returns what the tracer knows of sql.
func (z *Sanitizer) Get(sql string) *Sanitized {
	z.mu.RLock()
	s, ok := z.M[sql]
	z.mu.RUnlock()
	if ok {
		return s
	}
	s = &Sanitized{Set: evidence.Classify(sql), Text: SanitizeSQL(sql)}
	if sum := QuerySummary(s.Text); sum != "" {
		s.Summary = []attribute.KeyValue{schema.DBQuerySummaryKey.String(sum)}
	}
	if len(sql) > MaxCachedSQL {
		return s // uncached: operationName never reads its op
	}
	s.Op = otelpgx.SQLOperationName(context.Background(), z.InnerSQL(sql, s))
	z.mu.Lock()
	if z.M == nil {
		z.M = make(map[string]*Sanitized)
	}
	if _, raced := z.M[sql]; !raced {
		n := s.Size(sql)
		for len(z.M) >= SanitizeCacheEntries || z.Bytes+n > SanitizeCacheBytes {
			for k, v := range z.M { // map iteration starts anywhere: a random eviction
				z.Bytes -= v.Size(k)
				delete(z.M, k)
				break
			}
		}
		z.M[sql] = s
		z.Bytes += n
	}
	z.mu.Unlock()
	return s
}

// InnerSQL returns what the inner tracer is given of sql, which s is what the sanitizer
// knows of: its sanitized text unless [WithRawQueryText] was passed.
func (z *Sanitizer) InnerSQL(sql string, s *Sanitized) string {
	if z.Raw {
		return sql
	}
	return s.Text
}

// OperationName is otelpgx.SQLOperationName(ctx, given), for given the text an inner
// otelpgx tracer was handed of a SQL string, from the cache: otelpgx would parse and
// upper-case the statement on every sampled query (one allocation each). Sanitized
// texts are cached as SQL strings of their own: they sanitize to themselves, and many
// statements that differ only in their literals share one. A cached answer is used only
// when given is what the inner tracer gets of its SQL string, so that the name is always
// otelpgx's own.
func (z *Sanitizer) OperationName(ctx context.Context, given string) string {
	if len(given) <= MaxCachedSQL {
		if s := z.Get(given); z.InnerSQL(given, s) == given {
			return s.Op
		}
	}
	return otelpgx.SQLOperationName(ctx, given)
}
