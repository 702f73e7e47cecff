package frame

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/poolmetrics"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Conn is what the tracer keeps on one connection, in its CustomData.
//
// The connection's user changes it, in the hooks and in Run; mu orders that with the
// end of the connection's net.Conn, which may be closed on another goroutine (see
// wire.Conn). Uncontended, it costs a few nanoseconds per hook and allocates nothing.
type Conn struct {
	// core is the tracer whose hooks hold it: the executor ends the frames it manages
	// through it (FrameOfTx).
	core    *Core
	Mu      sync.Mutex
	Ev      evidence.Conn[*Frame] // the frame open on the connection, and its evidence
	Queries []QueryState          // started, not yet ended (a busy conn can nest a failed call)

	// The connection's span attributes (db.system.name, db.namespace, server.address,
	// server.port), built on its first recorded frame: conn.Config() copies the whole
	// configuration, which is too dear for every transaction.
	attrs []attribute.KeyValue

	// Refs are the connection's commit references: the cluster identity, the marker
	// functions checked, what the library added to the writes (package reference).
	Refs reference.Conn

	// NetConn is the connection's net.Conn wrapper, nil where pgconn uses another.
	NetConn *wire.Conn
	// Pool is what the connection-pool metrics keep on it.
	Pool poolmetrics.ConnState
	// Named are its statements prepared by name (see NamedStatements).
	Named NamedStatements
	// pastHooks: at the last query the hooks saw begin, a statement they did not see had
	// gone before it with its reply not read whole (see WentPastHooks).
	pastHooks bool
}

// QueryState is what a query's Start hook hands to its End hook (see startQuery).
type QueryState struct {
	Ctx       context.Context // what Start returned: End gets it back
	CallerCtx context.Context // what Start was given: the parent of a frame found at End
	Set       evidence.Set
	Frame     *Frame
	Savepoint string
	Batch     batchFacts
	Nested    bool // started while another call was in flight on the connection
	// Folded: the query is an event in place of a span — a transaction-control
	// statement's of its frame, an implicit prepare's of its
	// statement —, which started at start. op is what the event names:
	// the statement's db.operation.name, the prepared statement's name.
	Folded bool
	Start  time.Time
	Op     string
	// PrepareFailed: pgx's prepare of the query's statement, a call within it, failed:
	// pgx never sent its execution.
	PrepareFailed bool
}

// batchFacts collects the results of a batch's queued queries until its end, when TxStatus is
// valid again.
type batchFacts struct {
	Err         error
	RollbackTag bool
}

// stateKey is the CustomData key; the map belongs to the connection, so a pooled
// connection's state goes wherever the connection goes, and dies with it.
const stateKey = "github.com/txevidence/otelpgxtx.state"

// State returns the tracer's state of pg, made on first use; nil for a connection
// without CustomData, which is none that pgx connected.
func State(pg *pgconn.PgConn) *Conn {
	if pg == nil {
		return nil
	}
	data := pg.CustomData()
	if data == nil {
		return nil
	}
	st, _ := data[stateKey].(*Conn)
	if st == nil {
		server := classifier.ServerOf(pg.ParameterStatus)
		st = &Conn{Queries: make([]QueryState, 0, 2), Ev: evidence.NewConn[*Frame](server)}
		data[stateKey] = st
		if nc, ok := pg.Conn().(*wire.Conn); ok {
			if w, ok := nc.Listener().(*CloseWatch); ok {
				w.st.Store(st)
			}
			st.NetConn = nc
		}
		st.Refs = reference.NewConn(st.NetConn, server == classifier.ServerPostgreSQL, pg.PID())
	}
	return st
}

// State is the package's State for t's hooks: the state is t's, whose frames the
// executor ends through t (FrameOfTx).
func (t *Core) State(pg *pgconn.PgConn) *Conn {
	st := State(pg)
	if st != nil && st.core == nil {
		st.core = t
	}
	return st
}

// Frame returns the frame open on the connection, or nil.
func (st *Conn) Frame() *Frame { return st.Ev.Open() }

// Server is the kind of server, from what it reported at connection start: the
// classifier's PostgreSQL-only rules, the committed-locally notices and commit references
// apply to PostgreSQL alone.
func (st *Conn) Server() classifier.ServerKind { return st.Ev.Server() }

// Made returns the tracer's state of pg if a hook made it already, else nil: for an End
// hook, whose Start made it if it ran, and which has nothing to judge otherwise.
func Made(pg *pgconn.PgConn) *Conn {
	if pg == nil {
		return nil
	}
	st, _ := pg.CustomData()[stateKey].(*Conn)
	return st
}

// MarkCommit marks the position before a COMMIT is handed over (see wire.Conn), and
// reports whether the session had already ended before it. It asks that of PostgreSQL
// only: that a server reads nothing after its FATAL is PostgreSQL's (a backend exits), and
// the classifier's session_ended_before_commit holds for it alone, so on any other server
// (or one not known) the answer would change no verdict, and the peek's system call (the
// read ahead under TLS) is not made.
func (st *Conn) MarkCommit() (sessionEnded bool) {
	return st.NetConn != nil && st.NetConn.MarkCommit(st.Server() == classifier.ServerPostgreSQL)
}

