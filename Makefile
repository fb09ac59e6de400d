# phasegate — one command per job. `make help` lists them.

GO        ?= go
GOBIN     := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

GRPC_HEALTH_PROBE_VERSION := v0.4.62

# The library is the root module; the end-to-end tests and the benchmark
# programs (bench with its serial baseline, netbench) are the module in
# test/, and the example services (with their uber-go/fx and oklog/run
# comparisons) the module in examples/, so that their heavy dependencies
# never reach an adopter's go.mod.
MODULES   := . test examples tracing/internal/autoexportcmp

.PHONY: cni-plugin bench-compare bench-smoke bench-report bench-render reliability help demo run build test unit deps tools bench vet generate fuzz screenshot

help:
	@echo "make demo     the whole story: leaked slots, a daemon starting, health 503 -> 200 (as root)"
	@echo "make run      build and run the daemon on its defaults, or with ARGS='--flag value ...' (as root)"
	@echo "make cni-plugin  build the CNI plugin and install it into CNI_PATH (default /opt/cni/bin; root)"
	@echo "make test     every test: unit, kernel (root) and end-to-end; installs the tools they need"
	@echo "make unit     the tests that need no root and no tools"
	@echo "make bench    the Go micro-benchmarks (lifecycle, server)"
	@echo "make bench-report  phasegate vs serial startup vs kernel floor at N up to 10,000 (as root)"
	@echo "make bench-render  re-render docs/BENCHMARKS.md's section from the cached raw figures"
	@echo "make deps     install what the tests need: Debian packages (root), grpc-health-probe, Jaeger, Consul, the VM guest"
	@echo "make reliability  long crash/load/hostile-input runs; figures to docs/reliability/"
	@echo "make bench-compare  phasegate beside uber-go/fx and oklog/run (docs/FRAMEWORK.md)"
	@echo "make fuzz     run each fuzz target for FUZZTIME (default 1m)"

build:
	$(GO) build -o bin/phasegate ./cmd/phasegate
	$(GO) build -trimpath -o bin/phasegate-status ./cmd/phasegate-status

## cni-plugin: build the CNI plugin and install it where runtimes look for plugins (root).
CNI_PATH ?= /opt/cni/bin
cni-plugin:
	$(GO) build -trimpath -o bin/phasegate-cni ./cmd/phasegate-cni
	install -D -m 0755 bin/phasegate-cni $(CNI_PATH)/phasegate-cni

## demo: leaked slots, a daemon reclaiming them, health turning 503 → 200 (root).
demo: build
	bin/phasegate demo

## run: the daemon on its defaults, and the serve flags in ARGS
## (make run ARGS='--slot-cidr 10.99.0.0/24').
run: build
	bin/phasegate serve $(ARGS)

generate:
	$(GO) generate ./api/...

## test: the whole suite, as CI runs it (as root: network tests use real namespaces).
## It installs what it needs first (tools/deps.sh).
test: deps vet
	PHASEGATE_REQUIRE_TOOLS=1 PHASEGATE_JAEGER=$$(tools/jaeger/build.sh) PHASEGATE_CONSUL=$$(tools/consul/build.sh) \
		$(GO) test -race -count=1 -timeout 40m ./...
	cd test && PHASEGATE_REQUIRE_TOOLS=1 PHASEGATE_JAEGER=$$(../tools/jaeger/build.sh) PHASEGATE_CONSUL=$$(../tools/consul/build.sh) \
		PHASEGATE_GUEST=$$(../tools/guest/build.sh) \
		$(GO) test -race -count=1 -timeout 40m ./...
	cd examples && $(GO) test -race -count=1 -timeout 20m ./...
	cd tracing/internal/autoexportcmp && $(GO) test -count=1 ./...
	$(MAKE) bench-smoke

## deps: Debian packages (as root), grpc-health-probe and the cached Jaeger, Consul and microVM guest builds.
deps:
	tools/deps.sh

