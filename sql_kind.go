package otelpgxtx

import (
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/sqltext"
)

// stmtKind is what a statement does to the session's transaction.
type stmtKind uint8

const (
	stmtOther         stmtKind = iota
	stmtBegin                  // BEGIN …, START TRANSACTION …
	stmtCommit                 // COMMIT, END (also … AND NO CHAIN)
	stmtCommitChain            // COMMIT AND CHAIN: commits, then begins a new transaction
	stmtRollback               // ROLLBACK, ABORT
	stmtRollbackChain          // ROLLBACK AND CHAIN
	stmtSavepoint              // SAVEPOINT name
	stmtRelease                // RELEASE [SAVEPOINT] name
	stmtRollbackTo             // ROLLBACK [WORK|TRANSACTION] TO [SAVEPOINT] name
)

// stmtSet is what a query string does, as a set of kinds and two flags. Nearly every
// query holds one statement; a simple-protocol string may hold several ("begin; …;
// commit").
type stmtSet uint16

// Flags of a stmtSet, beside its kinds.
const (
	// setWrites: a statement may write (one not known to only read), so that the
	// transaction it runs in may have an xid: commit references are taken only then.
	setWrites stmtSet = 1 << 14
	// setSingle: the string holds one statement.
	setSingle stmtSet = 1 << 15
)

func (s stmtSet) has(k stmtKind) bool { return s&(1<<k) != 0 }
func (s stmtSet) writes() bool        { return s&setWrites != 0 }
func (s stmtSet) kinds() stmtSet      { return s &^ (setWrites | setSingle) }
func (s stmtSet) single() bool        { return s&setSingle != 0 }

func (s stmtSet) commits() bool   { return s.has(stmtCommit) || s.has(stmtCommitChain) }
func (s stmtSet) rollsBack() bool { return s.has(stmtRollback) || s.has(stmtRollbackChain) }
func (s stmtSet) chains() bool    { return s.has(stmtCommitChain) || s.has(stmtRollbackChain) }
func (s stmtSet) savepoint() bool {
	return s.has(stmtSavepoint) || s.has(stmtRelease) || s.has(stmtRollbackTo)
}

// classifyStatements returns what sql does to the transaction. It reads only the leading
// keywords of each statement, skips comments and white space, and ignores case; it splits
// on semicolons outside quotes, quoted identifiers, dollar quotes and comments.
func classifyStatements(sql string) stmtSet {
	kind, rest := classifyOne(sql)
	set := stmtSet(1)<<kind | setSingle | writes(kind, sql)
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
		set = set&^setSingle | 1<<kind | writes(kind, stmt)
	}
	return set.transactional()
}

// writes returns setWrites unless the statement sql, of kind k, is known to only read:
// transaction control, and the statements whose first keyword only reads or sets session
// state. A SELECT is taken to read, though a function it calls may write: such a
// transaction is treated as one that wrote nothing (no reference is taken for it, which
// loses precision, never soundness).
func writes(k stmtKind, sql string) stmtSet {
	if k != stmtOther {
		return 0
	}
	w, _ := sqltext.NextWord(sql)
	for _, r := range readOnlyWords {
		if eq(w, r) {
			return 0
		}
	}
	if w == "" && sqltext.SkipSpace(sql) == "" {
		return 0 // an empty statement
	}
	return setWrites
}

// readOnlyWords are the first keywords of statements that assign no transaction id.
var readOnlyWords = [...]string{"select", "show", "set", "reset", "values", "table", "fetch", "move", "close", "declare", "listen", "unlisten", "discard"}

// classifyBatch returns what the queued queries of b do to the transaction, and the SQL
// of the query that begins the frame (the one with BEGIN, else the first).
func (t *Tracer) classifyBatch(b *pgx.Batch) (stmtSet, string) {
	var set stmtSet
	beginSQL := ""
	if b != nil {
		for i, qq := range b.QueuedQueries {
			s := t.sanitized.get(qq.SQL).set
			if i == 0 || beginSQL == "" && s.has(stmtBegin) {
				beginSQL = qq.SQL
			}
			set |= s
		}
	}
	return (set &^ setSingle).transactional(), beginSQL
}

