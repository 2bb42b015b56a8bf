"""Golden values for tests/test_transformer.cpp: the Annotated Transformer (harvardnlp, 2022
edition, bench/pytorch/annotated_transformer.py), with torch.nn.LayerNorm(eps=1e-6) in place of its
hand-written LayerNorm (the original divides by the unbiased std + eps; Ember uses
torch.nn.LayerNorm's biased variance, a documented difference). A seeded model (N=2, d_model=32,
d_ff=64, h=4, V=11) is saved as transformer_model.safetensors (its parameters, Float32, written by
hand), then run in Float64 and eval mode on a fixed padded batch: log-probabilities, the
label-smoothed KL loss per token, some parameter gradients and the original's greedy decoding of
each source row go to transformer.json; the parameter names and shapes in PyTorch's order, and the
groups of parameters equal at initialisation, to transformer_names.json; six training steps, with
dropout off and with Ember's dropout masks, to transformer_train.json. Run with Debian's
python3-torch: /usr/bin/python3 gen_transformer.py"""
import json
import os
import struct
import sys

import numpy as np
import torch

from golden import HERE, write

# The model code is bench/pytorch/annotated_transformer.py, shared with the benchmarks.
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "pytorch"))
from annotated_transformer import (Batch, LabelSmoothing, greedy_decode,  # noqa: E402
                                   make_model, rate)


def write_safetensors(path, named):
    """The safetensors layout: u64 LE header length, JSON header, raw LE data."""
    header, blobs, offset = {}, [], 0
    for name, t in named:
        data = t.detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt", "source": "tests/golden/gen_transformer.py"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    print("wrote", path, os.path.getsize(path), "bytes")


def main():
    torch.manual_seed(0)
    V = 11
    model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # Parameters only: the positional tables are recomputed by Ember (5000 x 32 each).
    write_safetensors(os.path.join(HERE, "transformer_model.safetensors"),
                      list(model.named_parameters()))
    names = {"names": [n for n, _ in model.named_parameters()],
             "shapes": [list(p.shape) for _, p in model.named_parameters()],
             "buffers": [n for n, _ in model.named_buffers()]}
    # The parameters that the original's deep copies (clones, make_model's copy.deepcopy) leave
    # equal at initialisation, as groups of names: make_model re-draws only the matrices.
    groups = {}
    for n, p in model.named_parameters():
        groups.setdefault(p.detach().numpy().tobytes(), []).append(n)
    names["equal_at_init"] = [g for g in groups.values() if len(g) > 1]
    with open(os.path.join(HERE, "transformer_names.json"), "w") as f:
        json.dump(names, f, indent=0)
        f.write("\n")

    model = model.double()
    model.eval()
    # A padded batch (pad 0): the second and third rows end in padding.
    src = torch.tensor([[1, 5, 2, 9, 3, 7, 4], [1, 8, 8, 6, 10, 0, 0], [1, 3, 4, 0, 0, 0, 0]])
    tgt = torch.tensor([[1, 5, 2, 9, 3, 7], [1, 8, 8, 6, 10, 0], [1, 3, 4, 0, 0, 0]])
    batch = Batch(src, tgt, pad=0)
    out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    log_probs = model.generator(out)
    criterion = LabelSmoothing(V, padding_idx=0, smoothing=0.1)
    loss = criterion(log_probs.contiguous().view(-1, V), batch.tgt_y.contiguous().view(-1))
    loss = loss / batch.ntokens
    loss.backward()

    values = {"src": src, "tgt": tgt, "log_probs": log_probs, "loss": loss,
              "ntokens": batch.ntokens, "pe": model.src_embed[1].pe[0, :12],
              "attn.decoder.layers.1.src_attn": model.decoder.layers[1].src_attn.attn[2]}
    params = dict(model.named_parameters())
    for name in ["encoder.layers.0.self_attn.linears.0.weight",
                 "encoder.layers.1.feed_forward.w_2.bias",
                 "decoder.layers.0.self_attn.linears.2.bias",
                 "decoder.layers.1.src_attn.linears.3.bias",
                 "decoder.layers.0.sublayer.2.norm.weight",
                 "encoder.norm.bias",
                 "src_embed.0.lut.weight",
                 "tgt_embed.0.lut.weight",
                 "generator.proj.weight"]:
        values["grad." + name] = params[name].grad
    # The original's greedy_decode (one sequence at a time) of each source row.
    with torch.no_grad():
        values["greedy"] = torch.cat([
            greedy_decode(model, src[i:i + 1], batch.src_mask[i:i + 1], src.size(1), 1)
            for i in range(src.size(0))])
    write("transformer", values)
    train_steps(initial)


# The training steps' three padded batches, taken in turn, and the parameters compared after them.
TRAIN_BATCHES = [torch.tensor([[1, 5, 2, 9, 3, 7, 4], [1, 8, 8, 6, 10, 0, 0]]),
                 torch.tensor([[1, 3, 4, 2, 0, 0, 0], [1, 9, 9, 9, 1, 2, 3]]),
                 torch.tensor([[1, 10, 7, 5, 3, 2, 6], [1, 4, 0, 0, 0, 0, 0]])]
TRAIN_PARAMS = ["encoder.layers.0.self_attn.linears.0.weight",
                "decoder.layers.1.src_attn.linears.3.bias",
                "decoder.layers.0.feed_forward.w_1.weight",
                "decoder.norm.weight",
                "tgt_embed.0.lut.weight",
                "generator.proj.bias"]


