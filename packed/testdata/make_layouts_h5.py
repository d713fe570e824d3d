"""Writes layouts.h5, for TestHDF5Layouts: a file with a 512-byte user
block (HDF5's addresses start after it), holding a contiguous dataset
(rows read at their offset), a compact one and a contiguous one never
written (rows read by the HDF5 library; the last reads as its fill value).
Run with Debian's /usr/bin/python3:
    /usr/bin/python3 make_layouts_h5.py
"""
import h5py
import numpy as np

with h5py.File("layouts.h5", "w", libver="earliest", userblock_size=512) as f:
    f.create_dataset("contiguous", data=np.arange(5 * 3, dtype=">i2").reshape(5, 3))
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    f.create_dataset("compact", data=np.arange(4 * 2, dtype="<u4").reshape(4, 2), dcpl=dcpl)
    f.create_dataset("unwritten", shape=(3, 2), dtype="<f8", fillvalue=7.5)
