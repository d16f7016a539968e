# The two commands of the README:
#   make demo   run the autoscaler on a local control plane with the ARM simulator
#   make test   run the whole test suite (what CI runs)
GO ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test deps lint unit e2e bench build demo

test: deps lint unit e2e

# Prometheus (Debian's package) for the dashboard e2e test; a no-op when present.
deps:
	@./.ci/deps

lint:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || { echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# Every package but the end-to-end ones, with the race detector.
unit:
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list ./... | grep -v /e2e)

# End-to-end: a real control plane, kwok and the ARM simulator (the control
# plane is built into .cache/bin on first use).
e2e:
	$(GO) test -count=1 -timeout 60m ./e2e/...

bench:
	$(GO) test -run '^$$' -bench . -benchtime 5x -timeout 60m ./core/...

build:
	$(GO) build -o bin/vmss-autoscaler .

demo:
	$(GO) run ./e2e/demo $(ARGS)