def train_steps(initial):
    """transformer_train.json: six training steps of the golden model in Float64 from its saved
    weights, dropout off (eval mode: Ember's and torch's random streams differ), the original's
    optimizer (Adam, betas 0.9/0.98, eps 1e-9, base lr 0.5) and LambdaLR on rate(step, 32, 1,
    warmup 4) (a short warmup, so that the weights move), label smoothing 0.1, over three fixed
    padded batches in turn: each step's loss and learning rate, and parameters afterwards."""
    V = 11
    model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4)
    model.load_state_dict(initial)
    model = model.double()
    model.eval()
    criterion = LabelSmoothing(V, padding_idx=0, smoothing=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda=lambda step: rate(step, 32, factor=1.0, warmup=4))
    losses, lrs = [], []
    for step in range(6):
        data = TRAIN_BATCHES[step % len(TRAIN_BATCHES)]
        batch = Batch(data, data, pad=0)
        out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
        log_probs = model.generator(out)
        loss = criterion(log_probs.contiguous().view(-1, V),
                         batch.tgt_y.contiguous().view(-1)) / batch.ntokens
        loss.backward()
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(loss.item())
    values = {"batch0": TRAIN_BATCHES[0], "batch1": TRAIN_BATCHES[1], "batch2": TRAIN_BATCHES[2],
              "losses": torch.tensor(losses, dtype=torch.float64),
              "lrs": torch.tensor(lrs, dtype=torch.float64)}
    params = dict(model.named_parameters())
    for name in TRAIN_PARAMS:
        values["param." + name] = params[name].detach()
    values.update(train_steps_with_dropout(initial))
    write("transformer_train", values)


class EmberGenerator:
    """std::mt19937_64 (C++11), Ember's global generator: manual_seed(s) then one call per
    dropout gives the keys Ember's dropouts draw."""
    M64 = (1 << 64) - 1

    def __init__(self, seed):
        self.state = [seed & self.M64]
        for i in range(1, 312):
            prev = self.state[-1]
            self.state.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & self.M64)
        self.index = 312

    def __call__(self):
        if self.index == 312:
            s = self.state
            for k in range(312):
                x = (s[k] & 0xFFFFFFFF80000000) | (s[(k + 1) % 312] & 0x7FFFFFFF)
                s[k] = s[(k + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
            self.index = 0
        y = self.state[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        return (y ^ (y >> 43)) & self.M64


def counter_bits(key, counters):
    """graph/random.h's counter_bits: SplitMix64 of the state key + (counter + 1) * gamma."""
    u = np.uint64
    with np.errstate(over="ignore"):
        z = u(key) + (counters + u(1)) * u(0x9E3779B97F4A7C15)
        z = (z ^ (z >> u(30))) * u(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> u(27))) * u(0x94D049BB133111EB)
    return z ^ (z >> u(31))


class EmberDropout(torch.nn.Module):
    """Ember's dropout masks (ops/dropout_mask.h, Note [Dropout masks]) in the original's
    model: the key is the generator's next draw; pair j's bits keep element j by their low half
    and element j + n/2 by their high half when the half is at least p * 2^32."""

    def __init__(self, p, generator):
        super().__init__()
        self.p, self.generator = p, generator

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        n, key = x.numel(), self.generator()
        threshold = int(self.p * 2**32)
        half = n // 2
        bits = counter_bits(key, np.arange(half + n % 2, dtype=np.uint64))
        keep = np.concatenate([(bits[:half] & 0xFFFFFFFF) >= threshold,
                               (bits[:half] >> np.uint64(32)) >= threshold,
                               (bits[half:] & 0xFFFFFFFF) >= threshold])
        keep = torch.from_numpy(keep).view(x.shape)
        return torch.where(keep, x * (1.0 / (1.0 - self.p)), torch.zeros((), dtype=x.dtype))


def train_steps_with_dropout(initial, seed=7):
    """The six steps of train_steps in training mode, every dropout (p = 0.1) drawing Ember's
    mask: Ember's test seeds its generator with `seed` before the first step and must then agree
    to rounding, which pins where the original applies dropout and how it scales."""
    assert _mt19937_64_check()
    V = 11
    model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4)
    model.load_state_dict(initial)
    model = model.double()
    generator = EmberGenerator(seed)
    replaced = 0
    for module in list(model.modules()):
        if isinstance(getattr(module, "dropout", None), torch.nn.Dropout):
            module.dropout = EmberDropout(module.dropout.p, generator)
            replaced += 1
    assert replaced == 22, replaced
    model.train()
    criterion = LabelSmoothing(V, padding_idx=0, smoothing=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda=lambda step: rate(step, 32, factor=1.0, warmup=4))
    losses = []
    for step in range(6):
        data = TRAIN_BATCHES[step % len(TRAIN_BATCHES)]
        batch = Batch(data, data, pad=0)
        log_probs = model.generator(model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask))
        loss = criterion(log_probs.contiguous().view(-1, V),
                         batch.tgt_y.contiguous().view(-1)) / batch.ntokens
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(loss.item())
    values = {"dropout.seed": torch.tensor(seed),
              "dropout.losses": torch.tensor(losses, dtype=torch.float64)}
    params = dict(model.named_parameters())
    for name in TRAIN_PARAMS:
        values["dropout.param." + name] = params[name].detach()
    return values


def _mt19937_64_check():
    """The C++ standard's check of std::mt19937_64: the 10000th draw from the default seed."""
    g = EmberGenerator(5489)
    for _ in range(9999):
        g()
    return g() == 9981545732273789042


if __name__ == "__main__":
    main()
