#!/usr/bin/env python3
"""The products table of issue 48 from bench/products.sh's JSON files: one markdown table per
thread count, a row per products/ shape, the GFLOP/s median over the reps of Ember's product layer
with its own choice of library (auto) and with each library forced (EMBER_BLAS), of torch.mm
(MKL), and auto's GFLOP/s over torch's; above them the CPU (lscpu's model name, family and model
from /proc/cpuinfo).

    python3 bench/products_table.py DIR    (DIR holds <column>-t<threads>-r<rep>.json)
"""
import glob
import json
import os
import re
import subprocess
import sys

COLUMNS = ["auto", "openblas", "blis", "dnnl", "torch"]
HEADINGS = {"auto": "auto", "openblas": "openblas", "blis": "blis", "dnnl": "dnnl",
            "torch": "torch (MKL)"}


def median(values):
    v = sorted(values)
    k = len(v)
    return v[k // 2] if k % 2 else 0.5 * (v[k // 2 - 1] + v[k // 2])


def cpu_name():
    """'<lscpu model name> (<vendor> family F model M)', from what this machine says."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = re.search(r"^Model name:\s*(.+)$", lscpu, re.M).group(1).strip()
    except (OSError, AttributeError):
        name = "unknown CPU"
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if not line.strip():
                    break  # the first processor's block is enough
                info.setdefault(key, value.strip())
    except OSError:
        pass
    family = info.get("cpu family", "?")
    model = info.get("model", "?")
    vendor = info.get("vendor_id", "")
    return f"{name} ({vendor} family {family} model {model}), {os.cpu_count()} logical CPUs"


def load(directory):
    """{threads: {column: {name: [GFLOP/s per rep]}}}, the row order, and the runs' documents."""
    table, order, docs = {}, [], {}
    pattern = re.compile(r"^(\w+)-t(\d+)-r(\d+)\.json$")
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        match = pattern.match(os.path.basename(path))
        if not match or match.group(1) not in COLUMNS:
            continue
        column, threads = match.group(1), int(match.group(2))
        with open(path) as f:
            doc = json.load(f)
        docs.setdefault(column, []).append(doc)
        for r in doc["results"]:
            if not r["name"].startswith("products/") or not r["flops"] or r["median_s"] <= 0:
                continue
            rates = table.setdefault(threads, {}).setdefault(column, {})
            rates.setdefault(r["name"], []).append(r["flops"] / r["median_s"] * 1e-9)
            if r["name"] not in order:
                order.append(r["name"])
    return table, order, docs


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    table, order, docs = load(sys.argv[1])
    if not table:
        sys.exit(f"products_table.py: no <column>-t<threads>-r<rep>.json in {sys.argv[1]}")
    print(f"CPU: {cpu_name()}")
    if "torch" in docs:
        print(f"PyTorch {docs['torch'][0].get('torch', '?')} (torch.mm into a preallocated out)")
    # the library each Ember column ran on, as ember_bench's JSON says (blas_info; every run of a
    # column should say the same: a forced library that is missing falls back with a warning)
    for column in COLUMNS[:4]:
        said = sorted({d.get("blas_info", d.get("blas", "")) for d in docs.get(column, [])} - {""})
        if said:
            print(f"- {column}: {' / '.join(said)}"
                  + (" (NOT THE SAME IN EVERY RUN)" if len(said) > 1 else ""))
    for threads in sorted(table):
        columns = table[threads]
        reps = max((len(v) for c in columns.values() for v in c.values()), default=0)
        print()
        print(f"{threads} thread(s), GFLOP/s, median of {reps} rep(s)")
        print()
        print("| shape | " + " | ".join(HEADINGS[c] for c in COLUMNS) + " | auto / torch |")
        print("|---|" + "---:|" * (len(COLUMNS) + 1))
        for name in order:
            rates = {c: median(columns[c][name]) for c in COLUMNS
                     if c in columns and name in columns[c]}
            cells = [f"{rates[c]:.1f}" if c in rates else "—" for c in COLUMNS]
            ratio = (f"{rates['auto'] / rates['torch']:.2f}"
                     if "auto" in rates and "torch" in rates else "—")
            print(f"| {name[len('products/'):]} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main()