## bench-smoke: the startup benchmark once at N=200 so it keeps working, and part ab (one build beside itself, plain, ~10 s); no timing is judged (root).
bench-smoke:
	out=$$(mktemp -d) && cd test && $(GO) run ./bench -n 0,200 -reps 1 -load-n 200 -load-reps 1 -flood-duration 2s \
		-cni-calls 20 -cni-gc 50 -cni-podman 1 -parts dead,restore,load,acquire,slotrate,upgrade,flood,cni,ab \
		-ab-reps 1 -ab-starts 1 -ab-window 1s -ab-slot 250ms -ab-rates 500 -ab-tls=false -restore-datapath -out $$out -results $$out && rm -rf $$out

## bench-report: the startup benchmark as in docs/BENCHMARKS.md (root; 15–40 minutes); raw figures in /var/cache/phasegate/bench.
bench-report:
	cd test && $(GO) run ./bench -n 0,1000,5000,10000 -reps 3 -out ../docs/bench -doc ../docs/BENCHMARKS.md -headline ../README.md

## bench-render: docs/BENCHMARKS.md's section, README's headline, report.md and the PNGs again from the cached raw figures.
bench-render:
	cd test && $(GO) run ./bench -from -out ../docs/bench -doc ../docs/BENCHMARKS.md -headline ../README.md

unit:
	$(GO) test -race -count=1 ./lifecycle/... ./app/... ./eventstream/... ./tracing/... ./health/... ./server/... ./metrics/... ./timeline/... ./phases/... ./cmd/...
	cd examples && $(GO) test -race -count=1 -timeout 20m ./...

## bench-compare: seven no-op steps on phasegate, uber-go/fx and oklog/run (docs/FRAMEWORK.md).
bench-compare:
	cd examples && $(GO) test -run '^$$' -bench 'SevenSteps|AppStartStop' -benchmem -count 5 ./compare/

## screenshot: refresh docs/startup-timeline.png from a real start in headless Chromium (root).
screenshot:
	cd test && PHASEGATE_SCREENSHOT_DIR=$(CURDIR)/docs $(GO) test -count=1 -run TestOperatorMetricsAndTimeline .

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

tools: deps

## reliability: the long variants of the reliability tests (20 crash rounds with leases and
## workloads, 20 SIGHUP upgrades under 500 checks/s, 5,000 checks/s for 60 s over a 5,000-slot
## reclaim, restores, faults), their figures written to docs/reliability/ (root; ~20 minutes).
reliability:
	cd test && PHASEGATE_REPORT_DIR=$(CURDIR)/docs/reliability PHASEGATE_CRASH_ROUNDS=20 PHASEGATE_LOAD_LONG=1 PHASEGATE_UPGRADE_LONG=1 \
		$(GO) test -count=1 -timeout 90m -v -run 'TestCrashAnywhere|TestHealthUnderLoad|TestLock|TestBusy|TestHostile|TestBadConfiguration|TestNothingOutside|TestLiveRestore|TestLeaseLifecycle|TestUpgrade|TestSocketActivation|TestCorruptState|TestNewerStateSchema|TestTwoDaemons|TestEgress' .

## fuzz: each fuzz target for FUZZTIME (default 1m). Seed corpora run in every `make test`.
FUZZTIME ?= 1m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzNew$$' -fuzztime $(FUZZTIME) ./lifecycle/
	$(GO) test -run '^$$' -fuzz '^FuzzParseNames$$' -fuzztime $(FUZZTIME) ./network/slot/
	$(GO) test -run '^$$' -fuzz '^FuzzServeConfiguration$$' -fuzztime $(FUZZTIME) ./cmd/phasegate/
	$(GO) test -run '^$$' -fuzz '^FuzzHealthQuery$$' -fuzztime $(FUZZTIME) ./health/
	$(GO) test -run '^$$' -fuzz '^FuzzShown$$' -fuzztime $(FUZZTIME) ./internal/names/
	$(GO) test -run '^$$' -fuzz '^FuzzASCIIJSON$$' -fuzztime $(FUZZTIME) ./internal/names/

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./lifecycle/... ./server/...
