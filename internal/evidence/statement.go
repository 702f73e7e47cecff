package evidence

import (
	"strings"

	"github.com/txevidence/otelpgxtx/internal/sqltext"
)

// Kind is what a statement does to the session's transaction.
type Kind uint8

const (
	Other         Kind = iota
	Begin              // BEGIN …, START TRANSACTION …
	Commit             // COMMIT, END (also … AND NO CHAIN)
	CommitChain        // COMMIT AND CHAIN: commits, then begins a new transaction
	Rollback           // ROLLBACK, ABORT
	RollbackChain      // ROLLBACK AND CHAIN
	Savepoint          // SAVEPOINT name
	Release            // RELEASE [SAVEPOINT] name
	RollbackTo         // ROLLBACK [WORK|TRANSACTION] TO [SAVEPOINT] name
	// Prepare is PREPARE TRANSACTION 'gid': two-phase commit's first phase, which makes
	// the transaction durable and ends the session's part in it (see Conn.After).
	Prepare
	// CommitPrepared and RollbackPrepared (COMMIT PREPARED 'gid', ROLLBACK PREPARED
	// 'gid') end a prepared transaction; they run outside a transaction block.
	CommitPrepared
	RollbackPrepared
)

// Set is what a query string does, as a set of kinds and two flags. Nearly every
// query holds one statement; a simple-protocol string may hold several ("begin; …;
// commit").
type Set uint16

// Flags of a Set, beside its kinds.
const (
	// insideFlag: a statement may commit inside (CommitsInside).
	insideFlag Set = 1 << 13
	// writesFlag: a statement may write (one not known to only read), so that the
	// transaction it runs in may have an xid: commit references are taken only then.
	writesFlag Set = 1 << 14
	// singleFlag: the string holds one statement.
	singleFlag Set = 1 << 15
)

func (s Set) Has(k Kind) bool { return s&(1<<k) != 0 }
func (s Set) Writes() bool    { return s&writesFlag != 0 }
func (s Set) Kinds() Set      { return s &^ (writesFlag | singleFlag | insideFlag) }
func (s Set) Single() bool    { return s&singleFlag != 0 }

// CommitsInside reports whether a statement may commit inside itself when it runs outside
// a transaction block, with no command tag of its own for each commit: CALL and DO (a
// procedure or a DO block may COMMIT and ROLLBACK, PostgreSQL 11 and later), and the
// commands that run several transactions of their own (VACUUM, ANALYZE, CLUSTER and
// REINDEX, table by table; CREATE INDEX, DROP INDEX, REINDEX and ALTER TABLE … DETACH
// PARTITION with CONCURRENTLY, phase by phase). Its failure proves no rollback of what
// an inner commit made durable.
func (s Set) CommitsInside() bool { return s&insideFlag != 0 }

func (s Set) Commits() bool   { return s.Has(Commit) || s.Has(CommitChain) }
func (s Set) RollsBack() bool { return s.Has(Rollback) || s.Has(RollbackChain) }
func (s Set) Chains() bool    { return s.Has(CommitChain) || s.Has(RollbackChain) }

// Prepares reports whether a statement is PREPARE TRANSACTION.
func (s Set) Prepares() bool { return s.Has(Prepare) }

// Decides reports whether a statement's reply decides the fate of the transaction it
// runs in: COMMIT (also AND CHAIN) or PREPARE TRANSACTION. The frame is committing from
// the moment it is handed over. (COMMIT PREPARED and ROLLBACK PREPARED decide another
// transaction's, in a frame of their own: see Conn.Before.)
func (s Set) Decides() bool { return s.Commits() || s.Prepares() }

// EndsPrepared reports whether a statement ends a prepared transaction (COMMIT PREPARED,
// ROLLBACK PREPARED).
func (s Set) EndsPrepared() bool { return s.Has(CommitPrepared) || s.Has(RollbackPrepared) }

