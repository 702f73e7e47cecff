# The two commands of the README's quick start are `make demo` and `make test`.
GO ?= go

.PHONY: demo test test-library test-examples tools vet fuzz soak bench

demo:
	cd examples/jaeger && $(GO) run .

test: vet tools test-library test-examples

test-library:
	$(GO) test -race -count=1 ./...

# The demo module (its own go.mod): end to end against a real Jaeger v2 and a real
# Prometheus, and the alert rules' unit tests with promtool.
test-examples: tools
	cd examples/jaeger && $(GO) test -race -count=1 ./...
	"$$(scripts/prometheus)/promtool" check config examples/jaeger/prometheus.yml
	"$$(scripts/prometheus)/promtool" test rules examples/jaeger/alerts_test.yml

# The pinned programs the end-to-end tests run, built from the Go module proxy the first
# time (minutes each) and cached in ~/.cache/otelpgxtx (or $$OTELPGXTX_CACHE).
tools:
	@TOOL_STEP=1/2 scripts/jaeger >/dev/null
	@TOOL_STEP=2/2 scripts/prometheus >/dev/null

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	cd examples/jaeger && $(GO) vet ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzClassify -fuzztime 60s ./classifier/
	$(GO) test -run '^$$' -fuzz FuzzClassifyStatements -fuzztime 60s .

# A longer soundness run; the CI-sized one is part of `make test`.
soak:
	OTELPGXTX_SOAK_TX=30000 OTELPGXTX_SOAK_CRASHES=12 OTELPGXTX_SOAK_DURATION=50m \
		$(GO) test -run 'TestSoundness$$' -count=1 -timeout 60m -v .
