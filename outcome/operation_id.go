package outcome

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
)

// OperationID identifies one transaction frame across its span, its result, its logs and
// its reconciliation. It is 16 random bytes, printed as 32 lower-case hex digits.
// The zero value means "no operation id".
type OperationID [16]byte

// NewOperationID returns a fresh random operation id. It names, it does not guard: 128
// bits from the runtime's ChaCha8 generator make a collision as unlikely as from
// crypto/rand, at a fraction of its cost on the path of every frame (one getrandom call).
func NewOperationID() OperationID {
	var id OperationID
	binary.LittleEndian.PutUint64(id[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(id[8:], rand.Uint64())
	return id
}

// IsZero reports whether id is the zero value.
func (id OperationID) IsZero() bool { return id == OperationID{} }

// String returns id as 32 lower-case hex digits.
func (id OperationID) String() string { return hex.EncodeToString(id[:]) }

// ParseOperationID parses the form produced by [OperationID.String].
func ParseOperationID(s string) (OperationID, error) {
	var id OperationID
	if len(s) != 2*len(id) {
		return OperationID{}, fmt.Errorf("outcome: malformed operation id %q: want %d hex digits", s, 2*len(id))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return OperationID{}, fmt.Errorf("outcome: malformed operation id %q: %w", s, err)
	}
	return id, nil
}
