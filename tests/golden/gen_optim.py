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

# Parameter groups: group 0 holds parameter 0, group 1 parameters 1 and 2. Parameter 2 gets no
# gradient at step 0 and parameter 1 none at step 2, so state appears out of index order.
GROUP_STEPS = 4
GROUP_SKIP = {(0, 2), (2, 1)}
GROUP_CONFIGS = {
    "groups_sgd": (torch.optim.SGD, [dict(lr=0.1, momentum=0.9),
                                     dict(lr=0.05, momentum=0.5, weight_decay=0.1, nesterov=True)]),
    "groups_adam": (torch.optim.Adam, [dict(lr=0.01),
                                       dict(lr=0.03, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)]),
    "groups_adamw": (torch.optim.AdamW, [dict(lr=0.01),
                                         dict(lr=0.02, betas=(0.5, 0.9), weight_decay=0.3)]),
}
# The group options Ember saves, in torch's order (torch's own flags such as maximize are not
# Ember's); Adam's decoupled_weight_decay is Ember's, not in torch 1.13.
GROUP_KEYS = {
    torch.optim.SGD: ["lr", "momentum", "dampening", "weight_decay", "nesterov"],
    torch.optim.Adam: ["lr", "betas", "eps", "weight_decay"],
    torch.optim.AdamW: ["lr", "betas", "eps", "weight_decay"],
}


def flat_state_dict(opt):
    """torch's optimizer.state_dict() under Ember's flattened names."""
    out = {}
    sd = opt.state_dict()
    for i, st in sd["state"].items():
        for k, v in st.items():
            if v is None:  # SGD without momentum
                continue
            out[f"state.{i}.{k}"] = v.to(torch.int64) if k == "step" else v
    for g, group in enumerate(sd["param_groups"]):
        for k in GROUP_KEYS[type(opt)]:
            v = group[k]
            out[f"param_groups.{g}.{k}"] = torch.tensor(
                v, dtype=torch.bool if isinstance(v, bool) else torch.float64)
        if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
            out[f"param_groups.{g}.decoupled_weight_decay"] = torch.tensor(
                isinstance(opt, torch.optim.AdamW))
        out[f"param_groups.{g}.params"] = torch.tensor(group["params"], dtype=torch.int64)
    return out


for name, (cls, options) in GROUP_CONFIGS.items():
    params = [torch.randn(2, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64),
              torch.randn(4, dtype=torch.float64)]
    for i, p in enumerate(params):
        values[f"{name}.p{i}.init"] = p.clone()
        p.requires_grad_(True)
    opt = cls([dict(params=params[:1], **options[0]), dict(params=params[1:], **options[1])])
    for step in range(GROUP_STEPS):
        opt.zero_grad(set_to_none=True)
        for i, p in enumerate(params):
            if (step, i) in GROUP_SKIP:
                continue
            g = torch.randn(p.shape, dtype=torch.float64)
            values[f"{name}.p{i}.grad{step}"] = g
            p.grad = g.clone()
        opt.step()
        for i, p in enumerate(params):
            values[f"{name}.p{i}.after{step}"] = p.detach().clone()
    for k, v in flat_state_dict(opt).items():
        values[f"{name}.state_dict.{k}"] = v

write("optim", values)
