"""Golden values for nn::RNN, nn::GRU, nn::LSTM and the cells (tests/test_rnn.cpp) from torch.nn,
over every option: layers, bias, batch_first, bidirectional, tanh/relu, given or zero states,
padded or packed (lengths sorted or not), unbatched inputs; for each the outputs and the
gradients of the input, the states and every parameter for a fixed upstream gradient. Parameters
and inputs are fixed by a formula of the flat index (value() below, the same in the C++ test), so
only results are stored. Also rnn_model.safetensors: the state dict of a torch LSTM and GRU that
the C++ test loads through nn::load.
Run: /usr/bin/python3 tests/golden/gen_rnn.py -> rnn.json, rnn_model.safetensors"""
import os

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from golden import HERE, write
from gen_safetensors import save_file

T, B, I, H = 4, 3, 3, 2
KINDS = ("RNN tanh", "RNN relu", "GRU", "LSTM")


def value(shape, seed):
    """Values ((k·7 + 3·seed + 1) mod 17 − 8) / 10 over the flat index k (as value() in C++)."""
    n = 1
    for s in shape:
        n *= s
    k = torch.arange(n, dtype=torch.float64)
    return (((k * 7 + 3 * seed + 1) % 17) - 8).reshape(shape) / 10


def make(kind, layers, bias, batch_first, bidirectional):
    cls = {"RNN": nn.RNN, "GRU": nn.GRU, "LSTM": nn.LSTM}[kind.split()[0]]
    extra = {"nonlinearity": kind.split()[1]} if kind.startswith("RNN") else {}
    m = cls(I, H, num_layers=layers, bias=bias, batch_first=batch_first,
            bidirectional=bidirectional, **extra).double()
    with torch.no_grad():
        for p, (_, t) in enumerate(m.named_parameters()):
            t.copy_(value(t.shape, p + 10))
    return m


def record(values, name, m, x, states, out, h_n, c_n):
    """The results and, for upstream gradients value(·, 1..3), the gradients of x, the states
    and every parameter."""
    values[name + ".out"] = out
    values[name + ".h_n"] = h_n
    loss = (out * value(out.shape, 1)).sum() + (h_n * value(h_n.shape, 2)).sum()
    if c_n is not None:
        values[name + ".c_n"] = c_n
        loss = loss + (c_n * value(c_n.shape, 3)).sum()
    loss.backward()
    values[name + ".gx"] = x.grad
    for s, t in zip(("h0", "c0"), states):
        values[name + ".g" + s] = t.grad
    for pname, t in m.named_parameters():
        values[name + ".g." + pname] = t.grad


def modules(values):
    for kind in KINDS:
        for layers in (1, 2):
            for bias in (True, False):
                for batch_first in (False, True):
                    for bidirectional in (False, True):
                        for state in (False, True):
                            for packed in ("padded", "sorted", "unsorted"):
                                name = (f"{kind} L{layers} bias{int(bias)} bf{int(batch_first)} "
                                        f"bi{int(bidirectional)} state{int(state)} {packed}")
                                one(values, name, kind, layers, bias, batch_first, bidirectional,
                                    state, packed)
                        m = make(kind, layers, bias, batch_first, bidirectional)
                        values[f"{kind} L{layers} bias{int(bias)} bi{int(bidirectional)}.names"] = \
                            " ".join(f"{k}:{list(t.shape)}" for k, t in m.state_dict().items())


def one(values, name, kind, layers, bias, batch_first, bidirectional, state, packed):
    m = make(kind, layers, bias, batch_first, bidirectional)
    x = value((B, T, I) if batch_first else (T, B, I), 4).requires_grad_()
    D = 2 if bidirectional else 1
    states = []
    if state:
        states.append(value((layers * D, B, H), 5).requires_grad_())
        if kind == "LSTM":
            states.append(value((layers * D, B, H), 6).requires_grad_())
    hx = None if not states else (states[0] if kind != "LSTM" else tuple(states))
    if packed == "padded":
        r = m(x, hx)
        out = r[0]
    else:
        lengths = torch.tensor([4, 2, 1] if packed == "sorted" else [2, 4, 1])
        seq = pack_padded_sequence(x, lengths, batch_first, enforce_sorted=packed == "sorted")
        r = m(seq, hx)
        out = pad_packed_sequence(r[0], batch_first, total_length=T)[0]
        values[name + ".data"] = r[0].data
    h_n, c_n = (r[1], None) if kind != "LSTM" else r[1]
    record(values, name, m, x, states, out, h_n, c_n)


def unbatched(values):
    for kind in KINDS:
        for bidirectional in (False, True):
            name = f"{kind} unbatched bi{int(bidirectional)}"
            m = make(kind, 2, True, False, bidirectional)
            D = 2 if bidirectional else 1
            x = value((T, I), 4).requires_grad_()
            states = [value((2 * D, H), 5).requires_grad_()]
            if kind == "LSTM":
                states.append(value((2 * D, H), 6).requires_grad_())
            hx = states[0] if kind != "LSTM" else tuple(states)
            out, hn = m(x, hx)
            h_n, c_n = (hn, None) if kind != "LSTM" else hn
            record(values, name, m, x, states, out, h_n, c_n)


def cells(values):
    for kind in ("RNNCell tanh", "RNNCell relu", "GRUCell", "LSTMCell"):
        for bias in (True, False):
            for batched in (False, True):
                for state in (False, True):
                    name = f"{kind} bias{int(bias)} batched{int(batched)} state{int(state)}"
                    cls = {"RNNCell": nn.RNNCell, "GRUCell": nn.GRUCell,
                           "LSTMCell": nn.LSTMCell}[kind.split()[0]]
                    extra = {"nonlinearity": kind.split()[1]} if kind.startswith("RNNCell") else {}
                    m = cls(I, H, bias=bias, **extra).double()
                    with torch.no_grad():
                        for p, (_, t) in enumerate(m.named_parameters()):
                            t.copy_(value(t.shape, p + 10))
                    x = value((B, I) if batched else (I,), 4).requires_grad_()
                    shape = (B, H) if batched else (H,)
                    states = []
                    if state:
                        states.append(value(shape, 5).requires_grad_())
                        if kind == "LSTMCell":
                            states.append(value(shape, 6).requires_grad_())
                    hx = None if not states else (states[0] if kind != "LSTMCell"
                                                  else tuple(states))
                    r = m(x, hx)
                    h, c = (r, None) if kind != "LSTMCell" else r
                    record(values, name, m, x, states, h, h, c)


def state_dict_model(values):
    """A torch LSTM (2 layers, bidirectional, batch_first) and GRU after one SGD step, in Float32."""
    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(I, H, num_layers=2, batch_first=True, bidirectional=True)
            self.gru = nn.GRU(2 * H, H)

    model = Model()
    x = torch.randn(B, T, I)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out, _ = model.lstm(x)
    y, h = model.gru(out.transpose(0, 1))
    (y.square().sum() + h.sum()).backward()
    opt.step()
    save_file(model.state_dict(), os.path.join(HERE, "rnn_model.safetensors"))
    with torch.no_grad():
        out, (h_n, c_n) = model.lstm(x)
        y, h = model.gru(out.transpose(0, 1))
    values["model.x"] = x
    values["model.lstm_out"] = out
    values["model.lstm_c_n"] = c_n
    values["model.gru_out"] = y
    values["model.gru_h_n"] = h


def main():
    values = {}
    modules(values)
    unbatched(values)
    cells(values)
    state_dict_model(values)
    write("rnn", values)


if __name__ == "__main__":
    main()
