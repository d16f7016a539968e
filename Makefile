# The two commands of the README:
#   make demo   run the autoscaler on a local control plane with the ARM simulator
#   make test   run the whole test suite (what CI runs)
#   make peer   this autoscaler against Karpenter's kwok provider, side by side (PEER_SIZES, PEER_RUNS, PEER_REPEAT)
# and the image, built without Docker (cmd/image, go-containerregistry):
#   make image                          OCI layout + archive under $(IMAGE_DIR), linux/amd64 and linux/arm64
#   make push IMAGE=registry/name:tag   push it with the standard keychain (docker login, az acr login)
GO ?= go
# staticcheck is built once into the git-ignored .cache/tools, per its
# version and Go's (a staticcheck built by an older Go refuses newer code).
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK ?= .cache/tools/staticcheck-$(STATICCHECK_VERSION)-$(shell $(GO) env GOVERSION)/staticcheck
# Output of make image (git-ignored). VERSION defaults to the chart's
# appVersion, REVISION to `git rev-parse HEAD`, CA_CERTS to this machine's
# bundle (Debian's ca-certificates).
IMAGE_DIR ?= .cache/image
VERSION ?=
REVISION ?=
CA_CERTS ?= /etc/ssl/certs/ca-certificates.crt
IMAGE ?=
# The preflight agent's image: the binary on a GPU-tools base (e.g. NVIDIA's
# DCGM image), built by make image when PREFLIGHT_BASE is set and pushed by
# make push when PREFLIGHT_IMAGE is.
PREFLIGHT_BASE ?=
PREFLIGHT_IMAGE ?=

.PHONY: help test deps lint unit fuzz e2e scale scale-ci peer bench build demo image push dashboards

# make help lists the targets: the two commands first.
help:
	@echo 'make demo          run the autoscaler on a local control plane with the ARM simulator and a sample workload'
	@echo 'make test          the whole test suite, what CI runs: $(TEST_STAGES)'
	@echo 'make lint          gofmt, go vet, staticcheck, the complexity ratchet (.complexity-baseline)'
	@echo 'make unit          every package but the end-to-end ones, with -race'
	@echo 'make fuzz          each fuzz target for a bounded number of inputs'
	@echo 'make e2e           the end-to-end scenarios on a real control plane (one: see CONTRIBUTING.md)'
	@echo 'make scale-ci      the scale harness at CI size; make scale SCALE_SIZE=full|xl the full runs'
	@echo 'make peer          this autoscaler against Karpenter'"'"'s kwok provider, side by side'
	@echo 'make bench         the core benchmarks (a 7,500-node, 200,000-pod cluster)'
	@echo 'make build         bin/vmss-autoscaler'
	@echo 'make image         the OCI image (no Docker); make push IMAGE=registry/name:tag'
	@echo 'make dashboards    the Grafana dashboards'"'"' JSON from charts/dashboards'

# make test runs these stages in order, timing each (.ci/stages prints a
# line per stage and a one-line summary at the end) and stopping at the
# first that fails.
TEST_STAGES = deps lint unit fuzz e2e scale-ci
test:
	+@MAKE='$(MAKE)' ./.ci/stages $(TEST_STAGES)

# Prometheus (Debian's package) for the dashboard e2e test; a no-op when present.
deps:
	@./.ci/deps

# gofmt's list goes to stderr through the shell (>&2), not tee /dev/stderr:
# opening /dev/stderr reopens a log file that stderr is redirected to, with
# truncation, and wiped what make test had written before it.
lint: $(STATICCHECK)
	@unformatted="$$(git ls-files -co --exclude-standard '*.go' | xargs gofmt -l)"; \
	if [ -n "$$unformatted" ]; then echo "$$unformatted" >&2; echo "gofmt: files above need formatting" >&2; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
	$(GO) run ./cmd/complexity -over 15 -max-share 3 -baseline .complexity-baseline .

$(STATICCHECK):
	GOBIN=$(abspath $(dir $(STATICCHECK))) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# Every package but the end-to-end ones, with the race detector, except
# the image's: its tests cross-build the autoscaler for linux/amd64 and
# linux/arm64 and run it, which -race would build a second time for
# nothing (the race detector has no arm64 cross-build here and finds no
# races in a build script). They run once, without -race.
unit:
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list ./... | grep -v -e /e2e -e '/internal/image$$')
	$(GO) test -count=1 -timeout 30m ./internal/image

# Go native fuzzing of every parser of untrusted input, each for FUZZTIME
# (go test runs one fuzz target at a time). A crash is written to the
# package's testdata/fuzz/<Fuzz...>/ and then runs with every go test:
# commit it with the fix as its regression test.
#
# FUZZTIME is a count of executions, not a duration: with a duration, Go
# before 1.27 can fail a target with a bare "context deadline exceeded" and
# no crasher when the deadline ends a worker mid-call (Go issue 75804, a
# race in the fuzzing coordinator; CI hit it on FuzzParseNodeGroupSpec). A
# count has no deadline to race. 10,000 runs take 1-23 s a target here.
FUZZTIME ?= 10000x
FUZZ_TARGETS = \
	./cloudprovider/vmss:FuzzScaleSetTags \
	./cloudprovider/vmss:FuzzParseProviderID \
	./cloudprovider/vmss:FuzzAutoDiscovery \
	./cloudprovider:FuzzParseNodeGroupSpec \
	./preflight:FuzzParseTaint \
	./preflight/agent:FuzzTaintFlag \
	./preflight/agent:FuzzChecksYAML \
	./internal/app:FuzzFlagsYAML \
	./core/scaleup:FuzzParsePriorities \
	./balloon:FuzzParsePolicies \
	./core/health:FuzzParseHealthPolicy \
	./core/capacitybuffer:FuzzResolve \
	./ratelimit:FuzzParseRejected
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -timeout 10m $$pkg; \
	done

