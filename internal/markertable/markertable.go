// Package markertable reads and writes the names of commit-marker tables: the quoted
// schema-qualified name the library writes its marker rows through, the operator's
// spelling of it on the command line, and the database-qualified form a reconciliation
// reference carries. It is internal because users name the table as a pgx.Identifier
// (otelpgxtx.WithCommitMarker, reconcile.MarkerTableDDL); only the packages of this module
// turn it into SQL or read it back.
package markertable

import (
	"errors"
	"fmt"
	"strings"
)

// Quote returns a commit-marker table's name, schema and table, as a qualified
// SQL name with both parts quoted as identifiers ("app"."tx_marker"). The schema is
// required: a marker written through an unqualified name would go wherever the session's
// search_path pointed at commit time, and a reconciler looking it up with another
// search_path would find another table, or none. It refuses an empty part and a NUL byte,
// which PostgreSQL identifiers cannot hold.
func Quote(parts ...string) (string, error) {
	if len(parts) != 2 {
		return "", fmt.Errorf("a marker table is named by its schema and its name (2 parts), not %d part(s)", len(parts))
	}
	return quoteParts(parts)
}

// quoteParts quotes each part as an identifier and joins them with dots.
func quoteParts(parts []string) (string, error) {
	var b strings.Builder
	for i, p := range parts {
		if p == "" || strings.IndexByte(p, 0) >= 0 {
			return "", fmt.Errorf("marker table name part %d is empty or holds a NUL byte", i+1)
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(`"` + strings.ReplaceAll(p, `"`, `""`) + `"`)
	}
	return b.String(), nil
}

// Parse reads a marker table's name as an operator writes it, schema and
// table, and returns its two parts, for [Quote]: the quoted form
// ("app"."tx_marker") or, for parts that quoting leaves unchanged (lower-case letters,
// digits, _ and $, not starting with a digit or $), the same parts unquoted
// (app.tx_marker). Any other unquoted part is refused rather than guessed at:
// PostgreSQL folds App to app, while a quoted "App" is another table.
func Parse(s string) ([]string, error) {
	parts, err := splitTableName(s, true)
	if err == nil && len(parts) != 2 {
		err = fmt.Errorf("marker table %q is not schema-qualified: want schema.table", s)
	}
	return parts, err
}

// SplitRef splits a reference's marker table, "database"."schema"."table", into the
// database and the quoted relation ("schema"."table").
func SplitRef(s string) (database, relation string, err error) {
	parts, err := splitTableName(s, false)
	if err != nil {
		return "", "", err
	}
	if len(parts) != 3 {
		return "", "", fmt.Errorf("malformed marker table %q: want \"database\".\"schema\".\"table\"", s)
	}
	relation, _ = quoteParts(parts[1:])
	return parts[0], relation, nil
}

// RefTable returns the marker table of a reference: table (as [Quote]
// returns it) in database, "database"."schema"."table".
func RefTable(database, table string) (string, error) {
	db, err := quoteParts([]string{database})
	if err != nil {
		return "", err
	}
	if _, _, err := SplitRef(db + "." + table); err != nil {
		return "", err
	}
	return db + "." + table, nil
}

// splitTableName splits s into its 1 to 3 parts, each quoted ("a""b") or, if bare is
// set, a plain lower-case identifier.
func splitTableName(s string, bare bool) ([]string, error) {
	want := `"schema"."name"`
	if bare {
		want += " (or schema.name for lower-case names)"
	}
	bad := errors.New("malformed marker table " + fmt.Sprintf("%q", s) + ": want " + want)
	var parts []string
	for {
		var part string
		switch {
		case len(s) >= 2 && s[0] == '"':
			var b strings.Builder
			i := 1
			for ; i < len(s); i++ {
				if s[i] == 0 {
					return nil, bad
				}
				if s[i] == '"' {
					if i+1 < len(s) && s[i+1] == '"' {
						i++
					} else {
						break
					}
				}
				b.WriteByte(s[i])
			}
			if i == len(s) || b.Len() == 0 {
				return nil, bad
			}
			part, s = b.String(), s[i+1:]
		case bare:
			end := strings.IndexByte(s, '.')
			if end < 0 {
				end = len(s)
			}
			part, s = s[:end], s[end:]
			if !plainIdentifier(part) {
				return nil, bad
			}
		default:
			return nil, bad
		}
		parts = append(parts, part)
		if s == "" {
			return parts, nil
		}
		if s[0] != '.' || len(parts) == 3 {
			return nil, bad
		}
		s = s[1:]
	}
}

// plainIdentifier reports whether w is an identifier that quoting leaves unchanged.
func plainIdentifier(w string) bool {
	if w == "" || w[0] >= '0' && w[0] <= '9' || w[0] == '$' {
		return false
	}
	for i := 0; i < len(w); i++ {
		c := w[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '$') {
			return false
		}
	}
	return true
}
