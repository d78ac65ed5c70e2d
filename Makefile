# Metabus developer entry points. `make run` and `make test` are the two
# commands the README promises work on a fresh machine.
SHELL := /bin/bash
GO ?= go
export GOFLAGS ?= -buildvcs=false

# The local control plane (etcd, kube-apiserver, kube-controller-manager)
# is built from Go modules once per machine into this cache.
export METABUS_CACHE ?= $(HOME)/.cache/metabus

# FUZZTIME is an execution count, not a duration: a duration budget trips a
# race in Go's fuzz coordinator (golang/go#75804, unfixed in go1.26) that
# fails the run with "context deadline exceeded" and no crasher under CPU load.
FUZZTIME ?= 60000x
TEST_TIMEOUT ?= 30m
# TEST_PACKAGES is how many test packages `make test` runs at once: one more
# than the CPUs (go test's default is as many), because its longest
# packages mostly wait on other processes, leases and redeliveries (e2e used
# 0.4 of a core over its run, hack/faults 0.7, pkg/jsbus 0.15). The two
# longest go first (TEST_FIRST), so that neither starts late and ends the
# run alone; pkg/jsbus, whose lease tests are the most sensitive to load,
# is not among them, to stay out of the start's compiles and control
# planes. TEST_PACKAGES=2 is the old schedule on 2 cores.
TEST_PACKAGES ?= $(shell echo $$(( $$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) + 1 )))
TEST_FIRST := ./e2e/ ./hack/faults/

# The build's identity, stamped into every binary (pkg/version) and shown
# by --version, `metabus version`, the start-up log and metabus_build_info.
# The version is the VERSION file's, the one every manifest pins
# (deploy/version_test.go holds them equal); the revision tells builds of
# one version apart, marked -dirty when tracked files differ from it.
# `make image TAG=0.3.0-rc.1` stamps and tags that version instead.
TAG ?=
VERSION ?= $(or $(TAG),$(shell cat VERSION 2>/dev/null),dev)
REVISION ?= $(or $(shell git rev-parse HEAD 2>/dev/null),unknown)$(if $(shell git status --porcelain --untracked-files=no 2>/dev/null),-dirty)
VERSION_PKG := github.com/metabus/metabus/pkg/version
LDFLAGS := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Revision=$(REVISION)
IMAGE ?= ghcr.io/metabus/metabus
DOCKER ?= docker

.PHONY: all build image image-docker test unit e2e fuzz sim bench bench-bus bench-watcher bench-compare bench-scale faults faults-cluster run vet fmt kube-bins clean migrate-upstream

all: build

# build makes the binaries the way the image does (hack/image: static,
# -trimpath, no symbol table), so what `make bench` and the suites measure
# is what ships: a cgo build maps libc and a symbol-table build is a
# different binary.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/ ./cmd/...

# image builds the one image holding every binary, stamped and tagged
# $(IMAGE):$(VERSION), the image deploy/ names, with no container engine
# (hack/image): bin/image/metabus-$(VERSION).tar (docker load -i, crane
# push) and the OCI layout bin/image/oci (crane push). Reproducible: the
# same commit, Go toolchain and IMAGE_ARCH give the same digest.
# docs/releasing.md says how it is pushed and pinned.
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
image:
	$(GO) run ./hack/image -version $(VERSION) -revision $(REVISION) -repository $(IMAGE) -arch $(IMAGE_ARCH) -out bin/image

# image-docker builds the same binaries with Docker (Dockerfile, on
# distroless; what docker-compose.yaml builds), for machines with an engine.
image-docker:
	$(DOCKER) build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMAGE):$(VERSION) .

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	cd deploy/monitoring/promqlcheck && $(GO) vet ./...

# kube-bins builds (or finds cached) etcd, kube-apiserver and
# kube-controller-manager; a cold build takes 6-13 minutes on 2 cores.
kube-bins:
	@KUBE_BIN_DIR=$$(hack/kubeenv/build.sh | tail -1) && echo "control plane binaries: $$KUBE_BIN_DIR"

# test runs everything: unit tests, e2e tests against a real control plane
# and embedded JetStream, and bounded fuzz runs of the merge, the hook
# response decoder and the revision patcher.
test: vet
	@set -o pipefail; KUBE_BIN_DIR=$$(hack/kubeenv/build.sh | tail -1); export KUBE_BIN_DIR; \
	echo "control plane binaries: $$KUBE_BIN_DIR"; \
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -p $(TEST_PACKAGES) $(TEST_FIRST) ./... && \
	(cd deploy/monitoring/promqlcheck && $(GO) test -count=1 ./...) && \
	$(GO) test -count=1 -run '^$$' -fuzz FuzzMerge -fuzztime $(FUZZTIME) ./pkg/apply/ && \
	$(GO) test -count=1 -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./pkg/hookapi/ && \
	$(GO) test -count=1 -run '^$$' -fuzz FuzzPatch -fuzztime $(FUZZTIME) ./pkg/revision/

