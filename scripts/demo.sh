#!/usr/bin/env bash
# make demo: dlfs on its embedded single-node default. Generates a small
# ImageFolder-like dataset, mounts it behind pfssim (a simulated busy PFS),
# mounts dlfs over that, runs two epochs of the example PyTorch training loop
# (which tells dlfs its sampler, so dlfs prefetches in its order), prints the
# stats and unmounts.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${DLFS_DEMO_DIR:-/tmp/dlfs-demo}
rm -rf "$work/ssd" "$work/pfs.json"
mkdir -p "$work"/{pfs,mnt,ssd}
for m in "$work/mnt" "$work/pfs"; do mountpoint -q "$m" && ./bin/dlfs umount --lazy "$m" || true; done

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

wait_line() { # FILE PATTERN
  for _ in $(seq 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "demo: timed out waiting for '$2' in $1" >&2; cat "$1" >&2; return 1
}

echo "== generating a dataset of 2000 files under $work/source"
./bin/dlfsbench -gen-only -dir "$work" -files 2000 >/dev/null

echo "== pfssim: $work/source at $work/pfs (2 ms per open, 0.2 ms per read, 300 MB/s)"
./bin/pfssim -open-latency 2ms -read-latency 200us -bandwidth-mbps 300 -stats "$work/pfs.json" \
  "$work/source" "$work/pfs" >"$work/pfssim.log" 2>&1 &
pids+=($!)
wait_line "$work/pfssim.log" mounted

echo "== dlfs mount $work/pfs $work/mnt --ram-cache 1GiB --ssd-cache $work/ssd"
./bin/dlfs mount --ram-cache 1GiB --ssd-cache "$work/ssd" --ssd-cache-size 2GiB "$work/pfs" "$work/mnt" \
  >"$work/dlfs.log" 2>&1 &
pids=("$!" "${pids[@]}")
wait_line "$work/dlfs.log" "dlfs: mounted"
cat "$work/dlfs.log"

echo "== two epochs of examples/train_imagefolder.py (ImageFolder, dlfs.DistributedSampler, DataLoader with 2 workers)"
/usr/bin/python3 examples/train_imagefolder.py --data "$work/mnt" --epochs 2 --workers 2 --batch 32 --raw 2>&1 |
  grep -v -e "UserWarning" -e "warnings.warn"
echo "== the plan dlfs predicted for rank 0, epoch 1 (first lines of $work/mnt/.dlfs/jobs/default/rank-0/epoch-1)"
head -3 "$work/mnt/.dlfs/jobs/default/rank-0/epoch-1"

echo "== dlfs stats $work/mnt (the raw document: dlfs stats --json; live: dlfs stats --watch 2s)"
./bin/dlfs stats "$work/mnt"
echo "== pfssim counted: $(cat "$work/pfs.json")"
echo "== unmounting"
cleanup
pids=()
echo "demo: done"
