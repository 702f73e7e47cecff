package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/redact"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Querier runs a query returning one row: *pgxpool.Pool and *pgx.Conn are.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Resolved is what reconciliation learned of a transaction.
type Resolved uint8

const (
	// ResolvedUnknown: still unknown; [Resolution.Reason] says why. Never guess.
	ResolvedUnknown Resolved = iota
	// ResolvedCommitted: PostgreSQL's commit log says committed.
	ResolvedCommitted
	// ResolvedAborted: PostgreSQL's commit log says aborted: the work is not there.
	ResolvedAborted
	// ResolvedNoWrites: the transaction had no xid when COMMIT was sent; it wrote
	// nothing, so whether it committed changes nothing.
	ResolvedNoWrites
)

// resolvedNames are the tx.outcome.resolved values, indexed by Resolved.
var resolvedNames = [...]string{ResolvedUnknown: "unknown", ResolvedCommitted: "committed", ResolvedAborted: "aborted", ResolvedNoWrites: "no_writes"}

// String returns the tx.outcome.resolved value.
func (r Resolved) String() string {
	if int(r) < len(resolvedNames) {
		return resolvedNames[r]
	}
	return fmt.Sprintf("resolved(%d)", uint8(r))
}

// Reasons a reconciliation stays unknown.
const (
	UnknownInProgress  = "in_progress"   // still in progress after the wait (e.g. a synchronous-replication wait)
	UnknownTooOld      = "too_old"       // pg_xact_status is NULL: the commit log no longer covers the xid
	UnknownInTheFuture = "in_the_future" // the server has not assigned the xid yet: another history
	UnknownOtherSystem = "other_system"  // the reference names another cluster
	UnknownNoReference = "no_reference"  // nothing was captured before COMMIT
	// UnknownOtherTimeline: a failover happened since and the commit log says committed
	// below the new timeline's proven boundary (or no boundary is proven yet, or the
	// server is not on a later timeline): an xid may be handed out again after a fork.
	UnknownOtherTimeline = "other_timeline"
	// UnknownServerRestarted: the commit log says committed, but the server restarted
	// since the xid was captured (or the reference has no start time), the xid is below
	// the restart's boundary, and another restart in between could have handed it out again.
	UnknownServerRestarted = "server_restarted"
)

// Resolution is the answer of a [Reconciler].
type Resolution struct {
	resolved Resolved
	reason   string
	ref      outcome.ReconciliationRef
}

// Resolved returns what is known now.
func (r Resolution) Resolved() Resolved { return r.resolved }

// Reason returns why the resolution is unknown, or "".
func (r Resolution) Reason() string { return r.reason }

// Reference returns the reference that was resolved.
func (r Resolution) Reference() outcome.ReconciliationRef { return r.ref }

// Reconciler resolves indeterminate commits from PostgreSQL's own records
// (pg_xact_status, and the latest checkpoint's next xid after a crash restart or a
// failover). It never guesses: anything it cannot prove stays unknown, with the reason.
// Its answers describe the history of the server it asks: give it the surviving primary.
// Where synchronous replication is configured, a committed answer waits until the
// synchronous standbys confirm the commit (a replication barrier at the synchronous_commit
// of the reconciler's connection), so that a failover cannot undo it; otherwise it is
// unknown with [UnknownNotReplicated].
type Reconciler struct {
	db       Querier
	tracer   trace.Tracer
	wait     time.Duration
	interval time.Duration
	// errorMessages records errors with their full text ([WithErrorMessages]).
	errorMessages bool
}

// ReconcilerOption configures a [Reconciler]: [WithTracerProvider], [WithReconcileWait]
// and [WithErrorMessages].
type ReconcilerOption interface {
	applyReconciler(*reconcilerConfig)
}

// reconcilerConfig is what the ReconcilerOptions set; err is the first option refused.
type reconcilerConfig struct {
	tracerProvider trace.TracerProvider
	wait, interval time.Duration
	errorMessages  bool
	err            error
}

// WithReconcileWait bounds how long a [Reconciler] (or automatic reconciliation, see
// [WithAutoReconcile]) polls a transaction that is still in progress (a backend can sit
// in a synchronous-replication wait), and how often; 5 s and 50 ms by default. A zero
// wait asks once. It also bounds the replication barrier of a committed answer (see
// [Reconciler]), which is given at least a second.
func WithReconcileWait(wait, interval time.Duration) ReconcileWaitOption {
	return reconcileWaitOption{wait, interval}
}

