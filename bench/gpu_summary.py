#!/usr/bin/env python3
"""The figures of issue 35's speed section from one tools/gpu-check.sh run: the JSON files that
ember_bench --device cuda and bench_torch.py --device cuda wrote into DIR (ember*.json,
torch*.json), as one Markdown table and the checks beside it.

    bench/gpu_summary.py DIR

Rows: each transformer workload, Ember's median step (Float32, and bfloat16 products), PyTorch
eager's (Float32, torch.autocast bfloat16) and torch.compile's, and Ember / PyTorch eager. Then
step C's share of its products' throughput (the products alone, replayed through cuBLAS, against
the whole step: issue 35 asks >= 0.8), and what a steady step asked of the device (cudaMalloc
calls, host waits).
"""
import glob
import json
import os
import sys


def load(pattern):
    out = {}
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            doc = json.load(f)
        out[os.path.basename(path)[:-5]] = doc
    return out


def medians(doc):
    return {r["name"]: r for r in doc.get("results", [])} if doc else {}


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    d = sys.argv[1]
    runs = load(os.path.join(d, "ember*.json"))
    runs.update(load(os.path.join(d, "torch*.json")))
    if not runs:
        print(f"gpu_summary: no ember*.json or torch*.json in {d}", file=sys.stderr)
        return 1
    ember, ember_bf16 = medians(runs.get("ember")), medians(runs.get("ember_bf16"))
    eager, autocast = medians(runs.get("torch")), medians(runs.get("torch_autocast"))
    compiled = medians(runs.get("torch_compile"))
    first = next(iter(runs.values()))
    print(f"GPU: {first.get('gpu', '?')}; PyTorch {runs.get('torch', {}).get('torch', '?')}\n")
    print("| workload | Ember | Ember bf16 | PyTorch eager | PyTorch autocast bf16 | "
          "torch.compile | Ember / eager | Ember bf16 / autocast |")
    print("|---|---|---|---|---|---|---|---|")

    def ms(table, name):
        r = table.get(name)
        return f"{r['median_s'] * 1e3:.3f} ms" if r else "-"

    def ratio(a, b, name):
        if name in a and name in b:
            return f"{a[name]['median_s'] / b[name]['median_s']:.2f}"
        return "-"

    names = [n for n in ember if "products alone" not in n]
    for n in names:
        print(f"| {n} | {ms(ember, n)} | {ms(ember_bf16, n)} | {ms(eager, n)} | "
              f"{ms(autocast, n)} | {ms(compiled, n)} | {ratio(ember, eager, n)} | "
              f"{ratio(ember_bf16, autocast, n)} |")
    print()
    for n in names:
        alone = ember.get(f"{n} products alone")
        if alone:
            share = alone["median_s"] / ember[n]["median_s"]
            print(f"{n}: products alone {alone['median_s'] * 1e3:.3f} ms, the whole step "
                  f"{ember[n]['median_s'] * 1e3:.3f} ms: {share:.2f} of the products' "
                  f"throughput (goal >= 0.80)")
    for n in names:
        books = ember[n].get("device")
        if books:
            print(f"{n}: per step {books['kernels_per_step']:.0f} kernels, "
                  f"{books['products_per_step']:.0f} products, "
                  f"{books['host_waits_per_step']:.1f} host waits; "
                  f"{books['driver_allocs_in_steady_steps']} cudaMalloc in 5 steady steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