// Implicit reports whether a query of set, sent while the session is idle, is an implicit
// transaction of its own that may write: PostgreSQL runs a statement sent outside a
// transaction block in a transaction of its own, committed as soon as it has run (at the
// Sync after it; a simple-protocol string and a pgx batch are one, up to their Sync). A
// query that begins or prepares a transaction is not one (it is a frame's statement),
// nor a transaction-control statement alone, nor one known only to read: only a write can
// be lost with a commit. Several statements with a COMMIT or ROLLBACK among them and no
// BEGIN are one: their implicit transaction ends at that COMMIT (the protocol's own
// example, "insert …; commit; insert …"), and what follows it is another (Conn.Split).
func (s Set) Implicit() bool {
	if !s.Writes() || s.Kinds()&(1<<Begin|1<<Prepare|1<<CommitPrepared|1<<RollbackPrepared) != 0 {
		return false
	}
	return !s.Single() || s.Kinds()&controlKinds == 0
}

func (s Set) MovesSavepoint() bool {
	return s.Has(Savepoint) || s.Has(Release) || s.Has(RollbackTo)
}

// controlKinds are the transaction-control statements: BEGIN, COMMIT, ROLLBACK, their
// AND CHAIN forms and the savepoint statements.
const controlKinds Set = 1<<Begin | 1<<Commit | 1<<CommitChain | 1<<Rollback |
	1<<RollbackChain | 1<<Savepoint | 1<<Release | 1<<RollbackTo

// Control reports whether the query is one transaction-control statement alone: a string
// that does more ("begin; insert …") is not.
func (s Set) Control() bool { return s.Single() && s.Kinds()&controlKinds != 0 }

// OtherSet is the set of a query that is one statement of no transaction-control kind
// that writes nothing the kinds know of: a COPY, a prepare.
const OtherSet Set = 1 << Other

// CopyFromSet is the set of pgx's CopyFrom: one COPY … FROM STDIN, which writes.
const CopyFromSet Set = OtherSet | writesFlag | singleFlag

// Together is the set of queries sent together, each of set (or-ed): a batch.
func Together(set Set) Set { return (set &^ singleFlag).transactional() }

// Classify returns what sql does to the transaction. It reads only the leading
// keywords of each statement, skips comments and white space, and ignores case; it splits
// on semicolons outside quotes, quoted identifiers, dollar quotes and comments.
func Classify(sql string) Set {
	kind, rest := classifyOne(sql)
	set := Set(1)<<kind | singleFlag | writes(kind, sql) | inside(kind, sql)
	// The common case is a single statement: one IndexByte, no allocation.
	for strings.IndexByte(rest, ';') >= 0 {
		end := sqltext.StatementEnd(rest)
		if end >= len(rest) {
			break
		}
		rest = rest[end+1:]
		if sqltext.SkipSpace(rest) == "" {
			break // a trailing semicolon
		}
		stmt := rest
		kind, rest = classifyOne(rest)
		set = set&^singleFlag | 1<<kind | writes(kind, stmt)
	}
	if !set.Single() {
		// Several statements in one string run in an implicit transaction block, in which a
		// CALL or DO is atomic (no COMMIT inside) and the others are refused.
		set &^= insideFlag
	}
	return set.transactional()
}

// writes returns writesFlag unless the statement sql, of kind k, is known to only read:
// transaction control, and the statements whose first keyword only reads or sets session
// state. A SELECT is taken to read unless it writes by its own shape (selectWrites),
// though a function it calls may write: such a transaction is treated as one that wrote
// nothing (no reference is taken for it, which loses precision, never soundness).
func writes(k Kind, sql string) Set {
	if k != Other {
		return 0
	}
	w, rest := sqltext.NextWord(sql)
	if IsKeyword(w, "select") {
		return selectWrites(rest)
	}
	for _, r := range readOnlyWords {
		if IsKeyword(w, r) {
			return 0
		}
	}
	if w == "" && sqltext.SkipSpace(sql) == "" {
		return 0 // an empty statement
	}
	return writesFlag
}