// ReconcileWaitOption is a [ReconcilerOption] and an [AutoReconcileOption]: [WithReconcileWait].
type ReconcileWaitOption interface {
	ReconcilerOption
	AutoReconcileOption
}

// reconcileWaitOption is WithReconcileWait, which configures a Reconciler and automatic
// reconciliation alike.
type reconcileWaitOption struct{ wait, interval time.Duration }

// check refuses a negative wait and an interval that would poll without pause.
func (o reconcileWaitOption) check() error {
	if o.wait < 0 || o.interval <= 0 {
		return fmt.Errorf("otelpgxtx: WithReconcileWait: wait must be >= 0 and interval > 0, got %v, %v", o.wait, o.interval)
	}
	return nil
}

// applyReconciler sets the Reconciler's wait and interval.
func (o reconcileWaitOption) applyReconciler(c *reconcilerConfig) {
	if err := o.check(); err != nil {
		c.err = err
		return
	}
	c.wait, c.interval = o.wait, o.interval
}

// applyAuto sets automatic reconciliation's wait and interval.
func (o reconcileWaitOption) applyAuto(c *autoConfig) {
	if err := o.check(); err != nil {
		c.err = err
		return
	}
	c.wait, c.interval = o.wait, o.interval
}

// NewReconciler returns a reconciler that queries db, a pool or a connection outside any
// transaction (a [pgx.Tx] is refused): reconciling commits transactions of its own.
func NewReconciler(db Querier, opts ...ReconcilerOption) (*Reconciler, error) {
	if db == nil || pg.IsNilHandle(db) {
		return nil, invalid("NewReconciler: nil db")
	}
	if _, ok := db.(pgx.Tx); ok {
		// The marker's fence and the replication barrier commit transactions of their own.
		return nil, invalid("NewReconciler: db is a transaction; give it a pool or a connection")
	}
	cfg := reconcilerConfig{tracerProvider: otel.GetTracerProvider(), wait: 5 * time.Second, interval: 50 * time.Millisecond}
	for _, o := range opts {
		if o != nil {
			o.applyReconciler(&cfg)
		}
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	r := &Reconciler{db: db, tracer: cfg.tracerProvider.Tracer(ScopeName, trace.WithInstrumentationVersion(Version())),
		wait: cfg.wait, interval: cfg.interval, errorMessages: cfg.errorMessages}
	return r, nil
}

// Reconcile resolves an indeterminate result, linking its span to the frame that
// observed it (from the result's traceparent).
func Reconcile[T any](ctx context.Context, r *Reconciler, ind outcome.Indeterminate[T]) (Resolution, error) {
	if r == nil {
		return Resolution{}, invalid("Reconcile: nil reconciler")
	}
	ref, ok := ind.Reference()
	link := schema.SpanContextOf(ind.TraceParent())
	if !ok {
		return r.trace(ctx, link, ind.OperationID(), outcome.ReconciliationRef{}, func(context.Context) (Resolution, error) {
			return Resolution{reason: UnknownNoReference}, nil
		})
	}
	return r.resolve(ctx, ref, link, ind.OperationID())
}

// Resolve resolves a bare reference (one stored, say, with the operation in a queue).
// link, if valid, is the span that observed the indeterminate outcome.
func (r *Reconciler) Resolve(ctx context.Context, ref outcome.ReconciliationRef, link trace.SpanContext) (Resolution, error) {
	if err := ref.Validate(); err != nil {
		return Resolution{ref: ref}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return r.resolve(ctx, ref, link, outcome.OperationID{})
}

// resolve is Resolve for a validated reference, in a tx.reconcile span; id names the
// operation when the caller knows it.
func (r *Reconciler) resolve(ctx context.Context, ref outcome.ReconciliationRef, link trace.SpanContext, id outcome.OperationID) (Resolution, error) {
	return r.trace(ctx, link, id, ref, func(ctx context.Context) (Resolution, error) {
		res := Resolution{ref: ref}
		if ref.NoWrites() {
			res.resolved = ResolvedNoWrites
			return res, nil
		}
		if ref.HasMarker() {
			var err error
			res.resolved, res.reason, err = r.resolveMarker(ctx, ref.MarkerTable, ref.Operation, ref.SystemIdentifier)
			if err != nil {
				err = fmt.Errorf("otelpgxtx: reconciling %s: %w", ref, err)
			}
			return res, err
		}
		deadline := time.Now().Add(r.wait)
		for {
			v, err := r.query(ctx, ref.XID)
			if err != nil {
				return res, fmt.Errorf("otelpgxtx: reconciling %s: %w", ref, err)
			}
			var again bool
			res.resolved, res.reason, again = decide(ref, v)
			if res.resolved == ResolvedCommitted && v.syncStandbys {
				ok, err := r.replicated(ctx, incarnation{v.timeline, v.start}, deadline)
				if err != nil {
					return Resolution{ref: ref}, fmt.Errorf("otelpgxtx: reconciling %s: %w", ref, err)
				}
				if !ok {
					res.resolved, res.reason = ResolvedUnknown, UnknownNotReplicated
				}
			}
			if !again {
				return res, nil
			}
			// In progress: a backend may still sit in a synchronous-replication wait.
			if !time.Now().Before(deadline) {
				res.reason = UnknownInProgress
				return res, nil
			}
			t := time.NewTimer(r.interval)
			select {
			case <-ctx.Done():
				t.Stop()
				return res, ctx.Err()
			case <-t.C:
			}
		}
	})
}

// serverView is what one reconciliation query saw of the server and of the xid.
type serverView struct {
	status   *string // pg_xact_status; nil when the commit log no longer covers the xid
	inFuture bool    // pg_xact_status refused: the server has not assigned the xid yet
	sys      uint64
	// timeline the server writes WAL on; on a standby (inRecovery) its last restartpoint's.
	timeline   uint32
	inRecovery bool
	start      int64
	// The latest checkpoint's timeline and next full xid (pg_control_checkpoint()).
	checkpointTimeline uint32
	checkpointNextXID  uint64
	// syncStandbys: synchronous replication is configured (synchronous_standby_names).
	syncStandbys bool
}

// decide resolves ref from v, or asks to look again (the xid is in progress).
//
// An xid names the reference's transaction only in the server incarnation that assigned
// it: PostgreSQL does not WAL-log xid assignment, so after a crash restart or a failover
// an xid whose records never reached the surviving WAL is handed out again. What the
// server proves about a later incarnation is a boundary, the next xid of a checkpoint
// made after the reference's incarnation ended:
//
//   - crash recovery replays every WAL record and advances the next xid past each
//     record's xid (xlogrecovery.c, ApplyWalRecord: AdvanceNextFullTransactionIdPastXid),
//     then writes the end-of-recovery checkpoint and waits for it before it accepts
//     connections (xlog.c, PerformRecoveryXLogAction: CHECKPOINT_END_OF_RECOVERY |
//     CHECKPOINT_WAIT); after a clean restart the latest checkpoint is the shutdown one.
//     So, in a later incarnation on the same timeline, the latest checkpoint was made
//     after the reference's incarnation ended;
//   - a promoted standby replays the same way, and a checkpoint on the new timeline was
//     made after the switch.
//
// Such a checkpoint's next xid is above every xid with a WAL record in the history before
// it, so an xid at or above it never wrote its commit record there: the transaction did
// not commit in this server's history, whatever pg_xact_status says now (it may describe
// a reuser). TestReconcileXIDReusedAfterCrash and TestReconcileAfterFailover show both.
// Below the boundary a "committed" status stays unknown: an intermediate incarnation the
// server keeps no record of may have reused the xid and committed it.
func decide(ref outcome.ReconciliationRef, v serverView) (res Resolved, reason string, again bool) {
	if v.sys != ref.SystemIdentifier {
		return ResolvedUnknown, UnknownOtherSystem, false
	}
	sameTimeline := v.timeline == ref.Timeline
	same := sameTimeline && ref.ServerStart != 0 && v.start == ref.ServerStart
	// later: the server is a later incarnation of the reference's history (a primary on a
	// higher timeline, or restarted since on the same one), so the rules above apply.
	later := !v.inRecovery && (v.timeline > ref.Timeline ||
		sameTimeline && ref.ServerStart != 0 && v.start > ref.ServerStart)
	if later && (v.inFuture || v.checkpointTimeline == v.timeline && ref.XID >= v.checkpointNextXID) {
		// Not yet assigned now means not assigned before the restart or fork either: the
		// next xid only grows from the boundary.
		return ResolvedAborted, "", false
	}
	switch {
	case v.inFuture:
		return ResolvedUnknown, UnknownInTheFuture, false
	case !sameTimeline && !later:
		return ResolvedUnknown, UnknownOtherTimeline, false
	case v.status == nil:
		return ResolvedUnknown, UnknownTooOld, false
	case *v.status == "aborted":
		// A reuser's status means the original's records were lost: it never committed.
		return ResolvedAborted, "", false
	case *v.status == "committed" && same:
		return ResolvedCommitted, "", false
	case *v.status == "committed" && !sameTimeline:
		return ResolvedUnknown, UnknownOtherTimeline, false
	case *v.status == "committed":
		return ResolvedUnknown, UnknownServerRestarted, false
	}
	return ResolvedUnknown, "", true
}

// reconcileIdentitySQL reads the server's identity and its latest checkpoint.
const reconcileIdentitySQL = "s.system_identifier::text, coalesce(" + pg.TimelineSQL + ", c.timeline_id::text), pg_is_in_recovery(), " +
	pg.ServerStartSQL + ", c.timeline_id::text, c.next_xid::text, " + syncStandbysSQL + " " +
	"from pg_control_system() s, pg_control_checkpoint() c"

// query reads the xid's status together with the server's identity, in one round trip,
// so that both describe the same server; when the server refuses the xid as not yet
// assigned, a second query reads the identity alone.
func (r *Reconciler) query(ctx context.Context, xid uint64) (serverView, error) {
	var v serverView
	var sysText, tliText, startText, ckptTLIText, nextText string
	dest := []any{&sysText, &tliText, &v.inRecovery, &startText, &ckptTLIText, &nextText, &v.syncStandbys}
	err := r.db.QueryRow(ctx, "select pg_xact_status($1::text::xid8), "+reconcileIdentitySQL,
		strconv.FormatUint(xid, 10)).Scan(append([]any{&v.status}, dest...)...)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "22023" {
		v.inFuture = true
		err = r.db.QueryRow(ctx, "select "+reconcileIdentitySQL).Scan(dest...)
	}
	if err != nil {
		return v, err
	}
	var errs [5]error
	v.sys, errs[0] = strconv.ParseUint(sysText, 10, 64)
	tli, e1 := strconv.ParseUint(tliText, 10, 32)
	ctli, e2 := strconv.ParseUint(ckptTLIText, 10, 32)
	v.start, errs[3] = strconv.ParseInt(startText, 10, 64)
	v.checkpointNextXID, errs[4] = parseFullXID(nextText)
	errs[1], errs[2] = e1, e2
	if err := errors.Join(errs[:]...); err != nil {
		return v, err
	}
	v.timeline, v.checkpointTimeline = uint32(tli), uint32(ctli)
	return v, nil
}

// parseFullXID parses pg_control_checkpoint()'s next_xid, "<epoch>:<xid>", into a full
// (xid8) transaction id.
func parseFullXID(s string) (uint64, error) {
	e, x, ok := strings.Cut(s, ":")
	epoch, err1 := strconv.ParseUint(e, 10, 32)
	xid, err2 := strconv.ParseUint(x, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("unexpected next_xid %q", s)
	}
	return epoch<<32 | xid, nil
}

// trace runs one reconciliation in a tx.reconcile span linked to the original frame. The
// span is a child of the span in ctx; when ctx has none, of the frame span it links to,
// so that it is in the frame's trace: trace-id routing and tail sampling keep the two
// together only then.
func (r *Reconciler) trace(ctx context.Context, link trace.SpanContext, id outcome.OperationID, ref outcome.ReconciliationRef,
	do func(context.Context) (Resolution, error)) (Resolution, error) {
	// INTERNAL like the frame: its queries are the CLIENT spans of the db's tracer.
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	if link.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: link}))
		if !trace.SpanContextFromContext(ctx).IsValid() {
			ctx = trace.ContextWithSpanContext(ctx, link)
		}
	}
	ctx, span := r.tracer.Start(ctx, SpanNameReconcile, opts...)
	defer span.End()
	res, err := do(ctx)
	if span.IsRecording() {
		span.SetAttributes(dbSystemPostgreSQL, ResolvedOutcomeKey.String(res.resolved.String()))
		if !id.IsZero() {
			span.SetAttributes(OperationIDKey.String(id.String()))
		}
		if ref.SystemIdentifier != 0 {
			span.SetAttributes(ReconciliationRefKey.String(ref.String()))
		}
		if res.reason != "" {
			span.SetAttributes(errorTypeKey.String(res.reason))
		}
		if err != nil {
			span.RecordError(redact.Error(err, r.errorMessages))
			span.SetStatus(codes.Error, "reconciliation failed")
		}
	}
	return res, err
}
