package otelpgxtx

import "strings"

// savepointMoved records on p a savepoint statement of kinds set that succeeded, naming
// savepoint name, and returns its event's name and the depth of the savepoint it made or
// named (tx.savepoint.depth): pgx's Tx.Begin nests savepoints, and their events on one
// frame say how deep each is only through it. 0 means the name is not among the open
// savepoints the frame saw (one made before the frame was found).
//
// PostgreSQL's rules: SAVEPOINT pushes a savepoint, a name may repeat; RELEASE and
// ROLLBACK TO name the innermost savepoint of that name; RELEASE removes it and every one
// after it, ROLLBACK TO those after it only.
func (p *frameFolding) savepointMoved(set stmtSet, name string) (event string, depth int) {
	if set.has(stmtSavepoint) {
		p.savepoints = append(p.savepoints, name)
		return eventSavepointCreated, len(p.savepoints)
	}
	event = eventSavepointReleased
	if set.has(stmtRollbackTo) {
		event = eventSavepointRolledBack
	}
	for i := len(p.savepoints) - 1; i >= 0; i-- {
		if sameIdentifier(p.savepoints[i], name) {
			if event == eventSavepointReleased {
				clear(p.savepoints[i:]) // the names are substrings of SQL strings
				p.savepoints = p.savepoints[:i]
			} else {
				clear(p.savepoints[i+1:])
				p.savepoints = p.savepoints[:i+1]
			}
			return event, i + 1
		}
	}
	return event, 0
}

// sameIdentifier reports whether a and b, identifiers as written, name the same thing:
// PostgreSQL folds an unquoted identifier to lower case and keeps a quoted one as it is.
func sameIdentifier(a, b string) bool {
	if !quotedIdentifier(a) && !quotedIdentifier(b) {
		return strings.EqualFold(a, b) // no allocation: the common case
	}
	return foldIdentifier(a) == foldIdentifier(b)
}

func quotedIdentifier(s string) bool { return len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' }

// foldIdentifier returns the name identifier s stands for.
func foldIdentifier(s string) string {
	if quotedIdentifier(s) {
		return strings.ReplaceAll(s[1:len(s)-1], `""`, `"`)
	}
	return strings.ToLower(s)
}
