"""Golden values for the nn functions and losses (ops/nn_functional.cpp, ops/loss.cpp).
Run with Debian's python3-torch: /usr/bin/python3 tests/golden/gen_ops.py -> ops.json.
Inputs are saved with the outputs (our random numbers differ from torch's). Gradients are
those of sum(output * upstream) with the saved upstream tensor."""
import warnings

import torch
import torch.nn.functional as F

from golden import write

torch.manual_seed(7)
D = torch.float64
v = {}


def grad_of(f, x, upstream):
    x = x.detach().clone().requires_grad_()
    (f(x) * upstream).sum().backward()
    return x.grad


# softmax / log_softmax on 3-D input along every dim, negative dims included
x = torch.randn(2, 3, 4, dtype=D)
up = torch.randn(2, 3, 4, dtype=D)
v["sm_x"], v["sm_up"] = x, up
for name, dim in (("0", 0), ("1", 1), ("m1", -1)):
    v["softmax_" + name] = F.softmax(x, dim)
    v["log_softmax_" + name] = F.log_softmax(x, dim)
    v["softmax_grad_" + name] = grad_of(lambda t: F.softmax(t, dim), x, up)
    v["log_softmax_grad_" + name] = grad_of(lambda t: F.log_softmax(t, dim), x, up)
# 1-D and 2-D inputs
x1 = torch.randn(7, dtype=D)
x2 = torch.randn(3, 5, dtype=D)
v["sm1_x"], v["sm2_x"] = x1, x2
v["softmax_1d"] = F.softmax(x1, 0)
v["log_softmax_1d"] = F.log_softmax(x1, -1)
v["softmax_2d_0"] = F.softmax(x2, 0)
v["log_softmax_2d_m1"] = F.log_softmax(x2, -1)
# extreme rows: +-1e4 and a row masked with -1e9
big = torch.tensor([[1e4, -1e4, 0.0, 1e4], [-1e9, -1e9, 1.0, -1e9], [-1e9] * 4], dtype=D)
v["sm_big"] = big
v["softmax_big"] = F.softmax(big, -1)
v["log_softmax_big"] = F.log_softmax(big, -1)

# layer_norm with 2-D normalized_shape, weight and bias; and 1-D without affine
x = torch.randn(2, 3, 4, dtype=D) * 3 + 1
w = torch.randn(3, 4, dtype=D)
b = torch.randn(3, 4, dtype=D)
up = torch.randn(2, 3, 4, dtype=D)
v["ln_x"], v["ln_w"], v["ln_b"], v["ln_up"] = x, w, b, up
xs = [t.detach().clone().requires_grad_() for t in (x, w, b)]
y = F.layer_norm(xs[0], (3, 4), xs[1], xs[2], 1e-5)
(y * up).sum().backward()
v["ln_y"], v["ln_dx"], v["ln_dw"], v["ln_db"] = y, xs[0].grad, xs[1].grad, xs[2].grad
x1 = torch.randn(5, 6, dtype=D)
v["ln1_x"] = x1
v["ln1_y"] = F.layer_norm(x1, (6,), eps=1e-6)
x3 = torch.randn(2, 2, 5, dtype=D)
w3 = torch.randn(5, dtype=D)
b3 = torch.randn(5, dtype=D)
v["ln3_x"], v["ln3_w"], v["ln3_b"] = x3, w3, b3
v["ln3_y"] = F.layer_norm(x3, (5,), w3, b3)

# embedding with repeated indices
w = torch.randn(11, 3, dtype=D)
idx = torch.tensor([[1, 4, 4], [10, 0, 1]])
up = torch.randn(2, 3, 3, dtype=D)
v["emb_w"], v["emb_idx"], v["emb_up"] = w, idx, up
v["emb_y"] = F.embedding(idx, w)
v["emb_dw"] = grad_of(lambda t: F.embedding(idx, t), w, up)

idx1 = torch.tensor([3, 3, 0, 9])
v["emb1_idx"], v["emb1_y"] = idx1, F.embedding(idx1, w)

# mse_loss, same shapes and broadcast
a, t = torch.randn(3, 4, dtype=D), torch.randn(3, 4, dtype=D)
tb = torch.randn(4, dtype=D)
v["mse_a"], v["mse_t"], v["mse_tb"] = a, t, tb
for r in ("none", "mean", "sum"):
    v["mse_" + r] = F.mse_loss(a, t, reduction=r)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v["mse_bcast_" + r] = F.mse_loss(a, tb, reduction=r)
v["mse_grad_mean"] = grad_of(lambda u: F.mse_loss(u, t), a, torch.tensor(1.0, dtype=D))

# nll_loss with an ignored target
lp = F.log_softmax(torch.randn(5, 4, dtype=D), 1)
tgt = torch.tensor([1, 0, -100, 3, 1])
v["nll_lp"], v["nll_t"] = lp, tgt
for r in ("none", "mean", "sum"):
    v["nll_" + r] = F.nll_loss(lp, tgt, reduction=r)
lp1 = F.log_softmax(torch.randn(6, dtype=D), 0)
v["nll1_lp"] = lp1
v["nll1_sum"] = F.nll_loss(lp1, torch.tensor(4), reduction="sum")
v["nll_grad_mean"] = grad_of(lambda u: F.nll_loss(u, tgt), lp, torch.tensor(1.0, dtype=D))

# cross_entropy: plain, and label_smoothing=0.1 with ignore_index=2
x = torch.randn(6, 5, dtype=D) * 2
tgt = torch.tensor([0, 4, 2, 1, 3, 2])
up = torch.randn(6, dtype=D)
v["ce_x"], v["ce_t"], v["ce_up"] = x, tgt, up
for r in ("none", "mean", "sum"):
    v["ce_" + r] = F.cross_entropy(x, tgt, reduction=r)
    v["ce_ls_" + r] = F.cross_entropy(x, tgt, reduction=r, ignore_index=2, label_smoothing=0.1)
v["ce_ls_grad_mean"] = grad_of(
    lambda u: F.cross_entropy(u, tgt, ignore_index=2, label_smoothing=0.1), x,
    torch.tensor(1.0, dtype=D))
v["ce_ls_grad_none"] = grad_of(
    lambda u: F.cross_entropy(u, tgt, reduction="none", ignore_index=2, label_smoothing=0.1), x, up)
x1 = torch.randn(5, dtype=D)
v["ce1_x"], v["ce1_t"] = x1, torch.tensor(3)
v["ce1_ls_mean"] = F.cross_entropy(x1, torch.tensor(3), label_smoothing=0.2)

# kl_div with zeros in the target
lp = F.log_softmax(torch.randn(3, 4, dtype=D), 1)
t = F.softmax(torch.randn(3, 4, dtype=D), 1)
t[0, 1] = 0.0
t[2, 3] = 0.0
v["kl_lp"], v["kl_t"] = lp, t
for r in ("none", "mean", "sum"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note on 'mean' vs 'batchmean'
        v["kl_" + r] = F.kl_div(lp, t, reduction=r)
v["kl_grad_sum"] = grad_of(lambda u: F.kl_div(u, t, reduction="sum"), lp, torch.tensor(1.0, dtype=D))

write("ops", v)
