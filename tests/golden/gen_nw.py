"""Golden values for D2L's Nadaraya-Watson attention pooling (tests/test_nw_regression.cpp):
the nonparametric prediction and weights, the leave-one-out keys/values, and
NWKernelRegression's forward, loss and dL/dw at a fixed w. Float64; the inputs are saved too."""
import torch
from torch import nn

from golden import write

torch.manual_seed(0)
n_train = 20  # D2L uses 50; 20 keeps the file small and exercises a non-square case
x_train, _ = torch.sort(torch.rand(n_train, dtype=torch.float64) * 5)


def f(x):
    return 2 * torch.sin(x) + x**0.8


y_train = f(x_train) + torch.normal(0.0, 0.5, (n_train,), dtype=torch.float64)
x_test = torch.arange(0, 5, 0.1, dtype=torch.float64)

# Nonparametric attention pooling, exactly as D2L.
X_repeat = x_test.repeat_interleave(n_train).reshape((-1, n_train))
attention_weights = nn.functional.softmax(-(X_repeat - x_train) ** 2 / 2, dim=1)
y_hat = torch.matmul(attention_weights, y_train)


class NWKernelRegression(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([w], dtype=torch.float64))

    def forward(self, queries, keys, values):
        queries = queries.repeat_interleave(keys.shape[1]).reshape((-1, keys.shape[1]))
        self.attention_weights = nn.functional.softmax(-((queries - keys) * self.w) ** 2 / 2, dim=1)
        return torch.bmm(self.attention_weights.unsqueeze(1), values.unsqueeze(-1)).reshape(-1)


# Leave-one-out keys and values, then one training step's loss and gradient at w = 1.7.
X_tile = x_train.repeat((n_train, 1))
Y_tile = y_train.repeat((n_train, 1))
mask = (1 - torch.eye(n_train)).type(torch.bool)
keys = X_tile[mask].reshape((n_train, -1))
values = Y_tile[mask].reshape((n_train, -1))
net = NWKernelRegression(1.7)
loss = nn.MSELoss(reduction="none")
out = net(x_train, keys, values)
l = loss(out, y_train)
l.sum().backward()

write("nw_regression", {
    "x_train": x_train,
    "y_train": y_train,
    "x_test": x_test,
    "nonparametric.attention_weights": attention_weights,
    "nonparametric.y_hat": y_hat,
    "keys": keys,
    "values": values,
    "parametric.w": net.w.detach(),
    "parametric.out": out.detach(),
    "parametric.attention_weights": net.attention_weights.detach(),
    "parametric.loss": l.detach(),
    "parametric.w_grad": net.w.grad,
})
