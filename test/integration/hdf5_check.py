#!/usr/bin/python3
"""Write an HDF5 file with h5py, or check a dlfs mount of it with numpy.

  hdf5_check.py write FILE         writes the datasets below to FILE
  hdf5_check.py check FILE MOUNT   numpy.load of every MOUNT/DATASET/ROW.npy
                                   must equal FILE[DATASET][ROW]: the same
                                   dtype, shape and values. Prints the number
                                   of rows checked; exits 1 on a difference.

Datasets: /images (20, 8, 8, 3) uint8, /labels (20,) int64,
/group/features (15, 4) big-endian float32, /group/deep/x (3, 2, 2) float64;
and three that dlfs leaves out: /scalar (no rows), /names (strings) and
/huge (rows of 40 GB).
"""
import os
import sys

import h5py
import numpy as np

SHOWN = ["images", "labels", "group/features", "group/deep/x"]


def write(path):
    rng = np.random.default_rng(5)
    with h5py.File(path, "w") as f:
        f["images"] = rng.integers(0, 256, size=(20, 8, 8, 3), dtype=np.uint8)
        f["labels"] = rng.integers(-5, 5, size=(20,), dtype=np.int64)
        f.create_dataset("group/features", data=rng.standard_normal((15, 4)).astype(">f4"))
        f.create_dataset("group/deep/x", data=rng.standard_normal((3, 2, 2)), chunks=(1, 2, 2))
        f["scalar"] = 3.5
        f["names"] = np.array([b"a", b"bc"])
        # 40 GB a row, never written (chunked): too large a row to show.
        f.create_dataset("huge", shape=(2, 100000, 100000), dtype="f4", chunks=(1, 100, 100))


def check(path, mount):
    n = 0
    with h5py.File(path, "r") as f:
        for name in SHOWN:
            ds = f[name]
            width = len(str(max(ds.shape[0] - 1, 0)))
            files = sorted(os.listdir(os.path.join(mount, name)))
            want = ["%0*d.npy" % (width, i) for i in range(ds.shape[0])]
            if files != want:
                sys.exit("%s: files %s, want %s" % (name, files[:5], want[:5]))
            for i in range(ds.shape[0]):
                got = np.load(os.path.join(mount, name, want[i]))
                row = ds[i]
                if got.dtype != row.dtype or got.shape != row.shape or not np.array_equal(got, row):
                    sys.exit("%s row %d: %s %s, want %s %s" % (name, i, got.dtype, got.shape, row.dtype, row.shape))
                n += 1
    for left_out in ["scalar", "names", "huge"]:
        if os.path.exists(os.path.join(mount, left_out)):
            sys.exit("%s should not be shown" % left_out)
    print(n)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3])
