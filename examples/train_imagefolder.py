#!/usr/bin/python3
"""An ordinary ImageFolder + DistributedSampler + DataLoader training loop,
reading through dlfs. The only dlfs-specific line is the sampler class.

    python3 examples/train_imagefolder.py --data /mnt/dlfs/train --epochs 2

Run it under torchrun (or set RANK and WORLD_SIZE) for several ranks.
--raw skips image decoding (for synthetic datasets of random bytes);
--record FILE writes, per epoch, the dataset indices in the order the
loader delivered them (the tests compare them with dlfs's plan).
"""
import argparse
import json
import os
import sys
import time

import torch
import torchvision
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dlfs  # noqa: E402


def raw_loader(path):
    with open(path, "rb") as f:
        return f.read()


class Indexed(torch.utils.data.Dataset):
    """Wraps a dataset to return (size of the sample's bytes, index)."""

    def __init__(self, ds):
        self.ds = ds
        self.root = ds.root

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        data, _ = self.ds[i]
        n = len(data) if isinstance(data, bytes) else int(data.numel())
        return n, i


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
    ap.add_argument("--record")
    args = ap.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.raw:
        ds = torchvision.datasets.ImageFolder(args.data, loader=raw_loader)
    else:
        t = torchvision.transforms
        ds = torchvision.datasets.ImageFolder(args.data, transform=t.Compose([t.Resize(256), t.CenterCrop(224), t.ToTensor()]))
    data = Indexed(ds)
    sampler = dlfs.DistributedSampler(data, num_replicas=world, rank=rank, seed=args.seed, job=args.job,
                                      batch_size=args.batch, num_workers=args.workers)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.workers)
    record = []
    for epoch in range(args.start_epoch, args.start_epoch + args.epochs):
        sampler.set_epoch(epoch)
        start, n, nbytes, order = time.time(), 0, 0, []
        for sizes, idx in loader:
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            n += len(idx)
            nbytes += int(sizes.sum())
            order.extend(int(i) for i in idx)
        dt = time.time() - start
        print("rank %d epoch %d: %d samples, %.1f MB in %.2f s (%.0f samples/s)" % (rank, epoch, n, nbytes / 1e6, dt, n / dt), flush=True)
        record.append({"epoch": epoch, "seconds": dt, "samples": n, "bytes": nbytes,
                       "order": [ds.samples[i][0] for i in order]})
    if args.record:
        with open(args.record, "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    main()
