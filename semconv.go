package otelpgxtx

import (
	"strings"

	"go.opentelemetry.io/otel/attribute"

	"github.com/txevidence/otelpgxtx/internal/poolmetrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
)

// MessagePendingAtShutdown is the message of the log record [Tracer.Close] writes for each
// outcome automatic reconciliation had not settled: select them with it and pipe them to
// "otelpgxtx reconcile".
const MessagePendingAtShutdown = schema.MessagePendingAtShutdown

// MessageIndeterminate is the message of the log record written for each indeterminate
// frame ([WithLogger]); a log query selects these records by it, and those of
// [MessagePendingAtShutdown], for the operator's command (cmd/otelpgxtx). It says what
// is true when it is written — nothing may be replayed before the commit is settled —
// and stays true when [Retry] with [WithReconciler] settles it aborted and runs the
// attempt again. That settling is recorded in the trace (the otelpgxtx.retry span's
// tx.retry.settled event, then the next attempt's frames), not in a log record.
const MessageIndeterminate = schema.MessageIndeterminate

// MessageCrashRecovered is the message of the log record the tracer writes, once, when a
// connection's check sees that the server's latest checkpoint ends a crash recovery of the
// running postmaster (a backend died hard and the postmaster recovered in place): its
// tx.reconciliation.recovery field (a reconcile.Recovery) answers aborted every commit of
// that postmaster the recovery lost, after the server's next checkpoint has overwritten it
// too. Pipe it to "otelpgxtx reconcile" with the records of the commits to settle.
const MessageCrashRecovered = schema.MessageCrashRecovered

// Attribute keys of the frame span (see "Span schema" in the package documentation).
// They are exported because Go code that reads the spans (a span processor, a sampler, a
// test with an in-memory exporter) picks out a transaction and its outcome by them; the
// names of events, metrics and other spans are documented (docs/metrics.md) rather than
// exported, since what reads those is a query or an alert rule, not Go.
const (
	// OutcomeKey is tx.outcome: one of the five outcome strings, always set at the end.
	OutcomeKey = schema.OutcomeKey
	// PhaseKey is tx.phase: the last observed phase.
	PhaseKey = schema.PhaseKey
	// OperationIDKey is tx.operation_id: the frame's operation id.
	OperationIDKey = schema.OperationIDKey
	// FrameDepthKey is tx.frame.depth: 0 for a top-level transaction, n for one begun
	// while n others are suspended.
	FrameDepthKey = schema.FrameDepthKey
	// PropagationKey is tx.propagation, set by the executor.
	PropagationKey = schema.PropagationKey
	// IsolationKey is tx.isolation, as pgx spells it ("serializable", "read committed").
	IsolationKey = schema.IsolationKey
	// AccessModeKey is tx.access_mode ("read write", "read only").
	AccessModeKey = schema.AccessModeKey
	// AttemptKey is tx.attempt: 1 for the first attempt of an executor call.
	AttemptKey = schema.AttemptKey
	// ReconciliationXIDKey is tx.reconciliation.xid: the xid8 of the commit reference.
	ReconciliationXIDKey = schema.ReconciliationXIDKey
	// ReconciliationRefKey is tx.reconciliation.ref: the whole reconciliation reference.
	ReconciliationRefKey = schema.ReconciliationRefKey
	// NoReferenceKey is tx.reconciliation.no_reference, on an indeterminate frame with
	// commit references on but none taken, when the reason is the frame's own:
	// "multi_statement", its COMMIT came among other statements of one query string or
	// batch ("begin; insert …; commit"), where nothing can carry the reference without going
	// between the application's statements; of an implicit transaction:
	// "simple_protocol", sent as a simple Query, a transaction of its own that nothing can
	// join; "unchecked", the connection's first, which carried the check;
	// "no_transaction_block", a statement that may not run in a transaction block;
	// "xid_lost", the xid read's reply lost with the commit's; "implicit", another.
	// Reconciliation answers it no_reference.
	NoReferenceKey = schema.NoReferenceKey
	// ImplicitKey is tx.implicit: true on the span of an implicit transaction's frame (a
	// statement that may write, sent outside a transaction block, which PostgreSQL
	// commits as soon as it has run), absent on the others; on every series of the
	// transaction metrics, true or false.
	ImplicitKey = schema.ImplicitKey
	// PreparedKey is tx.prepared, true on a frame whose transaction was prepared
	// (PREPARE TRANSACTION): tx.outcome participating, waiting for its coordinator.
	PreparedKey = schema.PreparedKey
	// CommittedLocallyKey is tx.commit.committed_locally: the server said the commit is in
	// its local WAL but synchronous replication was not confirmed.
	CommittedLocallyKey = schema.CommittedLocallyKey
	// RetryableKey is tx.retryable, set on rolled-back frames.
	RetryableKey = schema.RetryableKey
	// ResolvedOutcomeKey is tx.outcome.resolved, on reconciliation spans.
	ResolvedOutcomeKey = schema.ResolvedOutcomeKey
)

