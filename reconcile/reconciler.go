package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/pg"
	"github.com/txevidence/otelpgxtx/internal/redact"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
)

// ScopeName is the instrumentation scope name of the reconciler's tracer.
const ScopeName = "github.com/txevidence/otelpgxtx/reconcile"

// Querier runs a query returning one row: *pgxpool.Pool and *pgx.Conn are.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Reconciler resolves indeterminate commits from PostgreSQL's own records
// (pg_xact_status, and the latest checkpoint's next xid after a crash restart or a
// failover). It never guesses: anything it cannot prove stays unknown, with the reason.
// Its answers describe the history of the server it asks: give it the surviving primary.
// Where synchronous replication is configured, a committed answer waits until the
// synchronous standbys confirm the commit (a replication barrier at the synchronous_commit
// of the reconciler's connection), so that a failover cannot undo it; otherwise it is
// unknown with [ReasonNotReplicated].
type Reconciler struct {
	db       Querier
	logger   *slog.Logger
	tracer   trace.Tracer
	wait     time.Duration
	interval time.Duration
	// errorMessages records errors with their full text ([WithErrorMessages]).
	errorMessages bool
	// terminate: end the backend that still holds an xid after the wait ([WithTerminate]).
	terminate bool
	// recoveries are the ends of crash recoveries it was told of, or saw (Remember).
	recoveries recoveries
}

// Option configures a [Reconciler]: [WithTracerProvider], [WithWait], [WithTerminate],
// [WithErrorMessages] and [WithLogger].
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config is what the options set; err is the first option refused.
type config struct {
	tracerProvider trace.TracerProvider
	wait, interval time.Duration
	errorMessages  bool
	terminate      bool
	logger         *slog.Logger
	err            error
}

// WithLogger sets the logger of what an operator must see beyond an answer (a marker that
// contradicts its reference's xid); slog's default by default. A nil logger keeps the
// default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithTracerProvider sets the tracer provider of the tx.reconcile spans; the global one
// by default. A nil provider keeps the default; a typed nil one (a nil
// *sdktrace.TracerProvider) is an error, since it would panic at the first span.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) {
		switch {
		case pg.IsNilHandle(tp):
			if c.err == nil { // the first refused is the one reported
				c.err = invalid("WithTracerProvider: nil %T", tp)
			}
		case tp != nil:
			c.tracerProvider = tp
		}
	})
}

// WithWait bounds how long a [Reconciler] polls a transaction that is still in progress (a
// backend can sit in a synchronous-replication wait), and how often; 5 s and 50 ms by
// default. A zero wait asks once. It also bounds the replication barrier of a committed
// answer (see [Reconciler]), which is given at least a second.
func WithWait(wait, interval time.Duration) Option {
	return optionFunc(func(c *config) {
		if wait < 0 || interval <= 0 {
			if c.err == nil { // the first refused is the one reported
				c.err = invalid("WithWait: wait must be >= 0 and interval > 0, got %v, %v", wait, interval)
			}
			return
		}
		c.wait, c.interval = wait, interval
	})
}

// WithTerminate makes the reconciler its own fence for an xid reference whose transaction
// is still in progress when the wait ([WithWait]) is over: it ends the backend that holds
// the xid (pg_terminate_backend; the server names it in pg_stat_activity.backend_xid), so
// that the server rolls the transaction back, unless that transaction had already
// committed locally (a backend in a synchronous-replication wait, which stays committed),
// and then answers what the server records, waiting for it once more. A client that lost
// its connection leaves its backend idle in its transaction until the server notices,
// which with TCP keepalives off can be hours: without the option the answer stays unknown
// (in_progress) until then.
//
// It needs the right to signal that backend: the pg_signal_backend role, or the role of
// the backend's session (a superuser's backends can be ended only by a superuser); a
// refusal is the Resolve's error. The risk is the client's: a reference is reconciled
// when its commit became indeterminate, and a client that has not in fact lost its
// connection (a slow network, a COMMIT still on its way) loses its transaction, the
// answer aborted saying so. Marker references are fenced by their own row and ignore the
// option. Off by default.
func WithTerminate() Option {
	return optionFunc(func(c *config) { c.terminate = true })
}

// WithErrorMessages records errors with their full text in the tx.reconcile spans. By
// default only the SQLSTATE, its class and the error's type are recorded: a server's
// message can quote values.
func WithErrorMessages() Option {
	return optionFunc(func(c *config) { c.errorMessages = true })
}

