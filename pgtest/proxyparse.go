package pgtest

import (
	"encoding/binary"
	"strings"
)

// Frontend protocol constants (PostgreSQL docs, "Message Formats").
const (
	cancelRequestCode = 80877102
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
	maxStartupLen     = 10000 // the server's MAX_STARTUP_PACKET_LENGTH
)

// scan walks the complete messages in data and returns the bytes to forward,
// how many bytes of data it consumed, and whether to cut the connection
// after forwarding.
func (p *Proxy) scan(pc *proxyConn, data []byte) (out []byte, consumed int, cut bool) {
	for {
		rest := data[consumed:]
		if pc.opaque {
			return append(out, rest...), len(data), false
		}
		if !pc.started {
			// Untyped: int32 length (including itself), int32 code, payload.
			if len(rest) < 8 {
				return out, consumed, false
			}
			n := int(binary.BigEndian.Uint32(rest))
			if n < 8 || n > maxStartupLen {
				pc.opaque = true
				continue
			}
			if len(rest) < n {
				return out, consumed, false
			}
			consumed += n
			code := binary.BigEndian.Uint32(rest[4:])
			if code == cancelRequestCode && p.cutting.Load() {
				pc.dropped = true
				return out, consumed, false
			}
			out = append(out, rest[:n]...)
			pc.started = true // startup or CancelRequest; typed messages follow
			continue
		}

		// Typed: type byte, int32 length (including itself), payload.
		if len(rest) < 5 {
			return out, consumed, false
		}
		n := 1 + int(binary.BigEndian.Uint32(rest[1:]))
		if n < 5 {
			pc.opaque = true
			continue
		}
		if len(rest) < n {
			return out, consumed, false
		}
		msg := rest[:n]
		consumed += n
		out, cut = p.forwardTyped(pc, out, msg)
		if cut {
			return out, consumed, true
		}
	}
}

// carriesCommit applies the rule documented on Proxy and tracks statement
// names from Parse and Close.
func (pc *proxyConn) carriesCommit(msg []byte, implicit string) bool {
	body := msg[5:]
	switch msg[0] {
	case 'Q':
		sql, _ := cstring(body)
		if implicit != "" && strings.Contains(sql, implicit) {
			return true
		}
		for stmt := range strings.SplitSeq(sql, ";") { // a ';' inside a literal may split too
			if isCommitSQL(stmt) {
				return true
			}
		}
		return false
	case 'P':
		name, rest := cstring(body)
		sql, _ := cstring(rest)
		isCommit := isCommitSQL(sql)
		if implicit != "" && strings.Contains(sql, implicit) {
			pc.implicit[name] = true
		} else {
			delete(pc.implicit, name)
		}
		if isCommit {
			pc.stmts[name] = true
		} else {
			delete(pc.stmts, name) // a re-Parse of the unnamed statement replaces it
		}
		return isCommit
	case 'B':
		_, rest := cstring(body) // portal name
		stmt, _ := cstring(rest)
		pc.boundImplicit = pc.implicit[stmt]
		return pc.stmts[stmt]
	case 'E':
		return pc.boundImplicit
	case 'C':
		if len(body) > 0 && body[0] == 'S' {
			name, _ := cstring(body[1:])
			delete(pc.stmts, name)
			delete(pc.implicit, name)
		}
	}
	return false
}

// cstring splits a NUL-terminated string off b.
func cstring(b []byte) (string, []byte) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:]
		}
	}
	return string(b), nil
}

// isCommitSQL reports whether sql starts with the keyword COMMIT or END, or with the
// two-phase commit statements PREPARE TRANSACTION and ROLLBACK PREPARED (COMMIT
// PREPARED starts with COMMIT), skipping whitespace and comments (tracing libraries
// prepend comments).
func isCommitSQL(sql string) bool {
	s := skipSpaceAndComments(sql)
	for _, kw := range []string{"commit", "end"} {
		if _, ok := keyword(s, kw); ok {
			return true
		}
	}
	for _, kws := range [][2]string{{"prepare", "transaction"}, {"rollback", "prepared"}} {
		if rest, ok := keyword(s, kws[0]); ok {
			if _, ok := keyword(skipSpaceAndComments(rest), kws[1]); ok {
				return true
			}
		}
	}
	return false
}

// keyword reports whether s starts with the keyword kw (any case), and returns the rest.
func keyword(s, kw string) (string, bool) {
	if len(s) >= len(kw) && strings.EqualFold(s[:len(kw)], kw) && (len(s) == len(kw) || !isIdentByte(s[len(kw)])) {
		return s[len(kw):], true
	}
	return s, false
}

// skipSpaceAndComments returns s from its first token on, or "" for an unterminated
// comment.
func skipSpaceAndComments(s string) string {
	for {
		s = strings.TrimLeft(s, " \t\r\n\f\v")
		switch {
		case strings.HasPrefix(s, "--"):
			i := strings.IndexByte(s, '\n')
			if i < 0 {
				return ""
			}
			s = s[i+1:]
		case strings.HasPrefix(s, "/*"): // PostgreSQL nests block comments
			depth, i := 0, 0
			for i < len(s) {
				if strings.HasPrefix(s[i:], "/*") {
					depth, i = depth+1, i+2
				} else if strings.HasPrefix(s[i:], "*/") {
					depth, i = depth-1, i+2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
			if depth != 0 {
				return ""
			}
			s = s[i:]
		default:
			return s
		}
	}
}

// isIdentByte reports a byte that continues an SQL identifier or keyword.
func isIdentByte(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 ||
		'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}
