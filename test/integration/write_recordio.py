#!/usr/bin/python3
"""Write an MXNet RecordIO dataset the way im2rec does, without mxnet:
OUT.rec holds one record per image, each an IRHeader (flag, label, id,
id2; struct 'IfQQ') followed by the image bytes, framed as dmlc-core's
RecordIOWriter frames it (magic 0xced7230a, lrecord = cflag << 29 | length,
data padded to 4 bytes, and a record split wherever its data holds the
magic at a 4-byte-aligned offset). OUT.idx lists "id<TAB>offset" per line.

Prints, as JSON, what dlfs should show: {"LABEL/ID.jpg": sha256 of the
image bytes}.

usage: write_recordio.py OUT N CLASSES
"""
import hashlib
import json
import random
import struct
import sys

MAGIC = 0xCED7230A


def frame(data):
    """dmlc::RecordIOWriter::WriteRecord."""
    out = b""
    magic = struct.pack("<I", MAGIC)
    dptr = 0
    for i in range(0, len(data) // 4 * 4, 4):
        if data[i:i + 4] == magic:
            flag = 1 if dptr == 0 else 2
            out += magic + struct.pack("<I", flag << 29 | (i - dptr)) + data[dptr:i]
            dptr = i + 4
    flag = 3 if dptr else 0
    out += magic + struct.pack("<I", flag << 29 | (len(data) - dptr)) + data[dptr:]
    return out + b"\0" * ((4 - len(data) % 4) % 4)


def main():
    out, n, classes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(7)
    want = {}
    with open(out + ".rec", "wb") as rec, open(out + ".idx", "w") as idx:
        for i in range(n):
            label = i % classes
            img = b"\xff\xd8\xff\xe0" + bytes(rng.getrandbits(8) for _ in range(rng.randint(100, 3000)))
            if i == 3:  # an image holding the magic at an aligned offset: a split record
                img = img[:8] + struct.pack("<I", MAGIC) + img[12:]
            header = struct.pack("<IfQQ", 0, float(label), i, 0)
            idx.write("%d\t%d\n" % (i, rec.tell()))
            rec.write(frame(header + img))
            want["%d/%d.jpg" % (label, i)] = hashlib.sha256(img).hexdigest()
    json.dump(want, sys.stdout)


if __name__ == "__main__":
    main()
