#!/usr/bin/python3
"""PyTorch's side of Ember's benchmark suite: the workloads of bench/ember_bench.cpp with the
same shapes, steps and timing method (warm-up for ~10% of the target time, then samples of
`inner` steps each, inner chosen so a sample lasts >= 1 ms and >= target / 200, samples so all
last ~target seconds, 3..200 of them; median and min per step, and the mean process CPU time per
step). Run with Debian's python3-torch:

    OMP_NUM_THREADS=N OPENBLAS_NUM_THREADS=N /usr/bin/python3 bench/pytorch/bench_torch.py \
        --threads N [--filter substr]... [--exact name]... [--json out.json] [--list] [--smoke]
        [--matmul-precision highest|high|medium] [--autocast]

--autocast runs every step under torch.autocast(device, torch.bfloat16): products in bfloat16,
what Ember's --matmul-precision medium compares with.

--device cuda runs the workloads ember_bench runs on a GPU (the transformer steps and the
second-order rows) there, each timed sample ending in torch.cuda.synchronize(); --compile wraps
the transformer steps' model in torch.compile (the "report torch.compile beside it" of issue 35).
"""
import argparse
import json
import math
import os
import resource
import sys
import time
import types

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WORKLOADS = []  # (name, flops, make(tiny) -> step, bytes)
DEVICE = torch.device("cpu")  # --device: where the transformer workloads run
COMPILE = False  # --compile: the transformer steps' model through torch.compile
ON_DEVICE = set()  # the names of the workloads that run on a --device


def workload(name, flops=0.0, bytes_=0.0):
    def register(make):
        WORKLOADS.append((name, flops, make, bytes_))
        return make
    return register


def passes(count, elements):
    """Bytes of `count` passes over a Float32 tensor of `elements` (ember_bench's passes)."""
    return count * 4.0 * elements


def leaf(*shape):
    return (torch.rand(shape) * 2 - 1).requires_grad_()


def forward_backward(inputs, f, out_shape):
    """y = f(inputs); y.backward(grad_out); the inputs' grads set to None after each step."""
    grad_out = torch.rand(out_shape)

    def step():
        f(inputs).backward(grad_out)
        for t in inputs:
            t.grad = None
    return step


# --- op level: forward + backward of the hot ops, and the per-op overhead

TRIAD = 1 << 25


@workload("bandwidth/triad b += s*c (2^25 floats)", bytes_=passes(3, TRIAD))
def _(tiny):
    b, c = torch.rand(8 if tiny else TRIAD), torch.rand(8 if tiny else TRIAD)
    return lambda: b.add_(c, alpha=3.0)


@workload("op/softmax (64,8,32,32) dim -1", bytes_=passes(5, 64 * 8 * 32 * 32))
def _(tiny):
    s = (2, 2, 4, 4) if tiny else (64, 8, 32, 32)
    return forward_backward([leaf(*s)], lambda v: torch.softmax(v[0], -1), s)


@workload("op/layer_norm (1024,512)", bytes_=passes(5, 1024 * 512))
def _(tiny):
    m, n = (4, 8) if tiny else (1024, 512)
    inputs = [leaf(m, n), torch.ones(n, requires_grad=True), torch.zeros(n, requires_grad=True)]
    return forward_backward(
        inputs, lambda v: nn.functional.layer_norm(v[0], (n,), v[1], v[2]), (m, n))


@workload("op/dropout p=0.1 (1024,512)", bytes_=passes(4, 1024 * 512))
def _(tiny):
    m, n = (4, 8) if tiny else (1024, 512)
    return forward_backward([leaf(m, n)], lambda v: nn.functional.dropout(v[0], 0.1, True),
                            (m, n))


@workload("op/bmm (256,32,64)x(256,64,32)", 3.0 * 2 * 256 * 32 * 64 * 32)
def _(tiny):
    b = 2 if tiny else 256
    return forward_backward([leaf(b, 32, 64), leaf(b, 64, 32)],
                            lambda v: torch.bmm(v[0], v[1]), (b, 32, 32))


@workload("op/linear 512->2048 on (1024,512)", 3.0 * 2 * 1024 * 512 * 2048)
def _(tiny):
    m, k, n = (4, 8, 16) if tiny else (1024, 512, 2048)
    return forward_backward([leaf(m, k), leaf(n, k), leaf(n)],
                            lambda v: nn.functional.linear(v[0], v[1], v[2]), (m, n))


