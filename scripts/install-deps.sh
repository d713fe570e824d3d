#!/usr/bin/env bash
# Installs what building and testing dlfs needs on a fresh Debian machine.
# Idempotent: it installs only what is missing. Needs root (or sudo).
set -euo pipefail

need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# tmux drives `dlfs stats --watch` in a test; pip, venv, setuptools and
# wheel install the Python helper into a virtual environment in another;
# systemd (systemd-analyze), yamllint and python3-yaml check deploy/;
# headless chromium loads the status page; iproute2 (ip, tc), util-linux
# (unshare, nsenter) and nftables build the multi-host test bed (test/testbed);
# acl (setfacl, getfacl) sets SOURCE's ACLs in a multi-user test.
for p in fuse3 gcc libc6-dev libhdf5-dev python3-torch python3-torchvision python3-numpy python3-h5py python3-pil \
  tmux python3-pip python3-venv python3-setuptools python3-wheel systemd yamllint python3-yaml chromium iproute2 util-linux nftables acl; do
  have "$p" || need+=("$p")
done
# mount(8) runs the mount helper in a test; dockerfile-utils (from npm,
# below) lints the Dockerfile in another.
have mount || need+=(mount)
command -v npm >/dev/null 2>&1 || have npm || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v dockerfile-utils >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: installing dockerfile-utils (npm)"
  $SUDO npm install -g --no-audit --no-fund --loglevel=error dockerfile-utils@0.16.3 >/dev/null
fi
if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    echo "install-deps: Go is at /usr/local/go/bin; add it to PATH" >&2
  else
    echo "install-deps: Go is missing; install Go 1.24 or newer" >&2
    exit 1
  fi
fi
[ -e /dev/fuse ] || { echo "install-deps: /dev/fuse is missing; FUSE is needed" >&2; exit 1; }
# staticcheck (its default checks, U1000 among them) runs in make test;
# the pinned version, installed into $(go env GOPATH)/bin when another or
# none is there.
GO="$(command -v go || echo /usr/local/go/bin/go)"
staticcheck_version="${STATICCHECK_VERSION:-v0.8.2}"
staticcheck="$("$GO" env GOPATH)/bin/staticcheck"
if ! { [ -x "$staticcheck" ] && "$GO" version -m "$staticcheck" | grep -Eq "^[[:space:]]+mod[[:space:]]+honnef.co/go/tools[[:space:]]+$staticcheck_version[[:space:]]"; }; then
  echo "install-deps: installing staticcheck $staticcheck_version"
  "$GO" install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
fi
