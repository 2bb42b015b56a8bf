#!/usr/bin/python3
"""The Burgers PINN in PyTorch: the reference side of `examples/pinn` (Raissi, Perdikaris &
Karniadakis, J. Comput. Phys. 378, 2019, the continuous-time Burgers example).

Same model, data construction, loss and optimizers as Ember's program: an MLP u(x, t) of
--layers Linear layers (--layers - 1 hidden tanh layers of --width units) on the inputs scaled to
[-1, 1], Xavier-normal weights and zero biases, in an nn.ModuleList `layers` (state_dict names
layers.0.weight, ..., as Ember's model.safetensors); N_u points drawn from the initial line
(256 x at t = 0, u = -sin(pi x)) and the boundaries x = ±1 (t = 0.01 j, u = 0), N_f Latin
hypercube collocation points in [-1, 1] x [0, 1] plus the N_u points; loss MSE_u + mean(f²),
f = u_t + u u_x - (0.01/pi) u_xx by autograd.grad(create_graph=True) with respect to separate x
and t columns; Adam, then one L-BFGS step(closure) with the strong Wolfe line search. Float32.
The draws come from numpy's and torch's generators, not Ember's, so the points and initial
weights are alike in distribution only. The relative L2 error is against the exact solution
(Cole–Hopf, 200-point Gauss–Hermite) on the 256 x 100 grid. train_seconds covers Adam and
L-BFGS only, as Ember's. Prints one JSON line with the keys of Ember's metrics.json (no loss
history, plus `side`).

    OMP_NUM_THREADS=N OPENBLAS_NUM_THREADS=N /usr/bin/python3 bench/pytorch/pinn.py --threads N
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

NU = 0.01 / math.pi
GRID_X = np.linspace(-1.0, 1.0, 256)  # the evaluation grid, as the paper's data set
GRID_T = 0.01 * np.arange(100)


class Net(nn.Module):
    def __init__(self, layers, width):
        super().__init__()
        self.layers = nn.ModuleList([
            nn.Linear(2 if i == 0 else width, 1 if i + 1 == layers else width)
            for i in range(layers)])
        for linear in self.layers:  # Xavier normal, zero bias
            nn.init.normal_(linear.weight, 0.0,
                            math.sqrt(2.0 / (linear.in_features + linear.out_features)))
            nn.init.zeros_(linear.bias)
        self.scale, self.shift = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0])

    def forward(self, xt):  # xt: (n, 2), columns x in [-1, 1] and t in [0, 1]
        h = xt * self.scale - self.shift  # to [-1, 1]²
        for i, linear in enumerate(self.layers):
            h = linear(h)
            if i + 1 < len(self.layers):
                h = torch.tanh(h)
        return h


def latin_hypercube(n, ranges, rng):
    """pyDOE's lhs as Ember's: each range cut into n strata, one uniform point in each, the strata
    of each dimension in a random order. Returns (n, len(ranges))."""
    points = np.empty((n, len(ranges)))
    for d, (lo, hi) in enumerate(ranges):
        points[:, d] = lo + (hi - lo) * (rng.permutation(n) + rng.random(n)) / n
    return points


def make_data(a, rng):
    """(xt_u, u, x_f, t_f): N_u initial and boundary points and values, and the collocation
    points' columns (N_f + N_u, 1), which require grad."""
    candidates = [(x, 0.0, -math.sin(math.pi * x)) for x in GRID_X]
    candidates += [(side, t, 0.0) for side in (-1.0, 1.0) for t in GRID_T]
    if a.n_u > len(candidates):
        sys.exit(f"pinn: --n-u {a.n_u} is more than the {len(candidates)} initial and boundary "
                 "points")
    chosen = np.array(candidates)[rng.permutation(len(candidates))[:a.n_u]]
    xt_f = np.concatenate([chosen[:, :2], latin_hypercube(a.n_f, [(-1, 1), (0, 1)], rng)])

    def column(v):
        return torch.tensor(v, dtype=torch.float32).reshape(-1, 1)
    return (torch.tensor(chosen[:, :2], dtype=torch.float32), column(chosen[:, 2]),
            column(xt_f[:, 0]).requires_grad_(), column(xt_f[:, 1]).requires_grad_())


