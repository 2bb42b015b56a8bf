"""safetensors interop with Python, both directions, without the `safetensors` package (not in
Debian): the format is written and read by hand, byte for byte as the reference implementation
(huggingface/safetensors) lays it out.

  /usr/bin/python3 tests/golden/gen_safetensors.py
      writes interop.safetensors (tensors sorted by alignment then name, as safetensors'
      `prepare`) and interop.json (the same values for the C++ test to compare with).
  /usr/bin/python3 tests/golden/gen_safetensors.py --verify FILE
      reads FILE (e.g. one saved by Ember's test) and checks it holds exactly those tensors.
"""
import json
import os
import struct
import sys

import torch

from golden import HERE, write

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.bool: "BOOL"}
FROM_NAME = {v: k for k, v in DTYPES.items()}


def interop_tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "encoder.layers.0.weight": torch.randn(3, 4, generator=g, dtype=torch.float32),
        "encoder.layers.0.bias": torch.randn(3, generator=g, dtype=torch.float32),
        "encoder.layers.1.weight": torch.randn(2, 3, generator=g, dtype=torch.float32),
        "encoder.norm.a_2": torch.tensor([1.5, -0.25], dtype=torch.float64),
        "pe": torch.randn(1, 5, 2, generator=g, dtype=torch.float64),
        "steps": torch.tensor([3, -7, 1 << 40], dtype=torch.int64),
        "mask": torch.tensor([[True, False, True], [False, False, True]]),
        "scalar": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, 4, dtype=torch.float32),
    }


def save_file(tensors, path, metadata=None):
    # safetensors' prepare(): sort by dtype alignment (largest first), then by name
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in order:
        t = tensors[name].contiguous()
        data = t.numpy().tobytes()  # little-endian on this host
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def load_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header past end of file"
    header = json.loads(raw[8:8 + n].decode())
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    spans, out = [], {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        dtype = FROM_NAME[e["dtype"]]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype) if end > begin else \
            torch.zeros(0, dtype=dtype)
        out[name] = t.reshape(e["shape"])
        spans.append((begin, end))
    spans.sort()
    at = 0
    for begin, end in spans:  # the tensors tile the data section: no overlap, no gap
        assert begin == at, f"gap or overlap at {begin}"
        at = end
    assert at == len(data), "trailing bytes"
    return out, meta


def main():
    expected = interop_tensors()
    if len(sys.argv) == 3 and sys.argv[1] == "--verify":
        got, meta = load_file(sys.argv[2])
        assert set(got) == set(expected), (sorted(got), sorted(expected))
        for name, t in expected.items():
            assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
            assert torch.equal(got[name], t), name
        print("verified", sys.argv[2], len(got), "tensors, metadata", meta)
        return
    path = os.path.join(HERE, "interop.safetensors")
    save_file(expected, path, metadata={"format": "pt"})
    got, _ = load_file(path)
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    print("wrote", path)
    write("interop", expected)


if __name__ == "__main__":
    main()