// New returns a reconciler that queries db, a pool or a connection outside any
// transaction (a [pgx.Tx] is refused): reconciling commits transactions of its own.
func New(db Querier, opts ...Option) (*Reconciler, error) {
	if db == nil || pg.IsNilHandle(db) {
		return nil, invalid("New: nil db")
	}
	if _, ok := db.(pgx.Tx); ok {
		// The marker's fence and the replication barrier commit transactions of their own.
		return nil, invalid("New: db is a transaction; give it a pool or a connection")
	}
	cfg := config{tracerProvider: otel.GetTracerProvider(), wait: 5 * time.Second, interval: 50 * time.Millisecond, logger: slog.Default()}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	r := &Reconciler{db: db, logger: cfg.logger, tracer: cfg.tracerProvider.Tracer(ScopeName, trace.WithInstrumentationVersion(schema.Version)),
		wait: cfg.wait, interval: cfg.interval, errorMessages: cfg.errorMessages, terminate: cfg.terminate}
	return r, nil
}

// Indeterminate settles an indeterminate result of the executor (otelpgxtx.Run) from its
// reference, linking its span to the frame that observed it (from the result's
// traceparent). A result without a reference stays unknown, [ReasonNoReference].
func Indeterminate[T any](ctx context.Context, r *Reconciler, ind outcome.Indeterminate[T]) (Answer, error) {
	switch {
	case ctx == nil:
		return Answer{}, invalid("Indeterminate: nil context")
	case r == nil:
		return Answer{}, invalid("Indeterminate: nil reconciler")
	}
	var refp *outcome.ReconciliationRef
	if ref, ok := ind.Reference(); ok {
		refp = &ref
	}
	return r.ResolveOperation(ctx, ind.OperationID(), refp, schema.SpanContextOf(ind.TraceParent()))
}

// Resolve settles the transaction a reference names (one stored, say, with the operation
// in a queue). link, if valid, is the span that observed the indeterminate outcome.
func (r *Reconciler) Resolve(ctx context.Context, ref outcome.ReconciliationRef, link trace.SpanContext) (Answer, error) {
	if err := r.check("Resolve", ctx); err != nil {
		return Answer{ref: ref}, err
	}
	if err := ref.Validate(); err != nil {
		return Answer{ref: ref}, invalid("Resolve: %w", err)
	}
	return r.resolve(ctx, ref, link, outcome.OperationID{})
}

// ResolveOperation settles operation op from its reference, or, when it has none (ref is
// nil), answers unknown with [ReasonNoReference] without asking: either way in a
// tx.reconcile span naming op and linked to link. It is what automatic reconciliation
// asks for each indeterminate frame.
func (r *Reconciler) ResolveOperation(ctx context.Context, op outcome.OperationID, ref *outcome.ReconciliationRef, link trace.SpanContext) (Answer, error) {
	if err := r.check("ResolveOperation", ctx); err != nil {
		var a Answer
		if ref != nil {
			a.ref = *ref
		}
		return a, err
	}
	if ref == nil {
		return r.trace(ctx, link, op, outcome.ReconciliationRef{}, func(context.Context) (Answer, error) {
			return Answer{reason: ReasonNoReference}, nil
		})
	}
	if err := ref.Validate(); err != nil {
		return Answer{ref: *ref}, invalid("ResolveOperation: %w", err)
	}
	return r.resolve(ctx, *ref, link, op)
}

// check refuses a call of method name on a nil *Reconciler or with a nil context, which
// would panic inside.
func (r *Reconciler) check(name string, ctx context.Context) error {
	switch {
	case r == nil:
		return invalid("%s: nil *Reconciler (make one with New)", name)
	case ctx == nil:
		return invalid("%s: nil context", name)
	}
	return nil
}

