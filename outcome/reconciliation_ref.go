package outcome

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/txevidence/otelpgxtx/internal/markertable"
)

// ReconciliationRef is a durable reference to one physical transaction, enough to ask
// PostgreSQL later whether it committed: the transaction's xid8 read before COMMIT was
// sent, and the identity of the cluster history that assigned it (system identifier and
// the timeline the server wrote WAL on). An xid is only meaningful on the same system
// identifier and timeline: after a failover the same number may name another transaction.
//
// XID 0 (InvalidTransactionId, never assigned to a transaction) means the transaction had
// no xid when COMMIT was sent: it wrote nothing, so its commit changes nothing.
//
// ServerStart is the server's pg_postmaster_start_time() in microseconds since the Unix
// epoch, 0 when unknown. PostgreSQL does not WAL-log xid assignment: after a crash
// restart, an xid whose records had not reached the WAL is handed out again, so a
// "committed" status found after a restart may belong to another transaction.
//
// StatsReset is when the server's cumulative statistics were last reset
// (pg_stat_archiver.stats_reset, µs since the Unix epoch) as the connection was checked, 0
// when unknown. A backend that dies hard (SIGKILL, the OOM killer, a segfault) makes the
// postmaster reinitialize and replay WAL in place: the start time and the timeline stay,
// xids whose records were lost are handed out again, and this time moves, since crash
// recovery discards the statistics. So only a reference whose StatsReset the server still
// shows was assigned its xid by the incarnation that answers (see package reconcile).
//
// Pooled is set when the identity was read through a connection pooler (PgBouncer): on a
// server connection other than the transaction's, perhaps of an earlier incarnation than
// the one that assigned the xid. It then proves no boundary for a later incarnation (see
// package reconcile); the incarnation it names still answers committed.
//
// MarkerTable and Operation are set when the transaction's COMMIT was sent right after
// the call of the commit-marker function, which inserts the operation id into the marker
// table named here as the database it is in and its quoted schema-qualified name
// ("database"."schema"."table": [ReconciliationRef.MarkerDatabase] and
// [ReconciliationRef.MarkerRelation] read it), unless the transaction is
// read-only or has no xid (then it cannot have changed anything durable, so the marker's
// absence still proves that nothing of it is in the database). The row exists in the
// surviving history exactly when the transaction committed there with writes. XID is 0
// when the call's reply never arrived.
//
// CheckedAt is the server's clock (µs since the Unix epoch) when the connection was
// checked, before the transaction began: a marker row is never older than it, so a
// reconciler can tell a row that may have been pruned from one never written.
//
// FlushLSN is how far the server had flushed its WAL when the connection was checked
// (pg_current_wal_flush_lsn, as a 64-bit position), 0 when unknown. A crash recovery that
// ended after the transaction began ends its WAL at or beyond it, so an end-of-recovery
// checkpoint at or beyond FlushLSN proves that recovery came after the reference: the
// xids at or above its next xid lost every record, their commit records included (see
// package reconcile).
type ReconciliationRef struct {
	XID              uint64
	SystemIdentifier uint64
	Timeline         uint32
	ServerStart      int64
	StatsReset       int64
	Pooled           bool
	MarkerTable      string
	Operation        OperationID
	CheckedAt        int64
	FlushLSN         uint64
}

// NewReconciliationRef returns a reference, refusing a zero system identifier or timeline
// (no PostgreSQL cluster has either).
func NewReconciliationRef(xid, systemIdentifier uint64, timeline uint32) (ReconciliationRef, error) {
	r := ReconciliationRef{XID: xid, SystemIdentifier: systemIdentifier, Timeline: timeline}
	if err := r.Validate(); err != nil {
		return ReconciliationRef{}, err
	}
	return r, nil
}

// Validate reports whether r names a cluster history: a zero system identifier or
// timeline is malformed.
func (r ReconciliationRef) Validate() error {
	if r.SystemIdentifier == 0 {
		return fmt.Errorf("outcome: malformed reconciliation reference %s: zero system identifier", r)
	}
	if r.Timeline == 0 {
		return fmt.Errorf("outcome: malformed reconciliation reference %s: zero timeline", r)
	}
	if r.MarkerTable != "" || !r.Operation.IsZero() {
		if r.Operation.IsZero() {
			return fmt.Errorf("outcome: malformed reconciliation reference %s: a marker without an operation id", r)
		}
		if _, _, err := markertable.SplitRef(r.MarkerTable); err != nil {
			return fmt.Errorf("outcome: malformed reconciliation reference %s: %w", r, err)
		}
	}
	return nil
}

// MarkerDatabase returns the database of the marker table, "" without a marker.
func (r ReconciliationRef) MarkerDatabase() string {
	db, _, _ := markertable.SplitRef(r.MarkerTable)
	return db
}

// MarkerRelation returns the marker table's quoted schema-qualified name, to be used in
// SQL in [ReconciliationRef.MarkerDatabase]; "" without a marker.
func (r ReconciliationRef) MarkerRelation() string {
	_, rel, _ := markertable.SplitRef(r.MarkerTable)
	return rel
}

// NoWrites reports whether the transaction had no xid when COMMIT was sent.
// A reference with a marker always wrote (the marker row).
func (r ReconciliationRef) NoWrites() bool { return r.XID == 0 && r.MarkerTable == "" }

// HasMarker reports whether the reference names a commit-marker row.
func (r ReconciliationRef) HasMarker() bool { return r.MarkerTable != "" }

