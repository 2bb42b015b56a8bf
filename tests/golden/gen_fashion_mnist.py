"""Reference numbers of Debian's dataset-fashion-mnist (tests/test_fashion_mnist.cpp), read from
the same gzipped IDX files with gzip and struct alone: per split, the counts, the first labels,
the label histogram, the byte sums of a few images and of the whole split, and one row of
pixels. Run with /usr/bin/python3; writes tests/golden/fashion_mnist.json."""
import gzip
import json
import os
import struct

ROOT = "/usr/share/datasets/fashion-mnist"
HERE = os.path.dirname(os.path.abspath(__file__))


def read(path, magic, rank):
    with gzip.open(path, "rb") as f:
        data = f.read()
    assert struct.unpack(">I", data[:4])[0] == magic
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    body = data[4 + 4 * rank:]
    n = 1
    for d in dims:
        n *= d
    assert len(body) == n
    return dims, body


def entry(values):
    return {"shape": [len(values)], "dtype": "int64", "data": list(values)}


out = {}
for split in ("train", "t10k"):
    (n, h, w), images = read(f"{ROOT}/{split}-images-idx3-ubyte.gz", 2051, 3)
    (m,), labels = read(f"{ROOT}/{split}-labels-idx1-ubyte.gz", 2049, 1)
    assert n == m and h == w == 28
    pixels = h * w
    picks = [0, 1, 2, n // 2, n - 1]
    out[f"{split}.size"] = entry([n])
    out[f"{split}.first_labels"] = entry(labels[:16])
    out[f"{split}.histogram"] = entry([labels.count(c) for c in range(10)])
    out[f"{split}.picks"] = entry(picks)
    out[f"{split}.pick_labels"] = entry([labels[i] for i in picks])
    out[f"{split}.pick_sums"] = entry([sum(images[i * pixels:(i + 1) * pixels]) for i in picks])
    out[f"{split}.total_sum"] = entry([sum(images)])
    # image 0's row 14, the middle of the garment
    out[f"{split}.row14"] = entry(images[14 * w:15 * w])

with open(os.path.join(HERE, "fashion_mnist.json"), "w") as f:
    f.write("{\n" + ",\n".join(json.dumps(k) + ":" + json.dumps(v, separators=(",", ":"))
                               for k, v in out.items()) + "\n}\n")
