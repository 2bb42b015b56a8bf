"""Golden values for the hand tests of tests/test_nn_functional.cpp and tests/test_loss.cpp that
no op-table row holds (rows: tests/op_table.h, gen_op_tables.py): softmax and log_softmax of
extreme rows, and kl_div with zeros in the target.
Run with Debian's python3-torch: /usr/bin/python3 tests/golden/gen_ops.py -> ops.json."""
import warnings

import torch
import torch.nn.functional as F

from golden import write

torch.manual_seed(7)
D = torch.float64
v = {}

# extreme rows: +-1e4 and a row masked with -1e9
big = torch.tensor([[1e4, -1e4, 0.0, 1e4], [-1e9, -1e9, 1.0, -1e9], [-1e9] * 4], dtype=D)
v["sm_big"] = big
v["softmax_big"] = F.softmax(big, -1)
v["log_softmax_big"] = F.log_softmax(big, -1)

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
x = lp.detach().clone().requires_grad_()
F.kl_div(x, t, reduction="sum").backward()
v["kl_grad_sum"] = x.grad

write("ops", v)
