package otelpgxtx

import (
	"strings"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/txevidence/otelpgxtx/internal/schema"
)

// Attribute keys of the frame span (see "Span schema" in the package documentation).
// They are exported because Go code that reads the spans (a span processor, a sampler, a
// test with an in-memory exporter) picks out a transaction and its outcome by them; the
// names of events, metrics and other spans are documented (docs/metrics.md) rather than
// exported, since what reads those is a query or an alert rule, not Go.
const (
	// OutcomeKey is tx.outcome: one of the five outcome strings, always set at the end.
	OutcomeKey = outcomeKey
	// PhaseKey is tx.phase: the last observed phase.
	PhaseKey = phaseKey
	// OperationIDKey is tx.operation_id: the frame's operation id.
	OperationIDKey = schema.OperationIDKey
	// FrameDepthKey is tx.frame.depth: 0 for a top-level transaction, n for one begun
	// while n others are suspended.
	FrameDepthKey = frameDepthKey
	// PropagationKey is tx.propagation, set by the executor.
	PropagationKey = propagationKey
	// IsolationKey is tx.isolation, as pgx spells it ("serializable", "read committed").
	IsolationKey = isolationKey
	// AccessModeKey is tx.access_mode ("read write", "read only").
	AccessModeKey = accessModeKey
	// AttemptKey is tx.attempt: 1 for the first attempt of an executor call.
	AttemptKey = attemptKey
	// ReconciliationXIDKey is tx.reconciliation.xid: the xid8 of the commit reference.
	ReconciliationXIDKey = reconciliationXIDKey
	// ReconciliationRefKey is tx.reconciliation.ref: the whole reconciliation reference.
	ReconciliationRefKey = schema.ReconciliationRefKey
	// NoReferenceKey is tx.reconciliation.no_reference, on an indeterminate frame with
	// commit references on but none taken, when the reason is the frame's own:
	// "multi_statement", its COMMIT came among other statements of one query string
	// ("begin; insert …; commit"), where nothing can carry the reference without going
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
	ImplicitKey = implicitKey
	// PreparedKey is tx.prepared, true on a frame whose transaction was prepared
	// (PREPARE TRANSACTION): tx.outcome participating, waiting for its coordinator.
	PreparedKey = preparedKey
	// CommittedLocallyKey is tx.commit.committed_locally: the server said the commit is in
	// its local WAL but synchronous replication was not confirmed.
	CommittedLocallyKey = committedLocallyKey
	// RetryableKey is tx.retryable, set on rolled-back frames.
	RetryableKey = retryableKey
	// ResolvedOutcomeKey is tx.outcome.resolved, on reconciliation spans.
	ResolvedOutcomeKey = schema.ResolvedOutcomeKey
)

// Attribute keys of the frame's events, unexported with the event names they go with.
const (
	// participantOutcomeKey is tx.participant.outcome, on tx.participant events: the
	// participant's own result. It is not tx.outcome, so that a search for a frame
	// outcome never finds a participant's.
	participantOutcomeKey = attribute.Key("tx.participant.outcome")
	// savepointNameKey is tx.savepoint.name, on savepoint events.
	savepointNameKey = attribute.Key("tx.savepoint.name")
	// savepointDepthKey is tx.savepoint.depth, on savepoint events: 1 for the outermost
	// savepoint of the transaction, n for one made while n−1 others were open — for a
	// release or rollback to, the depth of the savepoint it names.
	savepointDepthKey = attribute.Key("tx.savepoint.depth")
	// statementDurationKey is tx.statement.duration, in seconds: on the event that stands
	// for a statement without a span of its own (a transaction-control statement's event on
	// its frame, an implicit prepare's on its statement span), how long the statement
	// took, from its start hook to its end hook; the event is recorded when it ended.
	statementDurationKey = attribute.Key("tx.statement.duration")
)

// Semantic-convention keys: the conventions own them, and the OpenTelemetry module's
// semconv package (its newest, v1.43.0) names them, so they are not exported here.
const (
	dbNamespaceKey      = semconv.DBNamespaceKey
	dbResponseStatusKey = semconv.DBResponseStatusCodeKey
	dbOperationNameKey  = semconv.DBOperationNameKey
	serverAddressKey    = semconv.ServerAddressKey
	serverPortKey       = semconv.ServerPortKey
)

// Event names on the frame span, unexported: they annotate a trace for the person reading
// it, and the package documentation lists them.
const (
	// eventPhasePrefix and a phase's name (tx.phase.committing) name the event of each
	// phase the frame enters.
	eventPhasePrefix = "tx.phase."
	// eventSuspended is on the outer frame when a frame nested in it begins, with the
	// nested frame's tx.operation_id.
	eventSuspended = "tx.suspended"
	// eventResumed is on the outer frame when the nested frame concludes.
	eventResumed = "tx.resumed"
	// eventSavepointCreated records a SAVEPOINT, with tx.savepoint.name.
	eventSavepointCreated = "tx.savepoint.created"
	// eventSavepointReleased records a RELEASE SAVEPOINT, with tx.savepoint.name.
	eventSavepointReleased = "tx.savepoint.released"
	// eventSavepointRolledBack records a ROLLBACK TO SAVEPOINT, with tx.savepoint.name.
	eventSavepointRolledBack = "tx.savepoint.rolled_back"
	// eventStatement records a transaction-control statement, without a span of its own,
	// whose answer made no other event of the frame: a savepoint statement that failed, a
	// BEGIN inside the transaction. It carries db.operation.name, tx.statement.duration and,
	// on a server error, db.response.status_code.
	eventStatement = "tx.statement"
	// eventPrepare, on a statement's span, records the implicit prepare of the statement
	// (pgx prepares it before it runs it), with tx.statement.duration, otelpgx's
	// pgx.prepare_stmt.name when the statement is named, and db.response.status_code on a
	// server error.
	eventPrepare = "pgx.prepare"
	// eventRetry is on the frame of an attempt that [Run] retries.
	eventRetry = "tx.retry"
	// eventPostCommitFailed is on a committed frame whose post-commit work failed.
	eventPostCommitFailed = "tx.post_commit.failed"
	// eventParticipant records a Run call that joined this frame's transaction (Required,
	// Mandatory) or ran in a savepoint of it (Nested), with the call's tx.outcome.
	eventParticipant = "tx.participant"
)

