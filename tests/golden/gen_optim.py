"""Optimizer trajectories from torch.optim (Float64) for tests/test_optim.cpp.

For each configuration: two parameters (2, 3) and (3,), their initial values, the gradient fed
at each of STEPS steps (parameter 1 gets no gradient at step 2, so it is skipped and its state
does not advance), and both parameters after every step. Also clip_grad_norm_ cases.
Run: /usr/bin/python3 tests/golden/gen_optim.py
"""
import torch

from golden import write

torch.manual_seed(0)
STEPS = 5
SKIP = (2, 1)  # (step, parameter) without a gradient

CONFIGS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_wd": (torch.optim.SGD, dict(lr=0.1, weight_decay=0.05)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    "sgd_dampening": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.3)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.8, nesterov=True)),
    "sgd_all": (torch.optim.SGD, dict(lr=0.05, momentum=0.7, dampening=0.1, weight_decay=0.02)),
    "sgd_nesterov_wd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adam_betas": (torch.optim.Adam, dict(lr=0.02, betas=(0.8, 0.95), eps=1e-6)),
    "adam_wd": (torch.optim.Adam, dict(lr=0.01, weight_decay=0.1)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "adamw_betas": (torch.optim.AdamW, dict(lr=0.03, betas=(0.5, 0.9), eps=1e-4, weight_decay=0.5)),
}

values = {}
for name, (cls, kwargs) in CONFIGS.items():
    params = [torch.randn(2, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)]
    for i, p in enumerate(params):
        values[f"{name}.p{i}.init"] = p.clone()
        p.requires_grad_(True)
    opt = cls(params, **kwargs)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        for i, p in enumerate(params):
            if (step, i) == SKIP:
                continue
            g = torch.randn(p.shape, dtype=torch.float64)
            values[f"{name}.p{i}.grad{step}"] = g
            p.grad = g.clone()
        opt.step()
        for i, p in enumerate(params):
            values[f"{name}.p{i}.after{step}"] = p.detach().clone()

# clip_grad_norm_: (max_norm, grads) -> total norm and clipped grads
for k, max_norm in enumerate([0.5, 100.0]):
    params = [torch.zeros(3, 4, dtype=torch.float64, requires_grad=True),
              torch.zeros(5, dtype=torch.float64, requires_grad=True)]
    for i, p in enumerate(params):
        p.grad = torch.randn(p.shape, dtype=torch.float64) * 2
        values[f"clip{k}.grad{i}"] = p.grad.clone()
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    values[f"clip{k}.max_norm"] = torch.tensor(max_norm, dtype=torch.float64)
    values[f"clip{k}.total"] = total
    for i, p in enumerate(params):
        values[f"clip{k}.clipped{i}"] = p.grad.clone()

write("optim", values)
