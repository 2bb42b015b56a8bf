"""Golden values for ops/index.cpp (tests/test_index.cpp): repeat, repeat_interleave, cat, stack,
index_select, masked_select, triu/tril, sort. Inputs are saved beside the outputs, and every
differentiable case saves an upstream gradient `<case>.gy` and the input gradients it gives.
Run: /usr/bin/python3 tests/golden/gen_index.py"""
import torch

from golden import write

torch.manual_seed(3)
f64 = torch.float64
out = {}


def leaf(*shape):
    return torch.randn(*shape, dtype=f64).requires_grad_()


def record(name, inputs, y):
    """Saves inputs as name.x0, name.x1, ..., y as name.y, and the input gradients of
    sum(y * gy) for a random gy as name.g0, name.g1, ..."""
    for i, x in enumerate(inputs):
        out[f"{name}.x{i}"] = x
    out[f"{name}.y"] = y
    gy = torch.randn(y.shape, dtype=f64)
    out[f"{name}.gy"] = gy
    grads = torch.autograd.grad(y, inputs, gy)
    for i, g in enumerate(grads):
        out[f"{name}.g{i}"] = g


# repeat: leading extra repeats, a transposed input, a size-1 dim
x = leaf(2, 3)
record("repeat", [x], x.repeat(2, 1, 3))
x = leaf(3, 2)
record("repeat_t", [x], x.t().repeat(2, 2))
x = leaf(1, 3)
record("repeat_1", [x], x.repeat(4, 1))

# repeat_interleave: flattened, along a negative dim, along dim 0 of a transposed input
x = leaf(2, 3)
record("ri_flat", [x], x.repeat_interleave(2))
x = leaf(2, 3)
record("ri_dim", [x], x.repeat_interleave(3, dim=-1))
x = leaf(3, 2)
record("ri_t", [x], x.t().repeat_interleave(2, dim=0))
# D2L: x_test.repeat_interleave(n_train).reshape(-1, n_train)
x = leaf(5)
record("ri_d2l", [x], x.repeat_interleave(4).reshape(-1, 4))

# cat / stack
a, b, c = leaf(2, 3), leaf(2, 1), leaf(2, 2)
record("cat1", [a, b, c], torch.cat([a, b, c], dim=-1))
a, b = leaf(1, 3), leaf(2, 3)
record("cat0", [a, b], torch.cat([a, b], dim=0))
a, b, c = leaf(2, 3), leaf(2, 3), leaf(2, 3)
record("stack1", [a, b, c], torch.stack([a, b, c], dim=1))
a, b = leaf(2, 3), leaf(2, 3)
record("stack_neg", [a, b], torch.stack([a, b], dim=-1))

# index_select with repeated indices
x = leaf(4, 3)
idx = torch.tensor([3, 0, 3, 1])
out["is0.idx"] = idx
record("is0", [x], x.index_select(0, idx))
x = leaf(2, 3, 4)
idx = torch.tensor([2, 2, 0])
out["is_neg.idx"] = idx
record("is_neg", [x], x.index_select(-1, idx))

# masked_select: same shape, mask broadcast to x, x broadcast to mask
x = leaf(3, 4)
m = torch.rand(3, 4) > 0.5
out["ms.mask"] = m
record("ms", [x], torch.masked_select(x, m))
x = leaf(3, 4)
m = torch.tensor([True, False, True, True])
out["ms_bm.mask"] = m
record("ms_bm", [x], torch.masked_select(x, m))
x = leaf(3, 1)
m = torch.rand(3, 4) > 0.4
out["ms_bx.mask"] = m
record("ms_bx", [x], torch.masked_select(x, m))
# D2L leave-one-out keys: X_tile[(1 - eye(n)).bool()].reshape(n, -1)
x = leaf(5)
n = 5
x_tile = x.repeat((n, 1))
record("ms_d2l", [x], x_tile[(1 - torch.eye(n)).bool()].reshape(n, -1))

# triu / tril: batched, positive and negative diagonals, a wide and a tall matrix
x = leaf(2, 3, 4)
record("triu0", [x], torch.triu(x))
record("triu1", [x], torch.triu(x, 1))
record("triu_m1", [x], torch.triu(x, -1))
record("tril0", [x], torch.tril(x))
x = leaf(4, 3)
record("tril_m2", [x], torch.tril(x, -2))
x = leaf(4, 3)
record("tril2", [x], torch.tril(x, 2))

# sort: ties (stable), ascending and descending, negative and non-last dims
x = (torch.randn(3, 6, dtype=f64) * 2).round().div(2).requires_grad_()
v, i = torch.sort(x, dim=-1, stable=True)
out["sort_asc.i"] = i
record("sort_asc", [x], v)
v, i = torch.sort(x, dim=-1, descending=True, stable=True)
out["sort_desc.i"] = i
record("sort_desc", [x], v)
v, i = torch.sort(x, dim=0, stable=True)
out["sort_d0.i"] = i
record("sort_d0", [x], v)
x = torch.randn(40, dtype=f64).round().requires_grad_()  # longer than the insertion-sort cutoff
v, i = torch.sort(x, descending=True, stable=True)
out["sort_long.i"] = i
record("sort_long", [x], v)

write("index", out)
