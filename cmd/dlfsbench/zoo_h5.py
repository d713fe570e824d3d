"""The zoo suite's HDF5 workload (dlfsbench -suites zoo, zoo.go).

  zoo_h5.py make PATH ROWS ROWBYTES
      writes one HDF5 file with a contiguous dataset "rows" of ROWS rows of
      ROWBYTES random bytes; a file that has that shape already is kept.
  zoo_h5.py read PATH SEED
      reads every row once through h5py in a random order drawn from SEED,
      as a map-style Dataset whose __getitem__ returns ds[i] does, and
      prints {"seconds": S, "rows": N, "bytes": B}: the time from opening
      the file to the last row, the interpreter's start left out.

Rows larger than HDF5's 64 KiB sieve buffer are read by one pread each.
"""
import json
import os
import sys
import time

import h5py
import numpy as np


def make(path, rows, rowbytes):
    try:
        with h5py.File(path, "r") as f:
            if f["rows"].shape == (rows, rowbytes):
                return
    except (OSError, KeyError):
        pass
    tmp = path + ".tmp"
    rng = np.random.default_rng(29)
    with h5py.File(tmp, "w") as f:
        ds = f.create_dataset("rows", shape=(rows, rowbytes), dtype="u1")
        step = max(1, (64 << 20) // rowbytes)
        for i in range(0, rows, step):
            n = min(step, rows - i)
            ds[i:i + n] = rng.integers(0, 256, size=(n, rowbytes), dtype=np.uint8)
    os.replace(tmp, path)


def read(path, seed):
    start = time.perf_counter()
    n = 0
    with h5py.File(path, "r") as f:
        ds = f["rows"]
        order = np.random.default_rng(seed).permutation(ds.shape[0])
        for i in order:
            n += ds[int(i)].nbytes
        rows = len(order)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "rows": rows, "bytes": n}))


def main(argv):
    if len(argv) == 5 and argv[1] == "make":
        make(argv[2], int(argv[3]), int(argv[4]))
    elif len(argv) == 4 and argv[1] == "read":
        read(argv[2], int(argv[3]))
    else:
        sys.exit("usage: zoo_h5.py make PATH ROWS ROWBYTES | read PATH SEED")


if __name__ == "__main__":
    main(sys.argv)