// inside returns insideFlag for a statement sql, of kind k, that may commit inside
// (Set.CommitsInside): by its first keyword (CALL, DO, VACUUM, ANALYZE, CLUSTER, REINDEX),
// or CONCURRENTLY at the top level of a CREATE, DROP or ALTER (not REFRESH MATERIALIZED
// VIEW CONCURRENTLY, which runs in one transaction).
func inside(k Kind, sql string) Set {
	if k != Other {
		return 0
	}
	w, rest := sqltext.NextWord(sql)
	for _, c := range insideWords {
		if IsKeyword(w, c) {
			return insideFlag
		}
	}
	if !IsKeyword(w, "create") && !IsKeyword(w, "drop") && !IsKeyword(w, "alter") {
		return 0
	}
	for i := 0; i < len(rest); {
		kind, end := sqltext.Next(rest, i)
		switch {
		case kind == sqltext.Other && rest[i] == ';':
			return 0
		case kind == sqltext.Word && IsKeyword(rest[i:end], "concurrently"):
			return insideFlag
		}
		i = end
	}
	return 0
}

// insideWords are the first keywords of statements that may commit inside.
var insideWords = [...]string{"call", "do", "vacuum", "analyze", "analyse", "cluster", "reindex"}

// selectWrites returns writesFlag for a SELECT (rest: the text after the keyword) that
// assigns the transaction an xid by itself: SELECT … INTO, which creates a table, and a
// locking clause (FOR UPDATE, FOR NO KEY UPDATE, FOR SHARE, FOR KEY SHARE), which marks
// the rows it locks with the xid. Both are read at the statement's top level (outside
// parentheses), where nothing else spells them.
func selectWrites(rest string) Set {
	depth := 0
	for i := 0; i < len(rest); {
		kind, end := sqltext.Next(rest, i)
		switch {
		case kind == sqltext.Other && rest[i] == ';':
			return 0
		case kind == sqltext.Other && rest[i] == '(':
			depth++
		case kind == sqltext.Other && rest[i] == ')':
			depth--
		case kind == sqltext.Word && depth == 0:
			w := rest[i:end]
			if IsKeyword(w, "into") {
				return writesFlag
			}
			if IsKeyword(w, "for") {
				next, _ := sqltext.NextWord(rest[end:])
				if IsKeyword(next, "update") || IsKeyword(next, "share") || IsKeyword(next, "no") || IsKeyword(next, "key") {
					return writesFlag
				}
			}
		}
		i = end
	}
	return 0
}

// readOnlyWords are the first keywords of statements that assign no transaction id.
var readOnlyWords = [...]string{"show", "set", "reset", "values", "table", "fetch", "move", "close", "declare", "listen", "unlisten", "discard"}

// transactional drops Other from a set that holds a transaction-control kind: only
// a set of plain statements is "other".
func (s Set) transactional() Set {
	if s.Kinds() != 1<<Other {
		s &^= 1 << Other
	}
	return s
}

// classifyOne classifies the statement at the start of sql and returns the text after
// its leading keywords.
func classifyOne(sql string) (Kind, string) {
	w1, rest := sqltext.NextWord(sql)
	switch {
	case IsKeyword(w1, "begin"):
		return Begin, rest
	case IsKeyword(w1, "start"):
		if w2, r := sqltext.NextWord(rest); IsKeyword(w2, "transaction") {
			return Begin, r
		}
	case IsKeyword(w1, "commit"), IsKeyword(w1, "end"):
		w2, r := sqltext.NextWord(rest)
		if IsKeyword(w2, "prepared") && IsKeyword(w1, "commit") {
			return CommitPrepared, r
		}
		if IsKeyword(w2, "work") || IsKeyword(w2, "transaction") {
			w2, r = sqltext.NextWord(r)
		}
		return endKind(w2, r, Commit, CommitChain)
	case IsKeyword(w1, "rollback"), IsKeyword(w1, "abort"):
		w2, r := sqltext.NextWord(rest)
		if IsKeyword(w2, "prepared") && IsKeyword(w1, "rollback") {
			return RollbackPrepared, r
		}
		if IsKeyword(w2, "work") || IsKeyword(w2, "transaction") {
			w2, r = sqltext.NextWord(r)
		}
		if IsKeyword(w2, "to") && IsKeyword(w1, "rollback") {
			return RollbackTo, r
		}
		return endKind(w2, r, Rollback, RollbackChain)
	case IsKeyword(w1, "prepare"):
		if w2, r := sqltext.NextWord(rest); IsKeyword(w2, "transaction") {
			return Prepare, r
		}
	case IsKeyword(w1, "savepoint"):
		return Savepoint, rest
	case IsKeyword(w1, "release"):
		return Release, rest
	}
	return Other, rest
}

