// Package otelpgxtx is OpenTelemetry instrumentation for PostgreSQL transactions made
// with pgx v5: one span per physical transaction, with the phases the client observed as
// events, and an outcome that keeps "we don't know" as a result of its own. Instrument the
// pool's config before the pool is made, and close the tracer after the pool:
//
//	tracer, err := otelpgxtx.InstrumentPool(cfg, otelpgxtx.WithCommitReference())
//	if err != nil {
//		return err // an invalid option: the config has no tracer
//	}
//	defer tracer.Close(ctx)
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
//
// Application code does not change. To retry safely, wrap a transaction in [Retry] with
// [WithReconciler]: it runs it again only when it certainly did not commit. [Run] is the
// executor that returns the outcome as a sealed [outcome.Result]. Spans go to the global
// tracer provider unless [WithTracerProvider] says otherwise.
//
// A COMMIT whose reply is lost usually shows up as an error (or as a success), and
// callers retry it, sometimes applying the work twice. This package records what the
// client actually saw, classifies each ending into one of five outcomes (see
// [outcome.Outcome]) and shows an indeterminate commit distinctly: neither Error nor Ok,
// with tx.outcome=indeterminate for dashboards and alert rules.
//
// # Words
//
// Each of these words means one thing, here and in the code, the options and the docs:
//
//   - frame: one physical transaction as the instrumentation sees it — its span, its
//     phases, what came of it; frames nest when an outer transaction is suspended.
//   - implicit transaction: a write sent outside a transaction block (pool.Exec, a sqlc
//     query on the pool, database/sql's ExecContext, a batch or CopyFrom without BEGIN),
//     which PostgreSQL commits as soon as it has run: a frame whose span is its
//     statement's (tx.implicit). "Implicit prepare" is another thing: pgx's prepare of a
//     statement inside a query.
//   - phase: where the frame's evidence stands: not_started, active, committing, then
//     committed, rolled_back or unknown ([outcome.Phase]).
//   - evidence: what the client observed of an ending: committed, rolled back or unknown
//     ([classifier.Evidence]); the classifier's reading of one ending, with its
//     retryability, SQLSTATE and reason, is a classification ([classifier.Classification]).
//   - outcome: one of the five results of a frame or of a [Run] call ([outcome.Outcome],
//     the tx.outcome attribute), carried as a type by [outcome.Result].
//   - verdict: how a frame ended as the tracer judged it — its outcome, reason and
//     retryability — which a [Verdict] hands to the caller of a transaction made without
//     [Run].
//   - xid: PostgreSQL's number of a transaction that wrote, which the server records as
//     committed or aborted.
//   - reference: what a server can later answer an indeterminate commit from: the xid,
//     with the identity of the cluster that assigned it, and a marker if one was written
//     ([outcome.ReconciliationRef]; [WithCommitReference], [Policy.CommitReference]).
//   - marker: the row with the frame's operation id that its transaction writes through
//     a marker function, in its own commit ([WithCommitMarker], [Policy.CommitMarker]).
//   - reconciliation: asking the database, after the fact, what became of an
//     indeterminate commit (package reconcile; in the background with [WithAutoReconcile];
//     inside [Retry] with [WithReconciler]).
//   - answer: what reconciliation returns: committed, aborted, no_writes, or unknown with
//     a reason ([reconcile.Answer]).
//   - settled: an indeterminate commit whose answer is not unknown.
//
// # Setup
//
// [InstrumentPool] (or [InstrumentConnConfig]) sets a [Tracer] as the connection
// config's tracer and chains the notice, close and net.Conn hooks it needs. Check its
// error: an invalid option leaves the config without a tracer. Close the tracer after the
// pool: with [WithAutoReconcile] its workers run until [Tracer.Close]. [Tracer.Check] asks
// the server, at the service's start, what the references need (ExampleInstrumentPool;
// examples/quickstart is a whole program).
//
// Every Begin … Commit becomes a frame span, with the statement spans of the inner tracer
// (otelpgx by default) as its children, and every autocommit write an implicit
// transaction's frame, recorded on its statement's own span (no span more: see "Implicit
// transactions"); BEGIN, COMMIT, ROLLBACK and the savepoint
// statements are events of the frame, not spans of their own, unless [WithInnerSpans] asks
// for their spans (see "Statements as events"). The tracer sends nothing of its own on a
// plain pgx connection, unless asked for commit references ([WithCommitReference],
// [WithCommitMarker]).
//
// # After Commit returns
//
// Code that keeps its own tx.Commit(ctx), pgx.BeginFunc or database/sql tx.Commit() asks
// how the transaction ended with a [Verdict]: begin or end it with the context of
// [NewVerdict] (for database/sql, the context given to BeginTx), then call
// [Verdict.Result], an [outcome.Result] as Run's. Retry only a DeterminateRollback that is
// Retryable; hand an Indeterminate to reconciliation, never to a replay. [Retry] is that
// loop, and with [WithReconciler] it settles an Indeterminate itself before it answers.
// [ErrNoVerdict] says the tracer cannot know (an uninstrumented connection, another
// context).
//
// # Options
//
// There are four kinds, one for each thing configured, each with its own type so that
// one cannot be passed where another is meant: an [Option] configures the [Tracer]
// ([InstrumentPool], [InstrumentConnConfig]); an [AutoReconcileOption]
// configures [WithAutoReconcile] (the queue, the retry backoff, the callback); a
// [RetryOption] configures [Retry] (the reconciler, the wait); a reconcile.Option
// configures a reconcile.Reconciler (the wait for a transaction still in progress, its
// tracer provider, its error messages). The tracer's are declared in config.go (the
// commit references' in config_reference.go), automatic reconciliation's in
// config_auto.go, Retry's in retry.go. A [Policy] configures one [Run] call. An option
// value that is refused is an error wrapping [ErrInvalidArgument] that names the option,
// and so is a nil option argument without a documented meaning (a nil function, a typed
// nil provider): no bad argument makes the library panic. [WithSpanAttributes] and
// [WithMeterAttributes] refuse a key the library writes itself (every tx.* key, and the
// semantic conventions' keys it sets), so that tx.outcome is only ever a frame's.
//
// # Frames
//
// A frame is one physical transaction as the instrumentation sees it: its phase, its
// span, its operation id, its connection. It is kept in two places. On the connection,
// because the tracer sees BEGIN, COMMIT and ROLLBACK as statements of a *pgx.Conn; pooled
// connections are reused, and a frame that outlived its transaction would classify
// unrelated work against finished evidence, so every path that ends a transaction
// (commit, rollback, a closed or destroyed connection, a release mid-transaction, a
// connection found idle) ends the frame. And in the context, for [Begin] and [Run], so
// that a transaction begun inside another on a second connection sees the outer one: the
// outer frame is suspended (tx.suspended, tx.resumed events) and the inner frame is one
// level deeper, its span a child of the outer frame's span. Contexts are immutable, so no
// cleanup path can bring an ended frame back.
//
// Only the physical owner of a transaction (the frame that began it) records phases. A
// [Run] call that joins an outer transaction has no frame: it is a tx.participant event on
// the owner's frame, with tx.participant.outcome, and its result is Participating.
//
// # Phases
//
// One physical transaction moves through the phases of [outcome.Phase]:
//
//	not_started → active → committing → committed | rolled_back | unknown
//	not_started → rolled_back   (BEGIN failed)
//	active      → rolled_back   (explicit ROLLBACK, or the session died before COMMIT was sent)
//
// committing is recorded immediately before COMMIT is handed to the driver, so that a
// process dying inside the commit leaves the record "we asked and we don't know". Only a
// failure observed while committing can make the phase unknown: neither the error alone
// nor the phase alone does (see the classifier package for each rule and the real-server
// test that shows it). Two statements other than COMMIT commit: on CockroachDB, RELEASE
// SAVEPOINT cockroach_restart, recorded as committing before it is sent like COMMIT; and
// any statement the server answers with SQLSTATE 40003 (statement_completion_unknown:
// the server itself cannot tell whether it completed, and it may have been the commit),
// after which the frame is committing from that answer and unknown.
//
// # Implicit transactions
//
// A statement that may write (INSERT, UPDATE, DELETE, MERGE, DDL, COPY, CALL, DO,
// SELECT … FOR UPDATE or INTO), sent while the session is idle, is a transaction of its
// own, committed by the server at the Sync after it (a batch without BEGIN is one, up to
// its one Sync). Its frame is committing from the moment the statement is handed over and
// ends with its reply, judged as a COMMIT's reply is (docs/classifier.md). With the default
// otelpgx inner tracer the frame has no span of its own: the statement's span carries
// tx.outcome, tx.implicit=true, tx.operation_id and its status (Unset when indeterminate,
// where otelpgx alone would say Error). A committed one adds nothing more but tx.attempt
// (inside [Retry]), its reference (with the references on) and
// tx.commit.committed_locally, when it has them:
// the statement's span already says the rest, and its phases (the statement handed over,
// answered) tell nothing. One that did not commit also gets a frame's phase events, at
// the times the evidence recorded them, and its other attributes (see "Span schema").
// Where otelpgx starts no span (no
// recording parent: a background job's write), a committed frame has none either, and one
// that did not commit (rolled back, indeterminate, committed with a failure after the
// commit) gets a span of its own as it ends, started back at the frame's start, as
// [WithFilter] and the sampler decide: a lost write outside any trace is still traced.
// With a tracer of the application's, or with [WithImplicitFrameSpans], every one has a
// span of its own. Reads make no frame. The metrics count implicit transactions with
// tx.implicit=true, the log record and a [Verdict] cover them, and [WithImplicitFilter]
// leaves out those it rejects. With the references on, the marker call or the xid read
// rides after the statement, before its Sync, in the same write; a write sent as a simple
// Query gets none (tx.reconciliation.no_reference=simple_protocol): docs/reconciliation.md.
//
// # Span schema
//
// One span per frame, of kind INTERNAL (see "Span kind" below), named "transaction"
// ([DefaultSpanName]) or as [WithSpanName] or [WithSpanNameCtxFunc] say. It is a child of
// the span in BEGIN's context, or of the suspended outer frame.
//
// Attributes, with the keys declared as constants in this package ([OutcomeKey] …):
//
//   - tx.outcome: one of the five outcomes, always set when the span ends;
//   - tx.phase: the last observed phase (committed, rolled_back, unknown);
//   - tx.operation_id: 32 hex digits, also on Run's results and on log records;
//   - tx.frame.depth: 0 for a top-level transaction, n when n others are suspended;
//   - tx.isolation, tx.access_mode: as pgx spells them, when BEGIN says;
//   - tx.propagation, tx.attempt: set by [Run] (required, requires_new, nested, mandatory;
//     1, 2, …);
//   - tx.reconciliation.ref, tx.reconciliation.xid: the reference taken before COMMIT;
//   - tx.commit.committed_locally: the server said the commit is in its local WAL but its
//     synchronous replication was not confirmed;
//   - tx.implicit ([ImplicitKey]): true on an implicit transaction's frame (its span is
//     mostly its statement's: see "Implicit transactions"; on a committed one's
//     statement span only tx.outcome, tx.implicit, tx.operation_id and, when it has them,
//     tx.attempt, the reference and tx.commit.committed_locally, and no event of the
//     frame's);
//   - tx.prepared ([PreparedKey]): true on a frame whose transaction was prepared
//     (PREPARE TRANSACTION), whose outcome is participating: it waits for its coordinator;
//   - tx.retryable: on rolled-back frames;
//   - tx.rollback ([RollbackKey]): on rolled-back frames, deliberate (the application
//     rolled back with nothing gone wrong: no statement failed, Run's function returned
//     nil, the server answered the ROLLBACK) or failure (everything else; error.type
//     says what);
//   - db.system.name=postgresql, db.namespace, server.address, server.port (semantic
//     conventions; [WithDisableConnectionDetailsInAttributes] leaves the last three out);
//   - db.response.status_code (the SQLSTATE) and error.type on failures. error.type is a
//     fixed, low-cardinality reason: one of the classifier's Reason constants
//     (serialization_failure, connection_lost, server_fatal, …), or, for a frame whose
//     transaction ended where no statement showed it, ended_unobserved,
//     released_in_transaction or connection_closed; may_have_committed_inside for a CALL,
//     DO or VACUUM sent outside a transaction block that failed after it ran (it may have
//     committed inside: unknown).
//
// Events, in time order: tx.phase.active, tx.phase.committing, then exactly one of
// tx.phase.committed, tx.phase.rolled_back, tx.phase.unknown (tx.phase. and the phase;
// none on a committed implicit transaction's statement span); tx.suspended and tx.resumed
// around a nested frame; tx.savepoint.created, tx.savepoint.released,
// tx.savepoint.rolled_back with tx.savepoint.name (savepoints are
// events, not spans: they never change the frame's phase, and spans would double the span
// count of code that uses pgx's pseudo-nested Tx.Begin) and tx.savepoint.depth (1 for the
// outermost savepoint; for RELEASE and ROLLBACK TO, the depth of the one they name);
// tx.statement; tx.participant, with tx.participant.outcome and tx.propagation (not
// tx.outcome, so that a search for a frame outcome never finds a participant); tx.retry
// on an attempt Run retries; tx.post_commit.failed.
//
// # Statements as events
//
// The frame already says what the statement spans of BEGIN, COMMIT, ROLLBACK, SAVEPOINT,
// RELEASE and ROLLBACK TO say: tx.phase.active is BEGIN's answer, tx.phase.committing to
// tx.phase.committed is COMMIT's round trip, its status and error.type are COMMIT's
// failure. So by default ([InnerSpanTransactionControl]) each of them, sent alone as a
// query inside a frame whose span records, is no span: the event its answer makes carries
// what only its span had, db.operation.name, tx.statement.duration and, on a server error,
// db.response.status_code; a statement whose answer makes no other event (a savepoint
// statement that failed, a BEGIN inside the transaction) is a tx.statement event. An
// implicit prepare is likewise a pgx.prepare event of its statement's span
// ([InnerSpanPrepare]). The inner otelpgx tracer still gets both hooks of each, so its
// metrics are the same; their exemplars name the frame. [WithInnerSpans] makes them spans
// again; a tracer of the application's gets every statement as pgx gives it.
//
// Statements outside a recorded frame keep their spans: those of a frame the filter
// rejected, a COMMIT with no transaction, and a batch (its span and its query spans, BEGIN
// and COMMIT included); an explicit Prepare has no statement around it and stays a span.
// Run's COMMIT, with commit references or without, is the same event. With the default, a transaction of
// BEGIN, one INSERT and COMMIT is two spans, the frame and the INSERT, where otelpgx alone
// makes three. What changes is what one searches for: no span is named COMMIT, so search
// the frame spans by tx.outcome, read COMMIT's latency from
// otelpgxtx.transaction.commit.duration, and keep the spans with WithInnerSpans where dashboards are built from spans named BEGIN or COMMIT.
//
// Status, three codes with three meanings:
//
//   - committed: Ok, the documented meaning "commit confirmed" ([StatusStrict] leaves it
//     Unset, as the specification asks of instrumentation not configured otherwise);
//   - rolled_back: Error with the fixed description "transaction rolled back"; a
//     deliberate Rollback with nothing gone wrong stays Unset;
//   - indeterminate: Unset: nothing was determined, and tx.outcome says so;
//   - committed_with_post_commit_failure: Ok on the frame, Error on its tx.post_commit
//     child span (tx.post_commit).
//
// A failure the application expects leaves the status Unset where it would be Error, on
// the frame span and on the default otelpgx tracer's spans: by default the caller's own
// cancellation ([CallerCanceled]), which says nothing about the database;
// [WithExpectedErrors] replaces the list. Only the status changes: tx.outcome,
// error.type, tx.rollback, the metrics and Run's results stay the same.
//
// A reconciliation is a tx.reconcile span ([SpanNameReconcile]), INTERNAL too, linked to
// the frame that observed the indeterminate outcome, with tx.outcome.resolved and, when
// unknown, error.type set to the reason (reconcile.ReasonInProgress, reconcile.ReasonNotReplicated, …);
// its queries are the statement spans of the database's own tracer. A committed answer
// where synchronous replication is configured waits for the synchronous standbys (the
// replication barrier, see package reconcile), so that it survives a failover.
//
// # Span kind
//
// The frame span is INTERNAL, and the statement spans under it are CLIENT. The
// OpenTelemetry trace API defines CLIENT as a span that "describes a request to some
// remote service", usually the parent of a remote SERVER span, and INTERNAL as "an
// internal operation within an application, as opposed to an operation with remote
// parents or children" ([SpanKind]). A frame is not one request: it spans BEGIN, the
// application's own work between statements, and COMMIT, and each of those statements is
// already a CLIENT span of its own, as the database conventions ask of a span that
// describes a database call ([database client spans], [SQL spans]). The API calls a CLIENT
// span with a CLIENT child a complex scenario for semantic conventions to detail, and the
// database conventions detail none.
//
// The kind matters to tools that derive requests from spans. Grafana Tempo's service
// graphs count a CLIENT span with db.namespace, db.name or db.system as a database
// request ([Tempo service graphs]; the Collector's [servicegraph connector] is built on
// the same processor, with the database attributes configurable): a CLIENT frame, which
// carries db.namespace, would add one more "database request" per transaction, with a
// latency that includes the application's time between statements. Jaeger's service dependency graph does not depend on the kind: it
// links the services of parent and child spans (the in-memory store's getDependencies,
// and the Spark job, which looks at kinds only for Zipkin's shared client/server spans;
// [Jaeger dependencies], [Jaeger Spark dependencies]), and the frame and its statements
// belong to the application's service either way.
//
// # Composition with the inner tracer
//
// pgx runs the End hooks of a tracer chain in Start order, and otelpgx ends "the span in
// the context" it is given. So the tracer never puts the frame span into a context ahead
// of an inner Start unless it is also the one that calls the matching End: it wraps the
// inner tracer itself, forwards every tracer interface that one implements, and hides the
// frame's span from an inner End hook that did not start a span of its own.
//
// # Metrics
//
// Counted whether or not the trace is sampled: otelpgxtx.transaction.duration in seconds,
// one data point per frame (its count is the number of transactions), by tx.outcome, for
// rolled_back [RollbackKey] (a deliberate rollback is not a failure), and tx.implicit;
// otelpgxtx.transaction.commit.duration; otelpgxtx.participations, the Run calls that
// joined an outer transaction, which are not transactions; with automatic reconciliation,
// otelpgxtx.reconciliations, otelpgxtx.reconciliation.unresolved,
// otelpgxtx.reconciliation.unresolved.age and otelpgxtx.reconciliation.duration. Every
// series of the counters exists from the start at 0; a histogram's appears with its
// first data point (the alert rules of examples/jaeger catch a series that appears). [InstrumentPool] also records the connection-pool metrics of the semantic
// conventions (db.client.connection.count and the other db.client.connection.* names).
// docs/metrics.md lists every name with its attributes and units.
//
// # What leaves the process
//
// By default no literal value, statement parameter or server message text is recorded:
// the default otelpgx inner tracer gets query text with every literal replaced by "?",
// and errors with their SQLSTATE and class but not their message. [WithRawQueryText] and
// [WithErrorMessages] reveal more, for deployments where the traces may hold user data.
// A tracer of the application's ([WithInnerTracer]) is handed what pgx hands it, as
// without this package, unless [WithSanitizedInnerTracer] says otherwise.
//
// [SpanKind]: https://opentelemetry.io/docs/specs/otel/trace/api/#spankind
// [database client spans]: https://opentelemetry.io/docs/specs/semconv/db/database-spans/
// [SQL spans]: https://opentelemetry.io/docs/specs/semconv/db/sql/
// [servicegraph connector]: https://pkg.go.dev/github.com/open-telemetry/opentelemetry-collector-contrib/connector/servicegraphconnector
// [Tempo service graphs]: https://grafana.com/docs/tempo/latest/metrics-generator/service_graphs/
// [Jaeger dependencies]: https://github.com/jaegertracing/jaeger/blob/v1.76.0/internal/storage/v2/memory/tenant.go
// [Jaeger Spark dependencies]: https://github.com/jaegertracing/spark-dependencies/blob/main/jaeger-spark-dependencies-common/src/main/java/io/jaegertracing/spark/dependencies/SpansToDependencyLinks.java
package otelpgxtx