unit:
	$(GO) test -count=1 -short ./pkg/... ./services/... ./sdk/...
	cd deploy/monitoring/promqlcheck && $(GO) test -count=1 ./...

# sim runs the partition-ownership simulation (pkg/ownership, issue 24) over
# SIM_SCHEDULES randomized schedules (make test runs 100,000; about 10
# minutes for the default 2,000,000 on 2 idle cores), then the order
# simulation of the driver's oldest-message check and lease guard
# (pkg/jsbus, issue 33) over ORDER_SCHEDULES (make test runs 20,000; about
# 2 minutes for the default 1,000,000), then the real driver's simulation
# over OWNER_SCHEDULES (make test runs 4; about 3 s each). A failing seed
# replays with a trace: go test ./pkg/ownership -run 'TestSimulation$$'
# -sim.seed N -v (or ./pkg/jsbus -run 'TestOrderSimulation$$'
# -ordersim.seed N -v; -run 'TestOwnerSimulation$$' -ownersim.first N
# -ownersim.schedules 1 -v)
SIM_SCHEDULES ?= 2000000
ORDER_SCHEDULES ?= 1000000
OWNER_SCHEDULES ?= 200
sim:
	$(GO) test -count=1 -timeout 0 -run 'TestSimulation$$' ./pkg/ownership/ -sim.schedules $(SIM_SCHEDULES) -v
	$(GO) test -count=1 -timeout 0 -run 'TestOrderSimulation$$' ./pkg/jsbus/ -ordersim.schedules $(ORDER_SCHEDULES) -v
	$(GO) test -count=1 -timeout 0 -run 'TestOwnerSimulation$$' ./pkg/jsbus/ -ownersim.schedules $(OWNER_SCHEDULES) -v

e2e:
	@KUBE_BIN_DIR=$$(hack/kubeenv/build.sh | tail -1); export KUBE_BIN_DIR; \
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -v ./e2e/

# bench prints figures (never asserts on time): the pure cores and the bus,
# the bus's scaling with replicas, workers and controllers (bench-bus,
# ~2.5 min), then end-to-end convergence, idle latency and no-op resync cost
# against the local control plane (~3 min) and MapController against one
# CompositeController over 5,000 inputs (BenchmarkMapController, ~3 min;
# `go test ./e2e -bench MapController -map-inputs N` sizes it), the same hook
# over HTTP and over NATS (BenchmarkHookTransport: idle latency p50/p99 and
# convergence parents/s, ~2.5 min), then the raw-client,
# bin/metabus, bin/metabus --apply-strategy=server-side-apply and echo opt-in
# (metabus.dev/suppress-echoes) columns of hack/benchcmp: B1-B6 (~3 min, more
# when B6 finds a stall; server-side apply and the echo opt-in: B1-B5, ~2 min
# each), B7 (dispatcher replicas, ~1 min) and B8 (1,000 controllers, ~6 min;
# BENCH_ARGS=-scenarios B1,B2,B3,B4,B5,B6,B7 leaves it out).
bench: build
	$(GO) test -count=1 -run '^$$' -bench . -benchmem ./pkg/... ./services/...
	@$(MAKE) --no-print-directory bench-bus
	@KUBE_BIN_DIR=$$(hack/kubeenv/build.sh | tail -1); export KUBE_BIN_DIR; \
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 20m ./e2e/ && \
	$(GO) run ./hack/benchcmp -only raw,raw-contract,metabus,metabus-ssa,metabus-echo $(BENCH_ARGS)

# bench-bus: the partition consumers against a real nats-server process,
# no Kubernetes: cost per item and idle cost against controllers and
# replicas, and sync throughput against replicas × workers with a 200 ms
# hook (hack/busbench; `go run ./hack/busbench -h` lists its knobs).
bench-bus:
	$(GO) run ./hack/busbench $(BUSBENCH_ARGS)

# bench-watcher: how far one watcher goes (issue #12): its RSS per watched
# object and CPU per watch event at 20,000 and 100,000 watched objects
# (Benches and their ConfigMaps), against a fresh control plane, with the
# watcher as its own process and no dispatcher (hack/watcherbench). It
# takes ~12 min, so it is not part of `make bench`;
# WATCHERBENCH_ARGS="-sizes 20000" is a ~3 min run.
bench-watcher:
	@KUBE_BIN_DIR=$${KUBE_BIN_DIR:-$$(hack/kubeenv/build.sh | tail -1)}; export KUBE_BIN_DIR; \
	$(GO) run ./hack/watcherbench $(WATCHERBENCH_ARGS)

# bench-compare puts upstream Metacontroller (tuned) next to metabus and the
# raw client, two interleaved rounds, each on a fresh control plane:
#   make bench-compare MC_BIN=/path/to/metacontroller [BENCH_ARGS="-parents 500"]
bench-compare:
	@if [ -z "$(MC_BIN)" ]; then \
		echo "bench-compare: set MC_BIN to an upstream metacontroller binary, e.g." >&2; \
		echo "  make bench-compare MC_BIN=/path/to/metacontroller" >&2; exit 1; \
	elif [ ! -f "$(MC_BIN)" ] || [ ! -x "$(MC_BIN)" ]; then \
		echo "bench-compare: MC_BIN=$(MC_BIN) is not an executable file" >&2; exit 1; \
	fi
	@$(MAKE) --no-print-directory build
	@KUBE_BIN_DIR=$$(hack/kubeenv/build.sh | tail -1); export KUBE_BIN_DIR; \
	$(GO) run ./hack/benchcmp -rounds 2 -upstream "$(MC_BIN)" $(BENCH_ARGS)