// SpanNameReconcile is the name of the span of one reconciliation, linked to the
// original frame: exported, as the frame span's keys are, because code that follows a
// transaction to its settled outcome picks that span out by its name.
const SpanNameReconcile = schema.SpanNameReconcile

// ---- error.type values ------------------------------------------------------------
//
// A frame that did not commit says why in error.type: one of the classifier's reasons
// (classifier.ReasonSerializationFailure, classifier.ReasonConnectionLost,
// classifier.ReasonCompletionUnknown, …: what the server or the connection answered),
// or one of the evidence's (the transaction ended where no statement showed it:
// evidence.ReasonEndedUnobserved, evidence.ReasonReleasedInTransaction,
// evidence.ReasonConnectionClosed), or evidence.ReasonCommittedInside (a statement that
// may commit inside failed after it ran: unknown). A tx.reconcile span's error.type is one of package
// reconcile's reasons.

// RollbackKey is tx.rollback: on a rolled_back frame span, and on the rolled_back series
// of otelpgxtx.transaction.duration and otelpgxtx.transaction.commit.duration, whether the application ended the transaction on purpose ([RollbackDeliberate]) or something failed
// ([RollbackFailure]). A deliberate Rollback() is how Go code usually ends a read-only
// transaction; an alert on rollbacks must not count it. Its two values are the only ones,
// so it adds one series to each metric.
const RollbackKey = schema.RollbackKey

// The values of [RollbackKey].
const (
	// RollbackDeliberate: the application rolled back with nothing gone wrong — no
	// statement failed, [Run]'s function returned nil, no participant failed, and the
	// server answered the ROLLBACK. Its span status stays Unset.
	RollbackDeliberate = schema.RollbackDeliberate
	// RollbackFailure: a statement, the COMMIT or the connection failed, [Run]'s function
	// returned an error or panicked, or the transaction ended where no statement showed
	// it (error.type says which). Its span status is Error, unless the failure was an
	// expected one ([WithExpectedErrors]).
	RollbackFailure = schema.RollbackFailure
)

// ownKeys are the semantic conventions' keys the library writes on its spans and metrics
// (besides every tx.* key): an attribute of the application's under one of them would
// overwrite the library's value, or stand where the library writes none.
var ownKeys = map[attribute.Key]bool{
	schema.DBSystemNameKey: true, schema.DBNamespaceKey: true, schema.DBResponseStatusKey: true, schema.DBOperationNameKey: true,
	schema.DBQuerySummaryKey: true, schema.ServerAddressKey: true, schema.ServerPortKey: true, schema.ErrorTypeKey: true,
	poolmetrics.PoolNameKey: true, poolmetrics.ConnectionStateKey: true,
}

// ownKey reports whether k is a key the library writes itself: the tx.* namespace is the
// library's, all of it, so that a key it adds later is never already the application's.
func ownKey(k attribute.Key) bool {
	return strings.HasPrefix(string(k), "tx.") || ownKeys[k]
}

// checkAttributes refuses, for option name, an attribute under a key the library writes.
func checkAttributes(name string, attrs []attribute.KeyValue) error {
	for _, kv := range attrs {
		if ownKey(kv.Key) {
			return invalid("%s: %s is a key the library writes itself", name, kv.Key)
		}
	}
	return nil
}
