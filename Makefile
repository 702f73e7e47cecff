# The two commands of the README: make demo and make test.
GO ?= go

.PHONY: demo test setup test-library test-newest test-majors test-examples test-scripts test-pgx tools vet fuzz soak model bench bench-quick dashboard picture

demo:
	cd examples/jaeger && $(GO) run .

test: setup vet tools test-library test-newest test-majors test-examples test-scripts test-pgx

# What the tests need beyond Go and the PostgreSQL server programs (PgBouncer, npm, a C
# compiler, the locales): installed as root, else named in the one command that would.
setup:
	@scripts/setup

# The soak (soak_*_test.go, build tag soak) runs in a go test of its own, CI-sized: a
# package's tests share go test's 10-minute limit, and with the soak under -race the root
# package's took 6 to 7 minutes here, and over 10 on a busy machine. So do the root
# package's slowest tests (ROOT_SLOW: 245 of its 380 seconds under -race on a quiet
# machine, 2026-12-06), in two go tests, ROOT_SLOW_A and ROOT_SLOW_B. The four — the rest
# of ./..., the two halves, the soak — run side by side, each printed whole once all are
# done: they wait on their servers most of their time (237 s of the slow tests, 74 s of
# CPU); on two cores, quiet, 3 min 0 s side by side, 3 min 27 s one after the other
# (2026-12-07). Then allocs_test.go, built without -race (the race detector changes
# allocation counts): all of its tests.
ROOT_SLOW_A = TestImplicitTransactionFaults|TestStaleManyTransactionsRandomFailures|TestUnobservedCommitFaults|TestUnobservedCommitFailover
ROOT_SLOW_B = TestCommitsMoreThanOnce|TestLedgerWorkloadUnderSyncRepTerminations|TestSpanConcurrentFrames|TestMarkerNeverChangesCommit|TestMarkerNeverChangesAutocommit
ROOT_SLOW = $(ROOT_SLOW_A)|$(ROOT_SLOW_B)
test-library:
	@echo "test-library: ./... but ROOT_SLOW, beside ROOT_SLOW_A ($(ROOT_SLOW_A)), ROOT_SLOW_B ($(ROOT_SLOW_B)) and the soak, -race"
	@out=$$(mktemp -d); \
	$(GO) test -race -count=1 -skip '^($(ROOT_SLOW))$$' ./... >$$out/rest 2>&1 & rest=$$!; \
	$(GO) test -race -count=1 -run '^($(ROOT_SLOW_A))$$' . >$$out/a 2>&1 & a=$$!; \
	$(GO) test -race -count=1 -run '^($(ROOT_SLOW_B))$$' . >$$out/b 2>&1 & b=$$!; \
	$(GO) test -race -count=1 -tags soak -run '^TestSoundness(Failover)?$$' . >$$out/soak 2>&1 & soak=$$!; \
	fail=0; wait $$rest || fail=1; wait $$a || fail=1; wait $$b || fail=1; wait $$soak || fail=1; \
	cat $$out/rest $$out/a $$out/b $$out/soak; rm -rf $$out; [ $$fail = 0 ]
	$(GO) test -count=1 -run '^(TestHookAllocs|TestAutocommitAllocs|TestVerdictAllocs|TestFrameSize)$$' .

