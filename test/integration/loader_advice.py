"""Runs a dlfs.DataLoader over an ImageFolder with a stand-in model (a sleep
per batch) and a stand-in decode (CPU spent per sample), and prints one JSON
line per epoch: the epoch, the workers it ran with and the advice it took.

Used by TestLoaderAdvice (allocation_test.go)."""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402
import torchvision  # noqa: E402

import dlfs  # noqa: E402


def spend(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class Decode:
    def __init__(self, cpu):
        self.cpu = cpu

    def __call__(self, path):
        with open(path, "rb") as f:
            n = len(f.read())
        spend(self.cpu)
        return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--step", type=float, required=True, help="seconds of stand-in model per batch")
    ap.add_argument("--decode", type=float, default=0.0005, help="CPU seconds per sample")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--interval", type=float, default=0.5)
    a = ap.parse_args()
    ds = torchvision.datasets.ImageFolder(a.data, loader=Decode(a.decode))
    loader = dlfs.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers, job=a.job,
                             report_interval=a.interval)
    print(json.dumps({"wrapped": type(loader.dataset).__name__, "classes": len(loader.dataset.classes)}), flush=True)
    for epoch in range(a.epochs):
        n = 0
        for sizes, _ in loader:
            n += len(sizes)
            time.sleep(a.step)
        print(json.dumps({"epoch": epoch, "samples": n, "workers": loader.num_workers,
                          "prefetch_factor": loader.prefetch_factor, "advice": loader.last_advice}), flush=True)


if __name__ == "__main__":
    main()
