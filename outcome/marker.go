package outcome

import (
	"errors"
	"fmt"
	"strings"
)

// QuoteMarkerTable returns parts as a qualified SQL name with every part quoted as an
// identifier ("schema"."table"), the form a [ReconciliationRef] carries. It refuses no
// parts, an empty part and a NUL byte, which PostgreSQL identifiers cannot hold.
func QuoteMarkerTable(parts ...string) (string, error) {
	if len(parts) == 0 || len(parts) > 3 {
		return "", fmt.Errorf("outcome: a marker table name has 1 to 3 parts, not %d", len(parts))
	}
	var b strings.Builder
	for i, p := range parts {
		if p == "" || strings.IndexByte(p, 0) >= 0 {
			return "", fmt.Errorf("outcome: marker table name part %d is empty or holds a NUL byte", i+1)
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(`"` + strings.ReplaceAll(p, `"`, `""`) + `"`)
	}
	return b.String(), nil
}

// checkQuotedTable checks that s is what QuoteMarkerTable returns: quoted parts joined
// by dots, so that it can be placed in SQL as it is.
func checkQuotedTable(s string) error {
	bad := errors.New("outcome: malformed marker table " + fmt.Sprintf("%q", s) + `: want "name" or "schema"."name"`)
	parts := 0
	for {
		if len(s) < 2 || s[0] != '"' {
			return bad
		}
		i, n := 1, 0
		for ; i < len(s); i++ {
			if s[i] == 0 {
				return bad
			}
			if s[i] == '"' {
				if i+1 < len(s) && s[i+1] == '"' {
					i++
					n++
					continue
				}
				break
			}
			n++
		}
		if i == len(s) || n == 0 {
			return bad
		}
		parts++
		s = s[i+1:]
		if s == "" {
			break
		}
		if s[0] != '.' || parts == 3 {
			return bad
		}
		s = s[1:]
	}
	return nil
}