@workload("op/sdpa causal (12,4,64,32)", 3.0 * 2 * 2 * 48 * 64 * 64 * 32)
def _(tiny):
    s = (1, 2, 4, 2) if tiny else (12, 4, 64, 32)
    future = torch.ones(s[2], s[2], dtype=torch.bool).triu(1)  # what F.sdpa's math path masks

    def attention(v):
        scores = (v[0] @ v[1].transpose(-2, -1)) / math.sqrt(s[3])
        return torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ v[2]
    return forward_backward([leaf(*s), leaf(*s), leaf(*s)], attention, s)


# Elementwise math on a (12, 64, 512) Float32 activation, alone and forward + backward; log reads
# U(0.5, 1.5).
UNARY = [("exp", torch.exp), ("log", torch.log), ("tanh", torch.tanh),
         ("sigmoid", torch.sigmoid), ("gelu", nn.functional.gelu),
         ("gelu tanh", lambda x: nn.functional.gelu(x, approximate="tanh")),
         ("silu", nn.functional.silu)]


def unary(name, f):
    def make_input(s):
        return (torch.rand(s) + 0.5).requires_grad_() if name == "log" else leaf(*s)

    @workload(f"op/{name} (12,64,512)")
    def _(tiny):
        s = (2, 3, 4) if tiny else (12, 64, 512)
        return forward_backward([make_input(s)], lambda v: f(v[0]), s)

    @workload(f"op/{name} forward (12,64,512)")
    def _(tiny):
        x = make_input((2, 3, 4) if tiny else (12, 64, 512)).detach()
        return lambda: f(x)


for _name, _f in UNARY:
    unary(_name, _f)


@workload("overhead/x+1 forward")
def _(tiny):
    x = torch.rand(1)
    return lambda: x + 1


def under(guard_name, guard):
    """x + 1 on a requires_grad input under a grad-mode guard (Ember has NoGradGuard only)."""
    @workload(f"overhead/x+1 requires_grad under {guard_name}")
    def _(tiny):
        x = torch.rand(1, requires_grad=True)

        def step():
            with guard():
                return x + 1
        return step


