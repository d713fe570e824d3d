"""dlfs helpers for PyTorch training scripts.

dlfs prefetches clairvoyantly once it knows a job's sampler: its seed, its
epoch and the ranks on this node. Two ways to tell it, both with nothing
beyond torch:

* ``dlfs.DistributedSampler`` is a drop-in for
  ``torch.utils.data.DistributedSampler`` that announces epoch 0 when it is
  made (so prefetching starts while the model is still being built), and
  every later epoch as soon as ``set_epoch`` is called (or when iteration
  starts, if it was not).
* ``dlfs.announce(mountpoint, **keys)`` writes one control line, for
  anything else.

Both do nothing, and warn once, when the dataset is not on a dlfs mount, so
a script runs unchanged anywhere.
"""

import errno
import json
import os
import warnings

import torch
import torch.utils.data

__all__ = ["announce", "find_mount", "DistributedSampler", "DlfsError"]

CONTROL_NAME = os.environ.get("DLFS_CONTROL_NAME", ".dlfs")


class DlfsError(ValueError):
    """dlfs rejected a control line; the message is dlfs's reason."""


def find_mount(path):
    """Return the dlfs mount point holding path, or None."""
    p = os.path.abspath(path)
    while True:
        if os.path.exists(os.path.join(p, CONTROL_NAME, "control")):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def _value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    s = str(v)
    if not s or any(c.isspace() for c in s):
        raise ValueError("dlfs: control values cannot be empty or contain spaces: %r" % (v,))
    return s


def announce(mountpoint, **keys):
    """Write one control line of key=value pairs to MOUNTPOINT/.dlfs/control.

    Raises DlfsError with dlfs's reason if the line is rejected.
    """
    line = " ".join("%s=%s" % (k, _value(v)) for k, v in keys.items() if v is not None)
    path = os.path.join(mountpoint, CONTROL_NAME, "control")
    try:
        with open(path, "w") as f:
            f.write(line + "\n")
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        try:
            with open(path) as f:
                reason = json.load(f).get("last_error") or str(e)
        except (OSError, ValueError):
            reason = str(e)
        raise DlfsError("dlfs rejected %r: %s" % (line, reason)) from None


_warned = set()


class DistributedSampler(torch.utils.data.DistributedSampler):
    """torch.utils.data.DistributedSampler that tells dlfs its order.

    Extra keyword arguments: job (a name, default "default"), batch_size and
    num_workers (those of the DataLoader, which help dlfs follow the reads),
    lookahead (epochs to plan, default 2), ranks (all ranks of the job on
    this node, default just this one), root (the dataset directory; default
    dataset.root) and mountpoint (default: found from root).
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False, *,
                 job="default", batch_size=1, num_workers=0, lookahead=2, ranks=None, root=None,
                 mountpoint=None):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        root = root if root is not None else getattr(dataset, "root", None)
        self._dlfs_mount = mountpoint or (find_mount(root) if root else None)
        self._dlfs_keys = None
        self._dlfs_announced = None
        if self._dlfs_mount is None:
            key = str(root)
            if key not in _warned:
                _warned.add(key)
                warnings.warn("dlfs: %s is not on a dlfs mount; not announcing the sampler" % (root,))
            return
        rel = os.path.relpath(os.path.abspath(root), self._dlfs_mount)
        self._dlfs_keys = dict(
            job=job, root=rel, dataset="imagefolder", sampler="distributed", seed=seed,
            world=self.num_replicas, shuffle=shuffle, drop_last=drop_last, batch=batch_size,
            workers=num_workers, lookahead=lookahead, torch=torch.__version__.split("+")[0],
        )
        if ranks is not None:
            self._dlfs_keys["ranks"] = list(ranks)
        else:
            self._dlfs_keys["rank"] = self.rank
        self._announce(self.epoch)

    def _announce(self, epoch):
        if self._dlfs_keys is not None and self._dlfs_announced != epoch:
            announce(self._dlfs_mount, epoch=epoch, **self._dlfs_keys)
            self._dlfs_announced = epoch

    def set_epoch(self, epoch):
        super().set_epoch(epoch)
        self._announce(epoch)

    def __iter__(self):
        self._announce(self.epoch)
        return super().__iter__()