def loss_of(net, xt_u, u, x_f, t_f):
    """MSE_u + MSE_f, the residual's derivatives recorded (create_graph) for the backward."""
    u_f = net(torch.cat([x_f, t_f], 1))
    u_x, u_t = torch.autograd.grad(u_f, [x_f, t_f], torch.ones_like(u_f), create_graph=True)
    u_xx, = torch.autograd.grad(u_x, [x_f], torch.ones_like(u_x), create_graph=True)
    f = u_t + u_f * u_x - NU * u_xx
    return F.mse_loss(net(xt_u), u) + f.pow(2).mean()


def exact_solution():
    """u(t, x) on the grid, (256, 100), by Cole–Hopf: with η = sqrt(4 nu t) z, a ratio of two
    Gauss–Hermite integrals over z of sin(pi (x - η)) f(x - η) and f(x - η),
    f(y) = exp(-cos(pi y) / (2 pi nu)); the exponents shifted by their largest per point."""
    z, w = np.polynomial.hermite.hermgauss(200)
    x, t = np.meshgrid(GRID_X, GRID_T, indexing="ij")
    y = x[..., None] - np.sqrt(4 * NU * t)[..., None] * z
    e = -np.cos(math.pi * y) / (2 * math.pi * NU)
    f = w * np.exp(e - e.max(axis=-1, keepdims=True))
    u = -(np.sin(math.pi * y) * f).sum(-1) / f.sum(-1)
    u[:, GRID_T <= 0] = -np.sin(math.pi * x[:, GRID_T <= 0])
    return u


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=9, help="Linear layers (layers - 1 hidden)")
    ap.add_argument("--width", type=int, default=20)
    ap.add_argument("--n-u", type=int, default=100)
    ap.add_argument("--n-f", type=int, default=10000)
    ap.add_argument("--adam-iters", type=int, default=1000)
    ap.add_argument("--adam-lr", type=float, default=1e-3)
    ap.add_argument("--lbfgs-iters", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    a = ap.parse_args()
    torch.set_num_threads(a.threads or os.cpu_count())
    torch.manual_seed(a.seed)
    xt_u, u, x_f, t_f = make_data(a, np.random.default_rng(a.seed))
    net = Net(a.layers, a.width)
    params = list(net.parameters())

    adam_loss, lbfgs_loss = [], []

    def evaluate_loss(history, phase):
        loss = loss_of(net, xt_u, u, x_f, t_f)
        history.append(loss.item())
        if not math.isfinite(history[-1]):  # Ember's program stops as diverged
            sys.exit(f"pinn: the loss is {history[-1]} at {phase} evaluation {len(history)}")
        loss.backward()
        return loss

    start = time.perf_counter()
    adam = torch.optim.Adam(params, lr=a.adam_lr)
    for _ in range(a.adam_iters):
        adam.zero_grad()
        evaluate_loss(adam_loss, "Adam")
        adam.step()
    lbfgs_done = 0
    if a.lbfgs_iters > 0:
        lbfgs = torch.optim.LBFGS(params, lr=1, max_iter=a.lbfgs_iters,
                                  max_eval=a.lbfgs_iters * 5 // 4, tolerance_grad=1e-9,
                                  tolerance_change=1e-12, history_size=50,
                                  line_search_fn="strong_wolfe")

        def closure():
            lbfgs.zero_grad()
            return evaluate_loss(lbfgs_loss, "L-BFGS")
        lbfgs.step(closure)
        lbfgs_done = lbfgs.state[params[0]]["n_iter"]
    train_seconds = time.perf_counter() - start

    with torch.no_grad():
        x, t = np.meshgrid(GRID_X, GRID_T, indexing="ij")
        points = torch.tensor(np.stack([x.ravel(), t.ravel()], 1), dtype=torch.float32)
        predicted = net(points).double().numpy().reshape(x.shape)
    exact = exact_solution()
    rel_l2 = math.sqrt(((predicted - exact) ** 2).sum() / (exact ** 2).sum())
    final = lbfgs_loss[-1] if lbfgs_loss else (adam_loss[-1] if adam_loss else float("nan"))
    print(json.dumps({
        "side": f"pytorch {torch.__version__}",
        "config": {"layers": a.layers, "width": a.width, "n_u": a.n_u, "n_f": a.n_f,
                   "adam_lr": a.adam_lr, "seed": a.seed, "threads": torch.get_num_threads()},
        "rel_l2_error": rel_l2,
        "train_seconds": train_seconds,
        "adam_iters": a.adam_iters,
        "lbfgs_iters": lbfgs_done,
        "lbfgs_evaluations": len(lbfgs_loss),
        "final_loss": final,
    }))


if __name__ == "__main__":
    main()
