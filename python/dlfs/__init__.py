"""dlfs helpers for PyTorch training scripts.

dlfs prefetches clairvoyantly once it knows a job's sampler: its seed, its
epoch and the ranks on this node. Two ways to tell it, both with nothing
beyond torch:

* ``dlfs.DistributedSampler`` is a drop-in for
  ``torch.utils.data.DistributedSampler`` that announces epoch 0 when it is
  made (so prefetching starts while the model is still being built), and
  every later epoch as soon as ``set_epoch`` is called (or when iteration
  starts, if it was not).
* ``dlfs.LocalityBatchSampler`` is a batch sampler for
  ``DataLoader(ds, batch_sampler=...)`` that lets dlfs choose which rank
  trains on which sample of each global batch, so that each rank reads what
  its own node caches (``balance=locality``; every global batch stays
  exactly torch's).
* ``dlfs.DataLoader`` is a drop-in subclass of
  ``torch.utils.data.DataLoader`` that reports how fast its training loop
  and its workers go, and takes from dlfs, at each epoch start, the
  workers and prefetch_factor dlfs advises for it given the other jobs on
  the node (``--allocation``).
* ``dlfs.announce(mountpoint, **keys)`` writes one control line, for
  anything else.

All do nothing extra, and the samplers warn once, when the dataset is not
on a dlfs mount, so a script runs unchanged anywhere.
"""

import errno
import json
import multiprocessing
import os
import time
import warnings

import torch
import torch.utils.data

__version__ = "0.16.0"  # dlfs's version: `dlfs version` prints the same

__all__ = ["announce", "find_mount", "DistributedSampler", "LocalityBatchSampler", "DataLoader", "DlfsError"]

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
    dataset.root), mountpoint (default: found from root) and start_epoch
    (the first epoch this process trains, announced when the sampler is
    made; give it when resuming, or dlfs prefetches epoch 0 first).
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False, *,
                 job="default", batch_size=1, num_workers=0, lookahead=2, ranks=None, root=None,
                 mountpoint=None, start_epoch=0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.epoch = start_epoch
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


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message)


