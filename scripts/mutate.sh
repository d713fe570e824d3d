#!/usr/bin/env bash
# Mutation testing, package by package (make mutate; docs/mutation.md).
#   scripts/mutate.sh OUTDIR THRESHOLD WORKERS COEFFICIENT PKG...
# Two tools run on each package, one after the other: gremlins, which
# changes operators, and test/stmtdel, which deletes statements (a check,
# a release, an early return). MUTATE_WITH names the ones to run
# (default "gremlins stmtdel").
# For each package: a copy of its sources as mutated (OUTDIR/PKG.src, where
# the survivors' line numbers point), gremlins' log (OUTDIR/PKG.log) and
# JSON report (OUTDIR/PKG.json), stmtdel's (OUTDIR/PKG.del.log,
# OUTDIR/PKG.del.json), and a line for each in OUTDIR/summary ("PKG" for
# gremlins, "PKG:delete" for stmtdel); a PKG's slashes become dashes in
# these names (cluster/peer: OUTDIR/cluster-peer.log). The summary names
# the commit the tree was at (and whether it had changes).
# Exits 1 if a package's efficacy (killed / (killed + lived); for stmtdel,
# caught / (caught + escaped)) is under THRESHOLD, or was not measured.
#
# A mutant can make a test hang on a FUSE mount it serves itself (the
# hung-PFS tests): gremlins kills `go test` at its timeout, but the test
# binary, stuck on its own mount, stays, and gremlins' clean-up then waits
# on the mount for ever. So each package runs with a TMPDIR of its own, and
# once gremlins has reported, the FUSE connections of mounts left under it
# are aborted and the mounts detached.
set -uo pipefail

out=$1 threshold=$2 workers=$3 coefficient=$4
shift 4
export PATH="/usr/local/go/bin:$PATH"
gremlins="$(go env GOPATH)/bin/gremlins"
with=${MUTATE_WITH:-gremlins stmtdel}
mkdir -p "$out"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
[ -n "$(git status --porcelain -- "$@" 2>/dev/null)" ] && commit="$commit+changes"
echo "# at $commit, $(date -u +%Y-%m-%dT%H:%MZ)" >"$out/summary"
stmtdel="$out/stmtdel"
case " $with " in *" stmtdel "*) go build -o "$stmtdel" ./test/stmtdel || exit 1 ;; esac

# reap aborts the FUSE connections of mounts under $1 and detaches them.
reap() {
  local dir=$1
  grep -qs fusectl /proc/mounts || mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null || true
  # mountinfo: ID PARENT MAJOR:MINOR ROOT MOUNTPOINT ...; a FUSE
  # connection's id is its mount's minor device number.
  awk -v d="$dir/" 'index($5, d) == 1 { split($3, dev, ":"); print dev[2], $5 }' /proc/self/mountinfo |
    while read -r minor mnt; do
      [ -w "/sys/fs/fuse/connections/$minor/abort" ] && echo 1 >"/sys/fs/fuse/connections/$minor/abort"
      umount -l "$mnt" 2>/dev/null && echo "mutate: detached a mount a test left: $mnt" >&2
    done
}

for p in "$@"; do
  echo "mutate $p"
  n=${p//\//-}
  rm -rf "$out/$n.src" && cp -r "./$p" "$out/$n.src"
  case " $with " in *" stmtdel "*)
    tmp=$(mktemp -d "/tmp/dlfs-mutate-$n.XXXXXX")
    TMPDIR=$tmp "$stmtdel" -coefficient "$coefficient" -workers "$workers" -json "$out/$n.del.json" "./$p" 2>&1 | tee "$out/$n.del.log"
    reap "$tmp"
    rm -rf "$tmp"
    score=$(sed -n 's/.*; score \([0-9.]*\)%.*/\1/p' "$out/$n.del.log")
    counts=$(sed -n 's/^stmtdel [^:]*: \([0-9]* caught.*\); score.*/\1/p' "$out/$n.del.log")
    echo "$p:delete ${score:-none} $counts" >>"$out/summary"
  esac
  case " $with " in *" gremlins "*) ;; *) continue ;; esac
  tmp=$(mktemp -d "/tmp/dlfs-mutate-$n.XXXXXX")
  TMPDIR=$tmp GOFLAGS="${GOFLAGS:-} -count=1" "$gremlins" unleash --workers "$workers" --timeout-coefficient "$coefficient" \
    -S lt -o "$out/$n.json" "./$p" >"$out/$n.log" 2>&1 &
  pid=$!
  tail -n +1 -f --pid=$pid "$out/$n.log" &
  while kill -0 $pid 2>/dev/null; do
    sleep 5
    grep -q '^Mutator coverage:' "$out/$n.log" && reap "$tmp"
  done
  wait $pid
  reap "$tmp"
  rm -rf "$tmp"
  eff=$(sed -n 's/^Test efficacy: \([0-9.]*\)%.*/\1/p' "$out/$n.log")
  counts=$(grep -E '^(Killed|Timed out):' "$out/$n.log" | tr '\n' ' ')
  echo "$p ${eff:-none} $counts" >>"$out/summary"
done
echo
echo "package efficacy% (threshold $threshold%)"
cat "$out/summary"
awk -v t="$threshold" '!/^#/ && ($2 == "none" || $2 + 0 < t) { bad = bad " " $1 }
  END { if (bad != "") { print "mutate: below " t "% (or not measured):" bad > "/dev/stderr"; exit 1 } }' "$out/summary"
