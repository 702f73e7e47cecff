package otelpgxtx

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// frame is one physical transaction as the instrumentation sees it. Its depth, parent,
// connection and id are fixed at creation; its phase moves on each transition.
//
// The owning connection's goroutine changes it; other goroutines only read its phase
// and end state (atomics) and add events to its span (which is safe for concurrent use),
// except that the close of its connection may end it on another goroutine, under the
// connection state's mutex (see netConn).
type frame struct {
	t      *Tracer
	span   trace.Span
	id     outcome.OperationID
	depth  int
	parent *frame // the suspended outer frame, or nil
	// parentSpan is the span context the frame span was started under, so that a chained
	// transaction (COMMIT AND CHAIN) gets the same parent.
	parentSpan trace.SpanContext
	conn       *pgconn.PgConn
	start      time.Time
	// framedIn and framedOut are withFrame's last caller context and its answer; only
	// the connection's user calls withFrame.
	framedIn, framedOut context.Context
	// spanCtx is the context the frame span was started in and returned by Start: it
	// carries the frame span, for metric exemplars, at no allocation.
	spanCtx context.Context
	// connAttrs are the connection's attributes, from its connState.
	connAttrs []attribute.KeyValue

	phase atomic.Uint32 // outcome.Phase
	done  atomic.Bool   // the evidence is in: the frame left its connection
	ended atomic.Bool   // the span was ended
	// unrecorded: a Filter rejected the frame; its span only carries the caller's span
	// context, and nothing is parented to it.
	unrecorded bool
	name       string // the span's name, for the next frame of COMMIT AND CHAIN

	committingAt     time.Time
	doneAt           time.Time
	committedLocally bool
	// endedBeforeCommit: the server had sent a FATAL before COMMIT was written.
	endedBeforeCommit bool
	firstErr          classifier.Verdict // the first statement failure, if any
	hasErr            bool
	verdict           classifier.Verdict // the final verdict, once done
	isolation         string
	accessMode        string

	// Set by the executor.
	managed     bool  // the executor ends the span, after post-commit work
	cause       error // why the executor rolled back
	propagation string
	attempt     int
	ref         *outcome.ReconciliationRef
}

// startCtx rebuilds the context f was begun in, for the frame that a chain begins.
func (f *frame) startCtx() context.Context {
	ctx := trace.ContextWithSpanContext(context.Background(), f.parentSpan)
	if f.parent != nil {
		ctx = contextWithFrame(ctx, f.parent)
	}
	return ctx
}

// withSpan makes f's span the parent of what runs inside the frame; an unrecorded frame
// leaves ctx's own span there, as if there were no frame.
func (f *frame) withSpan(ctx context.Context) context.Context {
	if f.unrecorded {
		return ctx
	}
	return trace.ContextWithSpan(ctx, f.span)
}

func (f *frame) currentPhase() outcome.Phase { return outcome.Phase(f.phase.Load()) }

// open reports whether f's transaction is still going on.
func (f *frame) open() bool { return !f.done.Load() }

// connState is what the tracer keeps on one connection, in its CustomData.
//
// The connection's user changes it, in the hooks and in Run; mu orders that with the
// end of the connection's net.Conn, which may be closed on another goroutine (see
// netConn). Uncontended, it costs a few nanoseconds per hook and allocates nothing.
type connState struct {
	mu      sync.Mutex
	frame   *frame
	queries []queryState // started, not yet ended (a busy conn can nest a failed call)

	// The connection's span attributes (db.system.name, db.namespace, server.address,
	// server.port), built on its first recorded frame: conn.Config() copies the whole
	// configuration, which is too dear for every transaction.
	attrs []attribute.KeyValue

	// The cluster identity, read once per connection for reconciliation references.
	systemID     uint64
	timeline     uint32
	serverStart  int64 // µs since the epoch; a connection never outlives a restart
	identityRead bool

	// silent hides Run's closing of pgx's Tx object (see closePgxTx) from the hooks.
	silent bool
	// committing is set while Run's COMMIT is in flight through pgconn, where no hook
	// marks the connection busy.
	committing bool
	// nc is the connection's net.Conn wrapper, nil where pgconn uses another.
	nc *netConn
}

// queryState is what a statement's start hands to its end.
type queryState struct {
	ctx       context.Context // what Start returned: End gets it back
	callerCtx context.Context // what Start was given: the parent of a frame found at End
	set       stmtSet
	frame     *frame
	savepoint string
	batch     batchFacts
	nested    bool // started while another call was in flight on the connection
}

// batchFacts collects per-query results of a batch until its end, when TxStatus is
// valid again.
type batchFacts struct {
	err         error
	rollbackTag bool
}

// stateKey is the CustomData key; the map belongs to the connection, so a pooled
// connection's state goes wherever the connection goes, and dies with it.
const stateKey = "github.com/txevidence/otelpgxtx.state"

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
		st = &connState{queries: make([]queryState, 0, 2)}
		data[stateKey] = st
		if nc, ok := pg.Conn().(*netConn); ok {
			nc.st.Store(st)
			st.nc = nc
		}
	}
	return st
}

func connStateOf(conn *pgx.Conn) *connState {
	if conn == nil {
		return nil
	}
	return stateOf(conn.PgConn())
}

// armCommit marks the position before a COMMIT of f is handed over (see netConn).
func (st *connState) armCommit(f *frame) {
	if st.nc != nil {
		f.endedBeforeCommit = st.nc.armCommit()
	}
}

// commitFacts adds what the net.Conn saw of f's COMMIT to facts, and disarms it.
func (st *connState) commitFacts(f *frame, facts *classifier.Facts) {
	if st.nc != nil {
		facts.CommitNotSent = st.nc.commitNotSent()
	}
	facts.SessionEndedBeforeCommit = f.endedBeforeCommit
}

func (st *connState) push(q queryState) { st.queries = append(st.queries, q) }

// pop removes and returns the query whose Start returned ctx; the last one if none did.
// ok is false when no query was started: the caller has nothing to end.
func (st *connState) pop(ctx context.Context) (q queryState, ok bool) {
	n := len(st.queries)
	if n == 0 {
		return queryState{}, false
	}
	i := n - 1
	for j := n - 1; j >= 0; j-- {
		if st.queries[j].ctx == ctx {
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
		if st.queries[j].ctx == ctx {
			return &st.queries[j]
		}
	}
	if n := len(st.queries); n > 0 {
		return &st.queries[n-1]
	}
	return nil
}

// Frames travel in contexts as an immutable linked list: a context holds the innermost
// frame, which points to its suspended parent. No cleanup can resurrect a frame there:
// a finished frame is skipped, never reused.
type frameKey struct{}

func contextWithFrame(ctx context.Context, f *frame) context.Context {
	return context.WithValue(ctx, frameKey{}, f)
}

// openFrameFromContext returns the innermost frame in ctx whose transaction is open.
func openFrameFromContext(ctx context.Context) *frame {
	f, _ := ctx.Value(frameKey{}).(*frame)
	for f != nil && !f.open() {
		f = f.parent
	}
	return f
}