class LocalityBatchSampler(torch.utils.data.Sampler):
    """Batches of a DistributedSampler job, dealt by dlfs to the ranks whose
    nodes cache the samples.

    For every epoch, the union over ranks of their k-th batches is exactly
    torch's k-th global batch (what DistributedSampler with the same seed
    and epoch gives all ranks' k-th batches together), so the training is
    unchanged (Yang & Cong, Theorem 1); only which rank trains on which
    sample of it differs. With balance="locality" each rank's batch has the
    stock size; with balance="solar" sizes differ (weight each rank's loss
    by its batch's share of the global batch). epochorder=True lets dlfs
    choose which epoch uses which permutation, for cache reuse.

    Use as ``DataLoader(ds, batch_sampler=sampler)`` and call
    ``set_epoch(e)`` before each epoch (start_epoch is the first, announced
    when the sampler is made). It announces the job, waits (up to
    timeout seconds) for this node's plan of the epoch, and yields lists of
    dataset indices. When torch.distributed is initialised, the ranks check
    that their nodes planned from the same layout; if they did not, or the
    plan did not come in time, or the dataset is not on a dlfs mount, every
    rank yields the stock DistributedSampler batches for that epoch, and a
    warning says why.
    """

    def __init__(self, dataset, batch_size, num_replicas=None, rank=None, seed=0, drop_last=False, *,
                 balance="locality", epochorder=False, job="default", num_workers=0, lookahead=2,
                 root=None, mountpoint=None, timeout=60.0, start_epoch=0):
        if batch_size < 1:
            raise ValueError("dlfs: batch_size must be at least 1, got %r" % (batch_size,))
        self.dataset = dataset
        self.batch_size = batch_size
        self.timeout = timeout
        self.epoch = start_epoch
        self._stock = torch.utils.data.DistributedSampler(dataset, num_replicas=num_replicas, rank=rank,
                                                          shuffle=True, seed=seed, drop_last=drop_last)
        self.num_replicas, self.rank = self._stock.num_replicas, self._stock.rank
        self.last_source = None  # "dlfs" or "stock": where the last epoch's batches came from
        root = root if root is not None else getattr(dataset, "root", None)
        self._mount = mountpoint or (find_mount(root) if root else None)
        self._keys = None
        self._announced = None
        self._index = None
        if self._mount is None:
            _warn_once(str(root), "dlfs: %s is not on a dlfs mount; yielding the stock DistributedSampler batches" % (root,))
            return
        self._root = os.path.abspath(root)
        self._keys = dict(
            job=job, root=os.path.relpath(self._root, self._mount), dataset="imagefolder",
            sampler="distributed", seed=seed, world=self.num_replicas, shuffle=True, drop_last=drop_last,
            batch=batch_size, workers=num_workers, lookahead=lookahead, torch=torch.__version__.split("+")[0],
            balance=balance, epochorder=epochorder, rank=self.rank,
        )
        self._announce(start_epoch)

    def _announce(self, epoch):
        if self._keys is not None and self._announced != epoch:
            announce(self._mount, epoch=epoch, **self._keys)
            self._announced = epoch

    def set_epoch(self, epoch):
        self.epoch = epoch
        self._announce(epoch)

    def __len__(self):
        return (len(self._stock) + self.batch_size - 1) // self.batch_size

    def _stock_batches(self):
        self._stock.set_epoch(self.epoch)
        idx = list(self._stock)
        return [idx[i:i + self.batch_size] for i in range(0, len(idx), self.batch_size)]

    def _plan(self):
        """This node's plan for the epoch: (layout id, batches) or (None, reason)."""
        job, epoch = self._keys["job"], self.epoch
        status = os.path.join(self._mount, CONTROL_NAME, "control")
        deadline = time.monotonic() + self.timeout
        layout = None
        while True:
            try:
                with open(status) as f:
                    plan = json.load(f).get("jobs", {}).get(job, {}).get("plans", {}).get("epoch-%d" % epoch)
            except (OSError, ValueError) as e:
                return None, "reading %s: %s" % (status, e)
            if plan and plan.get("pinned"):
                layout = plan["layout"]
                break
            if time.monotonic() > deadline:
                return None, "no plan pinned for epoch %d of job %s after %.0f s (are all ranks announced?)" % (epoch, job, self.timeout)
            time.sleep(0.02)
        base = os.path.join(self._mount, CONTROL_NAME, "jobs", job, "rank-%d" % self.rank, "epoch-%d" % epoch)
        try:
            with open(base) as f:
                paths = f.read().split("\n")[:-1]
            with open(base + ".batches") as f:
                sizes = [int(x) for x in f.read().split()]
        except (OSError, ValueError) as e:
            return None, "reading the plan %s: %s" % (base, e)
        if sum(sizes) != len(paths) or len(sizes) != len(self):
            return None, "plan %s: %d samples in %d batches, want %d batches" % (base, len(paths), len(sizes), len(self))
        if self._index is None:
            self._index = {}
            for i, s in enumerate(getattr(self.dataset, "samples", [])):
                self._index.setdefault(os.path.relpath(os.path.abspath(s[0]), self._mount), i)
        out, at = [], 0
        for n in sizes:
            batch = []
            for p in paths[at:at + n]:
                i = self._index.get(p)
                if i is None:
                    return None, "plan %s names %s, which the dataset does not list" % (base, p)
                batch.append(i)
            out.append(batch)
            at += n
        return layout, out

    def __iter__(self):
        if self._keys is None:
            self.last_source = "stock"
            return iter(self._stock_batches())
        self._announce(self.epoch)
        layout, plan = self._plan()
        reason = plan if layout is None else None
        if torch.distributed.is_available() and torch.distributed.is_initialized() and self.num_replicas > 1:
            layouts = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(layouts, layout)
            missing = [r for r, l in enumerate(layouts) if l is None]
            if reason is None and missing:
                reason = "ranks %s have no plan for epoch %d" % (missing, self.epoch)
            elif reason is None and len(set(layouts)) > 1:
                reason = "the ranks' nodes planned epoch %d from different layouts %s" % (self.epoch, sorted(set(layouts)))
        if reason is not None:
            warnings.warn("dlfs: epoch %d: %s; yielding the stock DistributedSampler batches" % (self.epoch, reason))
            self.last_source = "stock"
            return iter(self._stock_batches())
        self.last_source = "dlfs"
        return iter(plan)