// resolve is Resolve for a validated reference, in a tx.reconcile span; id names the
// operation when the caller knows it.
func (r *Reconciler) resolve(ctx context.Context, ref outcome.ReconciliationRef, link trace.SpanContext, id outcome.OperationID) (Answer, error) {
	return r.trace(ctx, link, id, ref, func(ctx context.Context) (Answer, error) {
		res := Answer{ref: ref}
		if ref.NoWrites() {
			res.status = NoWrites
			return res, nil
		}
		if ref.HasMarker() {
			q := markerQuestion{relation: ref.MarkerRelation(), op: ref.Operation, database: ref.MarkerDatabase(),
				sys: ref.SystemIdentifier, checkedAt: ref.CheckedAt}
			var err error
			if ref.XID != 0 {
				q.xid, err = r.xidProof(ctx, ref)
			}
			if err == nil {
				res.status, res.reason, err = r.resolveMarker(ctx, q)
			}
			if err != nil {
				err = fmt.Errorf("reconcile: reconciling %s: %w", ref, err)
			}
			return res, err
		}
		deadline := time.Now().Add(r.wait)
		fenced := false
		for {
			v, err := r.query(ctx, ref.XID)
			if err != nil {
				return res, fmt.Errorf("reconcile: reconciling %s: %w", ref, err)
			}
			r.know(&v, ref)
			var again bool
			res.status, res.reason, again = decide(ref, v)
			if res.status == Committed && v.syncStandbys {
				ok, err := r.replicated(ctx, v.incarnation, deadline)
				if err != nil {
					return Answer{ref: ref}, fmt.Errorf("reconcile: reconciling %s: %w", ref, err)
				}
				if !ok {
					res.status, res.reason = Unknown, ReasonNotReplicated
				}
			}
			if !again {
				return res, nil
			}
			// In progress: a backend may still sit in a synchronous-replication wait.
			if !time.Now().Before(deadline) {
				if r.terminate && !fenced {
					fenced = true
					if err := r.terminateHolder(ctx, ref.XID); err != nil {
						return Answer{ref: ref}, fmt.Errorf("reconcile: reconciling %s: %w", ref, err)
					}
					deadline = time.Now().Add(max(r.wait, time.Second)) // the backend's exit
					continue
				}
				res.reason = ReasonInProgress
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

// know keeps the end of a crash recovery v shows, and gives v the ends of those of ref's
// postmaster the reconciler keeps, for decide.
func (r *Reconciler) know(v *serverView, ref outcome.ReconciliationRef) {
	if rec, ok := v.recoveryOf(); ok {
		r.Remember(rec)
	}
	v.recoveries = r.recoveries.of(ref)
}

// terminateHolder ends the backend whose transaction holds xid (WithTerminate). The caller
// found xid in progress on the incarnation that assigned it, so the running backend whose
// 32-bit backend_xid matches is that transaction's: no other running transaction can have
// the same low 32 bits. None there (a prepared transaction holds it, or it just ended) is
// no error: the next look answers.
func (r *Reconciler) terminateHolder(ctx context.Context, xid uint64) error {
	var ended bool
	err := r.db.QueryRow(ctx, "select pg_catalog.pg_terminate_backend(a.pid) from pg_catalog.pg_stat_activity a"+
		" where a.backend_xid = pg_catalog.xid($1::text::pg_catalog.xid8)", strconv.FormatUint(xid, 10)).Scan(&ended)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ending the backend that holds xid %d: %w", xid, err)
	}
	return nil
}

// xidProof returns what ref's xid proves on the server asked: Committed or Aborted where
// the incarnation that assigned it answers (same system, timeline, server start and
// statistics reset time), else Unknown (in progress, another incarnation, one that went
// through crash recovery: where PostgreSQL may have reused it).
func (r *Reconciler) xidProof(ctx context.Context, ref outcome.ReconciliationRef) (Status, error) {
	v, err := r.query(ctx, ref.XID)
	if err != nil {
		return Unknown, err
	}
	r.know(&v, ref)
	if v.sys == ref.SystemIdentifier && v.running(ref) && !v.inRecovery && v.lostInRecovery(ref) {
		return Aborted, nil // lost in a crash recovery after the reference
	}
	if v.inFuture || v.inRecovery || v.status == nil || v.sys != ref.SystemIdentifier || !v.assigned(ref) {
		return Unknown, nil
	}
	switch *v.status {
	case "committed":
		return Committed, nil
	case "aborted":
		return Aborted, nil
	}
	return Unknown, nil
}

// trace runs one reconciliation in a tx.reconcile span linked to the original frame. The
// span is a child of the span in ctx; when ctx has none, of the frame span it links to,
// so that it is in the frame's trace: trace-id routing and tail sampling keep the two
// together only then.
func (r *Reconciler) trace(ctx context.Context, link trace.SpanContext, id outcome.OperationID, ref outcome.ReconciliationRef,
	do func(context.Context) (Answer, error)) (Answer, error) {
	// INTERNAL like the frame: its queries are the CLIENT spans of the db's tracer.
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	if link.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: link}))
		if !trace.SpanContextFromContext(ctx).IsValid() {
			ctx = trace.ContextWithSpanContext(ctx, link)
		}
	}
	ctx, span := r.tracer.Start(ctx, schema.SpanNameReconcile, opts...)
	defer span.End()
	res, err := do(ctx)
	if span.IsRecording() {
		span.SetAttributes(schema.DBSystemPostgreSQL, schema.ResolvedOutcomeKey.String(res.status.String()))
		if !id.IsZero() {
			span.SetAttributes(schema.OperationIDKey.String(id.String()))
		}
		if ref.SystemIdentifier != 0 {
			span.SetAttributes(schema.ReconciliationRefKey.String(ref.String()))
		}
		if res.reason != "" {
			span.SetAttributes(schema.ErrorTypeKey.String(res.reason))
		}
		if err != nil {
			span.RecordError(redact.Error(err, r.errorMessages))
			span.SetStatus(codes.Error, "reconciliation failed")
		}
	}
	return res, err
}
