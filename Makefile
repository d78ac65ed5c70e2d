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

.PHONY: all build test unit e2e fuzz bench run vet fmt kube-bins clean

all: build

build:
	$(GO) build -o bin/ ./cmd/...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

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
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./... && \
	$(GO) test -count=1 -run '^$$' -fuzz FuzzMerge -fuzztime $(FUZZTIME) ./pkg/apply/ && \
	$(GO) test -count=1 -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./pkg/hookapi/ && \
	$(GO) test -count=1 -run '^$$' -fuzz FuzzPatch -fuzztime $(FUZZTIME) ./pkg/revision/

unit:
	$(GO) test -count=1 -short ./pkg/... ./services/...

e2e:
	@KUBE_BIN_DIR=$$(hack/kubeenv/build.sh | tail -1); export KUBE_BIN_DIR; \
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -v ./e2e/

# bench prints figures (never asserts on time): the pure cores and the bus,
# then end-to-end convergence, idle latency and no-op resync cost against the
# local control plane (~3 min).
bench:
	$(GO) test -count=1 -run '^$$' -bench . -benchmem ./pkg/... ./services/...
	@KUBE_BIN_DIR=$$(hack/kubeenv/build.sh | tail -1); export KUBE_BIN_DIR; \
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 20m ./e2e/

# run brings metabus up: against the current kubeconfig's cluster if it
# answers, otherwise against a local control plane it starts; then it runs
# the HelloWorld tutorial and keeps serving until Ctrl-C.
run:
	@KUBE_BIN_DIR=$$(hack/kubeenv/build.sh | tail -1); export KUBE_BIN_DIR; \
	$(GO) run ./hack/devrun $(ARGS)

clean:
	rm -rf bin