class _TimedDataset(torch.utils.data.Dataset):
    """A map-style dataset that adds the time and CPU time of every
    __getitem__ to a shared accumulator (samples, seconds, CPU seconds), in
    whichever process runs it: the DataLoader's workers, or the main
    process with no workers. Attributes are the wrapped dataset's."""

    def __init__(self, dataset, acc):
        self.dataset = dataset
        self._dlfs_acc = acc

    def __getitem__(self, index):
        wall, cpu = time.perf_counter(), time.process_time()
        item = self.dataset[index]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        acc = self._dlfs_acc
        with acc.get_lock():
            acc[0] += 1
            acc[1] += wall
            acc[2] += cpu
        return item

    def __len__(self):
        return len(self.dataset)

    def __getattr__(self, name):
        inner = self.__dict__.get("dataset")
        if inner is None:  # while unpickling
            raise AttributeError(name)
        return getattr(inner, name)


class _Measured:
    """The iterator of one epoch of a dlfs.DataLoader: the stock iterator,
    timing how long the training loop holds each batch and waits for the
    next."""

    def __init__(self, loader, it, epoch, began):
        self._loader, self._it, self._epoch = loader, it, epoch
        self._began = began  # when the epoch's iteration began
        self._held = None  # when the last batch was handed over
        self._first = True

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._it)

    def __next__(self):
        lo = self._loader
        t0 = time.perf_counter()
        if self._held is not None:
            lo._dlfs_sums[0] += t0 - self._held
            lo._dlfs_sums[2] += 1
        try:
            batch = next(self._it)
        except StopIteration:
            lo._dlfs_report(self._epoch)
            raise
        t1 = time.perf_counter()
        if self._first:  # the first wait is the workers starting
            lo._dlfs_start = t1 - self._began
        else:
            lo._dlfs_sums[1] += t1 - t0
            lo._dlfs_sums[3] += 1
        self._first = False
        self._held = t1
        if t1 - lo._dlfs_last >= lo._dlfs_interval:
            lo._dlfs_report(self._epoch)
        return batch


