"""L-BFGS trajectories from torch.optim.LBFGS (Float64) for tests/test_lbfgs.cpp.

Each case records, after every step(closure) call k: the parameters ("<case>.p<i>.after<k>"),
the loss step() returned ("<case>.loss<k>", the first evaluation of that call) and the state's
counters ("<case>.func_evals<k>", "<case>.n_iter<k>"). Cases:
  rosen, rosen_wolfe  the 2-D Rosenbrock function from (-1.5, 2), max_iter 5, history_size 3
                      (the history wraps), without and with the strong Wolfe line search;
  rosen_wolfe_long    the same with max_iter 20 (more line searches, zoom phases);
  regression          least squares with a Linear(3, 1)'s weight and bias (two parameters) on
                      fixed data, strong Wolfe, history_size 4; it converges, so later calls
                      return after their first evaluation.
"<case>.state_dict<K>.*" is torch's state after call K, flattened with Ember's names (see
optim/lbfgs.h); the script checks that a run resumed from it equals the uninterrupted one.
Run: /usr/bin/python3 tests/golden/lbfgs.py -> lbfgs.json
"""
import torch

from golden import write

torch.set_default_dtype(torch.float64)
torch.manual_seed(0)


def rosenbrock(p):
    x = p[0]
    return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2


N = 8
X = torch.randn(N, 3)
Y = X @ torch.tensor([[0.5], [-1.0], [2.0]]) + 0.3 + 0.1 * torch.randn(N, 1)


def least_squares(p):
    w, b = p
    return ((X @ w.t() + b - Y) ** 2).mean()


CASES = {
    "rosen": (rosenbrock, lambda: [torch.tensor([-1.5, 2.0])],
              dict(lr=1, max_iter=5, history_size=3), 6),  # a 7th call diverges
    "rosen_wolfe": (rosenbrock, lambda: [torch.tensor([-1.5, 2.0])],
                    dict(lr=1, max_iter=5, history_size=3, line_search_fn="strong_wolfe"), 8),
    "rosen_wolfe_long": (rosenbrock, lambda: [torch.tensor([-1.5, 2.0])],
                         dict(max_iter=20, history_size=3, line_search_fn="strong_wolfe"), 3),
    "regression": (least_squares, lambda: [torch.tensor([[0.1, 0.2, -0.3]]), torch.tensor([0.05])],
                   dict(lr=1, max_iter=20, history_size=4, line_search_fn="strong_wolfe"), 3),
}
RESUME_AFTER = 3  # the state dict recorded after this many calls (those with as many)
GROUP_KEYS = ["lr", "max_iter", "max_eval", "tolerance_grad", "tolerance_change", "history_size",
              "line_search_fn"]


def flat_state_dict(opt):
    """torch's opt.state_dict() as Ember names it: lists become one entry per element, the
    scratch list 'al' is left out, line_search_fn is a flag, numbers are 0-d tensors."""
    out = {}
    sd = opt.state_dict()
    for i, s in sd["state"].items():
        for key, v in s.items():
            if key == "al":
                continue
            if isinstance(v, list):
                for k, e in enumerate(v):
                    out[f"state.{i}.{key}.{k}"] = e.clone()
            elif key in ("n_iter", "func_evals"):
                out[f"state.{i}.{key}"] = torch.tensor(v, dtype=torch.int64)
            elif key in ("t", "prev_loss"):
                out[f"state.{i}.{key}"] = torch.tensor(float(v))
            else:  # d, prev_flat_grad, H_diag (a tensor once a pair was accepted, else 1)
                # (a copy: torch's step writes prev_flat_grad in place)
                out[f"state.{i}.{key}"] = torch.as_tensor(v, dtype=torch.float64).clone()
    for g, group in enumerate(sd["param_groups"]):
        for key in GROUP_KEYS:
            v = group[key]
            if key == "line_search_fn":
                v = torch.tensor(v == "strong_wolfe")
            elif key in ("max_iter", "max_eval", "history_size"):
                v = torch.tensor(v, dtype=torch.int64)
            else:
                v = torch.tensor(float(v))
            out[f"param_groups.{g}.{key}"] = v
        out[f"param_groups.{g}.params"] = torch.tensor(group["params"], dtype=torch.int64)
    return out


def make_closure(f, params, opt):
    def closure():
        opt.zero_grad(set_to_none=True)
        loss = f(params)
        loss.backward()
        return loss
    return closure


values = {"regression.x": X, "regression.y": Y}
for name, (f, init, kwargs, calls) in CASES.items():
    params = [p.requires_grad_() for p in init()]
    for i, p in enumerate(params):
        values[f"{name}.p{i}.init"] = p.detach().clone()
    opt = torch.optim.LBFGS(params, **kwargs)
    closure = make_closure(f, params, opt)
    for k in range(calls):
        loss = opt.step(closure)
        state = opt.state[params[0]]
        values[f"{name}.loss{k}"] = loss.detach().clone()
        values[f"{name}.func_evals{k}"] = torch.tensor(state["func_evals"], dtype=torch.int64)
        values[f"{name}.n_iter{k}"] = torch.tensor(state["n_iter"], dtype=torch.int64)
        for i, p in enumerate(params):
            values[f"{name}.p{i}.after{k}"] = p.detach().clone()
        if k + 1 == RESUME_AFTER:
            for key, v in flat_state_dict(opt).items():
                values[f"{name}.state_dict{k + 1}.{key}"] = v
            # Resuming from the state dict (and the parameters) equals the uninterrupted run.
            copies = [p.detach().clone().requires_grad_() for p in params]
            resumed = torch.optim.LBFGS(copies, **kwargs)
            resumed.load_state_dict(opt.state_dict())
            rest = make_closure(f, copies, resumed)
            for _ in range(calls - RESUME_AFTER):
                resumed.step(rest)
            resumed_final = [c.detach().clone() for c in copies]
    if calls > RESUME_AFTER:
        for i, p in enumerate(params):
            assert torch.equal(resumed_final[i], p.detach()), (name, i)

write("lbfgs", values, one_per_line=True)