# bench-scale: the scale reports of issue 31 beside upstream (tuned), one
# fresh control plane each: B7 (1,000 parents, 200 ms hook, 1/2/4
# dispatchers against upstream --workers 16/32/64), B9 (CPU per event with
# 1, 100, 1,000 controllers) and B11 (rolling update of 10 Pods), ~15 min:
#   make bench-scale MC_BIN=/path/to/metacontroller [BENCH_ARGS=-b7-appliers]
# The 100,000-parent report (B1, B5, B10) is a command of its own in
# docs/performance.md ("Scale").
bench-scale:
	@if [ -z "$(MC_BIN)" ] || [ ! -f "$(MC_BIN)" ] || [ ! -x "$(MC_BIN)" ]; then \
		echo "bench-scale: set MC_BIN to an upstream metacontroller binary, e.g." >&2; \
		echo "  make bench-scale MC_BIN=/path/to/metacontroller" >&2; exit 1; \
	fi
	@$(MAKE) --no-print-directory build
	@KUBE_BIN_DIR=$${KUBE_BIN_DIR:-$$(hack/kubeenv/build.sh | tail -1)}; export KUBE_BIN_DIR; \
	$(GO) run ./hack/benchcmp -only metabus,upstream -scenarios B7,B9,B11 -b7-parents 1000 -upstream "$(MC_BIN)" $(BENCH_ARGS)

# faults runs the fault-injection suite (hack/faults, issue #13): the four
# services as separate processes (2 dispatchers, 2 appliers) against a real
# nats-server and a fresh control plane, 2,000 parents under churn for 5
# minutes with a SIGKILL of a random service every ~2.5s, 2 nats-server and
# 1 kube-apiserver restarts and a misbehaving hook; then it checks the
# invariants and ends with "N passed, M failed" (~10-15 min; exit status 1
# on a violation). `make test` runs a short budget (TestFaultsShort).
#   make faults [FAULTS_ARGS="-parents 500 -fault-period 2m -keep"]
faults:
	@KUBE_BIN_DIR=$${KUBE_BIN_DIR:-$$(hack/kubeenv/build.sh | tail -1)}; export KUBE_BIN_DIR; \
	$(GO) run ./hack/faults $(FAULTS_ARGS)

# faults-cluster is the fault suite on the production topology (issue #25):
# three nats-server processes from deploy/nats (the shipped users and
# permissions), R3 streams, 2 watchers, 2 dispatchers, 3 appliers, 2,000
# parents under churn for 15 minutes with, besides the faults above, 12
# NATS node SIGKILLs (meta leader, MC_WORK, MC_DESIRED and KV_MC_OWNERS
# leaders first), a rolling restart, 10 forced leader moves, 3 node
# partitions, 3 services cut from NATS and a node that lost its store
# (~25 min). `make test` runs a short budget (TestFaultsClusteredShort).
#   make faults-cluster [FAULTS_ARGS="-parents 500 -fault-period 5m -keep"]
faults-cluster:
	@KUBE_BIN_DIR=$${KUBE_BIN_DIR:-$$(hack/kubeenv/build.sh | tail -1)}; export KUBE_BIN_DIR; \
	$(GO) run ./hack/faults -cluster $(FAULTS_ARGS)

# run brings metabus up: against the current kubeconfig's cluster if it
# answers (asked first, before anything is built), otherwise against a
# local control plane it builds once per machine (progress every 15 s) and
# starts; then it runs the HelloWorld tutorial and keeps serving until
# Ctrl-C. ARGS="--local" always uses a local control plane.
run:
	$(GO) run -ldflags "$(LDFLAGS)" ./hack/devrun $(ARGS)

clean:
	rm -rf bin

# migrate-upstream runs the migration tests with upstream Metacontroller's
# own binary (docs/migrating.md): upstream converges three controllers,
# metabus takes over without recreating or rewriting anything, then hands
# back to upstream the same way, in both apply strategies (~1 min after
# the build).
# `make test` runs the same tests without the upstream half.
#   make migrate-upstream MC_BIN=/path/to/metacontroller
migrate-upstream:
	@test -n "$(MC_BIN)" || { echo "migrate-upstream: set MC_BIN to an upstream metacontroller binary" >&2; exit 1; }
	@KUBE_BIN_DIR=$${KUBE_BIN_DIR:-$$(hack/kubeenv/build.sh | tail -1)}; export KUBE_BIN_DIR; \
	MC_BIN=$(abspath $(MC_BIN)) $(GO) test -count=1 -timeout 20m -v -run '^TestMigrate' ./e2e/
