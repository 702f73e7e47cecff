package pgtest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestReadyEnd: the end of the first ReadyForQuery is found however the stream is cut
// into reads, and nothing after it is counted for the client.
func TestReadyEnd(t *testing.T) {
	var stream []byte
	stream, _ = (&pgproto3.ErrorResponse{Severity: "ERROR", Code: "55P03", Message: "lock timeout"}).Encode(stream)
	stream, _ = (&pgproto3.ReadyForQuery{TxStatus: 'E'}).Encode(stream)
	end := len(stream)
	stream, _ = (&pgproto3.CommandComplete{CommandTag: []byte("ROLLBACK")}).Encode(stream)
	stream, _ = (&pgproto3.ReadyForQuery{TxStatus: 'I'}).Encode(stream)
	for size := 1; size <= len(stream); size++ {
		var r readyEnd
		through := 0
		found := false
		for at := 0; at < len(stream) && !found; at += size {
			n, ok := r.through(stream[at:min(at+size, len(stream))])
			through, found = at+n, ok
		}
		if !found || through != end {
			t.Fatalf("reads of %d bytes: through %d (found %v), want %d", size, through, found, end)
		}
	}
}
