"""Writes small.h5, the seed of FuzzHDF5Listing: two numeric datasets,
one in a group, as h5py writes them. Run with Debian's /usr/bin/python3:
    /usr/bin/python3 make_small_h5.py
"""
import h5py
import numpy as np

with h5py.File("small.h5", "w", libver="earliest") as f:
    f.create_dataset("x", data=np.arange(12, dtype="<i4").reshape(3, 4))
    f.create_group("g").create_dataset("y", data=np.ones((2, 2), dtype="<f8"))
