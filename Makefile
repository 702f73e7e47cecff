# The two commands of the README's quick start are `make demo` and `make test`.
GO ?= go

.PHONY: demo test vet fuzz

demo:
	$(GO) run ./examples/demo

test: vet
	$(GO) test -race -count=1 ./...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzClassify -fuzztime 60s ./classifier/
	$(GO) test -run '^$$' -fuzz FuzzClassifyStatements -fuzztime 60s .
