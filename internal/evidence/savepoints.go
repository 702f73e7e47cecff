package evidence

import "strings"

// SavepointMove is what a savepoint statement did: made a savepoint, released one, or
// rolled back to one.
type SavepointMove uint8

const (
	SavepointCreated SavepointMove = iota
	SavepointReleased
	SavepointRolledBack
)

// savepointMoved records on f a savepoint statement of kinds set that succeeded, naming
// savepoint name, and returns what it did and the depth of the savepoint it made or named
// (tx.savepoint.depth): pgx's Tx.Begin nests savepoints, and their events on one frame say
// how deep each is only through it. 0 means the name is not among the open savepoints the
// frame saw (one made before the frame was found).
//
// PostgreSQL's rules: SAVEPOINT pushes a savepoint, a name may repeat; RELEASE and
// ROLLBACK TO name the innermost savepoint of that name; RELEASE removes it and every one
// after it, ROLLBACK TO those after it only.
func (f *Frame) savepointMoved(set Set, name string) (move SavepointMove, depth int) {
	if set.Has(Savepoint) {
		f.savepoints = append(f.savepoints, name)
		return SavepointCreated, len(f.savepoints)
	}
	move = SavepointReleased
	if set.Has(RollbackTo) {
		move = SavepointRolledBack
	}
	for i := len(f.savepoints) - 1; i >= 0; i-- {
		if sameIdentifier(f.savepoints[i], name) {
			if move == SavepointReleased {
				clear(f.savepoints[i:]) // the names are substrings of SQL strings
				f.savepoints = f.savepoints[:i]
			} else {
				clear(f.savepoints[i+1:])
				f.savepoints = f.savepoints[:i+1]
			}
			return move, i + 1
		}
	}
	return move, 0
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
