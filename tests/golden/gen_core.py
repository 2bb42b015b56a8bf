"""Golden values for the core ops (elementwise, reductions, views) from PyTorch.
Run: /usr/bin/python3 tests/golden/gen_core.py  -> tests/golden/core.json"""
import torch

from golden import write

torch.manual_seed(0)
d = torch.float64
v = {}


def case(name, fn, *inputs):
    for i, x in enumerate(inputs):
        v[f"{name}.in{i}"] = x
    v[f"{name}.out"] = fn(*inputs)


a = torch.randn(3, 4, dtype=d)
b = torch.randn(3, 4, dtype=d)
row = torch.randn(4, dtype=d)
col = torch.randn(3, 1, dtype=d)
pos = torch.rand(3, 4, dtype=d) + 0.1

case("add", torch.add, a, b)
case("add_broadcast", torch.add, a, row)
case("sub_broadcast", torch.sub, col, a)
case("mul_broadcast", torch.mul, a, col)
case("div", torch.div, a, pos)
case("neg", torch.neg, a)
case("pow", lambda x: torch.pow(x, 0.8), pos)
case("pow2", lambda x: torch.pow(x, 2), a)
case("exp", torch.exp, a)
case("log", torch.log, pos)
case("sqrt", torch.sqrt, pos)
case("sin", torch.sin, a)
case("cos", torch.cos, a)
case("tanh", torch.tanh, a)
case("sigmoid", torch.sigmoid, a)
case("relu", torch.relu, a)
case("abs", torch.abs, a)
case("rsub", lambda x: 1 - x, a)
case("rdiv", lambda x: 2 / x, pos)
case("where", lambda x, y: torch.where(x > 0, x, y), a, b)
case("masked_fill", lambda x: x.masked_fill(x < 0, -1e9), a)
case("lt", lambda x, y: x < y, a, b)
case("ge_scalar", lambda x: x >= 0.5, a)

x3 = torch.randn(2, 3, 4, dtype=d)
case("sum_all", torch.sum, x3)
case("sum_dims", lambda x: x.sum(dim=[0, 2]), x3)
case("sum_neg_keepdim", lambda x: x.sum(dim=-1, keepdim=True), x3)
case("mean_dim", lambda x: x.mean(dim=1), x3)
case("mean_all", torch.mean, x3)
case("var_unbiased", lambda x: x.var(dim=-1), x3)
case("var_biased_keepdim", lambda x: x.var(dim=[0, 1], unbiased=False, keepdim=True), x3)
case("max_dim", lambda x: x.max(dim=1).values, x3)
case("max_dim_indices", lambda x: x.max(dim=1).indices, x3)
case("argmax_neg", lambda x: x.argmax(dim=-1), x3)
case("max_all", torch.max, x3)

case("transpose", lambda x: x.transpose(0, 2).contiguous(), x3)
case("permute", lambda x: x.permute(2, 0, 1).contiguous(), x3)
case("narrow", lambda x: x.narrow(2, 1, 2).contiguous(), x3)
case("expand", lambda x: x.expand(2, 3, 4).contiguous(), col)
case("flatten", lambda x: x.flatten(1), x3)
case("reshape_transposed", lambda x: x.transpose(0, 1).reshape(-1, 2), x3)

write("core", v)