class DataLoader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader that tells dlfs how it loads and takes
    dlfs's advice on its workers.

    dlfs shares the node's loader CPUs (``dlfs mount --loader-cpus``)
    between the DataLoaders that report to it, by what each one's model
    and samples cost (``--allocation need``, A-Dloader) or evenly
    (``even``). At each epoch start, unless persistent_workers keeps its
    workers, the loader reads ``.dlfs/jobs/JOB/rank-R/advice`` and runs
    that epoch with its ``workers`` and ``prefetch_factor``. While it runs
    it measures how long the training loop holds each batch and waits for
    the next, and in the workers the time and CPU time of each sample, and
    writes them to dlfs every report_interval seconds and at the end of
    each epoch.

    Extra keyword arguments: job (default: the job of a dlfs sampler, else
    "default"), rank (default: the sampler's rank, else torch.distributed's,
    else 0), root (the dataset directory; default dataset.root), mountpoint
    (default: found from root), report_interval (seconds, default 5) and
    advise (apply the advice; default True: with False it only reports).

    ``loader.dataset`` is a thin wrapper that times each sample; every
    attribute of the dataset given (``classes``, ``samples``, ...) reads
    through it, and ``loader.dataset.dataset`` is the dataset itself. Off
    a dlfs mount, or for an IterableDataset, it is the stock DataLoader.
    """

    def __init__(self, dataset, *args, job=None, rank=None, root=None, mountpoint=None, report_interval=5.0,
                 advise=True, **kwargs):
        root = root if root is not None else getattr(dataset, "root", None)
        mount = mountpoint or (find_mount(root) if root else None)
        self_acc = None
        if mount is not None and not isinstance(dataset, torch.utils.data.IterableDataset):
            self_acc = multiprocessing.Array("d", 3)
            dataset = _TimedDataset(dataset, self_acc)
        super().__init__(dataset, *args, **kwargs)
        self.last_advice = None  # the advice the current epoch runs with, or None
        self._dlfs_mount = mount if self_acc is not None else None
        self._dlfs_acc = self_acc
        if self._dlfs_mount is None:
            return
        sampler = self.batch_sampler if self.batch_sampler is not None and self.batch_size is None else self.sampler
        keys = getattr(sampler, "_dlfs_keys", None) or getattr(sampler, "_keys", None) or {}
        self._dlfs_job = job or keys.get("job") or "default"
        if rank is None:
            rank = getattr(sampler, "rank", None)
        if rank is None and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
        self._dlfs_rank = int(rank or 0)
        self._dlfs_sampler = sampler
        self._dlfs_interval = float(report_interval)
        self._dlfs_advise = advise
        self._dlfs_last = time.perf_counter()
        self._dlfs_sums = [0.0, 0.0, 0, 0]  # step seconds, wait seconds, steps, waits
        self._dlfs_taken = (0.0, 0.0, 0.0)  # the accumulator at the last report
        self._dlfs_epochs = 0
        self._dlfs_start = 0.0  # the last epoch's start, until reported

    def _dlfs_path(self, name):
        return os.path.join(self._dlfs_mount, CONTROL_NAME, "jobs", self._dlfs_job, "rank-%d" % self._dlfs_rank, name)

    def _dlfs_apply(self):
        if not self._dlfs_advise or (self.persistent_workers and getattr(self, "_iterator", None) is not None):
            return
        try:
            with open(self._dlfs_path("advice")) as f:
                adv = json.load(f)
            workers, factor = int(adv["workers"]), int(adv["prefetch_factor"])
        except FileNotFoundError:
            return  # no advice yet: this rank has not reported
        except (OSError, ValueError, KeyError, TypeError) as e:
            _warn_once(("advice", self._dlfs_mount), "dlfs: reading the advice for job %s rank %d: %s; keeping num_workers=%d"
                       % (self._dlfs_job, self._dlfs_rank, e, self.num_workers))
            return
        if workers < 0 or factor < 1:
            return
        if workers == 0 and self.persistent_workers:
            return  # torch needs workers for persistent_workers
        self.num_workers = workers
        if workers > 0:
            self.prefetch_factor = factor
        self.last_advice = adv

    def _dlfs_epoch(self):
        e = getattr(self._dlfs_sampler, "epoch", None)
        return int(e) if isinstance(e, int) and e >= 0 else self._dlfs_epochs

    def _dlfs_report(self, epoch):
        now = time.perf_counter()
        self._dlfs_last = now
        step, wait, steps, waits = self._dlfs_sums
        with self._dlfs_acc.get_lock():
            acc = (self._dlfs_acc[0], self._dlfs_acc[1], self._dlfs_acc[2])
        n, wall, cpu = (acc[i] - self._dlfs_taken[i] for i in range(3))
        if steps < 1 or n < 1:
            return
        self._dlfs_sums = [0.0, 0.0, 0, 0]
        self._dlfs_taken = acc
        batch = self.batch_size or max(1, round(n / steps))
        line = ("report job=%s rank=%d epoch=%d batch=%d workers=%d prefetch=%d step=%.6f wait=%.6f decode=%.6f cpu=%.6f samples=%d pid=%d"
                % (self._dlfs_job, self._dlfs_rank, epoch, batch, self.num_workers,
                   (self.prefetch_factor or 2) if self.num_workers > 0 else 2,
                   step / steps, wait / waits if waits else 0.0, wall / n, min(cpu, wall) / n, int(n), os.getpid()))
        if self._dlfs_start > 0:
            line += " start=%.6f" % self._dlfs_start
            self._dlfs_start = 0.0
        try:
            line += " length=%d" % (len(self) * batch)
        except TypeError:
            pass
        try:
            with open(os.path.join(self._dlfs_mount, CONTROL_NAME, "control"), "w") as f:
                f.write(line + "\n")
        except OSError as e:
            _warn_once(("report", self._dlfs_mount), "dlfs: reporting to %s failed: %s (%s)" % (self._dlfs_mount, e, line))

    def __iter__(self):
        if self._dlfs_mount is None:
            return super().__iter__()
        self._dlfs_apply()
        epoch = self._dlfs_epoch()
        self._dlfs_epochs += 1
        began = time.perf_counter()
        return _Measured(self, super().__iter__(), epoch, began)
