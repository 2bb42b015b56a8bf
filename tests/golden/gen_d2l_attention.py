"""Golden values for D2L's attention scoring (section "Attention Scoring Functions"): its
masked_softmax, AdditiveAttention and DotProductAttention, written out below as d2l defines them,
evaluated in Float64 with PyTorch: outputs, attention_weights and the gradients of the queries,
keys, values and weights for a random upstream gradient.
Run: /usr/bin/python3 tests/golden/gen_d2l_attention.py  -> tests/golden/d2l_attention.json"""
import math

import torch
from torch import nn

from golden import write


def sequence_mask(X, valid_len, value=0):  # d2l's
    maxlen = X.size(1)
    mask = torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


def masked_softmax(X, valid_lens):  # d2l's
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    else:
        shape = X.shape
        if valid_lens.dim() == 1:
            valid_lens = torch.repeat_interleave(valid_lens, shape[1])
        else:
            valid_lens = valid_lens.reshape(-1)
        X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
        return nn.functional.softmax(X.reshape(shape), dim=-1)


class AdditiveAttention(nn.Module):  # d2l's
    def __init__(self, key_size, query_size, num_hiddens, dropout, **kwargs):
        super(AdditiveAttention, self).__init__(**kwargs)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens):
        queries, keys = self.W_q(queries), self.W_k(keys)
        features = queries.unsqueeze(2) + keys.unsqueeze(1)
        features = torch.tanh(features)
        scores = self.w_v(features).squeeze(-1)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class DotProductAttention(nn.Module):  # d2l's
    def __init__(self, dropout, **kwargs):
        super(DotProductAttention, self).__init__(**kwargs)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


values = {}
torch.manual_seed(0)

# masked_softmax as d2l shows it: 1-D and 2-D lengths, Int64 and floating, and none
X = torch.rand(2, 2, 4, dtype=torch.float64)
for name, lens in [("1d", torch.tensor([2, 3])), ("2d", torch.tensor([[1, 3], [2, 4]])),
                   ("float", torch.tensor([1.5, 3.0], dtype=torch.float64)),
                   ("zero", torch.tensor([[0, 2], [4, 1]])), ("none", None)]:
    x = X.clone().requires_grad_()
    out = masked_softmax(x.clone(), lens)  # d2l's sequence_mask writes into its argument
    gy = torch.randn_like(out)
    out.backward(gy)
    values[f"ms.{name}.out"] = out
    values[f"ms.{name}.gy"] = gy
    values[f"ms.{name}.gx"] = x.grad
    if lens is not None:
        values[f"ms.{name}.lens"] = lens
values["ms.X"] = X


def attention_case(prefix, module, queries, keys, vals, valid_lens):
    module.double().eval()
    q = queries.clone().requires_grad_()
    k = keys.clone().requires_grad_()
    v = vals.clone().requires_grad_()
    out = module(q, k, v, valid_lens)
    gy = torch.randn_like(out)
    out.backward(gy)
    values.update({f"{prefix}.queries": queries, f"{prefix}.keys": keys, f"{prefix}.values": vals,
                   f"{prefix}.out": out, f"{prefix}.weights": module.attention_weights,
                   f"{prefix}.gy": gy, f"{prefix}.g_queries": q.grad, f"{prefix}.g_keys": k.grad,
                   f"{prefix}.g_values": v.grad})
    if valid_lens is not None:
        values[f"{prefix}.lens"] = valid_lens
    for name, p in module.named_parameters():
        values[f"{prefix}.{name}"] = p
        values[f"{prefix}.grad.{name}"] = p.grad
    values[f"{prefix}.names"] = " ".join(name for name, _ in module.named_parameters())


# AdditiveAttention as d2l's example (query_size 20, key_size 2, num_hiddens 8, lengths 2 and 6),
# with random keys so every input gets a gradient of its own
queries = torch.normal(0, 1, (2, 1, 20), dtype=torch.float64)
keys = torch.randn(2, 10, 2, dtype=torch.float64)
vals = torch.arange(40, dtype=torch.float64).reshape(1, 10, 4).repeat(2, 1, 1)
attention_case("add", AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1),
               queries, keys, vals, torch.tensor([2, 6]))
# several queries, lengths per query
attention_case("add2d", AdditiveAttention(key_size=3, query_size=5, num_hiddens=4, dropout=0),
               torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(2, 6, 3, dtype=torch.float64),
               torch.randn(2, 6, 2, dtype=torch.float64), torch.tensor([[1, 6, 3], [4, 2, 5]]))
attention_case("addnone", AdditiveAttention(key_size=3, query_size=5, num_hiddens=4, dropout=0),
               torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(2, 6, 3, dtype=torch.float64),
               torch.randn(2, 6, 2, dtype=torch.float64), None)

# DotProductAttention as d2l's example (queries (2, 1, 2), lengths 2 and 6), keys random
attention_case("dot", DotProductAttention(dropout=0.5), torch.normal(0, 1, (2, 1, 2), dtype=torch.float64),
               torch.randn(2, 10, 2, dtype=torch.float64), vals, torch.tensor([2, 6]))
attention_case("dot2d", DotProductAttention(dropout=0), torch.randn(2, 3, 4, dtype=torch.float64),
               torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 5, 3, dtype=torch.float64),
               torch.tensor([[1.0, 5.0, 2.5], [3.0, 0.0, 4.0]], dtype=torch.float64))

write("d2l_attention", values, one_per_line=True)
