#!/usr/bin/python3
"""The copy task's exact-copy accuracy over seeds, Ember against PyTorch (docs/examples.md).

One seed says little about the copy task: at the default settings training ends at the peak of
the learning-rate schedule and the accuracy of one run follows its last few steps. This script
runs `examples/transformer_copy` and `bench/pytorch/copy_task.py` once per seed and side, each
run at 1 thread pinned to one core (`taskset`), as many runs at a time as --cores lists, and
keeps OUT/{ember,torch}-sSEED/metrics.json (runs already there are not run again, so a
measurement can be stopped and resumed). Then it prints, per side: runs, mean, median and lowest
accuracy, and the median over runs of the last five epochs' mean evaluation loss; and a
two-sided rank test of the accuracies (Mann-Whitney U, p by 20000 permutations).

    bench/copy_seeds.py --seeds 0-19 --out /tmp/seeds            # default config, ~7 min a run
    bench/copy_seeds.py --seeds 0-39 --out /tmp/small -- \
        --layers 2 --d-model 64 --d-ff 256 --heads 4      # the small model, ~15 s a run
    bench/copy_seeds.py --out /tmp/seeds --summary                # print only

Arguments after `--` go to both trainers. Needs Debian's python3-torch (bench/run.sh installs
it) and a Release build of transformer_copy (BUILD_DIR/examples, --build, default build).
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = ("ember", "torch")


def seed_list(text):
    seeds = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def command(side, seed, run_dir, build, extra):
    args = ["--seed", str(seed), "--threads", "1", "--out", run_dir] + extra
    if side == "ember":
        return [os.path.join(build, "examples", "transformer_copy")] + args
    return ["/usr/bin/python3", os.path.join(ROOT, "bench", "pytorch", "copy_task.py")] + args


def run_all(jobs, cores):
    """Runs (side, seed, argv, run_dir) jobs, one per free core in `cores`."""
    free = list(cores)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    def one(job):
        side, seed, argv, run_dir = job
        core = free.pop()
        try:
            os.makedirs(run_dir, exist_ok=True)
            with open(os.path.join(run_dir, "log.txt"), "w") as log:
                code = subprocess.call(["taskset", "-c", str(core)] + argv, env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
            status = "done" if code == 0 else f"exit {code}, see {run_dir}/log.txt"
            print(f"{side} seed {seed}: {status}", flush=True)
        finally:
            free.append(core)

    with ThreadPoolExecutor(max_workers=len(cores)) as pool:
        list(pool.map(one, jobs))


def load(out):
    """{side: {seed: (accuracy, mean evaluation loss of the last five epochs)}} from OUT."""
    runs = {side: {} for side in SIDES}
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        side, _, seed = name.partition("-s")
        path = os.path.join(out, name, "metrics.json")
        if side in runs and seed.isdigit() and os.path.exists(path):
            with open(path) as f:
                m = json.load(f)
            last5 = statistics.mean(m["eval_loss"][-5:])
            runs[side][int(seed)] = (m["exact_copy_accuracy"], last5)
    return runs


def rank_test(a, b, permutations=20000):
    """Mann-Whitney U of a over b (ties count 1/2) and its two-sided permutation p-value."""
    values = a + b
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # average ranks over ties
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    n1, n2 = len(a), len(b)
    u_of = lambda idx: sum(ranks[k] for k in idx) - n1 * (n1 + 1) / 2  # noqa: E731
    u = u_of(range(n1))
    centre, rng, hits = n1 * n2 / 2, random.Random(0), 0
    indices = list(range(n1 + n2))
    for _ in range(permutations):
        rng.shuffle(indices)
        hits += abs(u_of(indices[:n1]) - centre) >= abs(u - centre) - 1e-9
    return u, hits / permutations


def summary(out):
    runs = load(out)
    print("side   runs   mean median lowest  eval loss, last 5 epochs (median of runs)")
    for side in SIDES:
        acc = [v[0] for v in runs[side].values()]
        if acc:
            loss = statistics.median(v[1] for v in runs[side].values())
            print(f"{side:6} {len(acc):4d} {statistics.mean(acc):6.3f} "
                  f"{statistics.median(acc):6.3f} {min(acc):6.3f}  {loss:.4f}")
    e, t = ([v[0] for v in runs[s].values()] for s in SIDES)
    if len(e) > 1 and len(t) > 1:
        u, p = rank_test(e, t)
        print(f"U(Ember over PyTorch) = {u:g} of {len(e) * len(t)}, "
              f"two-sided permutation p = {p:.2f}")


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-19", help="e.g. 0-19 or 0,3,5-9")
    parser.add_argument("--sides", default="ember,torch")
    parser.add_argument("--cores", help="cores to pin runs to, e.g. 0,1 (default: all)")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--summary", action="store_true", help="only print the summary of OUT")
    args = parser.parse_args(argv)
    unknown = set(args.sides.split(",")) - set(SIDES)
    if unknown:
        parser.error(f"--sides: unknown {', '.join(sorted(unknown))}; the sides are ember, torch")
    if not args.summary:
        cores = ([int(c) for c in args.cores.split(",")] if args.cores
                 else sorted(os.sched_getaffinity(0)))
        jobs = []
        for seed in seed_list(args.seeds):
            for side in args.sides.split(","):
                run_dir = os.path.join(args.out, f"{side}-s{seed}")
                if not os.path.exists(os.path.join(run_dir, "metrics.json")):
                    argv_run = command(side, seed, run_dir, args.build, extra)
                    jobs.append((side, seed, argv_run, run_dir))
        run_all(jobs, cores)
    summary(args.out)


if __name__ == "__main__":
    main()
