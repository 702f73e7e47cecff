package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

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
	UnknownInProgress    = "in_progress"    // still in progress after the wait (e.g. a synchronous-replication wait)
	UnknownTooOld        = "too_old"        // pg_xact_status is NULL: the commit log no longer covers the xid
	UnknownInTheFuture   = "in_the_future"  // the server has not assigned the xid yet: another history
	UnknownOtherSystem   = "other_system"   // the reference names another cluster
	UnknownOtherTimeline = "other_timeline" // a failover happened since: the xid may have been reused
	UnknownNoReference   = "no_reference"   // nothing was captured before COMMIT
	// UnknownServerRestarted: the commit log says committed, but the server restarted
	// since the xid was captured (or the reference has no start time), and a crash
	// restart hands out again the xids whose records had not reached the WAL.
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
// (pg_xact_status). It never guesses: anything it cannot prove stays unknown, with the
// reason.
type Reconciler struct {
	db       Querier
	tracer   trace.Tracer
	wait     time.Duration
	interval time.Duration
}

// ReconcilerOption configures a [Reconciler]: [WithTracerProvider] and [WithReconcileWait].
type ReconcilerOption interface {
	applyReconciler(*reconcilerConfig)
}

type reconcilerConfig struct {
	tracerProvider trace.TracerProvider
	wait, interval time.Duration
	err            error
}

type reconcilerOptionFunc func(*reconcilerConfig)

func (f reconcilerOptionFunc) applyReconciler(c *reconcilerConfig) { f(c) }

// WithReconcileWait bounds how long a [Reconciler] polls a transaction that is still in
// progress (a backend can sit in a synchronous-replication wait), and how often; 5 s and
// 50 ms by default. A zero wait asks once.
func WithReconcileWait(wait, interval time.Duration) ReconcilerOption {
	return reconcilerOptionFunc(func(c *reconcilerConfig) {
		if wait < 0 || interval <= 0 {
			c.err = fmt.Errorf("otelpgxtx: WithReconcileWait: wait must be >= 0 and interval > 0, got %v, %v", wait, interval)
			return
		}
		c.wait, c.interval = wait, interval
	})
}

// NewReconciler returns a reconciler that queries db.
func NewReconciler(db Querier, opts ...ReconcilerOption) (*Reconciler, error) {
	if db == nil || isNilHandle(db) {
		return nil, invalid("NewReconciler: nil db")
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
		wait: cfg.wait, interval: cfg.interval}
	return r, nil
}

// Reconcile resolves an indeterminate result, linking its span to the frame that
// observed it (from the result's traceparent).
func Reconcile[T any](ctx context.Context, r *Reconciler, ind outcome.Indeterminate[T]) (Resolution, error) {
	if r == nil {
		return Resolution{}, invalid("Reconcile: nil reconciler")
	}
	ref, ok := ind.Reference()
	link := spanContextFromTraceParent(ind.TraceParent())
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

func (r *Reconciler) resolve(ctx context.Context, ref outcome.ReconciliationRef, link trace.SpanContext, id outcome.OperationID) (Resolution, error) {
	return r.trace(ctx, link, id, ref, func(ctx context.Context) (Resolution, error) {
		res := Resolution{ref: ref}
		if ref.NoWrites() {
			res.resolved = ResolvedNoWrites
			return res, nil
		}
		deadline := time.Now().Add(r.wait)
		for {
			status, sys, tli, start, err := r.query(ctx, ref.XID)
			switch {
			case err != nil:
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "22023" {
					res.reason = UnknownInTheFuture
					return res, nil
				}
				return res, fmt.Errorf("otelpgxtx: reconciling %s: %w", ref, err)
			case sys != ref.SystemIdentifier:
				res.reason = UnknownOtherSystem
				return res, nil
			case tli != ref.Timeline:
				res.reason = UnknownOtherTimeline
				return res, nil
			case status == nil:
				res.reason = UnknownTooOld
				return res, nil
			case *status == "committed" && start != ref.ServerStart:
				// "aborted" stays trustworthy across a restart (a reused xid means the
				// original's records were lost, so it never committed); "committed" may
				// be the reuser's.
				res.reason = UnknownServerRestarted
				return res, nil
			case *status == "committed":
				res.resolved = ResolvedCommitted
				return res, nil
			case *status == "aborted":
				res.resolved = ResolvedAborted
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

// query reads the xid's status together with the cluster identity, in one round trip,
// so that both describe the same server.
func (r *Reconciler) query(ctx context.Context, xid uint64) (status *string, sys uint64, tli uint32, start int64, err error) {
	var sysText, tliText, startText string
	err = r.db.QueryRow(ctx, "select pg_xact_status($1::text::xid8), s.system_identifier::text, c.timeline_id::text, "+serverStartSQL+
		" from pg_control_system() s, pg_control_checkpoint() c",
		strconv.FormatUint(xid, 10)).Scan(&status, &sysText, &tliText, &startText)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	sys, err1 := strconv.ParseUint(sysText, 10, 64)
	t, err2 := strconv.ParseUint(tliText, 10, 32)
	start, err3 := strconv.ParseInt(startText, 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, 0, 0, 0, err
	}
	return status, sys, uint32(t), start, nil
}

// trace runs one reconciliation in a tx.reconcile span linked to the original frame.
func (r *Reconciler) trace(ctx context.Context, link trace.SpanContext, id outcome.OperationID, ref outcome.ReconciliationRef,
	do func(context.Context) (Resolution, error)) (Resolution, error) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
	if link.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: link}))
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
			span.RecordError(err)
			span.SetStatus(codes.Error, "reconciliation failed")
		}
	}
	return res, err
}

// traceParent returns sc as a W3C traceparent value.
func traceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	return carrier.Get("traceparent")
}

func spanContextFromTraceParent(tp string) trace.SpanContext {
	if tp == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
	return trace.SpanContextFromContext(ctx)
}
