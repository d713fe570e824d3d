#!/usr/bin/python3
"""Index ROOT with torchvision's ImageFolder and print what a training
script would see, as JSON: the classes, and for every sample its path
relative to ROOT, its target and the SHA-256 of its bytes as read by the
dataset's loader function. Run it over SOURCE and over the mount and compare.

usage: imagefolder_compare.py ROOT
"""
import hashlib
import json
import os
import sys

import torchvision


def raw_loader(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    root = sys.argv[1]
    ds = torchvision.datasets.ImageFolder(root, loader=raw_loader)
    samples = []
    for i, (path, target) in enumerate(ds.samples):
        data, t = ds[i]
        assert t == target
        samples.append([os.path.relpath(path, root), target, hashlib.sha256(data).hexdigest()])
    json.dump({"classes": ds.classes, "class_to_idx": ds.class_to_idx, "samples": samples}, sys.stdout)


if __name__ == "__main__":
    main()
