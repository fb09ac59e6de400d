# phasegate — one command per job. `make help` lists them.

GO        ?= go
GOBIN     := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

GRPC_HEALTH_PROBE_VERSION := v0.4.62

.PHONY: help test unit tools jaeger grpc-health-probe bench vet fmt

help:
	@echo "make test     every test: unit, kernel (root) and end-to-end; installs the tools they need"
	@echo "make unit     the tests that need no root and no tools"
	@echo "make bench    the Go benchmarks (see docs/BENCHMARKS.md)"
	@echo "make tools    install grpc-health-probe and build the cached Jaeger"

## test: the whole suite, as CI runs it (as root: network tests use real namespaces).
test: tools vet
	PHASEGATE_REQUIRE_TOOLS=1 PHASEGATE_JAEGER=$$(tools/jaeger/build.sh) \
		$(GO) test -race -count=1 -timeout 40m ./...

unit:
	$(GO) test -race -count=1 ./lifecycle/... ./tracing/... ./health/... ./server/...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

tools: grpc-health-probe jaeger

grpc-health-probe:
	@command -v grpc-health-probe >/dev/null 2>&1 || \
		$(GO) install github.com/grpc-ecosystem/grpc-health-probe@$(GRPC_HEALTH_PROBE_VERSION)

jaeger:
	@tools/jaeger/build.sh >/dev/null

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./lifecycle/...
