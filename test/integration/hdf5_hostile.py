"""Writes hostile HDF5 files for the fault suite (made with h5py, as an
attacker would):

  hdf5_hostile.py external OUT.h5 SECRET OTHER.h5
      OUT.h5 holds /good (4 rows of 8 bytes, stored inside), /ext (its raw
      data in SECRET, by name: H5Pset_external), /virt (a virtual dataset
      over OTHER.h5's /data) and /link (an external link to OTHER.h5's
      /data). OTHER.h5 is written too.
  hdf5_hostile.py rows OUT.h5 N
      OUT.h5 declares one dataset of N rows of one byte, chunked and never
      written: a file of about a kilobyte.
"""
import sys

import h5py
import numpy as np

if sys.argv[1] == "external":
    out, secret, other = sys.argv[2:5]
    with h5py.File(other, "w") as f:
        f.create_dataset("data", data=np.arange(32, dtype="u1").reshape(4, 8))
    with h5py.File(out, "w") as f:
        f.create_dataset("good", data=np.full((4, 8), 7, dtype="u1"))
        f.create_dataset("ext", shape=(4, 8), dtype="u1", external=[(secret, 0, 32)])
        layout = h5py.VirtualLayout(shape=(4, 8), dtype="u1")
        layout[:] = h5py.VirtualSource(other, "data", shape=(4, 8))
        f.create_virtual_dataset("virt", layout)
        f["link"] = h5py.ExternalLink(other, "/data")
elif sys.argv[1] == "rows":
    out, n = sys.argv[2], int(sys.argv[3])
    with h5py.File(out, "w") as f:
        f.create_dataset("big", shape=(n, 1), dtype="u1", chunks=(1024, 1))
else:
    sys.exit("usage: see the docstring")
