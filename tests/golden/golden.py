"""Shared writer for golden files: run the gen_*.py scripts with Debian's python3-torch
(/usr/bin/python3); they write tests/golden/<name>.json, which are committed."""
import json
import math
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
        # JSON has no NaN or infinity: those go as the strings "nan", "inf", "-inf"
        data = [v if math.isfinite(v) else repr(v) for v in t.flatten().to(torch.float64).tolist()]
    return {"shape": list(t.shape), "dtype": dtype, "data": data}


def write(name, values, one_per_line=False):
    """values: dict name -> tensor (or str). Writes tests/golden/<name>.json, on one line or
    with one entry a line (diffs then show which entries changed)."""
    path = os.path.join(HERE, name + ".json")
    entries = {k: entry(v) for k, v in values.items()}
    with open(path, "w") as f:
        if one_per_line:
            f.write("{\n" + ",\n".join(json.dumps(k) + ":" + json.dumps(v, separators=(",", ":"))
                                       for k, v in entries.items()) + "\n}")
        else:
            json.dump(entries, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", path, len(values), "values")
