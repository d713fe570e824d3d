# dlfs: see README.md.
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go

.PHONY: all build deps test unit integration fuzz bench demo clean

all: build

deps:
	./scripts/install-deps.sh

build:
	$(GO) build -o bin/dlfs ./cmd/dlfs
	$(GO) build -o bin/pfssim ./cmd/pfssim
	$(GO) build -o bin/dlfsbench ./cmd/dlfsbench

# Everything CI runs: unit tests (with the race detector), integration
# tests with real mounts and torch, and a short run of every fuzzer. The
# fuzzers run for a count of inputs, not a time: a timed run that ends
# before a busy machine finishes the seed corpus fails with "context
# deadline exceeded".
test: deps build
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 10m $$($(GO) list ./... | grep -v /test/integration)
	$(GO) test -count=1 -timeout 15m ./test/integration/
	$(MAKE) fuzz FUZZTIME=20000x

FUZZTIME ?= 30s
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

bench: deps build
	./bin/dlfsbench

demo: deps build
	./scripts/demo.sh

clean:
	rm -rf bin
