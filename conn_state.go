package otelpgxtx

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
)

// connState is what the tracer keeps on one connection, in its CustomData.
//
// The connection's user changes it, in the hooks and in Run; mu orders that with the
// end of the connection's net.Conn, which may be closed on another goroutine (see
// wire.Conn). Uncontended, it costs a few nanoseconds per hook and allocates nothing.
type connState struct {
	// t is the tracer whose hooks made it: Run ends the frames it manages through it.
	t       *core
	mu      sync.Mutex
	ev      evidence.Conn[*frame] // the frame open on the connection, and its evidence
	queries []queryState          // started, not yet ended (a busy conn can nest a failed call)

	// The connection's span attributes (db.system.name, db.namespace, server.address,
	// server.port), built on its first recorded frame: conn.Config() copies the whole
	// configuration, which is too dear for every transaction.
	attrs []attribute.KeyValue

	// refs are the connection's commit references: the cluster identity, the marker
	// functions checked, what the library added to the writes (package reference).
	refs reference.Conn

	// nc is the connection's net.Conn wrapper, nil where pgconn uses another.
	nc *wire.Conn
	// pool is what the connection-pool metrics keep on it.
	pool poolConnState
	// named are its statements prepared by name (see prepared_names.go).
	named namedStatements
}

// queryState is what a query's Start hook hands to its End hook (see startQuery).
type queryState struct {
	ctx       context.Context // what Start returned: End gets it back
	callerCtx context.Context // what Start was given: the parent of a frame found at End
	set       evidence.Set
	frame     *frame
	savepoint string
	batch     batchFacts
	nested    bool // started while another call was in flight on the connection
	// folded: the query is an event in place of a span — a transaction-control
	// statement's of its frame, an implicit prepare's of its
	// statement —, which started at start. op is what the event names:
	// the statement's db.operation.name, the prepared statement's name.
	folded bool
	start  time.Time
	op     string
	// prepareFailed: pgx's prepare of the query's statement, a call within it, failed:
	// pgx never sent its execution.
	prepareFailed bool
}

// batchFacts collects the results of a batch's queued queries until its end, when TxStatus is
// valid again.
type batchFacts struct {
	err         error
	rollbackTag bool
}

// stateKey is the CustomData key; the map belongs to the connection, so a pooled
// connection's state goes wherever the connection goes, and dies with it.
const stateKey = "github.com/txevidence/otelpgxtx.state"

// stateOf returns the tracer's state of pg, made on first use; nil for a connection
// without CustomData, which is none that pgx connected.
func stateOf(pg *pgconn.PgConn) *connState {
	if pg == nil {
		return nil
	}
	data := pg.CustomData()
	if data == nil {
		return nil
	}
	st, _ := data[stateKey].(*connState)
	if st == nil {
		server := classifier.ServerOf(pg.ParameterStatus)
		st = &connState{queries: make([]queryState, 0, 2), ev: evidence.NewConn[*frame](server)}
		data[stateKey] = st
		if nc, ok := pg.Conn().(*wire.Conn); ok {
			if w, ok := nc.Listener().(*closeWatch); ok {
				w.st.Store(st)
			}
			st.nc = nc
		}
		st.refs = reference.NewConn(st.nc, server == classifier.ServerPostgreSQL, pg.PID())
	}
	return st
}

// connStateOf is stateOf for the *pgx.Conn that the hooks are given.
func connStateOf(conn *pgx.Conn) *connState {
	if conn == nil {
		return nil
	}
	return stateOf(conn.PgConn())
}

// stateOf is the package's stateOf for t's hooks, which make the state t's.
func (t *core) stateOf(pg *pgconn.PgConn) *connState {
	st := stateOf(pg)
	if st != nil && st.t == nil {
		st.t = t
	}
	return st
}

// connStateOf is stateOf for the *pgx.Conn that t's hooks are given.
func (t *core) connStateOf(conn *pgx.Conn) *connState {
	if conn == nil {
		return nil
	}
	return t.stateOf(conn.PgConn())
}

// frame returns the frame open on the connection, or nil.
func (st *connState) frame() *frame { return st.ev.Open() }

// server is the kind of server, from what it reported at connection start: the
// classifier's PostgreSQL-only rules, the committed-locally notices and commit references
// apply to PostgreSQL alone.
func (st *connState) server() classifier.ServerKind { return st.ev.Server() }