# The library's tests against the newest pgx and OpenTelemetry tested (scripts/newest, which
# says which), as test-library runs them against go.mod's, the oldest the library works with:
# only those whose facts can differ with pgx's or OpenTelemetry's version, named in
# NEWEST_TESTS below by what of pgx or the SDK they hold (one -run pattern, in whichever of
# NEWEST_PACKAGES they are); a test of what pgx or the SDK does goes there. Left out, and run
# on go.mod's versions only, is what the library and the server decide whichever pgx carried
# the statements: the fault matrices, the references' differential tests over server settings,
# failovers and crash recovery, the reconciler's rules, Run's and Retry's own logic, models,
# soaks and statistical tests, allocation targets and benchmark models, bad input and options,
# the docs, the harness's own tests but for its reading of what pgx sends. Without -race
# (test-library has it). 1.5 to 2.5 minutes on two cores shared with other test runs, where
# the packages' whole suites took 6 to 9 (the root package once past go test's 10-minute
# limit). docs/testing.md#oldest-and-newest-dependencies says why these versions and what is
# left out.
NEWEST_PACKAGES = . ./classifier ./cmd/otelpgxtx ./internal/... ./pgtest ./reconcile
# How pgx reports errors, which the classifier and each frame's outcome read: every COMMIT
# reply of the classifier's table, the faults whose rule is pgconn's word (nothing written,
# a FATAL already in the socket, a busy connection, an ended context), other servers' replies.
NEWEST_TESTS += TestRealCommitPlain TestRealCommitAfterFailedStatement \
	TestRealCommitDeferredUniqueViolation TestRealCommitSerializationFailure \
	TestRealCommitTerminatedDuringSyncRep TestRealCommitCanceledDuringSyncRep \
	TestRealCommitFatalDuringDeferredTrigger TestRealCommitAfterIdleBackendTerminated \
	TestRealCommitProxyCut TestRealCommitWithoutTransaction TestServerOfRealServer \
	TestCommitNotExecuted TestCommitContextDoneBeforeWrite TestRunUnreadResult \
	TestRunIdleTermination TestRunIndeterminateNeverRetried TestRunRetriesSerializationFailure \
	TestRunDeferredViolationNotRetried TestRunCommitted TestVerdictRollbacks TestRetryNotReached \
	TestRunNestedDeadlineKeepsOuter TestRunNestedAlreadyExpired TestReferenceCheckCancelled \
	TestImplicitClientFailureAfterCommit TestImplicitReferenceCallFails \
	TestErrorDescriptionsOfRealFaults TestExpectedErrors TestPgBouncerBackendTerminated \
	TestServerKindFromStartup TestCommitAnswerOnOtherServers TestCockroachRestartProtocol \
	TestRunOnCockroachDB TestReferencesOffWhenIdentityRefused \
	TestCommittedLocallyOnlyFromPostgreSQL TestReconcileNoDatabaseKeepsPasswordSecret
# The span contract of each outcome reachable through plain pgx.
NEWEST_TESTS += TestSpanCommitted TestSpanStrictStatus TestSpanDeliberateRollback \
	TestSpanRollbackAfterStatementError TestSpanDeferredConstraintAtCommit \
	TestSpanSerializationFailureAtCommit TestSpanIndeterminateSyncRepTerminated \
	TestSpanIndeterminateProxyCut TestSpanNestedSuspendedOuter TestSpanSavepoints
# How pgx closes connections, and what a closed connection's handles do.
NEWEST_TESTS += TestPgxConnClosedMidTransaction TestNetConnPassThrough \
	TestNetConnClosedUnderStatements TestOneEndingCloseAndHook TestStaleReleasedMidTransaction \
	TestStaleConnectionClosedByServer TestStaleContextCancelledMidTransaction \
	TestStaleNewBeginOnFramedConnection TestEndedUnobservedNotRolledBack TestRunEscapedHandles \
	TestUnobservedCommitReplyUnread
# The tracer hooks: which pgx calls, in what order, with what data and context; the user's
# own tracer and hooks handed what pgx hands them.
NEWEST_TESTS += TestDetectionFromWhatPgxSends TestChainKeepsParent \
	TestHooksWithoutStateCallInner TestEndWithoutStart TestUncomparableContext \
	TestWithInnerTracer TestInstrumentChainsUserHooks TestApplicationTracerSeesWhatPgxGives \
	TestExpectedErrorsLeaveUserTracerAlone TestSpanNameCtxFunc TestStatementSpanNames \
	TestImplicitReadsAndFilter TestImplicitNoReferenceReasons TestImplicitUnspannedFrames \
	TestVerdictCommitted
# Prepared statements (pgx's cache and its evictions), batches, CopyFrom.
NEWEST_TESTS += TestImplicitPreparedByName TestPreparedNamesKept \
	TestSpanImplicitPrepareStaysUnderItsStatement TestReferenceWithEvictedStatements \
	TestWithoutInnerSpans TestSanitizedInnerTracerBatchCopy TestNoSecretsLeaveByDefault \
	TestSecretsWithOptIn TestEveryWriteTakesAReference
