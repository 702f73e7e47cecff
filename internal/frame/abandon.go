package frame

import (
	"github.com/txevidence/otelpgxtx/internal/evidence"
)

// Abandon ends the frame open on st, whose transaction ended where no query showed it,
// for reason: the connection was released mid-transaction, closed, or found idle.
func (t *Core) Abandon(st *Conn, reason string) {
	if f := st.Frame(); f != nil {
		seen := evidence.SeenNothing
		if reason == evidence.ReasonEndedUnobserved {
			st.Refs.Unobserved(f.CommitRef)
			seen = st.SeenEnd()
		}
		t.Apply(st, f, st.Ev.Abandon(reason, seen), nil)
	}
}