for _guard_name, _guard in [("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)]:
    under(_guard_name, _guard)


@workload("overhead/x+1 requires_grad fwd+bwd")
def _(tiny):
    x = torch.rand(1, requires_grad=True)

    def step():
        (x + 1).backward()
        x.grad = None
    return step


def sgemm(m, k, n):
    @workload(f"sgemm/{m}x{k}x{n}", 2.0 * m * k * n)
    def _(tiny):
        s = 16 if tiny else 1
        a, b = torch.rand(m // s, k // s), torch.rand(k // s, n // s)
        c = torch.empty(m // s, n // s)
        return lambda: torch.mm(a, b, out=c)


for _m, _k, _n in [(1024, 512, 2048), (800, 512, 2048), (1024, 512, 512)]:
    sgemm(_m, _k, _n)


# Where a second thread starts to pay (ember_bench's grain/ rows).
def grain(n):
    @workload(f"grain/x*y n={n}")
    def _(tiny):
        x, y = torch.rand(8 if tiny else n), torch.rand(8 if tiny else n)
        return lambda: x * y

    @workload(f"grain/exp n={n}")
    def _(tiny):
        x = torch.rand(8 if tiny else n)
        return lambda: torch.exp(x)


def grain_sgemm(m, k, n):
    @workload(f"grain/sgemm {m}x{k}x{n}", 2.0 * m * k * n)
    def _(tiny):
        s = 16 if tiny else 1
        a, b = torch.rand(m // s + 1, k // s + 1), torch.rand(k // s + 1, n // s + 1)
        c = torch.empty(m // s + 1, n // s + 1)
        return lambda: torch.mm(a, b, out=c)


for _n in [8192, 16384, 32768, 65536, 131072, 262144, 524288]:
    grain(_n)
for _m, _k, _n in [(80, 64, 64), (200, 64, 64), (800, 64, 64), (800, 64, 256), (800, 256, 64),
                   (800, 128, 128), (768, 128, 512), (2048, 256, 256), (2048, 256, 1024)]:
    grain_sgemm(_m, _k, _n)


# --- The products table (issue 48; ember_bench's products/ rows, bench/products.cpp): one Float32
# product torch.mm(a, b, out=c) per step, op(a) (m, k), op(b) (k, n), an operand marked T the
# transposed view of a contiguous tensor. PRODUCT_SHAPES mirrors kProductShapes in
# bench/products.cpp row for row (keep the two the same; the sources of the shapes are told
# there): group, what, m, n, k, transposes.
PRODUCT_SHAPES = [
    ("A", "qkv", 800, 512, 512, "NT"),
    ("A", "ff1", 800, 2048, 512, "NT"),
    ("A", "ff2", 800, 512, 2048, "NT"),
    ("A", "ff1.dX", 800, 512, 2048, "NN"),
    ("A", "ff1.dW", 2048, 512, 800, "TN"),
    ("A", "qkv.dW", 512, 512, 800, "TN"),
    ("B", "qkv", 800, 64, 64, "NT"),
    ("B", "ff1", 800, 256, 64, "NT"),
    ("B", "ff1.dX", 800, 64, 256, "NN"),
    ("B", "ff1.dW", 256, 64, 800, "TN"),
    ("B", "ff2.dX", 800, 256, 64, "NN"),
    ("C", "generator", 1024, 1000, 512, "NT"),
    ("C", "ff1", 1024, 2048, 512, "NT"),
    ("C", "ff1.dW", 2048, 512, 1024, "TN"),
    ("lstm", "hidden", 64, 1024, 256, "NT"),
    ("lstm", "hidden.dh", 64, 256, 1024, "NN"),
    ("lstm", "hidden.dW", 1024, 256, 64, "TN"),
    ("lstm", "input", 2048, 1024, 256, "NT"),
    ("conv", "cnn.conv2", 32, 100352, 288, "NN"),
    ("conv", "cnn.conv4", 64, 25088, 576, "NN"),
    ("conv", "cnn.conv3", 64, 25088, 288, "NN"),
    ("conv", "resnet.stage1", 16, 100352, 144, "NN"),
    ("small", "fixed", 16, 16, 16, "NN"),
    ("small", "fixed", 32, 64, 32, "NT"),
    ("small", "fixed", 64, 64, 64, "NN"),
    ("small", "fixed", 128, 128, 128, "NN"),
]


def product_operand(rows, cols, transposed):
    """(rows, cols), as a contiguous tensor or the transposed view of one."""
    return torch.rand(cols, rows).t() if transposed else torch.rand(rows, cols)


def product(group, what, m, n, k, trans):
    @workload(f"products/{group} {what} {m}x{n}x{k} {trans}", 2.0 * m * n * k)
    def _(tiny):
        def size(d):  # --smoke: each size a sixteenth (and at least 1), the transposes kept
            return d // 16 + 1 if tiny else d
        m_, n_, k_ = size(m), size(n), size(k)
        a = product_operand(m_, k_, trans[0] == "T")
        b = product_operand(k_, n_, trans[1] == "T")
        c = torch.empty(m_, n_)
        return lambda: torch.mm(a, b, out=c)


for _p in PRODUCT_SHAPES:
    product(*_p)


# --- The convolution layers of examples/fashion_mnist at batch 128 (bench/conv_shapes.h):
# forward alone and forward + backward (input, weight and bias gradients), in NCHW as Ember's
# conv/ rows, and the same in channels_last ("... channels_last"), where PyTorch's oneDNN path
# keeps its blocked/NHWC layout between layers.

CONV_BATCH = 128
CONV_SHAPES = [  # model, layer, C_in, C_out, kernel, stride, size, bias
    ("cnn", "conv1", 1, 32, 3, 1, 28, True),
    ("cnn", "conv2", 32, 32, 3, 1, 28, True),
    ("cnn", "conv3", 32, 64, 3, 1, 14, True),
    ("cnn", "conv4", 64, 64, 3, 1, 14, True),
    ("resnet", "stem", 1, 16, 3, 1, 28, False),
    ("resnet", "stage1", 16, 16, 3, 1, 28, False),
    ("resnet", "stage2.conv1", 16, 32, 3, 2, 28, False),
    ("resnet", "stage2.proj", 16, 32, 1, 2, 28, False),
    ("resnet", "stage2", 32, 32, 3, 1, 14, False),
    ("resnet", "stage3.conv1", 32, 64, 3, 2, 14, False),
    ("resnet", "stage3.proj", 32, 64, 1, 2, 14, False),
    ("resnet", "stage3", 64, 64, 3, 1, 7, False),
]


def conv_layer(model, layer, c_in, c_out, k, stride, size, bias):
    pad = k // 2
    out = (size + 2 * pad - k) // stride + 1
    flops = 2.0 * CONV_BATCH * c_out * out * out * c_in * k * k
    name = f"{model} {layer} {c_in}->{c_out} {k}x{k}{'' if stride == 1 else f' s{stride}'} " \
           f"{size}x{size}"

    def tensors(tiny, channels_last):
        n, s = (2, 5) if tiny else (CONV_BATCH, size)
        v = [torch.rand(n, c_in, s, s) * 2 - 1, (torch.rand(c_out, c_in, k, k) * 2 - 1) * 0.1]
        if channels_last:
            v = [t.contiguous(memory_format=torch.channels_last) for t in v]
        if bias:
            v.append(torch.rand(c_out) * 0.1)
        return v

    def conv(v):
        return nn.functional.conv2d(v[0], v[1], v[2] if bias else None, stride, pad)

    for suffix, channels_last in (("", False), (" channels_last", True)):
        @workload(f"conv/{name} forward{suffix}", flops)
        def _(tiny, channels_last=channels_last):
            v = tensors(tiny, channels_last)

            def step():
                with torch.no_grad():
                    conv(v)
            return step

        @workload(f"conv/{name} fwd+bwd{suffix}", 3 * flops)
        def _(tiny, channels_last=channels_last):
            v = [t.requires_grad_() for t in tensors(tiny, channels_last)]
            grad_out = torch.rand(conv(v).shape)
            if channels_last:
                grad_out = grad_out.contiguous(memory_format=torch.channels_last)

            def step():
                conv(v).backward(grad_out)
                for t in v:
                    t.grad = None
            return step


for _c in CONV_SHAPES:
    conv_layer(*_c)


# --- One training step of each model of examples/fashion_mnist (the twin's own definitions in
# bench/pytorch/fashion_mnist.py) at batch 128: forward, cross-entropy, backward and Adam's update
# on random images and labels, as ember_bench's fashion/ rows; NCHW and channels_last.

def fashion_step(model):
    import fashion_mnist  # bench/pytorch/fashion_mnist.py, beside this file

    for suffix, channels_last in (("", False), (" channels_last", True)):
        @workload(f"fashion/{model} train step b{CONV_BATCH}{suffix}")
        def _(tiny, channels_last=channels_last):
            n = 2 if tiny else CONV_BATCH
            net = fashion_mnist.cnn() if model == "cnn" else fashion_mnist.ResNet()
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            net = net.to(memory_format=fmt).train()
            adam = torch.optim.Adam(net.parameters())
            x = ((torch.rand(n, 1, 28, 28) - 0.2860) / 0.3530).contiguous(memory_format=fmt)
            y = torch.randint(0, 10, (n,))

            def step():
                adam.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(net(x), y).backward()
                adam.step()
            return step


fashion_step("cnn")
fashion_step("resnet")


# --- One LSTM and one GRU layer over a whole sequence (input 256, hidden 256, batch 64, 32 steps),
# as ember_bench's rnn/ rows: the forward alone and forward + backward through time.

def rnn_layer(kind, cls, gates):
    steps, batch, size = 32, 64, 256
    flops = 2.0 * steps * batch * gates * size * (size + size)

    def make(tiny, grad):
        t, b, i, h = (3, 2, 4, 5) if tiny else (steps, batch, size, size)
        layer = cls(i, h)
        x = torch.rand(t, b, i) * 2 - 1
        return layer, x.requires_grad_(grad)

    @workload(f"rnn/{kind} 256x256 b64 t32 forward", flops)
    def _(tiny):
        layer, x = make(tiny, False)

        def step():
            with torch.no_grad():
                layer(x)
        return step

    @workload(f"rnn/{kind} 256x256 b64 t32 fwd+bwd", 3 * flops)
    def _(tiny):
        layer, x = make(tiny, True)
        grad_out = torch.rand(layer(x)[0].shape)

        def step():
            layer(x)[0].backward(grad_out)
            x.grad = None
            layer.zero_grad(set_to_none=True)
        return step


rnn_layer("lstm", nn.LSTM, 4)
rnn_layer("gru", nn.GRU, 3)


# --- forward mode: a jvp of an MLP 512-1024-1024-512 (tanh), batch 256, against its input

def jvp_mlp():
    name = "jvp/mlp 512-1024-1024-512 tanh b256"
    flops = 2.0 * 256 * (512 * 1024 + 1024 * 1024 + 1024 * 512)

    def make(tiny):
        sizes = [4, 6, 6, 4] if tiny else [512, 1024, 1024, 512]
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i + 2 < len(sizes):
                layers.append(nn.Tanh())
        mlp = nn.Sequential(*layers).requires_grad_(False)
        b = 2 if tiny else 256
        return mlp, torch.randn(b, sizes[0]), torch.randn(b, sizes[0])

    @workload(f"{name} forward", flops)
    def _(tiny):
        mlp, x, _ = make(tiny)

        def step():
            with torch.no_grad():
                mlp(x)
        return step

    @workload(f"{name} jvp forward mode", 2 * flops)
    def _(tiny):
        mlp, x, v = make(tiny)

        def step():
            torch.func.jvp(mlp, (x,), (v,))
        return step


jvp_mlp()


# --- D2L 11.2 parametric attention pooling: one epoch of training

class NWKernelRegression(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.rand((1,), requires_grad=True))

    def forward(self, queries, keys, values):
        queries = queries.repeat_interleave(keys.shape[1]).reshape((-1, keys.shape[1]))
        self.attention_weights = nn.functional.softmax(
            -((queries - keys) * self.w)**2 / 2, dim=1)
        return torch.bmm(self.attention_weights.unsqueeze(1), values.unsqueeze(-1)).reshape(-1)


def nw_epoch(n):
    @workload(f"nw/epoch n_train={n}")
    def _(tiny):
        n_train = 5 if tiny else n
        x_train, _ = torch.sort(torch.rand(n_train) * 5)
        y_train = 2 * torch.sin(x_train) + x_train**0.8 + torch.normal(0.0, 0.5, (n_train,))
        off_diagonal = (1 - torch.eye(n_train)).type(torch.bool)
        keys = x_train.repeat((n_train, 1))[off_diagonal].reshape((n_train, -1))
        values = y_train.repeat((n_train, 1))[off_diagonal].reshape((n_train, -1))
        net = NWKernelRegression()
        loss = nn.MSELoss(reduction='none')
        trainer = torch.optim.SGD(net.parameters(), lr=0.5)

        def step():
            trainer.zero_grad()
            l = loss(net(x_train, keys, values), y_train)
            l.sum().backward()
            trainer.step()
        return step


for _n in (50, 1000, 4000):
    nw_epoch(_n)


# --- Annotated Transformer training steps: forward, label-smoothed KL / ntokens, backward,
# Adam + LambdaLR (Noam rate), dropout 0.1, one fixed batch of the copy task's kind

TRANSFORMERS = [  # name, V, N, d_model, d_ff, h, batch, length
    ("transformer/A copy V=11 N=2 d=512 b=80 len=10", 11, 2, 512, 2048, 8, 80, 10),
    ("transformer/B small V=11 N=2 d=64 b=80 len=10", 11, 2, 64, 256, 4, 80, 10),
    ("transformer/C base V=1000 N=6 d=512 b=32 len=32", 1000, 6, 512, 2048, 8, 32, 32),
]


def transformer_flops(V, N, D, F, h, B, L):
    """Multiply-adds of the forward's products (projections, attention, feed-forward,
    generator) times 2 flops, times 3 for forward + backward."""
    S, T = L, L - 1
    enc = S * (4 * D * D + 2 * D * F) + 2 * S * S * D
    dec = T * (4 * D * D + 2 * D * F) + 2 * T * T * D + T * 2 * D * D + S * 2 * D * D + 2 * T * S * D
    return 3 * 2 * B * (N * (enc + dec) + T * D * V)


def transformer_setup(tiny, V, N, d_model, d_ff, h, batch, length):
    """The model (train mode, dropout 0.1), loss and one fixed batch of a transformer workload;
    the tiny config for --smoke."""
    from annotated_transformer import Batch, LabelSmoothing, SimpleLossCompute, make_model
    if tiny:
        V, N, d_model, d_ff, h, batch, length = 11, 1, 16, 32, 2, 2, 5
    model = make_model(V, V, N=N, d_model=d_model, d_ff=d_ff, h=h, dropout=0.1)
    model.train()
    criterion = LabelSmoothing(size=V, padding_idx=0, smoothing=0.1)
    loss_compute = SimpleLossCompute(model.generator, criterion)
    data = torch.randint(1, V, size=(batch, length))
    data[:, 0] = 1
    model.to(DEVICE)
    data = data.to(DEVICE)
    return model, loss_compute, Batch(data.clone(), data.clone(), 0), d_model


def transformer_step(name, *config):
    ON_DEVICE.add(name)

    @workload(name, transformer_flops(*config))
    def _(tiny):
        from annotated_transformer import rate
        model, loss_compute, batch_, d = transformer_setup(tiny, *config)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.5, betas=(0.9, 0.98), eps=1e-9)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda=lambda step: rate(step, d, factor=1.0, warmup=400))
        forward = torch.compile(model.forward) if COMPILE else model.forward

        def step():
            out = forward(batch_.src, batch_.tgt, batch_.src_mask, batch_.tgt_mask)
            _, loss_node = loss_compute(out, batch_.tgt_y, batch_.ntokens)
            loss_node.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        return step


for _t in TRANSFORMERS:
    transformer_step(*_t)


def second_order(name, hvp, *config):
    """Step B's model and batch without the optimizer: the loss's gradient with respect to every
    parameter, or a Hessian-vector product (the gradient with create_graph, then the gradient of
    g.v), as ember_bench's second-order/ rows."""
    ON_DEVICE.add(name)

    @workload(name, transformer_flops(*config))
    def _(tiny):
        model, loss_compute, batch_, _ = transformer_setup(tiny, *config)
        params = list(model.parameters())
        v = [torch.randn_like(p) for p in params]

        def step():
            out = model.forward(batch_.src, batch_.tgt, batch_.src_mask, batch_.tgt_mask)
            _, loss = loss_compute(out, batch_.tgt_y, batch_.ntokens)
            g = torch.autograd.grad(loss, params, create_graph=hvp)
            if hvp:
                torch.autograd.grad(g, params, v)
        return step


for _hvp, _suffix in ((False, "gradient"), (True, "hvp")):
    second_order("second-order/B " + _suffix, _hvp, *TRANSFORMERS[1][1:])


class _LossOf(nn.Module):
    """The model's loss on one batch as a module, so that functional_call swaps every parameter
    the loss uses (the generator's too) while it runs."""

    def __init__(self, model, loss_compute):
        super().__init__()
        self.model = model
        self.loss_compute = loss_compute

    def forward(self, b):
        out = self.model.forward(b.src, b.tgt, b.src_mask, b.tgt_mask)
        return self.loss_compute(out, b.tgt_y, b.ntokens)[1]


def second_order_functional(name, *config):
    """The Hessian-vector product as torch.autograd.functional.vhp of the loss as a function of
    the parameters (torch.func.functional_call), as ember_bench's autograd::functional::vhp with
    nn::functional_call."""
    ON_DEVICE.add(name)

    @workload(name, transformer_flops(*config))
    def _(tiny):
        model, loss_compute, batch_, _ = transformer_setup(tiny, *config)
        try:
            from torch.func import functional_call
        except ImportError:  # PyTorch 1.13
            from torch.nn.utils.stateless import functional_call
        loss_of = _LossOf(model, loss_compute)
        names = [n for n, _ in loss_of.named_parameters()]
        params = tuple(p.detach() for _, p in loss_of.named_parameters())
        v = tuple(torch.randn_like(p) for p in params)

        def f(*xs):
            return functional_call(loss_of, dict(zip(names, xs)), (batch_,))

        def step():
            torch.autograd.functional.vhp(f, params, v)
        return step


second_order_functional("second-order/B vhp (functional)", *TRANSFORMERS[1][1:])


def jvp_step_b(config):
    """Issue 46's jvp/ rows on step B's model, as ember_bench's: the loss alone under no_grad, and
    torch.func.jvp of functional_call along a direction v of the input embeddings (the two
    embedding tables) or of every parameter (ember_bench also times its double-vjp trick, which
    has no twin here)."""
    flops = transformer_flops(*config)

    def setup(tiny):
        from annotated_transformer import PositionalEncoding
        model, loss_compute, batch_, _ = transformer_setup(tiny, *config)
        # The original's positional encoding calls requires_grad_(False) on its (constant) table
        # in forward, which torch.func refuses inside a transform: the same sum without the call.
        for m in model.modules():
            if isinstance(m, PositionalEncoding):
                m.forward = types.MethodType(
                    lambda self, x: self.dropout(x + self.pe[:, : x.size(1)]), m)
        return _LossOf(model, loss_compute), batch_

    @workload("jvp/B loss forward", flops / 3)
    def _(tiny):
        loss_of, batch_ = setup(tiny)

        def step():
            with torch.no_grad():
                loss_of(batch_)
        return step

    for embeddings_only, what, products in ((True, "input embeddings", 2),
                                            (False, "all parameters", 3)):
        @workload(f"jvp/B loss, {what} jvp forward mode", products * flops / 3)
        def _(tiny, embeddings_only=embeddings_only):
            from torch.func import functional_call
            loss_of, batch_ = setup(tiny)
            named = [(n, p.detach()) for n, p in loss_of.named_parameters()
                     if not embeddings_only or ".lut." in n]
            names = [n for n, _ in named]
            params = tuple(p for _, p in named)
            v = tuple(torch.randn_like(p) for p in params)

            def f(*xs):
                return functional_call(loss_of, dict(zip(names, xs)), (batch_,))

            def step():
                torch.func.jvp(f, params, v)
            return step


jvp_step_b(TRANSFORMERS[1][1:])


# --- harness

def wait_for_device():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def time_steps(step, target):
    w0 = time.perf_counter()
    warm = 0
    while True:
        step()
        warm += 1
        wait_for_device()
        if time.perf_counter() - w0 >= 0.1 * target or warm >= 100000:
            break
    estimate = max((time.perf_counter() - w0) / warm, 1e-9)
    inner = max(1, math.ceil(max(1e-3, target / 200) / estimate))
    samples = min(max(int(target / (estimate * inner)), 3), 200)
    per_step = []
    cpu0 = time.process_time()
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            step()
        wait_for_device()
        per_step.append((time.perf_counter() - t0) / inner)
    cpu = (time.process_time() - cpu0) / (samples * inner)
    per_step.sort()
    k = len(per_step)
    median = per_step[k // 2] if k % 2 else 0.5 * (per_step[k // 2 - 1] + per_step[k // 2])
    return median, per_step[0], cpu, samples, inner


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--filter", action="append", default=[])
    p.add_argument("--exact", action="append", default=[])
    p.add_argument("--json", default="")
    p.add_argument("--time", type=float, default=1.0)
    p.add_argument("--list", action="store_true")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--matmul-precision", choices=["highest", "high", "medium"], default="highest")
    p.add_argument("--autocast", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    global DEVICE, COMPILE
    DEVICE, COMPILE = torch.device(a.device), a.compile
    torch.set_num_threads(a.threads)
    torch.set_float32_matmul_precision(a.matmul_precision)

    def selected(name):
        if DEVICE.type != "cpu" and name not in ON_DEVICE:
            return False
        if a.exact:
            return name in a.exact
        return not a.filter or any(f in name for f in a.filter)

    results = []
    for name, flops, make, bytes_ in WORKLOADS:
        if not selected(name):
            continue
        if a.list:
            print(name)
            continue
        torch.manual_seed(0)
        step = make(a.smoke)
        if a.autocast:
            def step(plain=step):
                with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                    plain()
        if a.smoke:
            step()
            print(f"{name:<44} ok")
            continue
        median, best, cpu, samples, inner = time_steps(step, a.time)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rate = f"{flops / median * 1e-9:8.1f} GFLOP/s" if flops else ""
        if bytes_:
            rate = f"{bytes_ / median * 1e-9:8.1f} GB/s"
        print(f"{name:<44} median {median * 1e6:11.3f} us  min {best * 1e6:11.3f} us  "
              f"cpu {cpu * 1e6:11.3f} us  "
              f"({samples}x{inner})  {rate}", flush=True)
        results.append(dict(name=name, median_s=median, min_s=best, cpu_s=cpu, samples=samples,
                            inner=inner, flops=flops, bytes=bytes_, max_rss_kb=rss))
    if a.json and not a.list and not a.smoke:
        with open(a.json, "w") as f:
            gpu = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else ""
            json.dump(dict(side="pytorch", threads=a.threads, torch=torch.__version__,
                           matmul_precision=a.matmul_precision, autocast=a.autocast,
                           device=str(DEVICE), gpu=gpu, compile=a.compile,
                           results=results), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
