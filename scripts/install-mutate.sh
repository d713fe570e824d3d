#!/usr/bin/env bash
# Installs gremlins, the mutation tester behind `make mutate`, into
# $(go env GOPATH)/bin. Idempotent: does nothing when the pinned version is
# already there. Not a dependency of make test.
set -euo pipefail

export PATH="/usr/local/go/bin:$PATH"
version="${GREMLINS_VERSION:-v0.6.0}"
bin="$(go env GOPATH)/bin/gremlins"
# gremlins built by go install calls itself "dev": ask go for the module
# version recorded in the binary instead.
if [ -x "$bin" ] && go version -m "$bin" | grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/go-gremlins/gremlins[[:space:]]+$version[[:space:]]"; then
  exit 0
fi
echo "install-mutate: installing gremlins $version"
go install "github.com/go-gremlins/gremlins/cmd/gremlins@$version"
