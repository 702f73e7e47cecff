// Package sqltext reads PostgreSQL's SQL text the way its lexer does (with
// standard_conforming_strings on, as pgx requires): one token at a time, comments and
// white space skipped, statements split at the semicolons that end them. It is the one
// scanner the instrumentation uses, for the text it records (literals replaced) and for
// what a statement does to the transaction (BEGIN, COMMIT, savepoints). It allocates
// nothing.
package sqltext

import "strings"

// Kind is the kind of one lexical token of PostgreSQL's SQL.
type Kind uint8

const (
	Other        Kind = iota // an operator or punctuation byte
	Space                    // white space
	Comment                  // -- line or /* nestable block */ comment
	Word                     // keyword or identifier
	QuotedIdent              // "identifier" or U&"identifier"
	Param                    // $n
	Literal                  // string, bit string, dollar-quoted string or number
	Unterminated             // a quote that does not close: the rest of the text
)

// Next returns the kind of the token at s[i] and the index just after it. It
// follows PostgreSQL's lexer with standard_conforming_strings on (pgx requires it).
func Next(s string, i int) (Kind, int) {
	c := s[i]
	switch {
	case IsSpace(c):
		j := i + 1
		for j < len(s) && IsSpace(s[j]) {
			j++
		}
		return Space, j
	case c == '-' && i+1 < len(s) && s[i+1] == '-':
		if j := strings.IndexByte(s[i:], '\n'); j >= 0 {
			return Comment, i + j
		}
		return Comment, len(s)
	case c == '/' && i+1 < len(s) && s[i+1] == '*':
		return Comment, i + blockCommentEnd(s[i:])
	case c == '\'':
		return quoted(s, i, '\'', false, Literal)
	case c == '"':
		return quoted(s, i, '"', false, QuotedIdent)
	case c == '$':
		return dollarToken(s, i)
	case IsDigit(c) || c == '.' && i+1 < len(s) && IsDigit(s[i+1]):
		return numberToken(s, i)
	case IsWordStart(c):
		return wordToken(s, i)
	}
	return Other, i + 1
}

// dollarToken returns the token at s[i] == '$': a $n parameter, a dollar-quoted string,
// or a lone dollar sign.
func dollarToken(s string, i int) (Kind, int) {
	if i+1 < len(s) && IsDigit(s[i+1]) {
		j := i + 1
		for j < len(s) && IsDigit(s[j]) {
			j++
		}
		return Param, j
	}
	switch end := dollarQuoteEnd(s, i); {
	case end == i:
		return Other, i + 1
	case end >= len(s):
		return Unterminated, len(s)
	default:
		return Literal, end + 1
	}
}

// numberToken returns the numeric literal that starts at s[i].
func numberToken(s string, i int) (Kind, int) {
	// Decimal, exponent, 0x/0o/0b and 1_000 forms alike: everything that can
	// continue a number, so that no digit of it survives.
	j := i + 1
	for j < len(s) {
		d := s[j]
		if IsDigit(d) || IsLetter(d) || d == '_' || d == '.' {
			j++
		} else if (d == '+' || d == '-') && (s[j-1] == 'e' || s[j-1] == 'E') {
			j++
		} else {
			break
		}
	}
	return Literal, j
}

// wordToken returns the keyword or identifier that starts at s[i], or the string that
// it prefixes (E'…', B'…', X'…', N'…', U&'…', U&"…").
func wordToken(s string, i int) (Kind, int) {
	c := s[i]
	j := i + 1
	for j < len(s) && (IsWordStart(s[j]) || IsDigit(s[j]) || s[j] == '$') {
		j++
	}
	if j < len(s) && j == i+1 {
		switch {
		case s[j] == '\'' && (c|0x20 == 'e'):
			return quoted(s, j, '\'', true, Literal)
		case s[j] == '\'' && (c|0x20 == 'b' || c|0x20 == 'x' || c|0x20 == 'n'):
			return quoted(s, j, '\'', false, Literal)
		case s[j] == '&' && c|0x20 == 'u' && j+1 < len(s) && s[j+1] == '\'':
			return quoted(s, j+1, '\'', false, Literal)
		case s[j] == '&' && c|0x20 == 'u' && j+1 < len(s) && s[j+1] == '"':
			return quoted(s, j+1, '"', false, QuotedIdent)
		}
	}
	return Word, j
}

// quoted returns the token whose opening quote is at s[q].
func quoted(s string, q int, quote byte, escapes bool, kind Kind) (Kind, int) {
	end := quoteEnd(s, q, quote, escapes)
	if end >= len(s) {
		return Unterminated, len(s)
	}
	return kind, end + 1
}

func IsDigit(c byte) bool { return c >= '0' && c <= '9' }

// IsWordStart reports whether c may start an identifier: PostgreSQL counts every
// non-ASCII byte as a letter.
func IsWordStart(c byte) bool { return IsLetter(c) || c == '_' || c >= 0x80 }

func IsSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// StatementEnd returns the index of the semicolon that ends the first statement of s
// (one outside quotes, quoted identifiers, dollar quotes and comments), or len(s).
func StatementEnd(s string) int {
	for i := 0; i < len(s); {
		kind, end := Next(s, i)
		if kind == Other && s[i] == ';' {
			return i
		}
		i = end
	}
	return len(s)
}

// quoteEnd returns the index of the quote that closes the one at s[i]; a doubled quote
// is part of the text, and so is a backslash-escaped one in an E” string.
func quoteEnd(s string, i int, q byte, escapes bool) int {
	for j := i + 1; j < len(s); j++ {
		switch {
		case escapes && s[j] == '\\':
			j++
		case s[j] == q:
			if j+1 < len(s) && s[j+1] == q {
				j++
				continue
			}
			return j
		}
	}
	return len(s)
}

// dollarQuoteEnd returns the index of the last byte of the dollar-quoted string that
// starts at s[i] ($tag$…$tag$, the tag's letters non-ASCII too, as PostgreSQL allows),
// or i when s[i] starts no dollar quote (a $1 parameter).
func dollarQuoteEnd(s string, i int) int {
	j := i + 1
	for j < len(s) && (IsLetter(s[j]) || s[j] == '_' || s[j] >= 0x80 || (j > i+1 && s[j] >= '0' && s[j] <= '9')) {
		j++
	}
	if j >= len(s) || s[j] != '$' {
		return i
	}
	tag := s[i : j+1]
	k := strings.Index(s[j+1:], tag)
	if k < 0 {
		return len(s)
	}
	return j + 1 + k + len(tag) - 1
}

// NextWord skips white space and comments and returns the keyword-like word at the
// start of s (letters and underscores) and what follows it.
func NextWord(s string) (string, string) {
	s = SkipSpace(s)
	i := 0
	for i < len(s) && (IsLetter(s[i]) || s[i] == '_') {
		i++
	}
	return s[:i], s[i:]
}

func IsLetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

// SkipSpace returns s after its leading white space and comments.
func SkipSpace(s string) string {
	i := 0
	for i < len(s) {
		kind, end := Next(s, i)
		if kind != Space && kind != Comment {
			break
		}
		i = end
	}
	return s[i:]
}

// blockCommentEnd returns the index just after the (nestable) block comment at s[0].
func blockCommentEnd(s string) int {
	depth := 0
	for i := 0; i+1 < len(s); i++ {
		switch {
		case s[i] == '/' && s[i+1] == '*':
			depth++
			i++
		case s[i] == '*' && s[i+1] == '/':
			depth--
			i++
			if depth == 0 {
				return i + 1
			}
		}
	}
	return len(s)
}