// endKind reads an optional "AND [NO] CHAIN" after COMMIT or ROLLBACK.
func endKind(w, rest string, plain, chain Kind) (Kind, string) {
	if !IsKeyword(w, "and") {
		return plain, rest
	}
	w2, r := sqltext.NextWord(rest)
	if IsKeyword(w2, "chain") {
		return chain, r
	}
	return plain, r
}

// IsKeyword reports whether word is keyword, in any case, as SQL keywords are.
func IsKeyword(word, keyword string) bool {
	return len(word) == len(keyword) && strings.EqualFold(word, keyword)
}

// BeginOptions reads the isolation level and access mode of the BEGIN or START
// TRANSACTION at the start of sql (see beginOptions).
func BeginOptions(sql string) (isolation, accessMode string) {
	_, rest := classifyOne(sql)
	return beginOptions(rest)
}

// beginOptions reads the isolation level and access mode from the text after BEGIN or
// START TRANSACTION. It returns pgx's spellings ("repeatable read", "read only"), or ""
// where the statement does not say.
func beginOptions(rest string) (isolation, accessMode string) {
	for {
		w, r := sqltext.NextWord(rest)
		switch {
		case w == "":
			r = sqltext.SkipSpace(r)
			if r == "" || r[0] != ',' {
				return isolation, accessMode
			}
			r = r[1:]
		case IsKeyword(w, "isolation"):
			_, r = sqltext.NextWord(r) // LEVEL
			a, r2 := sqltext.NextWord(r)
			b, r3 := sqltext.NextWord(r2)
			switch {
			case IsKeyword(a, "serializable"):
				isolation, r = "serializable", r2
			case IsKeyword(a, "repeatable"):
				isolation, r = "repeatable read", r3
			case IsKeyword(a, "read") && IsKeyword(b, "committed"):
				isolation, r = "read committed", r3
			case IsKeyword(a, "read") && IsKeyword(b, "uncommitted"):
				isolation, r = "read uncommitted", r3
			}
		case IsKeyword(w, "read"):
			b, r2 := sqltext.NextWord(r)
			switch {
			case IsKeyword(b, "only"):
				accessMode, r = "read only", r2
			case IsKeyword(b, "write"):
				accessMode, r = "read write", r2
			}
		}
		if len(r) >= len(rest) {
			return isolation, accessMode // no progress: text we do not read
		}
		rest = r
	}
}

// GID returns the global transaction identifier of the PREPARE TRANSACTION, COMMIT
// PREPARED or ROLLBACK PREPARED at the start of sql: its string literal as written
// ('…', quotes included), a substring of sql; "" when it is not one (an escape or dollar
// quoted string, a parameter).
func GID(sql string) string {
	kind, rest := classifyOne(sql)
	rest = sqltext.SkipSpace(rest)
	if kind != Prepare && kind != CommitPrepared && kind != RollbackPrepared || rest == "" || rest[0] != '\'' {
		return ""
	}
	if kind, end := sqltext.Next(rest, 0); kind == sqltext.Literal {
		return rest[:end]
	}
	return ""
}

// SavepointName returns the name after SAVEPOINT, RELEASE [SAVEPOINT] or ROLLBACK [WORK|
// TRANSACTION] TO [SAVEPOINT], as a substring of sql (no allocation).
func SavepointName(sql string) string {
	kind, rest := classifyOne(sql)
	if kind == Release || kind == RollbackTo {
		if w, r := sqltext.NextWord(rest); IsKeyword(w, "savepoint") {
			rest = r
		}
	}
	rest = sqltext.SkipSpace(rest)
	if rest == "" {
		return ""
	}
	// The name is one token, read as the lexer reads it: a quoted one may hold spaces or
	// semicolons.
	if kind, end := sqltext.Next(rest, 0); kind == sqltext.Word || kind == sqltext.QuotedIdent {
		return rest[:end]
	}
	return ""
}