// poolState is what the pool metrics keep on the connection of conn, nil without state.
func poolState(conn *pgx.Conn) *poolConnState {
	if st := connStateOf(conn); st != nil {
		return &st.pool
	}
	return nil
}

// madeStateOf is the tracer's state of conn if a hook made it already, else nil: for an
// End hook, whose Start made it if it ran, and which has nothing to judge otherwise.
func madeStateOf(conn *pgx.Conn) *connState {
	if conn == nil {
		return nil
	}
	return madeState(conn.PgConn())
}

// madeState is madeStateOf for pg.
func madeState(pg *pgconn.PgConn) *connState {
	if pg == nil {
		return nil
	}
	st, _ := pg.CustomData()[stateKey].(*connState)
	return st
}

// markCommit marks the position before a COMMIT is handed over (see wire.Conn), and
// reports whether the session had already ended before it.
func (st *connState) markCommit() (sessionEnded bool) {
	return st.nc != nil && st.nc.MarkCommit()
}

// seenEnd is what the replies pgconn read since the last query the hooks saw showed of
// the end of the transaction then open (wire.EndSeen): the server's COMMIT, ROLLBACK or
// PREPARE TRANSACTION, or nothing told apart.
func (st *connState) seenEnd() evidence.Seen {
	if st.nc == nil {
		return evidence.SeenNothing
	}
	return seenFromWire(st.nc.SeenEnd())
}

// seenFromWire is the evidence's word for what the wire saw end a transaction.
func seenFromWire(e wire.EndSeen) evidence.Seen {
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

// repliedClean reports whether the replies pgconn read since the implicit transaction of
// the query in flight was handed over reached an idle ReadyForQuery with no
// ErrorResponse before it (wire.Conn.RepliedClean).
func (st *connState) repliedClean() bool {
	return st.nc != nil && st.nc.RepliedClean()
}

// commitNotSent reports whether the write carrying f's COMMIT sent nothing, and returns
// the net.Conn's accounting of it to idle; only while f is committing.
func (st *connState) commitNotSent(f *frame) bool {
	if f == nil || f.ev.Phase() != outcome.PhaseCommitting || st.nc == nil {
		return false
	}
	return st.nc.CommitNotSent()
}

// push records a started query, for its End hook to pop.
func (st *connState) push(q queryState) { st.queries = append(st.queries, q) }

// pop removes and returns the query whose Start returned ctx; the last one if none did.
// Contexts are matched with sameContext: == on a context passed by value can panic.
// ok is false when no query was started: the caller has nothing to end.
func (st *connState) pop(ctx context.Context) (q queryState, ok bool) {
	n := len(st.queries)
	if n == 0 {
		return queryState{}, false
	}
	i := n - 1
	for j := n - 1; j >= 0; j-- {
		if sameContext(st.queries[j].ctx, ctx) {
			i = j
			break
		}
	}
	q = st.queries[i]
	copy(st.queries[i:], st.queries[i+1:])
	st.queries[n-1] = queryState{}
	st.queries = st.queries[:n-1]
	return q, true
}

// top returns the innermost running query, for batch-query hooks.
func (st *connState) top(ctx context.Context) *queryState {
	for j := len(st.queries) - 1; j >= 0; j-- {
		if sameContext(st.queries[j].ctx, ctx) {
			return &st.queries[j]
		}
	}
	if n := len(st.queries); n > 0 {
		return &st.queries[n-1]
	}
	return nil
}

// closeWatch is the tracer's side of a wrapped connection's close notice: it concludes
// the frame open on the connection (see Tracer.netConnClosed), once the connection has
// tracer state (stateOf stores it). Close may run on another goroutine than the
// connection's user, hence atomic.
type closeWatch struct {
	closed func(*connState) // Tracer.netConnClosed
	st     atomic.Pointer[connState]
}

// NetConnClosed concludes the frame open on the closed connection, if any.
func (w *closeWatch) NetConnClosed() {
	if st := w.st.Load(); st != nil {
		w.closed(st)
	}
}

// sameContext reports whether a and b are one context. Only pointers are compared: ==
// on two values of a non-comparable context type panics.
func sameContext(a, b context.Context) bool {
	return a != nil && reflect.TypeOf(a).Kind() == reflect.Pointer && a == b
}

// poolConnState is what the pool metrics keep on a connection, in its connState.
type poolConnState struct {
	seen       bool      // its pool is among the observed ones
	acquiredAt time.Time // when it was last acquired; zero once released
}
