"""A stand-in training job for dlfsbench's allocation suite (issue 15).

A dlfs.DataLoader over an ImageFolder, batches of --batch, a stand-in
model (a sleep of --step seconds per batch) and a stand-in decode (--decode
CPU seconds per sample, spent in the workers). Epoch e reads --epoch-files
samples starting at e * --epoch-files, shuffled, so every epoch reads from
the PFS (a stream of new data, as a dataset larger than the node's memory
gives). It runs epochs until --seconds have passed and writes one JSON line
per epoch to --out: its start, its first batch and its end (seconds since
--t0), samples, the workers it ran with and the samples/s the advice
predicted for them.
With --end it writes "end job=NAME" to the control file when done."""

import argparse
import json
import os
import sys
import time

import torch
import torchvision

sys.path.insert(0, os.environ["DLFS_PYTHON"])
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


class Chunks(torch.utils.data.Sampler):
    """Epoch e yields indices [e*k, (e+1)*k) modulo n, shuffled."""

    def __init__(self, n, k, seed):
        self.n, self.k, self.seed, self.epoch = n, k, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        base = self.epoch * self.k
        return iter([(base + int(i)) % self.n for i in torch.randperm(self.k, generator=g)])

    def __len__(self):
        return self.k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--step", type=float, required=True)
    ap.add_argument("--decode", type=float, required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--epoch-files", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--t0", type=float, required=True, help="time.time() the suite counts from")
    ap.add_argument("--out", required=True)
    ap.add_argument("--end", action="store_true")
    a = ap.parse_args()
    ds = torchvision.datasets.ImageFolder(a.data, loader=Decode(a.decode))
    sampler = Chunks(len(ds), a.epoch_files, 15)
    loader = dlfs.DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers, job=a.job,
                             report_interval=1.0)
    stop = time.time() + a.seconds
    with open(a.out, "w") as out:
        epoch = 0
        while time.time() < stop:
            sampler.set_epoch(epoch)
            t0, n, first = time.time(), 0, None
            for sizes, _ in loader:
                if first is None:
                    first = time.time()  # the workers have started
                n += len(sizes)
                time.sleep(a.step)
            adv = loader.last_advice or {}
            out.write(json.dumps({"epoch": epoch, "start": t0 - a.t0, "end": time.time() - a.t0, "samples": n,
                                  "first": (first or time.time()) - a.t0, "batch": a.batch, "workers": loader.num_workers,
                                  "predicted": adv.get("predicted_samples_per_second")}) + "\n")
            out.flush()
            epoch += 1
    if a.end:
        mount = dlfs.find_mount(a.data)
        with open(os.path.join(mount, ".dlfs", "control"), "w") as f:
            f.write("end job=%s\n" % a.job)


if __name__ == "__main__":
    main()
