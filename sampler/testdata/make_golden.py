#!/usr/bin/python3
"""Draw sampler orders with real torch and write them to golden.json.

Every case records the whole index list as the SHA-256 of its decimal
values joined by commas, plus its length and first ten values for
readable failures. Run with Debian's python3-torch:

    /usr/bin/python3 sampler/testdata/make_golden.py > sampler/testdata/golden.json
"""
import hashlib
import json
import sys

import torch
from torch.utils.data import DistributedSampler, RandomSampler


class Len:
    """A dataset of which samplers only need the length."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def record(kind, params, idx):
    idx = [int(i) for i in idx]
    return {
        "kind": kind,
        **params,
        "len": len(idx),
        "head": idx[:10],
        "sha256": hashlib.sha256(",".join(map(str, idx)).encode()).hexdigest(),
    }


def main():
    cases = []
    for n in [1, 2, 3, 10, 1000, 1_281_167]:
        for seed in [0, 1, 42, 2**32 + 5, 2**40 + 123, 2**64 - 1]:
            if n == 1_281_167 and seed not in (0, 2**32 + 5):
                continue
            g = torch.Generator()
            g.manual_seed(seed)
            cases.append(record("randperm", {"n": n, "seed": seed}, torch.randperm(n, generator=g).tolist()))

    dist = [
        # n, world, seed, epoch, shuffle, drop_last
        (1000, 4, 0, 0, True, False),
        (1000, 4, 7, 3, True, False),
        (1003, 4, 7, 3, True, False),
        (1003, 4, 7, 3, True, True),
        (10, 16, 5, 1, True, False),  # padding longer than the dataset
        (10, 16, 5, 1, True, True),   # every rank gets nothing
        (7, 3, 2**32 + 17, 2, False, False),
        (7, 3, 11, 0, False, True),
        (1_281_167, 8, 2**32 + 17, 5, True, False),
        (1_281_167, 7, 123, 0, True, True),
    ]
    for n, world, seed, epoch, shuffle, drop_last in dist:
        ranks = range(world) if n < 100_000 else [0, world - 1]
        for rank in ranks:
            s = DistributedSampler(Len(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
            s.set_epoch(epoch)
            params = {"n": n, "world": world, "rank": rank, "seed": seed, "epoch": epoch,
                      "shuffle": shuffle, "drop_last": drop_last}
            cases.append(record("distributed", params, list(s)))

    for n, seed in [(10, 3), (1000, 2**33 + 9), (50_000, 77)]:
        g = torch.Generator()
        g.manual_seed(seed)
        s = RandomSampler(Len(n), generator=g)
        for epoch in range(3):
            cases.append(record("random", {"n": n, "seed": seed, "epoch": epoch}, list(s)))

    json.dump({"torch": torch.__version__, "cases": cases}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
