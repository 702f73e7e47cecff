package reconcile

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx/internal/pg"
)

// incarnation is what names one run of one server's history: a reference's xid means
// the same transaction only on the same timeline, the same server start and the same
// statistics reset time, which crash recovery moves while the postmaster keeps its start
// time (see pg.StatsResetSQL).
type incarnation struct {
	timeline   uint32
	start      int64
	statsReset int64
}

// incarnationSQL reads the incarnation: the timeline written on, the server start and
// the statistics' reset time.
const incarnationSQL = "coalesce(" + pg.TimelineSQL + ", '0'), " + pg.ServerStartSQL + ", " + pg.StatsResetSQL

// syncStandbysSQL reads whether synchronous replication is configured: only then can a
// commit be local to the primary, and a committed answer need the barrier.
const syncStandbysSQL = "current_setting('synchronous_standby_names') <> ''"

// barrierSQL commits an implicit transaction that writes WAL, a transactional logical
// decoding message (prefix "otelpgxtx.barrier", empty; any role may emit one, at any
// wal_level): an xid alone writes no WAL, and PostgreSQL only waits for the standbys
// after a commit that wrote some (xact.c, RecordTransactionCommit). Its commit record
// follows, in the WAL, the commit record of every transaction the reconciler has seen
// committed, and synchronous replication releases a committing backend only once the
// synchronous standbys confirm the WAL up to its own commit record (syncrep.c,
// SyncRepWaitForLSN), so a barrier that returns makes every earlier commit as durable as
// an acknowledged one. It runs at the synchronous_commit of the reconciler's connection.
// The application_name, local to the transaction and shown in pg_stat_activity while it
// waits, names the backend for replicatedByName.
const barrierSQL = "select pg_logical_emit_message(true, 'otelpgxtx.barrier', '')::text, " +
	"set_config('application_name', $1, true), " + incarnationSQL

// replicated runs the replication barrier for a commit seen on incarnation in, bounded
// by deadline but given at least minBarrierWait. It reports false, with no error,
// when the bound passed first or the barrier ran on another incarnation (the pool reached
// another server since). A backend waiting for the standbys ignores its client, so
// a barrier given up must be cancelled on the server, lest it hold a connection slot
// until the standbys come back: through the connection's cancel key where the
// reconciler can hold one (a pool's or a *pgx.Conn), else by its name.
func (r *Reconciler) replicated(ctx context.Context, in incarnation, deadline time.Time) (bool, error) {
	bound := later(deadline, time.Now().Add(minBarrierWait))
	name := "otelpgxtx barrier " + strconv.FormatUint(rand.Uint64(), 16)
	var conn *pgx.Conn
	switch db := r.db.(type) {
	case *pgx.Conn:
		conn = db
	case *pgxpool.Pool:
		held, err := db.Acquire(ctx)
		if err != nil {
			return false, err
		}
		defer held.Release()
		conn = held.Conn()
	default:
		return r.replicatedByName(ctx, in, bound, name)
	}
	return replicatedOn(ctx, conn, in, bound, name)
}

// replicatedOn runs the barrier named name on conn, which the reconciler holds, and gives
// it up at bound or when ctx ends by sending cancel requests with conn's cancel key.
func replicatedOn(ctx context.Context, conn *pgx.Conn, in incarnation, bound time.Time, name string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	// The query ends when the server answers it: cancel requests make it answer once the
	// bound passes or the caller gives up. Ending it on the client instead would close
	// the connection and leave the backend waiting. The simple protocol sends it as one
	// message, so the backend is never idle between its parts, when a cancel is dropped.
	qctx, stop := context.WithTimeout(context.WithoutCancel(ctx), time.Until(bound)+cancelGrace)
	defer stop()
	answered := make(chan struct{})
	var once sync.Once
	var gaveUp bool
	giveUp := func() {
		once.Do(func() {
			gaveUp = true
			// A cancel that reaches the backend before it read the query is dropped: repeat.
			for qctx.Err() == nil {
				_ = conn.PgConn().CancelRequest(qctx)
				select {
				case <-answered:
					return
				case <-time.After(cancelRepeat):
				}
			}
		})
	}
	timer := time.AfterFunc(time.Until(bound), giveUp)
	stopOnCaller := context.AfterFunc(ctx, giveUp)
	got, err := scanBarrier(conn.QueryRow(qctx, barrierSQL, pgx.QueryExecModeSimpleProtocol, name))
	close(answered)
	timer.Stop()
	stopOnCaller()
	// Waits for a cancel in progress: once delivered, it finds the backend idle, and
	// PostgreSQL drops a cancel that finds it idle, so the next statement is safe.
	once.Do(func() {})
	switch {
	case gaveUp && ctx.Err() != nil:
		return false, ctx.Err()
	case gaveUp:
		// Cancelled, the wait ended with a WARNING and the barrier committed locally only.
		return false, nil
	case err != nil:
		return false, err
	}
	return got == in, nil
}

// minBarrierWait is the least a barrier is given, whatever the reconcile wait: healthy
// standbys confirm in milliseconds, but a barrier's own commit on a loaded server can
// take longer than a short poll interval, and giving up then would turn a replicated
// commit into not_replicated.
const minBarrierWait = time.Second

// cancelRepeat is how often a barrier being given up is sent a cancel request again.
const cancelRepeat = 100 * time.Millisecond

// cancelGrace bounds a cancel request, and how long past the bound a barrier may take
// to answer it before the client gives up on the connection.
const cancelGrace = 5 * time.Second

// scanBarrier reads the incarnation a barrier committed on.
func scanBarrier(row pgx.Row) (incarnation, error) {
	var lsn, setName, tli, start, reset string
	if err := row.Scan(&lsn, &setName, &tli, &start, &reset); err != nil {
		return incarnation{}, err
	}
	return parseIncarnation(tli, start, reset)
}

// replicatedByName is replicated for a db the reconciler cannot hold a connection of:
// the client bounds the barrier, and a barrier given up is cancelled by its name.
func (r *Reconciler) replicatedByName(ctx context.Context, in incarnation, bound time.Time, name string) (bool, error) {
	bctx, cancel := context.WithDeadline(ctx, bound)
	defer cancel()
	got, err := scanBarrier(r.db.QueryRow(bctx, barrierSQL, name))
	if err == nil {
		return got == in, nil
	}
	if bctx.Err() == nil {
		return false, err
	}
	cctx, cancelLookup := context.WithTimeout(context.WithoutCancel(ctx), cancelGrace)
	defer cancelLookup()
	var n int64
	_ = r.db.QueryRow(cctx, "select count(pg_cancel_backend(pid)) from pg_stat_activity where application_name = $1", name).Scan(&n)
	return false, ctx.Err()
}

// parseIncarnation parses the timeline, start time and statistics reset time read by
// incarnationSQL.
func parseIncarnation(tli, start, reset string) (incarnation, error) {
	t, err1 := strconv.ParseUint(tli, 10, 32)
	s, err2 := strconv.ParseInt(start, 10, 64)
	r, err3 := strconv.ParseInt(reset, 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return incarnation{}, err
	}
	return incarnation{timeline: uint32(t), start: s, statsReset: r}, nil
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
