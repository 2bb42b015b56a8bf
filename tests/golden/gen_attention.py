"""Golden values for the Annotated Transformer's attention() with a causal mask, from PyTorch.
Run: /usr/bin/python3 tests/golden/gen_attention.py  -> tests/golden/attention.json"""
import math

import torch

from golden import write


def subsequent_mask(size):  # the original's, verbatim
    attn_shape = (1, size, size)
    mask = torch.triu(torch.ones(attn_shape), diagonal=1).type(torch.uint8)
    return mask == 0


def attention(query, key, value, mask=None):  # the original's, without dropout
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    return torch.matmul(p_attn, value), p_attn


torch.manual_seed(0)
q = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
k = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
v = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
mask = subsequent_mask(5).unsqueeze(1)  # (1, 1, 5, 5), as MultiHeadedAttention passes it
out, p_attn = attention(q, k, v, mask)
g = torch.randn_like(out)
out.backward(g)
write("attention", {"q": q, "k": k, "v": v, "mask": mask, "out": out, "p_attn": p_attn,
                    "grad_out": g, "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad})