# End-to-end: a real control plane, kwok and the ARM simulator (the control
# plane is built into .cache/bin on first use). Scenarios that only use their
# own namespace, scale sets and autoscaler run E2E_PARALLEL at a time on the
# shared control plane; those that kill or freeze a shared component (the
# API server, etcd, kwok), need the node-registration hook to themselves
# (the smoothing rates) or apply the chart's preflight DaemonSet (it selects
# every pending node) run alone, before the rest (they do not call
# t.Parallel).
# cmd/testtimes prints what a plain go test would, then the slowest
# tests (what each costs: every minute of make test is paid for), and
# keeps the JSON stream in .cache/e2e.json.
E2E_PARALLEL ?= 4
e2e:
	@mkdir -p .cache
	$(GO) run ./cmd/testtimes -json-out .cache/e2e.json -slowest 25 -- $(GO) test -json -count=1 -timeout 60m -parallel $(E2E_PARALLEL) ./e2e/...

# The scale harness (e2e/scale): the autoscaler with default flags on a
# real control plane, kwok and the ARM simulator, from 0 to thousands of
# nodes; a table (markdown, JSON) and plots under .cache/scale. make scale
# is the full size (2,000 nodes, 8,000 pods, gangs of 400: about an hour);
# SCALE_SIZE=xl the seeds' size on the real GPU layout (issue #38): 7,500
# ND H100 v5 nodes in 75 InfiniBand scale sets of 100 (singlePlacementGroup),
# one 8-GPU pod each, 55 sets full before the autoscaler starts and 20 for it
# to fill, the simulator's Compute RP policies on, operations of minutes
# compressed, kwok's Leases renewed every 60 s with the node lifecycle grace
# at 300 s, held until the autoscaler has run 30 minutes and judged on the
# issue's criteria (freeze, VM lists per 30 minutes, 429s in steady state,
# time to all nodes against the binding bound: the per-set write budgets, or
# the in-flight cap when longer): about 40 minutes;
# make test runs the CI size (60 nodes) so the harness cannot rot. ARGS adds
# flags (go run ./e2e/scale --help), e.g. the xl layout at 10 sets:
# ARGS="--nodes=1000 --seed-nodes=500 --min-autoscaler-run=0".
SCALE_SIZE ?= full
scale:
	$(GO) run ./e2e/scale --size=$(SCALE_SIZE) $(ARGS)

scale-ci:
	$(GO) run ./e2e/scale --size=ci

# The peer benchmark (e2e/peer): the same control plane, kwok and pods
# (2 CPU / 2 Gi pause pods, 64-core nodes) scaled by this autoscaler with
# its default flags, by Karpenter's kwok provider (built once from the
# module proxy into .cache/karpenter) and on nodes that already exist (the
# floor), each on a fresh control plane, PEER_REPEAT rounds of each
# (interleaved; the table shows medians: one round's time to all Running
# varies by a tenth on this machine); report.md, report.json and plots
# of pods Running under PEER_DIR. About 6 minutes a round.
PEER_SIZES ?= 1000,5000
PEER_RUNS ?= ours,karpenter,floor
PEER_REPEAT ?= 3
PEER_DIR ?= .cache/peer
peer:
	$(GO) run ./e2e/peer --sizes=$(PEER_SIZES) --runs=$(PEER_RUNS) --repeat=$(PEER_REPEAT) --report-dir=$(PEER_DIR) $(ARGS)

bench:
	$(GO) test -run '^$$' -bench . -benchtime 20x -timeout 60m ./core/...

build:
	$(GO) build -o bin/vmss-autoscaler ./cmd/vmss-autoscaler

image:
	$(GO) run ./cmd/image build --out=$(IMAGE_DIR) --ca-certificates=$(CA_CERTS) $(if $(VERSION),--version=$(VERSION)) $(if $(REVISION),--revision=$(REVISION)) $(if $(PREFLIGHT_BASE),--preflight-base=$(PREFLIGHT_BASE))

# The Grafana dashboards' JSON, generated from Go (charts/dashboards); a
# unit test fails when the committed JSON is out of date.
dashboards:
	$(GO) generate ./charts/dashboards

# Pushes what make image last built (it does not rebuild: the version built is the one pushed).
push:
	@test -n "$(IMAGE)" || { echo "usage: make push IMAGE=<registry>/vmss-autoscaler:<tag>" >&2; exit 1; }
	$(GO) run ./cmd/image push --layout=$(IMAGE_DIR)/oci $(IMAGE)
	$(if $(PREFLIGHT_IMAGE),$(GO) run ./cmd/image push --layout=$(IMAGE_DIR)/preflight-oci $(PREFLIGHT_IMAGE))

demo:
	$(GO) run ./e2e/demo $(ARGS)