# What pgx writes and reads on the wire, which the commit references ride in (internal/wire
# splices them into pgconn's writes and reads their replies before pgconn does), and the
# test proxy's reading of what pgx sends (COMMIT in each style, round trips, cancels).
NEWEST_TESTS += TestWireUnchangedByInstrumentation TestConnectSilentServerUnchanged \
	TestSpliceRealServer TestSpliceAfterRealServer TestPlainReference TestPlainMarker \
	TestPlainReferenceLeavesTheRestAlone TestPlainReferenceCheckFails \
	TestPlainReferenceAsyncMessages TestPlainReferenceThroughPgBouncer \
	TestPlainMarkerSerializationFailure TestPlainReferenceConnectionCut \
	TestXIDReadWithCancelRequests TestXIDReadRefusedAfterCheck TestReferenceLogsNoError \
	TestImplicitFirstWriteReference TestImplicitReferenceChangesNothing \
	TestReferenceAfterDiscardAll TestReferenceFailedTransaction \
	TestReferencesOffBelowOldestServer TestRunIdentityRefused \
	TestRunIdentityReadOnDeadConnection TestIdentityReadWithEndedContext TestOneReference \
	TestMarkerAddsNoRoundTrip TestRunReferenceAddsNoRoundTrip TestCommitSpanSameWithReference \
	TestProxyRoundTrips TestProxyCutCommit TestProxyDropsCancelAfterCut
# The reconciler and the command through pgx: its decoding of the server's answers, the
# cancel of a given-up barrier through a pool's and a connection's cancel key.
NEWEST_TESTS += TestReconcilerAbortedNoWritesAndUnknowns TestReconcileBarrierLevel \
	TestReconcileRealIndeterminate
# pgxpool's acquire, release and Stat; database/sql through pgx's stdlib.
NEWEST_TESTS += TestReleaseIdleWithFrame TestPoolMetrics TestPoolAttributes \
	TestPoolMetricsOptions TestVerdictPooledConnectionReused TestRunRequiresNewOtherPoolOfOne \
	TestSpanConcurrentFrames TestDatabaseSQL TestVerdictDatabaseSQL TestControlEventsDatabaseSQL
# The OpenTelemetry SDK's span and metric API: attributes, events, sampling, non-recording
# spans, exemplars, counters and observable gauges.
NEWEST_TESTS += TestSpanAndMeterAttributes TestControlEventsAnswers \
	TestControlEventsMetricsUnchanged TestControlEventsExemplarsNameTheFrame \
	TestControlEventsNotWhereNoFrameHoldsThem TestControlEventsOwnTracer \
	TestUnsampledSDKSpansDoNotPanic TestNoSDKDoesNotPanic TestUnsampledFramesStillCounted \
	TestMetricsByOutcome TestTransactionCounts TestUnresolvedGaugesShared \
	TestImplicitFrameSpans TestImplicitUnspannedFramesDecided TestRetryOneTrace
empty :=
NEWEST_RUN = ^($(subst $(empty) $(empty),|,$(strip $(NEWEST_TESTS))))$$
# A name in NEWEST_TESTS that no test has any more (renamed, removed) fails the target, so
# that the list cannot silently run less.
test-newest:
	@have=$$(grep -rhoE --include='*_test.go' '^func Test[A-Za-z0-9_]+' . | cut -c6-); \
	for t in $(NEWEST_TESTS); do \
		echo "$$have" | grep -qx "$$t" || { echo "test-newest: NEWEST_TESTS names $$t, which no test file has" >&2; exit 1; }; \
	done
	@echo "test-newest: $(words $(NEWEST_TESTS)) tests (NEWEST_TESTS) of $(NEWEST_PACKAGES)"
	@scripts/newest $(GO) test -count=1 -run '$(NEWEST_RUN)' $(NEWEST_PACKAGES)

