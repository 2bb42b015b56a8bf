"""Learning-rate schedules from torch.optim.lr_scheduler for tests/test_optim.cpp.

Each configuration builds an optimizer with two parameter groups (lr 0.1 and 0.02; SGD unless
the name says adam) and its scheduler(s), then records every group's lr at epoch 0 (after
construction) and after each step() — and, for OneCycleLR, the momentum it cycles (Adam's beta1,
SGD's momentum). Keys: <name>.lr<g> and <name>.momentum<g>, 1-D over the epochs.
Run: /usr/bin/python3 tests/golden/gen_sched.py
"""
import warnings

import torch
from torch.optim import lr_scheduler as S

from golden import write

warnings.filterwarnings("ignore")  # scheduler.step() before optimizer.step() is fine here
STEPS = 20


def sgd():
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)
    return torch.optim.SGD([dict(params=[a], lr=0.1, momentum=0.9),
                            dict(params=[b], lr=0.02)], lr=0.1)


def adam():
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)
    return torch.optim.Adam([dict(params=[a], lr=0.1),
                             dict(params=[b], lr=0.02, betas=(0.8, 0.99))])


# name: (optimizer, scheduler factory, steps); the C++ table mirrors these.
CONFIGS = {
    "lambda": (sgd, lambda o: S.LambdaLR(o, lambda k: 0.95 ** k * (1 + k % 3)), STEPS),
    "step": (sgd, lambda o: S.StepLR(o, 3, 0.5), STEPS),
    "step_default": (sgd, lambda o: S.StepLR(o, 4), STEPS),
    "cosine": (sgd, lambda o: S.CosineAnnealingLR(o, 8, 0.001), STEPS),
    "cosine_default": (sgd, lambda o: S.CosineAnnealingLR(o, 10), STEPS),
    "linear": (sgd, lambda o: S.LinearLR(o, 0.25, 1.0, 6), STEPS),
    "linear_default": (sgd, lambda o: S.LinearLR(o), STEPS),
    "linear_down": (sgd, lambda o: S.LinearLR(o, 1.0, 0.1, 10), STEPS),
    "onecycle_adam": (adam, lambda o: S.OneCycleLR(o, 0.5, total_steps=20), 20),
    "onecycle_sgd": (sgd, lambda o: S.OneCycleLR(o, 0.3, total_steps=16, pct_start=0.25,
                                                 div_factor=10, final_div_factor=100), 16),
    "sequential": (sgd, lambda o: S.SequentialLR(
        o, [S.LinearLR(o, 0.1, 1.0, 4), S.CosineAnnealingLR(o, 10, 0.001)], [5]), STEPS),
    "sequential3": (sgd, lambda o: S.SequentialLR(
        o, [S.LinearLR(o, 0.5, 1.0, 3), S.StepLR(o, 2, 0.5), S.CosineAnnealingLR(o, 6)],
        [4, 10]), STEPS),
}

values = {}
for name, (make_optimizer, make_scheduler, steps) in CONFIGS.items():
    opt = make_optimizer()
    scheduler = make_scheduler(opt)
    lrs, momenta = [], []
    for step in range(steps + 1):
        if step > 0:
            opt.step()
            scheduler.step()
        lrs.append([g["lr"] for g in opt.param_groups])
        momenta.append([g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups])
    for g in range(2):
        values[f"{name}.lr{g}"] = torch.tensor([row[g] for row in lrs], dtype=torch.float64)
        if name.startswith("onecycle"):
            values[f"{name}.momentum{g}"] = torch.tensor([row[g] for row in momenta],
                                                         dtype=torch.float64)

write("sched", values)
