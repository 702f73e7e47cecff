package reconcile

import (
	"strconv"
	"strings"
	"sync"

	"github.com/txevidence/otelpgxtx/outcome"
)

// Recovery is the end of one crash recovery of a server, as its end-of-recovery
// checkpoint showed it: made at CheckpointLSN, with the next xid NextXID, by the
// postmaster of system SystemIdentifier started at ServerStart, on Timeline. Every xid at
// or above NextXID lost every record in that recovery, its commit record included, so a
// reference of that postmaster taken before the recovery (its FlushLSN at or below
// CheckpointLSN) is answered aborted when its xid is at or above NextXID, whatever
// pg_xact_status says (a reuser's status). The server shows it only until its next
// checkpoint; the instrumentation logs it when a connection's check sees it
// (otelpgxtx.MessageCrashRecovered), and a Reconciler told of it (Remember) keeps it.
type Recovery struct {
	SystemIdentifier uint64
	Timeline         uint32
	ServerStart      int64
	CheckpointLSN    uint64
	NextXID          uint64
}

// String returns "pgrecovery:<system identifier>/<timeline>/<server start>/<checkpoint
// LSN>/<next xid8>", the form ParseRecovery reads.
func (r Recovery) String() string {
	return "pgrecovery:" + strconv.FormatUint(r.SystemIdentifier, 10) + "/" + strconv.FormatUint(uint64(r.Timeline), 10) + "/" +
		strconv.FormatInt(r.ServerStart, 10) + "/" + outcome.FormatLSN(r.CheckpointLSN) + "/" + strconv.FormatUint(r.NextXID, 10)
}

// ParseRecovery parses the form of [Recovery.String].
func ParseRecovery(s string) (Recovery, error) {
	rest, ok := strings.CutPrefix(s, "pgrecovery:")
	f := strings.Split(rest, "/")
	if !ok || len(f) != 6 { // the LSN holds a slash
		return Recovery{}, invalid("malformed recovery %q: want pgrecovery:<system identifier>/<timeline>/<server start>/<checkpoint LSN>/<next xid>", s)
	}
	sys, err1 := strconv.ParseUint(f[0], 10, 64)
	tli, err2 := strconv.ParseUint(f[1], 10, 32)
	start, err3 := strconv.ParseInt(f[2], 10, 64)
	lsn, err4 := outcome.ParseLSN(f[3] + "/" + f[4])
	next, err5 := strconv.ParseUint(f[5], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil || sys == 0 || tli == 0 || start <= 0 || lsn == 0 || next == 0 {
		return Recovery{}, invalid("malformed recovery %q: its fields must be positive numbers", s)
	}
	return Recovery{SystemIdentifier: sys, Timeline: uint32(tli), ServerStart: start, CheckpointLSN: lsn, NextXID: next}, nil
}

// proves reports whether r shows ref's transaction lost: r is of ref's postmaster and
// came after ref's check, and ref's xid is at or above r's next xid (see lostInRecovery).
func (r Recovery) proves(ref outcome.ReconciliationRef) bool {
	return !ref.Pooled && ref.FlushLSN != 0 && r.SystemIdentifier == ref.SystemIdentifier && r.Timeline == ref.Timeline &&
		r.ServerStart == ref.ServerStart && r.CheckpointLSN >= ref.FlushLSN && ref.XID >= r.NextXID
}

// maxRecoveries bounds the recoveries a Reconciler keeps: each is a crash of the server,
// and the oldest prove least (a reference is rarely older than the last few).
const maxRecoveries = 256

// recoveries are the recoveries a Reconciler was told of, newest last.
type recoveries struct {
	mu   sync.Mutex
	list []Recovery
}

// Remember keeps rec, the end of a crash recovery a connection's check saw (or one read
// from a log record), so that references taken before it are answered from it after the
// server's next checkpoint has overwritten it. It is safe for concurrent use.
func (r *Reconciler) Remember(rec Recovery) {
	if r == nil || rec.NextXID == 0 {
		return
	}
	r.recoveries.mu.Lock()
	defer r.recoveries.mu.Unlock()
	for _, have := range r.recoveries.list {
		if have == rec {
			return
		}
	}
	if len(r.recoveries.list) == maxRecoveries {
		r.recoveries.list = r.recoveries.list[1:]
	}
	r.recoveries.list = append(r.recoveries.list, rec)
}

// of returns the remembered recoveries of ref's postmaster.
func (rs *recoveries) of(ref outcome.ReconciliationRef) []Recovery {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []Recovery
	for _, rec := range rs.list {
		if rec.SystemIdentifier == ref.SystemIdentifier && rec.Timeline == ref.Timeline && rec.ServerStart == ref.ServerStart {
			out = append(out, rec)
		}
	}
	return out
}

// recoveryOf is the Recovery of the latest checkpoint a reconciliation query saw, if it
// is a shutdown-type one of the running postmaster, for Remember.
func (v serverView) recoveryOf() (Recovery, bool) {
	if !v.checkpointShutdown || v.inRecovery || v.checkpointTimeline != v.timeline || v.start == 0 {
		return Recovery{}, false
	}
	return Recovery{SystemIdentifier: v.sys, Timeline: v.timeline, ServerStart: v.start, CheckpointLSN: v.checkpointLSN,
		NextXID: v.checkpointNextXID}, true
}
