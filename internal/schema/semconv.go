package schema

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// DBQuerySummaryKey is db.query.summary (stable since semantic conventions v1.26).
const DBQuerySummaryKey = semconv.DBQuerySummaryKey

// Attribute keys of the frame's events, unexported with the event names they go with.
const (
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
)

// Semantic-convention keys: the conventions own them, and the OpenTelemetry module's
// semconv package (its newest, v1.43.0) names them, so they are not exported here.
const (
	DBNamespaceKey      = semconv.DBNamespaceKey
	DBResponseStatusKey = semconv.DBResponseStatusCodeKey
	DBOperationNameKey  = semconv.DBOperationNameKey
	ServerAddressKey    = semconv.ServerAddressKey
	ServerPortKey       = semconv.ServerPortKey
)

// Event names on the frame span, unexported: they annotate a trace for the person reading
// it, and the package documentation lists them.
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

// SpanNameRetry is the span of one [Retry] call: its attempts' frames are its
// descendants, each attempt an event (eventRetryAttempt), the settling of an
// indeterminate one an event (eventRetrySettled); it ends with the call's tx.outcome.
const SpanNameRetry = "otelpgxtx.retry"

// Events of the Retry span.
const (
	// EventRetryAttempt: one call of the attempt function ended, with tx.attempt, the
	// attempt's tx.outcome (error.type when the tracer had no verdict) and its
	// tx.operation_id.
	EventRetryAttempt = "tx.retry.attempt"
	// EventRetrySettled: the attempt's indeterminate outcome was settled, with
	// tx.outcome.resolved and, when unknown, error.type (the reason).
	EventRetrySettled = "tx.retry.settled"
)

// SpanNamePostCommit is the child span of a frame that runs its post-commit hooks; it is
// reached through its frame, so its name is not exported.
const SpanNamePostCommit = "tx.post_commit"

// StatusDescriptionRolledBack is the fixed description of the Error status of a
// rolled-back frame; the cause is in error.type and db.response.status_code.
const StatusDescriptionRolledBack = "transaction rolled back"

// The values of the exported keys above, defined once beside the unexported ones.
const (
	OutcomeKey               = attribute.Key("tx.outcome")
	PhaseKey                 = attribute.Key("tx.phase")
	FrameDepthKey            = attribute.Key("tx.frame.depth")
	PropagationKey           = attribute.Key("tx.propagation")
	IsolationKey             = attribute.Key("tx.isolation")
	AccessModeKey            = attribute.Key("tx.access_mode")
	AttemptKey               = attribute.Key("tx.attempt")
	ReconciliationXIDKey     = attribute.Key("tx.reconciliation.xid")
	ImplicitKey              = attribute.Key("tx.implicit")
	PreparedKey              = attribute.Key("tx.prepared")
	CommittedLocallyKey      = attribute.Key("tx.commit.committed_locally")
	RetryableKey             = attribute.Key("tx.retryable")
	RollbackKey              = attribute.Key("tx.rollback")
	RollbackDeliberate       = "deliberate"
	RollbackFailure          = "failure"
	ScopeName                = "github.com/txevidence/otelpgxtx"
	MessageIndeterminate     = "transaction commit outcome is indeterminate: settle it before any replay"
	MessagePendingAtShutdown = "transaction commit outcome still unknown at shutdown: reconcile it"
	MessageCrashRecovered    = "the database recovered from a crash: this record settles the commits the recovery lost"
)
