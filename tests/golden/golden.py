"""Shared writer for golden files: run the gen_*.py scripts with Debian's python3-torch
(/usr/bin/python3); they write tests/golden/<name>.json, which are committed."""
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def entry(t):
    if isinstance(t, str):
        return {"text": t}
    t = torch.as_tensor(t).detach()
    if t.dtype == torch.bool:
        dtype = "bool"
        data = t.flatten().to(torch.int64).tolist()
    elif t.dtype in (torch.int64, torch.int32):
        dtype = "int64"
        data = t.flatten().to(torch.int64).tolist()
    else:
        dtype = "float64"
        data = t.flatten().to(torch.float64).tolist()
    return {"shape": list(t.shape), "dtype": dtype, "data": data}


def write(name, values):
    """values: dict name -> tensor (or str). Writes tests/golden/<name>.json."""
    path = os.path.join(HERE, name + ".json")
    with open(path, "w") as f:
        json.dump({k: entry(v) for k, v in values.items()}, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", path, len(values), "values")
