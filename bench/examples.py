#!/usr/bin/python3
"""The example trainers side by side: Ember against PyTorch on the same work, whole programs.

Rows (issue 17): the char-level GPT's training iteration (examples/char_lm against
bench/pytorch/char_lm.py, nanoGPT's CPU config, ms per iteration over --char-lm-iters
iterations, evaluations excluded) and G2P's training step (examples/g2p against
bench/pytorch/g2p.py at the default config, tokens per second over the first --g2p-steps
steps of an epoch, nothing evaluated). Every side runs --repeat times at each thread count, the
sides taking turns run by run so a burst of load hits all of them; the table gives the median
of each side, the ratio of medians against the fastest PyTorch (time: Ember / PyTorch, lower is
better for Ember) and each program's peak RSS (the largest of its runs, from wait4).

    bench/examples.py --build build --torch-python /usr/bin/python3 \\
        [--torch-python /path/to/venv/bin/python] [--threads 1 2] [--repeat 3] [--bf16]

--bf16 adds Ember with --matmul-precision medium and each PyTorch under --autocast (bfloat16
products): a second ratio compares Ember medium with the fastest PyTorch of either precision.

Threads as bench/run.sh: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and EMBER_NUM_THREADS and the
programs' own --threads; from 2 threads every side runs both with OpenMP's default wait policy
and with OMP_WAIT_POLICY=PASSIVE, and the table gives each side at its better one.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env):
    """Runs cmd; returns (its stdout, its peak RSS in MB). Exits on failure."""
    with tempfile.TemporaryFile("w+") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read()
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{text[-2000:]}")
    return text, usage.ru_maxrss / 1024


def char_lm(side, a, threads, out):
    common = ["--threads", str(threads), "--iters", str(a.char_lm_iters), "--eval-interval",
              str(a.char_lm_iters), "--eval-iters", "1", "--out", out]
    if side is None:
        cmd = [os.path.join(a.build, "examples", "char_lm")] + common
    else:
        cmd = [side, "bench/pytorch/char_lm.py"] + common
    return cmd, lambda text: json.load(open(os.path.join(out, "metrics.json")))["ms_per_iter"]


def g2p(side, a, threads, out):
    steps = str(a.g2p_steps)
    if side is None:
        cmd = [os.path.join(a.build, "examples", "g2p"), "--threads", str(threads), "--max-steps",
               steps, "--log-every", steps, "--out", out]
    else:
        cmd = [side, "bench/pytorch/g2p.py", "--threads", str(threads), "--max-steps", steps,
               "--log-every", steps, "--out", out]

    def tokens_per_second(text):
        found = re.findall(r"(\d+) tokens/s", text)
        if not found:
            sys.exit(f"no tokens/s in the output of {' '.join(cmd)}:\n{text[-2000:]}")
        return float(found[-1])
    return cmd, tokens_per_second


WORKLOADS = {
    "char_lm iteration (4 layers, d 128, block 64, batch 12)": (char_lm, "ms/iter", False),
    "g2p training step (3 layers, d 256, ~4096 tokens)": (g2p, "tokens/s", True),
}


def torch_version(python):
    return subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--torch-python", action="append", default=[])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--char-lm-iters", type=int, default=300)
    ap.add_argument("--g2p-steps", type=int, default=100)
    ap.add_argument("--bf16", action="store_true",
                    help="also Ember with --matmul-precision medium and each PyTorch with "
                         "--autocast (bfloat16 products)")
    ap.add_argument("--only", default="", help="run the workloads whose name contains this")
    ap.add_argument("--policies", nargs="+", default=["default", "PASSIVE"],
                    help="OpenMP wait policies tried from 2 threads on")
    ap.add_argument("--json", default="", help="write every run's figure here")
    a = ap.parse_args()
    pythons = a.torch_python or ["/usr/bin/python3"]
    # (key, label, python or None for Ember, extra arguments, bfloat16 products?)
    sides = [("ember", "Ember", None, [], False)]
    if a.bf16:
        sides.append(("ember-medium", "Ember medium", None, ["--matmul-precision", "medium"], True))
    for p in pythons:
        name = f"PyTorch {torch_version(p)}"
        sides.append((p, name, p, [], False))
        if a.bf16:
            sides.append((p + " autocast", name + " autocast", p, ["--autocast"], True))
    label = {key: lab for key, lab, *_ in sides}
    results = {}  # (workload, threads, side key, policy) -> {"values": [...], "rss": max}
    with tempfile.TemporaryDirectory() as tmp:
        for threads in a.threads:
            env = dict(os.environ, OMP_NUM_THREADS=str(threads),
                       OPENBLAS_NUM_THREADS=str(threads), EMBER_NUM_THREADS=str(threads))
            env.pop("OMP_WAIT_POLICY", None)
            policies = a.policies if threads >= 2 else ["default"]
            for workload, (make, unit, _) in WORKLOADS.items():
                if a.only not in workload:
                    continue
                for r in range(a.repeat):
                    for policy in policies:
                        for i, (key, _, python, extra, _) in enumerate(sides):
                            out = os.path.join(tmp, f"{i}")
                            cmd, read = make(python, a, threads, out)
                            run_env = dict(env, **({"OMP_WAIT_POLICY": policy}
                                                   if policy != "default" else {}))
                            text, rss = run(cmd + extra, run_env)
                            value = read(text)
                            entry = results.setdefault((workload, threads, key, policy),
                                                       {"values": [], "rss": 0.0})
                            entry["values"].append(value)
                            entry["rss"] = max(entry["rss"], rss)
                            print(f"{workload} | {threads} thread(s), {policy} | {label[key]} | "
                                  f"run {r + 1}: {value:.1f} {unit}, peak RSS {rss:.0f} MB",
                                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"workload": w, "threads": t, "policy": pol, "side": label[s], **e}
                       for (w, t, s, pol), e in results.items()], f, indent=2)
    torch_keys = [key for key, _, python, _, _ in sides if python]
    plain = [key for key, _, python, _, bf16 in sides if python and not bf16]
    ratios = [("Ember / fastest PyTorch in Float32 (time)", "ember", plain)]
    if a.bf16:
        ratios.append(("Ember medium / fastest PyTorch, any precision (time)", "ember-medium",
                       torch_keys))
    print()
    print("| workload | threads | " + " | ".join(label[k] for k, *_ in sides) + " | " +
          " | ".join(r[0] for r in ratios) + " | peak RSS MB " +
          " / ".join(label[k] for k, *_ in sides) + " |")
    print("|---" * (2 + len(sides) + len(ratios) + 1) + "|")
    for workload, (_, unit, higher_is_faster) in WORKLOADS.items():
        for threads in a.threads:
            med, policy, rss = {}, {}, {}
            for key, *_ in sides:  # each side at its better wait policy
                runs = {pol: e for (w, t, side, pol), e in results.items()
                        if (w, t, side) == (workload, threads, key)}
                if not runs:
                    continue
                medians = {pol: statistics.median(e["values"]) for pol, e in runs.items()}
                policy[key] = (max if higher_is_faster else min)(medians, key=medians.get)
                med[key] = medians[policy[key]]
                rss[key] = max(e["rss"] for e in runs.values())
            if len(med) < len(sides):
                continue
            time = {k: 1 / v if higher_is_faster else v for k, v in med.items()}
            shown = {k: f"{med[k]:.1f} {unit}" + (f" ({policy[k]})" if threads >= 2 else "")
                     for k in med}
            print(f"| {workload} | {threads} | " + " | ".join(shown[k] for k, *_ in sides) +
                  " | " + " | ".join(f"{time[num] / min(time[k] for k in den):.2f}"
                                     for _, num, den in ratios) +
                  " | " + " / ".join(f"{rss[k]:.0f}" for k, *_ in sides) + " |")


if __name__ == "__main__":
    main()