# The real-server tests whose facts depend on the PostgreSQL major (the harness, the
# classifier, the reconciler, the root package's reference, reconciliation and failover tests,
# the command), on the oldest and the newest supported majors besides the machine's own:
# the npm packages' builds (scripts/postgres), through pgtest's OTELPGXTX_PG_BIN. Without
# -race (the machine's server run has it). Left out, and run on the machine's server only:
# the soaks and the model-based test (statistics of the library, not facts of the server;
# minutes each), and the two localisation tests (those builds have no message translations).
MAJORS ?= 13 18
MAJOR_PACKAGES = . ./pgtest ./classifier ./reconcile ./cmd/otelpgxtx ./internal/wire
MAJOR_LEFT_OUT = ^(TestStaleManyTransactionsRandomFailures|TestRunModel|TestRealCommittedLocallyLocalized|TestRealCommittedLocallyOtherDatabaseEncoding)$$
# Every major's run goes beside the others', and on each major the root package's slowest
# tests (ROOT_SLOW_A and ROOT_SLOW_B) in two go tests of their own beside the rest: a major's
# run waits on its servers most of its time (PostgreSQL 13: 272 s wall, 108 s of CPU on two
# cores, the root package 253 s of it, 2026-12-06), so the six go tests share two cores
# without waiting on each other much: 2 min 37 s, one major after the other 2 min 59 s
# (quiet, 2026-12-07). Each is printed whole once all are done. The servers are installed
# first, so that one that fails to install starts no go test.
test-majors:
	@for major in $(MAJORS); do scripts/postgres $$major >/dev/null || exit 1; done
	@out=$$(mktemp -d); pids=; \
	for major in $(MAJORS); do \
		bin=$$(scripts/postgres $$major); \
		echo "test-majors: PostgreSQL $$major ($$bin)"; \
		OTELPGXTX_PG_BIN=$$bin $(GO) test -count=1 -skip '$(MAJOR_LEFT_OUT)|^($(ROOT_SLOW))$$' $(MAJOR_PACKAGES) >$$out/$$major-rest 2>&1 & pids="$$pids $$!"; \
		OTELPGXTX_PG_BIN=$$bin $(GO) test -count=1 -run '^($(ROOT_SLOW_A))$$' -skip '$(MAJOR_LEFT_OUT)' . >$$out/$$major-a 2>&1 & pids="$$pids $$!"; \
		OTELPGXTX_PG_BIN=$$bin $(GO) test -count=1 -run '^($(ROOT_SLOW_B))$$' -skip '$(MAJOR_LEFT_OUT)' . >$$out/$$major-b 2>&1 & pids="$$pids $$!"; \
	done; \
	fail=0; for p in $$pids; do wait $$p || fail=1; done; \
	for major in $(MAJORS); do \
		echo "test-majors: PostgreSQL $$major"; cat $$out/$$major-rest $$out/$$major-a $$out/$$major-b; \
	done; rm -rf $$out; [ $$fail = 0 ]

# pgx's own tests (root package, pgxpool, stdlib of the pgx in go.mod, the oldest the library
# supports; `scripts/newest go run ./scripts/pgxsuite` for the newest), with -race, without
# the library, with it installed where pgx parses each config, at connect time, and where
# pgx parses with commit references on (the xid read; the marker) (scripts/pgxsuite; about
# 2 minutes warm).
test-pgx:
	$(GO) run ./scripts/pgxsuite -race

# The chart of scripts/bench (its own go.mod, so that the library does not depend on gonum),
# the trace picture of scripts/tracepicture (its own go.mod, for golang.org/x/image),
# and the Grafana dashboard's generator (its own go.mod, for grafana-foundation-sdk): its
# test fails when examples/jaeger/grafana/otelpgxtx.json is not what it writes.
test-scripts:
	cd scripts/benchplot && $(GO) test -count=1 ./...
	cd scripts/dashboard && $(GO) test -count=1 ./...
	cd scripts/tracepicture && $(GO) test -count=1 ./...

# Writes examples/jaeger/grafana/otelpgxtx.json from scripts/dashboard.
dashboard:
	cd scripts/dashboard && $(GO) run .

# Renders docs/trace.png from the spans of a real run (scripts/tracepicture).
picture:
	cd scripts/tracepicture && $(GO) run . -o ../../docs/trace.png

