#!/usr/bin/python3
"""An ordinary ImageFolder + DistributedSampler + DataLoader training loop,
reading through dlfs. The only dlfs-specific line is the sampler class.

    python3 examples/train_imagefolder.py --data /mnt/dlfs/train --epochs 2

Run it under torchrun (or set RANK and WORLD_SIZE) for several ranks.
--raw skips image decoding (for synthetic datasets of random bytes);
--no-isatty opens each sample as Python 3.14's open() does, without the
isatty() check that costs a FUSE round trip per file;
--balance locality|solar uses dlfs.LocalityBatchSampler, so each rank
trains on what its node caches (every global batch stays torch's), and
--dist joins torch.distributed (gloo; MASTER_ADDR and MASTER_PORT) so the
ranks check that they follow one plan;
--record FILE writes, per epoch, the samples in the order the loader
delivered them, by batch, with a CRC-32 of each sample's bytes under
--raw, and torch's own global batches (the tests compare them with dlfs's
plan and with torch).
"""
import argparse
import io
import json
import os
import sys
import time
import zlib

import torch
import torchvision
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dlfs  # noqa: E402


def cpu_ticks():
    """The machine's CPU time so far (total, idle) from /proc/stat, or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[3] + v[4]
    except (OSError, ValueError, IndexError):
        return None


def raw_loader(path):
    with open(path, "rb") as f:
        return f.read()


def raw_loader_no_isatty(path):
    """raw_loader as Python 3.14's open() runs it: with a buffer size
    given, open() skips its isatty() check, an ioctl that a FUSE mount
    sends to its daemon for every file (3.14 skips it for regular files)."""
    with open(path, "rb", buffering=io.DEFAULT_BUFFER_SIZE) as f:
        return f.read()


def pil_loader_no_isatty(path):
    """torchvision's default loader, opened as raw_loader_no_isatty opens."""
    from PIL import Image
    with open(path, "rb", buffering=io.DEFAULT_BUFFER_SIZE) as f:
        return Image.open(f).convert("RGB")


class Indexed(torch.utils.data.Dataset):
    """Wraps a dataset to return (size of the sample's bytes, index, CRC-32
    of the bytes under --raw, else 0)."""

    def __init__(self, ds):
        self.ds = ds
        self.root = ds.root
        self.samples = ds.samples  # (path, class) pairs: dlfs.LocalityBatchSampler maps its plan with them

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        data, _ = self.ds[i]
        if isinstance(data, bytes):
            return len(data), i, zlib.crc32(data)
        return int(data.numel()), i, 0


class Decoy(torch.utils.data.Sampler):
    """Starts as DistributedSampler(seed) does, then leaves its order."""

    def __init__(self, data, world, rank, seed, head):
        self.inner = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=rank, seed=seed)
        self.head = head

    def set_epoch(self, epoch):
        self.inner.set_epoch(epoch)

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        idx = list(self.inner)
        rest = idx[self.head:]
        g = torch.Generator()
        g.manual_seed(987654)
        yield from idx[:self.head]
        yield from (rest[i] for i in torch.randperm(len(rest), generator=g).tolist())


