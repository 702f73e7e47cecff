package frame

import (
	"sync"

	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// SeenRecoveries are what a tracer's checks saw of crash recoveries: the recoveries it
// logged, so that each is logged once whatever number of connections see it, and the
// latest flush position each postmaster showed, which tells a recovery made in the second
// the postmaster started from the shutdown before it.
type SeenRecoveries struct {
	mu      sync.Mutex
	logged  map[reconcile.Recovery]struct{}
	flushed map[postmaster]uint64
}

// postmaster is one life of a server: a crash recovery it survives keeps all three.
type postmaster struct {
	system   uint64
	timeline uint32
	start    int64
}

// maxSeen bounds each map: an entry is a crash, or a restart, of a server; the oldest
// matter least.
const maxSeen = 1024

// Saw keeps what one check saw, the latest checkpoint ck and the flush position flushed,
// and returns the recovery ck ends if it is one not seen before.
func (s *SeenRecoveries) Saw(ck reference.Checkpoint, flushed uint64) (reconcile.Recovery, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := postmaster{ck.SystemIdentifier, ck.Timeline, ck.ServerStart}
	before := s.flushed[p]
	if s.flushed == nil || len(s.flushed) >= maxSeen {
		s.flushed = map[postmaster]uint64{}
	}
	s.flushed[p] = max(before, flushed)
	// A checkpoint at or past a flush position of this postmaster was made in its life.
	ended := ck.Ended || (ck.NextXID != 0 && before != 0 && ck.CheckpointLSN >= before)
	if _, ok := s.logged[ck.Recovery]; !ended || ok {
		return reconcile.Recovery{}, false
	}
	if s.logged == nil || len(s.logged) >= maxSeen {
		s.logged = map[reconcile.Recovery]struct{}{}
	}
	s.logged[ck.Recovery] = struct{}{}
	return ck.Recovery, true
}
