#!/usr/bin/env python3
"""Joins ember_bench and bench_torch.py JSON outputs into one Markdown table: workload, threads,
Ember median, PyTorch median, ratio Ember/PyTorch (wall time), the same ratio of CPU time per step
(robust when other processes share the cores), GFLOP/s of both for GEMM-bound workloads next to
the plain sgemm rate at a comparable size, GB/s of both for bandwidth-bound ones (the bytes their
tensor passes must move) next to the triad's, and each side's peak RSS.

    bench/compare.py DIR_OR_JSON...   (every *.json in a directory; files name their side)
    bench/compare.py --runs DIR...    (each directory one run of bench/run.sh: medians over
                                       the runs, and the ratio of each run in a last column)

Workload 4, the whole copy-task run, comes from the trainers' own metrics.json files in
subdirectories run-<side>-t<threads>/ of a directory (examples/transformer_copy and
bench/pytorch/copy_task.py): two rows, the run's total wall time (CPU time and peak RSS of the
process) and the time inside training steps, and a line with both sides' exact-copy accuracy.
"""
import glob
import json
import os
import sys

# The sgemm reference row (Ember's cblas_sgemm at the same thread count) for each GEMM-bound
# workload: the size of its largest products.
SGEMM_REF = {
    "op/linear": "sgemm/1024x512x2048",
    "op/bmm": "sgemm/1024x512x512",
    "transformer/A": "sgemm/800x512x2048",
    "transformer/C": "sgemm/1024x512x2048",
}


TRIAD = "bandwidth/triad b += s*c (2^25 floats)"

RUN_TOTAL = "run/transformer_copy defaults, 20 epochs: whole run"
RUN_TRAIN = "run/transformer_copy defaults, 20 epochs: training steps"


def run_results(path):
    """The two workload-4 rows of one trainer's metrics.json in run-<side>-t<threads>/."""
    with open(path) as fh:
        m = json.load(fh)
    side, threads = os.path.basename(os.path.dirname(path)).split("-")[1:3]
    total = dict(name=RUN_TOTAL, median_s=m["total_seconds"], cpu_s=m.get("cpu_seconds"),
                 max_rss_kb=m.get("max_rss_mb", 0) * 1024, accuracy=m["exact_copy_accuracy"])
    train = dict(name=RUN_TRAIN, median_s=m["train_seconds"], cpu_s=None,
                 max_rss_kb=total["max_rss_kb"])
    return side, int(threads[1:]), [total, train]


def load(paths):
    rows = {}  # (name, threads) -> {side: result}
    order = []

    def add(side, threads, results):
        for r in results:
            key = (r["name"], threads)
            if key not in rows:
                rows[key] = {}
                order.append(key)
            rows[key][side] = r

    for p in paths:
        files = sorted(glob.glob(os.path.join(p, "*.json"))) if os.path.isdir(p) else [p]
        for f in files:
            with open(f) as fh:
                doc = json.load(fh)
            add(doc["side"], doc["threads"], doc["results"])
        if os.path.isdir(p):
            for f in sorted(glob.glob(os.path.join(p, "run-*-t*", "metrics.json"))):
                add(*run_results(f))
    return rows, order


def median(values):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    k = len(v)
    return v[k // 2] if k % 2 else 0.5 * (v[k // 2 - 1] + v[k // 2])


def combine_runs(dirs):
    """Rows of several runs: per side, the median over runs of the median and CPU time, the
    largest RSS; and per key the Ember/PyTorch ratio of each run that has both sides."""
    loaded = [load([d]) for d in dirs]
    rows, order, per_run = {}, [], {}
    for run_rows, run_order in loaded:
        for key in run_order:
            if key not in rows:
                rows[key] = {}
                order.append(key)
            sides = run_rows[key]
            for side, r in sides.items():
                rows[key].setdefault(side, []).append(r)
            if "ember" in sides and "pytorch" in sides:
                per_run.setdefault(key, []).append(
                    sides["ember"]["median_s"] / sides["pytorch"]["median_s"])
    merged = {}
    for key, sides in rows.items():
        merged[key] = {}
        for side, rs in sides.items():
            m = dict(rs[0])
            m["median_s"] = median(r["median_s"] for r in rs)
            m["cpu_s"] = median(r.get("cpu_s") for r in rs)
            m["max_rss_kb"] = max(r["max_rss_kb"] for r in rs)
            merged[key][side] = m
    return merged, order, per_run


def fmt_time(s):
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}" if s / scale < 100 else f"{s / scale:.0f} {unit}"
    return f"{s * 1e9:.0f} ns"


def gflops(r):
    return r["flops"] / r["median_s"] * 1e-9 if r and r.get("flops") else None


def gbytes(r):
    return r["bytes"] / r["median_s"] * 1e-9 if r and r.get("bytes") else None


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    per_run = None
    if argv[1] == "--runs":
        rows, order, per_run = combine_runs(argv[2:])
    else:
        rows, order = load(argv[1:])
    threads = sorted({t for _, t in order})
    names = []
    for n, _ in order:
        if n not in names:
            names.append(n)
    print("| workload | threads | Ember median | PyTorch median | Ember/PyTorch "
          "| CPU/step Ember / PyTorch | CPU ratio "
          "| GFLOP/s Ember / PyTorch / sgemm, or GB/s Ember / PyTorch / triad "
          "| max RSS MB Ember / PyTorch |"
          + (" ratio of each run |" if per_run is not None else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if per_run is not None else ""))
    for name in names:
        for t in threads:
            sides = rows.get((name, t))
            if not sides:
                continue
            e, p = sides.get("ember"), sides.get("pytorch")
            em, pm = (e or {}).get("median_s"), (p or {}).get("median_s")
            ratio = f"{em / pm:.2f}" if em and pm else "-"
            ec, pc = (e or {}).get("cpu_s"), (p or {}).get("cpu_s")
            cpu = f"{fmt_time(ec)} / {fmt_time(pc)}"
            cpu_ratio = f"{ec / pc:.2f}" if ec and pc else "-"
            rate = ""
            if gflops(e) or gflops(p):
                ref = next((v for k, v in SGEMM_REF.items() if name.startswith(k)), None)
                ref_rate = gflops(rows.get((ref, t), {}).get("ember")) if ref else None
                rate = " / ".join(f"{x:.1f}" if x else "-"
                                  for x in (gflops(e), gflops(p), ref_rate))
            elif gbytes(e) or gbytes(p):
                triad = gbytes(rows.get((TRIAD, t), {}).get("ember"))
                rate = " / ".join(f"{x:.1f}" if x else "-" for x in (gbytes(e), gbytes(p), triad))
                rate += " GB/s"
            rss = " / ".join(f"{r['max_rss_kb'] / 1024:.0f}" if r else "-" for r in (e, p))
            runs = ""
            if per_run is not None:
                runs = " " + " ".join(f"{x:.2f}" for x in per_run.get((name, t), [])) + " |"
            print(f"| {name} | {t} | {fmt_time(em)} | {fmt_time(pm)} | {ratio} | {cpu} "
                  f"| {cpu_ratio} | {rate} | {rss} |{runs}")
    for t in threads:
        sides = rows.get((RUN_TOTAL, t), {})
        if sides:
            acc = " / ".join(f"{sides[s]['accuracy']:.3f}" if s in sides else "-"
                             for s in ("ember", "pytorch"))
            print(f"\nWhole run at {t} thread(s): exact-copy accuracy over 200 fresh sequences, "
                  f"Ember / PyTorch: {acc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