// transactional drops stmtOther from a set that holds a transaction-control kind: only
// a set of plain statements is "other".
func (s stmtSet) transactional() stmtSet {
	if s.kinds() != 1<<stmtOther {
		s &^= 1 << stmtOther
	}
	return s
}

// classifyOne classifies the statement at the start of sql and returns the text after
// its leading keywords.
func classifyOne(sql string) (stmtKind, string) {
	w1, rest := sqltext.NextWord(sql)
	switch {
	case eq(w1, "begin"):
		return stmtBegin, rest
	case eq(w1, "start"):
		if w2, r := sqltext.NextWord(rest); eq(w2, "transaction") {
			return stmtBegin, r
		}
	case eq(w1, "commit"), eq(w1, "end"):
		w2, r := sqltext.NextWord(rest)
		if eq(w2, "prepared") {
			return stmtOther, rest // COMMIT PREPARED runs outside a transaction
		}
		if eq(w2, "work") || eq(w2, "transaction") {
			w2, r = sqltext.NextWord(r)
		}
		return endKind(w2, r, stmtCommit, stmtCommitChain)
	case eq(w1, "rollback"), eq(w1, "abort"):
		w2, r := sqltext.NextWord(rest)
		if eq(w2, "prepared") && eq(w1, "rollback") {
			return stmtOther, rest
		}
		if eq(w2, "work") || eq(w2, "transaction") {
			w2, r = sqltext.NextWord(r)
		}
		if eq(w2, "to") && eq(w1, "rollback") {
			return stmtRollbackTo, r
		}
		return endKind(w2, r, stmtRollback, stmtRollbackChain)
	case eq(w1, "savepoint"):
		return stmtSavepoint, rest
	case eq(w1, "release"):
		return stmtRelease, rest
	}
	return stmtOther, rest
}

// endKind reads an optional "AND [NO] CHAIN" after COMMIT or ROLLBACK.
func endKind(w, rest string, plain, chain stmtKind) (stmtKind, string) {
	if !eq(w, "and") {
		return plain, rest
	}
	w2, r := sqltext.NextWord(rest)
	if eq(w2, "chain") {
		return chain, r
	}
	return plain, r
}

// eq reports whether word is keyword, in any case, as SQL keywords are.
func eq(word, keyword string) bool {
	return len(word) == len(keyword) && strings.EqualFold(word, keyword)
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
		case eq(w, "isolation"):
			_, r = sqltext.NextWord(r) // LEVEL
			a, r2 := sqltext.NextWord(r)
			b, r3 := sqltext.NextWord(r2)
			switch {
			case eq(a, "serializable"):
				isolation, r = "serializable", r2
			case eq(a, "repeatable"):
				isolation, r = "repeatable read", r3
			case eq(a, "read") && eq(b, "committed"):
				isolation, r = "read committed", r3
			case eq(a, "read") && eq(b, "uncommitted"):
				isolation, r = "read uncommitted", r3
			}
		case eq(w, "read"):
			b, r2 := sqltext.NextWord(r)
			switch {
			case eq(b, "only"):
				accessMode, r = "read only", r2
			case eq(b, "write"):
				accessMode, r = "read write", r2
			}
		}
		if len(r) >= len(rest) {
			return isolation, accessMode // no progress: text we do not read
		}
		rest = r
	}
}

// savepointName returns the name after SAVEPOINT, RELEASE [SAVEPOINT] or ROLLBACK [WORK|
// TRANSACTION] TO [SAVEPOINT], as a substring of sql (no allocation).
func savepointName(sql string) string {
	kind, rest := classifyOne(sql)
	if kind == stmtRelease || kind == stmtRollbackTo {
		if w, r := sqltext.NextWord(rest); eq(w, "savepoint") {
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
