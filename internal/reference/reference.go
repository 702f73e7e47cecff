// Package reference takes commit references, one mechanism for Run and for plain pgx
// alike, carried by the application's own writes through the connection's net.Conn
// wrapper (internal/wire): the xid read (pg_current_xact_id_if_assigned, a fast-path
// FunctionCall) after the transaction's first statement that may write, in that
// statement's write, so that the xid is on the client before COMMIT is written; else, or
// for the commit marker of MarkerTableDDL (a Query that names its function), a call in
// COMMIT's write, ahead of it, whose reply the server flushes before it reads COMMIT; and,
// ahead of a connection's first BEGIN, the check of the cluster identity and of the
// marker function. It sits between the wire and the evidence: it knows the frame's
// transaction only through Life, and hands what the server answered to the caller.
package reference

import (
	"strconv"

	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// Mode is what a plain pgx COMMIT carries for its reference.
type Mode uint8

const (
	None   Mode = iota // nothing: the default, no byte of the library's
	XID                // the xid read (WithCommitReference)
	Marker             // the commit marker (WithCommitMarker)
)

// Refs is what a frame's COMMIT carries for its reference: nothing, the xid read, or the
// commit marker of a table (quoted). The tracer's options give it to the frames of plain
// pgx, a Policy to those Run begins. Every: the call goes with every COMMIT, also of a
// transaction whose statements the tracer took to only read (a SELECT may call a function
// that writes) — Run's promise, on which the marker's absence as proof of an abort rests
// (reconcile's asserted markers); the tracer's options add nothing to those.
type Refs struct {
	Mode   Mode
	Marker string
	Every  bool
}

// Life is what the references need of a frame's transaction, read from its evidence:
// whether it is going on, began read-only, wrote, or failed. They change nothing of it: a
// failure of the library's own read is returned to the caller (Collected.ReadFailed).
type Life interface {
	Open() bool
	ReadOnly() bool
	Wrote() bool
	Failed() bool
}

// Frame is a frame's commit reference: what its COMMIT carries for one, and what it got.
//
// A frame whose COMMIT carries nothing (Refs.Mode None, the default) has none: its
// *Frame is nil, which every method here takes for a frame without references, so that
// the frames of the defaults do not carry these bytes.
type Frame struct {
	// refs is what its COMMIT carries for a reference (the tracer's options, or Run's).
	refs Refs
	life Life
	id   outcome.OperationID
	// xid is the transaction's xid as the xid read after one of its statements found it;
	// 0 while none was found, and then COMMIT's write carries the read.
	xid uint64
	ref *outcome.ReconciliationRef
	// marker is the marker function whose call the COMMIT write carries.
	marker *markerFn
	// multiCommit: the frame's references were on, and its COMMIT came among other
	// statements of one query string.
	multiCommit bool
	// implicit: the frame's references were on, and it is an implicit transaction.
	implicit bool
	// simple: the implicit transaction went as a simple Query (Collect); implicitWhy is
	// why another has none, when it is known (MissingUnchecked …).
	simple      bool
	implicitWhy string
}

// MissingMultiStatement is Frame.Missing's word for a frame whose COMMIT came among other
// statements of one query string ("begin; insert …; commit", as migration tools write),
// where nothing can carry the call without going between the application's statements,
// and for an implicit transaction sent in a batch with another transaction's end among its
// statements, where what rides before the Sync answers for the last transaction only.
const MissingMultiStatement = "multi_statement"

// MissingImplicit is Frame.Missing's word for an implicit transaction (a statement sent
// outside a transaction block, committed by the server as soon as it has run): the xid
// read and the marker call ride in a transaction block — after a write, ahead of COMMIT —
// and an implicit transaction has neither; carrying them would mean adding messages
// inside the application's own Sync group (see docs/reconciliation.md).
const MissingImplicit = "implicit"

// Init makes f the reference part of a frame whose transaction life is, operation id,
// carrying refs.
func (f *Frame) Init(refs Refs, life Life, id outcome.OperationID) {
	*f = Frame{refs: refs, life: life, id: id}
}

// Refs is what the frame's COMMIT carries for a reference: nothing for a nil f.
func (f *Frame) Refs() Refs {
	if f == nil {
		return Refs{}
	}
	return f.refs
}

// Ref is the frame's reference, nil when it has none.
func (f *Frame) Ref() *outcome.ReconciliationRef {
	if f == nil {
		return nil
	}
	return f.ref
}

// Missing says why a frame whose references were on has no reference, when the reason
// is its own: MissingMultiStatement, MissingImplicit, else "".
func (f *Frame) Missing() string {
	switch {
	case f == nil, f.ref != nil:
	case f.multiCommit:
		return MissingMultiStatement
	case f.implicit && f.simple:
		return MissingSimpleProtocol
	case f.implicit && f.implicitWhy != "":
		return f.implicitWhy
	case f.implicit:
		return MissingImplicit
	}
	return ""
}

// XID is the xid the read after a statement found, 0 while none.
func (f *Frame) XID() uint64 {
	if f == nil {
		return 0
	}
	return f.xid
}

// Unobserved gives f, whose transaction ended where no query showed it (a COMMIT sent
// past the tracer, perhaps), the reference it can have: the xid the read after one of its
// statements found, which pg_xact_status settles whatever ended the transaction. Without
// one it has none.
func (c *Conn) Unobserved(f *Frame) {
	if f == nil {
		return
	}
	if c.reading == f {
		// The read's reply came before the server's last ReadyForQuery, which pgconn has
		// read: it is whole.
		c.Collect(f, true)
	}
	if f.ref == nil && f.xid != 0 && c.Known() {
		f.ref = c.ref(f.xid)
	}
}

// Conn is the references of one connection: where they are (unchecked, on, off), the
// cluster identity, the marker functions checked on it, and the library's addition in
// flight. The connection's user changes it, under its state's lock.
type Conn struct {
	nc       *wire.Conn // nil where pgconn uses another net.Conn: references are off
	postgres bool       // the server is PostgreSQL: the xid read and the marker are its own
	identity identity
	// state is where the connection's commit references are, offWhy why they are off.
	state  state
	offWhy string
	// xidCall is the xid read, a fast-path call by the OID the identity check found.
	xidCall []byte
	// markers are the commit-marker functions checked on the connection.
	markers []*markerFn
	// adding: an addition is armed for, or was made to, the query in flight, or its reply
	// is on its way (the xid read after a statement, whose frame is reading).
	adding   bool
	reading  *Frame
	checking check // what the check in flight ahead of BEGIN asks
	// preparing is the frame of the COMMIT PREPARED or ROLLBACK PREPARED whose write
	// carries the check (ArmPrepared), and preparedXID the xid the check read for it,
	// until Collect gives it the reference.
	preparing   *Frame
	preparedXID uint64
	// implicit is the implicit transaction's frame whose write is armed to carry the
	// check or its call (ArmImplicit), until Collect; implicitXID is the xid read's
	// messages there.
	implicit    *Frame
	implicitXID []byte
	// inside is the frame whose statement, which may commit inside, carries the lxid read
	// ahead of it (inside.go), until Collect; lxidQuery is that read's message.
	inside    *Frame
	lxidQuery []byte
	// before is the backend's virtual transaction id the lxid read found ahead of
	// beforeOf's statement, until OneTransaction asks: one statement at a time has one, so
	// the connection keeps it, not every frame.
	before   vxid
	beforeOf *Frame
	// run are the references of Run's Policy while Run begins a transaction on the
	// connection (running): its frame carries them in place of the tracer's.
	run     Refs
	running bool
	// cancels: the connection's context watcher may send cancel requests (another than
	// pgconn's default, which sets a deadline), which can land on the library's message
	// after the statement they were sent for.
	cancels bool
}

// NewConn returns the references of a connection whose net.Conn is nc (nil if it is not
// the wrapper), to a PostgreSQL server if postgres, whose backend pgconn was told is pid.
func NewConn(nc *wire.Conn, postgres bool, pid uint32) Conn {
	return Conn{nc: nc, postgres: postgres, identity: identity{pid: pid}}
}

// identity is the cluster identity, read once per connection, with the database and the
// server's clock at the check.
type identity struct {
	systemID    uint64
	timeline    uint32
	serverStart int64 // µs since the epoch; a connection never outlives a restart
	statsReset  int64 // µs since the epoch; nor a crash recovery, which moves it
	// pid is the PID pgconn was told at connection start (BackendKeyData), and pooled says
	// that the identity check's backend had another: a pooler (PgBouncer) is in between,
	// and the transactions may run on other server connections than the check's.
	pid        uint32
	pooled     bool
	database   string
	checkedAt  int64      // µs since the epoch
	flushLSN   uint64     // pg_current_wal_flush_lsn() at the check
	checkpoint Checkpoint // the server's latest, at the check
}

// Checkpoint is what a connection's check saw of the server's latest checkpoint, when it
// may end a crash recovery of the running postmaster (a backend died hard, and the
// postmaster recovered in place): the Recovery it would be, with Ended when it must be one
// (a shutdown-type checkpoint made in a later second than the postmaster started), or
// NextXID zero when it cannot (an online checkpoint, or one from before the start). One in
// the very second of the start may be the shutdown before it: it ends a recovery only if
// it is at or past a flush position a check of the running postmaster saw before.
type Checkpoint struct {
	reconcile.Recovery
	Ended bool
}

// Checkpoint returns what the connection's check saw of the latest checkpoint, and the
// check's flush position.
func (c *Conn) Checkpoint() (Checkpoint, uint64) {
	return c.identity.checkpoint, c.identity.flushLSN
}

// state is where a connection's commit references are. Whether a marker function is
// usable is the table's own, on top of on (markerFn.problem says why it is off).
type state uint8

const (
	unchecked state = iota // no check answered yet: asked ahead of the next BEGIN
	on                     // the cluster identity is known: references can be taken
	off                    // the check refused them (offWhy): for the connection's life
)

// Cancels records that the connection's context watcher may send cancel requests.
func (c *Conn) Cancels() { c.cancels = true }

// Running records that Run begins a transaction on the connection with refs (its
// Policy's), until Ran.
func (c *Conn) Running(refs Refs) { c.run, c.running = refs, true }

// Ran ends what Running began.
func (c *Conn) Ran() { c.running = false }

// FrameRefs returns what a frame begun on the connection now carries: Run's, while it
// begins one, else the tracer's, refs.
func (c *Conn) FrameRefs(refs Refs) Refs {
	if c.running {
		return c.run
	}
	return refs
}

// Checked reports whether the connection's check has answered, and Known whether it holds
// a cluster identity, without which a reference could not be checked.
func (c *Conn) Checked() bool { return c.state != unchecked }

// Known reports whether the connection holds a cluster identity.
func (c *Conn) Known() bool { return c != nil && c.state == on }

// Adding reports whether an addition is armed or in flight.
func (c *Conn) Adding() bool { return c.adding }

// Reading returns the frame whose xid read's reply is on its way, or nil.
func (c *Conn) Reading() *Frame { return c.reading }

// Identity returns the cluster identity, the database and the time of the check, for a
// reference made by hand (a test's).
func (c *Conn) Identity() (systemID uint64, timeline uint32, database string, checkedAt int64) {
	return c.identity.systemID, c.identity.timeline, c.identity.database, c.identity.checkedAt
}

// on reports whether the library may add to the connection's writes for refs: they are
// on, the connection's net.Conn is the wrapper, the check found nothing wrong, and the
// server is PostgreSQL (the xid read, the fast-path call and what a marker's absence
// proves are PostgreSQL's).
func (c *Conn) on(refs Refs) bool {
	return refs.Mode != None && c.nc != nil && c.postgres && c.state != off
}

// MinServerMajor is the oldest PostgreSQL the references work with: the functions they
// call, pg_current_xact_id_if_assigned and (to reconcile) pg_xact_status, came with 13.
const MinServerMajor = 13

// TooOld says why references are off on a server that reports server_version v, "" when
// they are not: its major version is below MinServerMajor. A version that does not begin
// with a number is left to the check.
func TooOld(v string) string {
	major := 0
	for _, c := range v {
		if c < '0' || c > '9' || major > MinServerMajor {
			break
		}
		major = major*10 + int(c-'0')
	}
	if major == 0 || major >= MinServerMajor {
		return ""
	}
	return "PostgreSQL " + strconv.Itoa(major) + " is older than " + strconv.Itoa(MinServerMajor) +
		", the oldest with the functions the references call (pg_current_xact_id_if_assigned, pg_xact_status)"
}

// ref returns a reference to xid on the connection's cluster.
func (c *Conn) ref(xid uint64) *outcome.ReconciliationRef {
	id := &c.identity
	return &outcome.ReconciliationRef{XID: xid, SystemIdentifier: id.systemID, Timeline: id.timeline, ServerStart: id.serverStart,
		StatsReset: id.statsReset, Pooled: id.pooled, FlushLSN: id.flushLSN}
}

// Off is a notice that references, or a marker, are off on the connection, for one log
// record: What is off, Why (the library's own words: SQLSTATEs, the table name the
// application configured, never user data).
type Off struct{ What, Why string }