// SeenEnd is what the replies pgconn read since the last query the hooks saw showed of
// the end of the transaction then open (wire.EndSeen): the server's COMMIT, ROLLBACK or
// PREPARE TRANSACTION, or nothing told apart.
func (st *Conn) SeenEnd() evidence.Seen {
	if st.NetConn == nil {
		return evidence.SeenNothing
	}
	return SeenFromWire(st.NetConn.SeenEnd())
}

// WentPastHooks reports whether a statement the hooks did not see may have ended the
// open transaction where nothing they read can tell: one was written since the last query
// they saw (wire.Conn.WroteStatement) with none of theirs in flight — pgconn, busy with
// one, refuses any other — and its reply was not read whole, the connection being closed
// or busy; or the last query they saw begin found that so. A reply read whole shows the
// statement's effect in pgconn's transaction status and in the replies (SeenEnd). False
// without the library's net.Conn, which InstrumentConnConfig and InstrumentPool always put
// in place.
func (st *Conn) WentPastHooks(pg *pgconn.PgConn) bool {
	if !pg.IsClosed() && !pg.IsBusy() {
		return false
	}
	return st.pastHooks || len(st.Queries) == 0 && st.NetConn != nil && st.NetConn.WroteStatement()
}

// NotePastHooks records, as a query the hooks see begins (before any byte of it is
// written), whether a statement went past them before it (WentPastHooks): the query's
// own write and end start the wire's account afresh, this keeps what it held.
func (st *Conn) NotePastHooks(pg *pgconn.PgConn) bool {
	st.pastHooks = st.WentPastHooks(pg)
	return st.pastHooks
}

// SeenFromWire is the evidence's word for what the wire saw end a transaction.
func SeenFromWire(e wire.EndSeen) evidence.Seen {
	switch e {
	case wire.EndCommit:
		return evidence.SeenCommit
	case wire.EndRollback:
		return evidence.SeenRollback
	case wire.EndPrepare:
		return evidence.SeenPrepare
	}
	return evidence.SeenNothing
}

// RepliedClean reports whether the replies pgconn read since the implicit transaction of
// the query in flight was handed over reached an idle ReadyForQuery with no
// ErrorResponse before it (wire.Conn.RepliedClean).
func (st *Conn) RepliedClean() bool {
	return st.NetConn != nil && st.NetConn.RepliedClean()
}

// CommitNotSent reports whether the write carrying f's COMMIT sent nothing, and returns
// the net.Conn's accounting of it to idle; only while f is committing.
func (st *Conn) CommitNotSent(f *Frame) bool {
	if f == nil || f.Ev.Phase() != outcome.PhaseCommitting || st.NetConn == nil {
		return false
	}
	return st.NetConn.CommitNotSent()
}

// Push records a started query, for its End hook to pop.
func (st *Conn) Push(q QueryState) { st.Queries = append(st.Queries, q) }

// Pop removes and returns the query whose Start returned ctx; the last one if none did.
// Contexts are matched with sameContext: == on a context passed by value can panic.
// ok is false when no query was started: the caller has nothing to end.
func (st *Conn) Pop(ctx context.Context) (q QueryState, ok bool) {
	n := len(st.Queries)
	if n == 0 {
		return QueryState{}, false
	}
	i := n - 1
	for j := n - 1; j >= 0; j-- {
		if pg.SameContext(st.Queries[j].Ctx, ctx) {
			i = j
			break
		}
	}
	q = st.Queries[i]
	copy(st.Queries[i:], st.Queries[i+1:])
	st.Queries[n-1] = QueryState{}
	st.Queries = st.Queries[:n-1]
	return q, true
}

// Top returns the innermost running query, for batch-query hooks.
func (st *Conn) Top(ctx context.Context) *QueryState {
	for j := len(st.Queries) - 1; j >= 0; j-- {
		if pg.SameContext(st.Queries[j].Ctx, ctx) {
			return &st.Queries[j]
		}
	}
	if n := len(st.Queries); n > 0 {
		return &st.Queries[n-1]
	}
	return nil
}

// CloseWatch is the tracer's side of a wrapped connection's close notice: it concludes
// the frame open on the connection (see hooks.Adapter.NetConnClosed), once the connection has
// tracer state (State stores it). Close may run on another goroutine than the
// connection's user, hence atomic.
type CloseWatch struct {
	Closed func(*Conn) // hooks.Adapter.NetConnClosed
	st     atomic.Pointer[Conn]
}

// NetConnClosed concludes the frame open on the closed connection, if any.
func (w *CloseWatch) NetConnClosed() {
	if st := w.st.Load(); st != nil {
		w.Closed(st)
	}
}

// PgConn is conn's PgConn, nil for no connection: what State and Made take of the
// *pgx.Conn a hook is given.
func PgConn(conn *pgx.Conn) *pgconn.PgConn {
	if conn == nil {
		return nil
	}
	return conn.PgConn()
}
