# dlfs: see README.md.
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go

.PHONY: all build deps test unit integration fuzz mutate bench bench-scale demo clean dlfs static install uninstall image docs man

all: build

deps:
	./scripts/install-deps.sh

build:
	$(GO) build -o bin/dlfs ./cmd/dlfs
	$(GO) build -o bin/pfssim ./cmd/pfssim
	$(GO) build -o bin/dlfsbench ./cmd/dlfsbench

# bin/dlfs alone, as build makes it (with HDF5, so it needs libhdf5): what
# the Dockerfile builds.
dlfs:
	$(GO) build -o bin/dlfs ./cmd/dlfs

# A static binary without cgo, and so without HDF5 (a SOURCE of HDF5 files
# is refused with one line): no libraries needed, any Linux of the same
# architecture runs it (docs/install.md).
STATIC ?= bin/dlfs-static
static:
	CGO_ENABLED=0 $(GO) build -tags nohdf5 -trimpath -o $(STATIC) ./cmd/dlfs

# Installs DLFS_BIN as PREFIX/bin/dlfs, the mount helpers mount(8) and
# fstab use (SBINDIR/mount.fuse.dlfs and mount.dlfs, links to it) and the
# systemd unit (docs/install.md). DESTDIR stages it all under a root.
PREFIX ?= /usr/local
SBINDIR ?= /sbin
UNITDIR ?= /etc/systemd/system
DLFS_BIN ?= bin/dlfs
install:
	[ "$(DLFS_BIN)" != bin/dlfs ] || $(MAKE) dlfs
	install -D -m 0755 $(DLFS_BIN) $(DESTDIR)$(PREFIX)/bin/dlfs
	install -d $(DESTDIR)$(SBINDIR)
	ln -sfn $(PREFIX)/bin/dlfs $(DESTDIR)$(SBINDIR)/mount.fuse.dlfs
	ln -sfn $(PREFIX)/bin/dlfs $(DESTDIR)$(SBINDIR)/mount.dlfs
	install -d $(DESTDIR)$(UNITDIR)
	sed 's|/usr/local/bin/dlfs|$(PREFIX)/bin/dlfs|g' deploy/systemd/dlfs@.service > $(DESTDIR)$(UNITDIR)/dlfs@.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/dlfs@.service

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/dlfs $(DESTDIR)$(SBINDIR)/mount.fuse.dlfs $(DESTDIR)$(SBINDIR)/mount.dlfs $(DESTDIR)$(UNITDIR)/dlfs@.service

# The container image deploy/kubernetes/daemonset.yaml runs (Dockerfile).
IMAGE ?= dlfs:latest
image:
	docker build -t $(IMAGE) .

# Everything CI runs: go vet and staticcheck (its default checks, U1000
# among them; scripts/install-deps.sh installs it), unit tests (with the
# race detector), integration tests with real mounts and torch, and a
# short run of every fuzzer. The fuzzers run for a count of inputs, not a
# time: a timed run that ends before a busy machine finishes the seed
# corpus fails with "context deadline exceeded".
test: deps build
	$(GO) vet ./...
	$$($(GO) env GOPATH)/bin/staticcheck ./...
	$(GO) test -race -count=1 -timeout 10m $$($(GO) list ./... | grep -v /test/integration)
	$(GO) test -count=1 -timeout 15m ./test/integration/
	$(MAKE) fuzz FUZZTIME=20000x FUZZTIME_HDF5=2000x

FUZZTIME ?= 30s
# FuzzHDF5Listing starts a child process per input (packed's preflight of
# every HDF5 file), about 40 inputs a second against thousands: it gets
# its own count.
FUZZTIME_HDF5 ?= $(FUZZTIME)
# Fails if a package's targets cannot be listed (a build error), or if
# there are none at all: a fuzz run that fuzzes nothing is not a pass.
fuzz:
	@set -e; n=0; for pkg in $$($(GO) list ./...); do \
	  list=$$($(GO) test -list '^Fuzz' $$pkg) || { echo "fuzz: cannot list the targets of $$pkg" >&2; exit 1; }; \
	  for f in $$(echo "$$list" | grep '^Fuzz' || true); do \
	    t=$(FUZZTIME); [ "$$f" = FuzzHDF5Listing ] && t=$(FUZZTIME_HDF5); \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $$t $$pkg; n=$$((n+1)); \
	  done; \
	done; \
	[ $$n -gt 0 ] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }; echo "fuzz: $$n targets"

# Mutation testing (docs/mutation.md), outside make test: two tools plant
# one bug at a time in a package and run that package's tests. gremlins
# changes an operator (in a copy of the tree); test/stmtdel deletes a
# statement (a call, an early return, an if, a defer, an assignment;
# through go test -overlay). A mutant the tests still pass "lived"
# (gremlins) or "escaped" (stmtdel). MUTATE_WITH picks the tools. Package
# by package, one worker by default (the machine is small and shared). A
# mutant's test run may take MUTATE_TIMEOUT_COEFFICIENT times the first,
# unmutated run (-count=1, so that a cached result does not make that
# tiny); one that takes longer counts as timed out, neither lived nor
# killed. Each package's efficacy (killed / (killed + lived)) must reach
# MUTATE_THRESHOLD with each tool. Logs, JSON reports, the sources as
# mutated and a summary naming the commit go to bin/mutate/ (see
# scripts/mutate.sh).
MUTATE_PKGS ?= integrity placement control ssdstore catalog cluster/peer fusefs loader \
	ramcache source prefetch access jobs cluster daemon/owners backing
MUTATE_WITH ?= gremlins stmtdel
MUTATE_WORKERS ?= 1
MUTATE_TIMEOUT_COEFFICIENT ?= 20
MUTATE_THRESHOLD ?= 80
mutate:
	./scripts/install-mutate.sh
	MUTATE_WITH="$(MUTATE_WITH)" ./scripts/mutate.sh bin/mutate $(MUTATE_THRESHOLD) $(MUTATE_WORKERS) $(MUTATE_TIMEOUT_COEFFICIENT) $(MUTATE_PKGS)

bench: deps build
	./bin/dlfsbench

# Issue 13's scale rows, outside make test and make bench: a tree of
# SCALE_FILES tiny files, generated once under /tmp/dlfsbench and reused.
SCALE_FILES ?= 1000000
bench-scale: deps build
	./bin/dlfsbench -suites scale -scale-files $(SCALE_FILES)

# The command reference, docs/reference/dlfs*.md, written from the cobra
# commands; cmd/dlfs's TestReferenceCurrent fails when it is out of date.
docs:
	$(GO) test -count=1 -run '^TestReferenceCurrent$$' ./cmd/dlfs -args -update-reference

# Man pages of every command into MANDIR (not committed).
MANDIR ?= bin/man
man:
	$(GO) test -count=1 -run '^TestReferenceCurrent$$' ./cmd/dlfs -args -man $(abspath $(MANDIR))

demo: deps build
	./scripts/demo.sh

clean:
	rm -rf bin