// String returns "pg:<system identifier>/<timeline>/<xid8>/<server start>/<stats reset>"
// (without the last field when the reset time is unknown, without the last two when the
// start is), followed by ";pooled" when Pooled is set, ";flushed=<LSN>" (PostgreSQL's
// form, 0/15224C0) when FlushLSN is, ";checked=<µs>" when CheckedAt is set and
// ";marker=<operation id>@<quoted table>" with a marker, the form
// [ParseReconciliationRef] reads.
func (r ReconciliationRef) String() string {
	// Appended into one buffer: it is an attribute of every frame span with a reference.
	b := make([]byte, 0, 96+len(r.MarkerTable))
	b = append(b, "pg:"...)
	b = strconv.AppendUint(b, r.SystemIdentifier, 10)
	b = append(b, '/')
	b = strconv.AppendUint(b, uint64(r.Timeline), 10)
	b = append(b, '/')
	b = strconv.AppendUint(b, r.XID, 10)
	if r.ServerStart != 0 {
		b = strconv.AppendInt(append(b, '/'), r.ServerStart, 10)
		if r.StatsReset != 0 {
			b = strconv.AppendInt(append(b, '/'), r.StatsReset, 10)
		}
	}
	if r.Pooled {
		b = append(b, ";pooled"...)
	}
	if r.FlushLSN != 0 {
		b = appendLSN(append(b, ";flushed="...), r.FlushLSN)
	}
	if r.CheckedAt != 0 {
		b = strconv.AppendInt(append(b, ";checked="...), r.CheckedAt, 10)
	}
	if r.MarkerTable != "" {
		b = append(append(append(append(b, ";marker="...), r.Operation.String()...), '@'), r.MarkerTable...)
	}
	return string(b)
}

// ParseReconciliationRef parses the form produced by [ReconciliationRef.String].
func ParseReconciliationRef(s string) (ReconciliationRef, error) {
	rest, ok := strings.CutPrefix(s, "pg:")
	rest, marker, hasMarker := strings.Cut(rest, ";marker=")
	var op OperationID
	var table string
	if hasMarker {
		opText, t, found := strings.Cut(marker, "@")
		var err error
		if op, err = ParseOperationID(opText); err != nil || !found || op.IsZero() {
			return ReconciliationRef{}, fmt.Errorf("outcome: malformed reconciliation reference %q: want ;marker=<operation id>@<quoted table>", s)
		}
		if _, _, err := markertable.SplitRef(t); err != nil {
			return ReconciliationRef{}, fmt.Errorf("outcome: malformed reconciliation reference: %w", err)
		}
		table = t
	}
	var checked int64
	var flushed uint64
	rest, checkedText, hasChecked := strings.Cut(rest, ";checked=")
	rest, flushedText, hasFlushed := strings.Cut(rest, ";flushed=")
	rest, pooled := strings.CutSuffix(rest, ";pooled")
	if hasFlushed {
		var err error
		if flushed, err = ParseLSN(flushedText); err != nil || flushed == 0 {
			return ReconciliationRef{}, fmt.Errorf("outcome: malformed reconciliation reference %q: ;flushed= wants a WAL position, as 0/15224C0", s)
		}
	}
	if hasChecked {
		var err error
		if checked, err = positive(checkedText); err != nil {
			return ReconciliationRef{}, fmt.Errorf("outcome: malformed reconciliation reference %q: ;checked= wants a positive decimal number", s)
		}
	}
	parts := strings.Split(rest, "/")
	if !ok || len(parts) < 3 || len(parts) > 5 {
		return ReconciliationRef{}, fmt.Errorf("outcome: malformed reconciliation reference %q: want pg:<system identifier>/<timeline>/<xid8>[/<server start>[/<stats reset>]]", s)
	}
	sys, err1 := strconv.ParseUint(parts[0], 10, 64)
	tli, err2 := strconv.ParseUint(parts[1], 10, 32)
	xid, err3 := strconv.ParseUint(parts[2], 10, 64)
	var start, reset int64
	var err4, err5 error
	if len(parts) >= 4 {
		start, err4 = positive(parts[3])
	}
	if len(parts) == 5 {
		reset, err5 = positive(parts[4])
	}
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil {
		return ReconciliationRef{}, fmt.Errorf("outcome: malformed reconciliation reference %q: fields must be positive decimal numbers", s)
	}
	r, err := NewReconciliationRef(xid, sys, uint32(tli))
	if err != nil {
		return ReconciliationRef{}, err
	}
	r.ServerStart, r.StatsReset, r.Pooled, r.MarkerTable, r.Operation, r.CheckedAt = start, reset, pooled, table, op, checked
	r.FlushLSN = flushed
	return r, nil
}

// positive parses a positive decimal int64.
func positive(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err == nil && n <= 0 {
		err = fmt.Errorf("non-positive %d", n)
	}
	return n, err
}

// FormatLSN writes a WAL position as PostgreSQL does (pg_lsn's text form): the high and
// low 32 bits in hexadecimal, upper case, with a slash between them.
func FormatLSN(lsn uint64) string { return string(appendLSN(nil, lsn)) }

// appendLSN appends lsn in pg_lsn's text form, its hexadecimal digits upper-case.
func appendLSN(b []byte, lsn uint64) []byte {
	at := len(b)
	b = strconv.AppendUint(b, lsn>>32, 16)
	b = append(b, '/')
	b = strconv.AppendUint(b, lsn&0xffffffff, 16)
	for i := at; i < len(b); i++ {
		if 'a' <= b[i] && b[i] <= 'f' {
			b[i] -= 'a' - 'A'
		}
	}
	return b
}

// ParseLSN reads a WAL position in pg_lsn's text form (FormatLSN's).
func ParseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if !ok || err1 != nil || err2 != nil || hi == "" || lo == "" {
		return 0, fmt.Errorf("outcome: malformed WAL position %q: want two hexadecimal numbers, as 0/15224C0", s)
	}
	return h<<32 | l, nil
}