# The demo module (its own go.mod): end to end against a real Jaeger v2 and a real
# Prometheus, and the alert rules' unit tests with promtool; the quickstart program (its own
# go.mod) run against a throw-away server.
test-examples: tools
	cd examples/jaeger && $(GO) test -race -count=1 ./...
	cd examples/quickstart && $(GO) test -race -count=1 ./...
	"$$(scripts/prometheus)/promtool" check config examples/jaeger/prometheus.yml
	"$$(scripts/prometheus)/promtool" test rules examples/jaeger/alerts_test.yml

# The pinned programs the end-to-end tests run (Jaeger v2, Prometheus and promtool, the
# two-tier pipeline's collector from scripts/otelcol), built from the Go module proxy the first
# time (minutes each), and the PostgreSQL 13 and 18 builds test-majors runs, from the npm
# registry (seconds each); cached in ~/.cache/otelpgxtx (or $$OTELPGXTX_CACHE).
tools:
	@TOOL_STEP=1/5 scripts/jaeger >/dev/null
	@TOOL_STEP=2/5 scripts/prometheus >/dev/null
	@TOOL_STEP=3/5 scripts/collector >/dev/null
	@TOOL_STEP=4/5 scripts/postgres 13 >/dev/null
	@TOOL_STEP=5/5 scripts/postgres 18 >/dev/null

# gofmt, go vet and staticcheck (pinned: scripts/staticcheck builds it once into the otelpgxtx
# cache, about half a minute) over the library and each module of its own, with no finding; a
# deliberate exception is a //lint:ignore with its reason on the line.
STATICCHECK = "$$($(CURDIR)/scripts/staticcheck)"
vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	@scripts/staticcheck >/dev/null
	$(GO) vet -tags soak ./...
	$(STATICCHECK) -tags soak ./...
	cd examples/jaeger && $(GO) vet ./... && $(STATICCHECK) ./...
	cd examples/quickstart && $(GO) vet ./... && $(STATICCHECK) ./...
	cd scripts/benchplot && $(GO) vet ./... && $(STATICCHECK) ./...
	cd scripts/dashboard && $(GO) vet ./... && $(STATICCHECK) ./...
	cd scripts/tracepicture && $(GO) vet ./... && $(STATICCHECK) ./...
	cd scripts/otelcol && export GOFLAGS="-trimpath -mod=readonly" && $(GO) vet ./... && $(STATICCHECK) ./... # the flags of its build: one compile serves both

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzClassify -fuzztime 60s ./classifier/
	$(GO) test -run '^$$' -fuzz FuzzClassifyStatements -fuzztime 60s ./internal/evidence/
	$(GO) test -run '^$$' -fuzz FuzzSanitize -fuzztime 60s .
	$(GO) test -run '^$$' -fuzz FuzzReplyFilter -fuzztime 60s ./internal/wire/
	$(GO) test -run '^$$' -fuzz FuzzNext -fuzztime 60s ./internal/sqltext/
	$(GO) test -run '^$$' -fuzz FuzzErrorDescription -fuzztime 60s ./internal/redact/

# A longer soundness run, on the single server (crash restarts) and on the cluster
# (failovers alternating with crash restarts); the CI-sized ones are part of `make test`.
soak:
	OTELPGXTX_SOAK_TX=30000 OTELPGXTX_SOAK_CRASHES=12 OTELPGXTX_SOAK_DURATION=50m \
		$(GO) test -tags soak -run 'TestSoundness$$|TestSoundnessFailover$$' -count=1 -timeout 120m -v .

# A longer model-based run of Run; the CI-sized one (200 trees) is part of `make test`.
model:
	OTELPGXTX_MODEL_TREES=5000 $(GO) test -run 'TestRunModel$$' -count=1 -timeout 60m .

# The performance figures of the README (bench/latest.txt, bench/latest.svg): every benchmark
# in COUNT interleaved rounds, about 55 minutes on 2 cores; see scripts/bench for the settings
# (COUNT, BENCHTIME, RTTS, GOROUTINES, PROFILE_*). bench-quick runs each once, as a smoke test.
bench:
	scripts/bench

bench-quick:
	scripts/bench quick