// SpanNameReconcile is the name of the span of one reconciliation, linked to the
// original frame: exported, as the frame span's keys are, because code that follows a
// transaction to its settled outcome picks that span out by its name.
const SpanNameReconcile = schema.SpanNameReconcile

// spanNameRetry is the span of one [Retry] call: its attempts' frames are its
// descendants, each attempt an event (eventRetryAttempt), the settling of an
// indeterminate one an event (eventRetrySettled); it ends with the call's tx.outcome.
const spanNameRetry = "otelpgxtx.retry"

// Events of the Retry span.
const (
	// eventRetryAttempt: one call of the attempt function ended, with tx.attempt, the
	// attempt's tx.outcome (error.type when the tracer had no verdict) and its
	// tx.operation_id.
	eventRetryAttempt = "tx.retry.attempt"
	// eventRetrySettled: the attempt's indeterminate outcome was settled, with
	// tx.outcome.resolved and, when unknown, error.type (the reason).
	eventRetrySettled = "tx.retry.settled"
)

// spanNamePostCommit is the child span of a frame that runs its post-commit hooks; it is
// reached through its frame, so its name is not exported.
const spanNamePostCommit = "tx.post_commit"

// statusDescriptionRolledBack is the fixed description of the Error status of a
// rolled-back frame; the cause is in error.type and db.response.status_code.
const statusDescriptionRolledBack = "transaction rolled back"

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
// of otelpgxtx.transactions, otelpgxtx.transaction.duration and
// otelpgxtx.transaction.commit.duration, whether the application ended the transaction on purpose ([RollbackDeliberate]) or something failed
// ([RollbackFailure]). A deliberate Rollback() is how Go code usually ends a read-only
// transaction; an alert on rollbacks must not count it. Its two values are the only ones,
// so it adds one series to each metric.
const RollbackKey = rollbackKey

// The values of [RollbackKey].
const (
	// RollbackDeliberate: the application rolled back with nothing gone wrong — no
	// statement failed, [Run]'s function returned nil, no participant failed, and the
	// server answered the ROLLBACK. Its span status stays Unset.
	RollbackDeliberate = rollbackDeliberate
	// RollbackFailure: a statement, the COMMIT or the connection failed, [Run]'s function
	// returned an error or panicked, or the transaction ended where no statement showed
	// it (error.type says which). Its span status is Error, unless the failure was an
	// expected one ([WithExpectedErrors]).
	RollbackFailure = rollbackFailure
)

// ownKeys are the semantic conventions' keys the library writes on its spans and metrics
// (besides every tx.* key): an attribute of the application's under one of them would
// overwrite the library's value, or stand where the library writes none.
var ownKeys = map[attribute.Key]bool{
	schema.DBSystemNameKey: true, dbNamespaceKey: true, dbResponseStatusKey: true, dbOperationNameKey: true,
	dbQuerySummaryKey: true, serverAddressKey: true, serverPortKey: true, schema.ErrorTypeKey: true,
	poolNameKey: true, connectionStateKey: true,
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

// The values of the exported keys above, defined once beside the unexported ones.
const (
	outcomeKey               = attribute.Key("tx.outcome")
	phaseKey                 = attribute.Key("tx.phase")
	frameDepthKey            = attribute.Key("tx.frame.depth")
	propagationKey           = attribute.Key("tx.propagation")
	isolationKey             = attribute.Key("tx.isolation")
	accessModeKey            = attribute.Key("tx.access_mode")
	attemptKey               = attribute.Key("tx.attempt")
	reconciliationXIDKey     = attribute.Key("tx.reconciliation.xid")
	implicitKey              = attribute.Key("tx.implicit")
	preparedKey              = attribute.Key("tx.prepared")
	committedLocallyKey      = attribute.Key("tx.commit.committed_locally")
	retryableKey             = attribute.Key("tx.retryable")
	rollbackKey              = attribute.Key("tx.rollback")
	rollbackDeliberate       = "deliberate"
	rollbackFailure          = "failure"
	scopeName                = "github.com/txevidence/otelpgxtx"
	messageIndeterminate     = "transaction commit outcome is indeterminate: settle it before any replay"
	messagePendingAtShutdown = "transaction commit outcome still unknown at shutdown: reconcile it"
	messageCrashRecovered    = "the database recovered from a crash: this record settles the commits the recovery lost"
)