def torch_global_batches(data, world, seed, epoch, batch):
    """torch's global batches: batch k of every rank of a stock
    DistributedSampler, together, as sorted index lists."""
    per_rank = []
    for r in range(world):
        s = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=r, shuffle=True, seed=seed)
        s.set_epoch(epoch)
        idx = list(s)
        per_rank.append([idx[i:i + batch] for i in range(0, len(idx), batch)])
    return [sorted(sum((b[k] for b in per_rank), [])) for k in range(len(per_rank[0]))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--start-epoch", type=int, default=0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--job", default="default")
    ap.add_argument("--raw", action="store_true")
    ap.add_argument("--step-ms", type=float, default=0, help="stand-in for the model's step: sleep this long per batch")
    ap.add_argument("--sampler", choices=["dlfs", "torch", "none", "decoy"], default="dlfs",
                    help="dlfs.DistributedSampler (announces the job), torch's DistributedSampler (no control line), "
                         "none: the DataLoader's own SequentialSampler (shuffle=False, no control line), or decoy: "
                         "torch's DistributedSampler order for the first two batches, then another order (to test a wrong guess)")
    ap.add_argument("--balance", choices=["locality", "solar"])
    ap.add_argument("--epochorder", action="store_true")
    ap.add_argument("--dist", action="store_true", help="join torch.distributed (gloo)")
    ap.add_argument("--timeout", type=float, default=60, help="seconds to wait for dlfs's plan of an epoch")
    ap.add_argument("--record")
    ap.add_argument("--no-isatty", action="store_true",
                    help="open each sample as Python 3.14 does, without the isatty() ioctl of 3.11-3.13's open()")
    args = ap.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.raw:
        ds = torchvision.datasets.ImageFolder(args.data, loader=raw_loader_no_isatty if args.no_isatty else raw_loader)
    else:
        t = torchvision.transforms
        extra = {"loader": pil_loader_no_isatty} if args.no_isatty else {}
        ds = torchvision.datasets.ImageFolder(args.data, transform=t.Compose([t.Resize(256), t.CenterCrop(224), t.ToTensor()]), **extra)
    data = Indexed(ds)
    if args.dist:
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    if args.balance:
        sampler = dlfs.LocalityBatchSampler(data, args.batch, num_replicas=world, rank=rank, seed=args.seed,
                                            balance=args.balance, epochorder=args.epochorder, job=args.job,
                                            num_workers=args.workers, timeout=args.timeout,
                                            start_epoch=args.start_epoch)
        loader = DataLoader(data, batch_sampler=sampler, num_workers=args.workers)
    elif args.sampler == "none":
        sampler = None
        loader = DataLoader(data, batch_size=args.batch, shuffle=False, num_workers=args.workers)
    else:
        if args.sampler == "torch":
            sampler = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=rank, seed=args.seed)
        elif args.sampler == "decoy":
            sampler = Decoy(data, world, rank, args.seed, 2 * args.batch)
        else:
            sampler = dlfs.DistributedSampler(data, num_replicas=world, rank=rank, seed=args.seed, job=args.job,
                                              batch_size=args.batch, num_workers=args.workers,
                                              start_epoch=args.start_epoch)
        loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.workers)
    record = []
    for epoch in range(args.start_epoch, args.start_epoch + args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        cpu0 = cpu_ticks()
        start, n, nbytes, order, batches, crcs = time.time(), 0, 0, [], [], []
        for sizes, idx, crc in loader:
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            n += len(idx)
            nbytes += int(sizes.sum())
            order.extend(int(i) for i in idx)
            batches.append([int(i) for i in idx])
            crcs.extend(int(c) for c in crc)
        dt = time.time() - start
        if args.dist:
            torch.distributed.barrier()  # the epoch ends when every rank is done
            dt = time.time() - start
        print("rank %d epoch %d: %d samples, %.1f MB in %.2f s (%.0f samples/s)" % (rank, epoch, n, nbytes / 1e6, dt, n / dt), flush=True)
        cpu1 = cpu_ticks()
        busy = None
        if cpu0 and cpu1 and cpu1[0] > cpu0[0]:
            busy = 1 - (cpu1[1] - cpu0[1]) / (cpu1[0] - cpu0[0])
        rec = {"epoch": epoch, "seconds": dt, "samples": n, "bytes": nbytes, "cpu_busy": busy,
               "order": [ds.samples[i][0] for i in order]}
        if args.record and args.balance:
            rec["batches"] = [[ds.samples[i][0] for i in b] for b in batches]
            rec["crc"] = crcs
            rec["source"] = sampler.last_source
            rec["global"] = [[ds.samples[i][0] for i in b]
                             for b in torch_global_batches(data, world, args.seed, epoch, args.batch)]
        record.append(rec)
    if args.record:
        with open(args.record, "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    main()
