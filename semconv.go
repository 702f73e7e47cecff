package otelpgxtx

import "go.opentelemetry.io/otel/attribute"

// Attribute keys of the frame span (see "Span schema" in the package documentation).
// They are a public contract: dashboards and alert rules select on them.
const (
	// OutcomeKey is tx.outcome: one of the five outcome strings, always set at the end.
	OutcomeKey = attribute.Key("tx.outcome")
	// PhaseKey is tx.phase: the last observed phase.
	PhaseKey = attribute.Key("tx.phase")
	// OperationIDKey is tx.operation_id: the frame's operation id.
	OperationIDKey = attribute.Key("tx.operation_id")
	// FrameDepthKey is tx.frame.depth: 0 for a top-level transaction, n for one begun
	// while n others are suspended.
	FrameDepthKey = attribute.Key("tx.frame.depth")
	// PropagationKey is tx.propagation, set by the executor.
	PropagationKey = attribute.Key("tx.propagation")
	// IsolationKey is tx.isolation, as pgx spells it ("serializable", "read committed").
	IsolationKey = attribute.Key("tx.isolation")
	// AccessModeKey is tx.access_mode ("read write", "read only").
	AccessModeKey = attribute.Key("tx.access_mode")
	// AttemptKey is tx.attempt: 1 for the first attempt of an executor call.
	AttemptKey = attribute.Key("tx.attempt")
	// ReconciliationXIDKey is tx.reconciliation.xid: the xid8 captured before COMMIT.
	ReconciliationXIDKey = attribute.Key("tx.reconciliation.xid")
	// ReconciliationRefKey is tx.reconciliation.ref: the whole reconciliation reference.
	ReconciliationRefKey = attribute.Key("tx.reconciliation.ref")
	// CommittedLocallyKey is tx.commit.committed_locally: the server said the commit is in
	// its local WAL but synchronous replication was not confirmed.
	CommittedLocallyKey = attribute.Key("tx.commit.committed_locally")
	// RetryableKey is tx.retryable, set on rolled-back frames.
	RetryableKey = attribute.Key("tx.retryable")
	// ResolvedOutcomeKey is tx.outcome.resolved, on reconciliation spans.
	ResolvedOutcomeKey = attribute.Key("tx.outcome.resolved")
	// ParticipantOutcomeKey is tx.participant.outcome, on tx.participant events: the
	// participant's own result. It is not tx.outcome, so that a search for a frame
	// outcome never finds a participant's.
	ParticipantOutcomeKey = attribute.Key("tx.participant.outcome")
	// SavepointNameKey is tx.savepoint.name, on savepoint events.
	SavepointNameKey = attribute.Key("tx.savepoint.name")
	// SavepointDepthKey is tx.savepoint.depth, on savepoint events: 1 for the outermost
	// savepoint of the transaction, n for one made while n−1 others were open — for a
	// release or rollback to, the depth of the savepoint it names.
	SavepointDepthKey = attribute.Key("tx.savepoint.depth")
	// StatementDurationKey is tx.statement.duration, in seconds: on the event that stands
	// for a statement without a span of its own (a transaction-control statement's event on
	// its frame, an implicit prepare's on its statement span), how long the statement
	// took, from its start hook to its end hook; the event is recorded when it ended.
	StatementDurationKey = attribute.Key("tx.statement.duration")

	// Semantic-convention keys.
	dbSystemNameKey     = attribute.Key("db.system.name")
	dbNamespaceKey      = attribute.Key("db.namespace")
	dbResponseStatusKey = attribute.Key("db.response.status_code")
	dbOperationNameKey  = attribute.Key("db.operation.name")
	serverAddressKey    = attribute.Key("server.address")
	serverPortKey       = attribute.Key("server.port")
	errorTypeKey        = attribute.Key("error.type")
)

// Event names on the frame span.
const (
	// EventPhasePrefix and a phase's name (tx.phase.committing) name the event of each
	// phase the frame enters.
	EventPhasePrefix = "tx.phase."
	// EventSuspended is on the outer frame when a frame nested in it begins, with the
	// nested frame's tx.operation_id.
	EventSuspended = "tx.suspended"
	// EventResumed is on the outer frame when the nested frame concludes.
	EventResumed = "tx.resumed"
	// EventSavepointCreated records a SAVEPOINT, with tx.savepoint.name.
	EventSavepointCreated = "tx.savepoint.created"
	// EventSavepointReleased records a RELEASE SAVEPOINT, with tx.savepoint.name.
	EventSavepointReleased = "tx.savepoint.released"
	// EventSavepointRolledBack records a ROLLBACK TO SAVEPOINT, with tx.savepoint.name.
	EventSavepointRolledBack = "tx.savepoint.rolled_back"
	// EventStatement records a transaction-control statement, without a span of its own,
	// whose answer made no other event of the frame: a savepoint statement that failed, a
	// BEGIN inside the transaction. It carries db.operation.name, tx.statement.duration and,
	// on a server error, db.response.status_code.
	EventStatement = "tx.statement"
	// EventPrepare, on a statement's span, records the implicit prepare of the statement
	// (pgx prepares it before it runs it), with tx.statement.duration, otelpgx's
	// pgx.prepare_stmt.name when the statement is named, and db.response.status_code on a
	// server error.
	EventPrepare = "pgx.prepare"
	// EventRetry is on the frame of an attempt that [Run] retries.
	EventRetry = "tx.retry"
	// EventPostCommitFailed is on a committed frame whose post-commit work failed.
	EventPostCommitFailed = "tx.post_commit.failed"
	// EventParticipant records a Run call that joined this frame's transaction (Required,
	// Mandatory) or ran in a savepoint of it (Nested), with the call's tx.outcome.
	EventParticipant = "tx.participant"
)

// Names of the spans the executor and the reconciler make.
const (
	// SpanNamePostCommit is the child span of a frame that runs its post-commit hooks.
	SpanNamePostCommit = "tx.post_commit"
	// SpanNameReconcile is the span of one reconciliation, linked to the original frame.
	SpanNameReconcile = "tx.reconcile"
)

// StatusDescriptionRolledBack is the fixed description of the Error status of a
// rolled-back frame; the cause is in error.type and db.response.status_code.
const StatusDescriptionRolledBack = "transaction rolled back"

var dbSystemPostgreSQL = dbSystemNameKey.String("postgresql")
