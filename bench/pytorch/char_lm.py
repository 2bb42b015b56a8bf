#!/usr/bin/python3
"""The character-level GPT in PyTorch: the reference side of `examples/char_lm`.

nanoGPT's model (model.py: token + learned position embeddings, pre-norm blocks of causal
self-attention and a GELU MLP, final LayerNorm, output tied to the token embedding, N(0, 0.02)
init with the residual projections scaled by 1/sqrt(2 layers), no biases) and its training loop
(train.py: AdamW betas 0.9/0.99 with decay on the matrices only, linear warmup then cosine decay
to min_lr, clipping at 1, random windows of the text, eval of --eval-iters batches of each split
every --eval-interval iterations), at nanoGPT's CPU config by default, on the same text and
split as Ember's trainer: the fortune files of Debian's `fortunes` package without a dot in their
name, in name order, concatenated; the first 90% train; the vocabulary the sorted distinct
characters. Attention is nanoGPT's: F.scaled_dot_product_attention(is_causal=True) where torch
has it (2.0 and later), else written out (q k^T / sqrt(d), causal mask, softmax, @ v), nanoGPT's
own fallback and the only path of Debian's PyTorch 1.13; --no-flash forces the fallback.
Writes OUT/metrics.json with the keys of Ember's (plus `side`).

    OMP_NUM_THREADS=N OPENBLAS_NUM_THREADS=N /usr/bin/python3 bench/pytorch/char_lm.py \
        --threads N --out DIR
"""
import argparse
import json
import math
import os
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

FLASH = hasattr(F, "scaled_dot_product_attention")  # set from --no-flash in main()


def read_text(data):
    if os.path.isdir(data):
        files = sorted(os.path.join(data, f) for f in os.listdir(data)
                       if "." not in f and os.path.isfile(os.path.join(data, f))
                       and not os.path.islink(os.path.join(data, f)))
    else:
        files = [data]
    text = "".join(open(f, encoding="utf-8", errors="surrogateescape").read() for f in files)
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    ids = torch.tensor([stoi[ch] for ch in text], dtype=torch.long)
    n = len(ids) * 9 // 10
    return files, chars, ids[:n], ids[n:]


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, block, dropout):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.heads = heads
        self.dropout = dropout
        self.flash = FLASH
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, d, dropout):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm with an optional bias (torch 1.13's nn.LayerNorm has no bias=False)."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class Block(nn.Module):
    def __init__(self, d, heads, block, dropout):
        super().__init__()
        self.ln_1 = LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, block, dropout)
        self.ln_2 = LayerNorm(d)
        self.mlp = MLP(d, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, d, dropout):
        super().__init__()
        self.block = block
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(d, heads, block, dropout) for _ in range(layers)])
        self.ln_f = LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--lr-decay-iters", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta2", type=float, default=0.99)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--eval-interval", type=int, default=250)
    ap.add_argument("--eval-iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--out", default="out/char_lm_pytorch")
    ap.add_argument("--matmul-precision", choices=["highest", "high", "medium"],
                    default="highest", help="torch.set_float32_matmul_precision")
    ap.add_argument("--autocast", action="store_true",
                    help="forward and loss under torch.autocast('cpu', torch.bfloat16)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (Ember's --device)")
    ap.add_argument("--compile", action="store_true",
                    help="train through torch.compile(model) (issue 35's comparison beside eager)")
    ap.add_argument("--no-flash", action="store_true",
                    help="attention written out even where F.scaled_dot_product_attention exists")
    a = ap.parse_args()
    global FLASH
    FLASH = FLASH and not a.no_flash
    torch.set_num_threads(a.threads)
    torch.set_float32_matmul_precision(a.matmul_precision)
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    files, chars, train_data, val_data = read_text(a.data)
    print(f"{len(files)} files, {len(train_data) + len(val_data)} characters: train "
          f"{len(train_data)}, val {len(val_data)}; vocabulary {len(chars)}", flush=True)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    model = GPT(len(chars), a.block, a.layers, a.heads, a.d_model, a.dropout).to(device)
    step_model = torch.compile(model) if a.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=a.lr, betas=(0.9, a.beta2))
    decay_iters = a.lr_decay_iters or a.iters

    def get_lr(it):
        if it < a.warmup:
            return a.lr * (it + 1) / (a.warmup + 1)
        if it > decay_iters:
            return a.min_lr
        ratio = (it - a.warmup) / max(decay_iters - a.warmup, 1)
        return a.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (a.lr - a.min_lr)

    def get_batch(data):
        ix = torch.randint(len(data) - a.block, (a.batch,))
        x = torch.stack([data[i:i + a.block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + a.block] for i in ix])
        return x.to(device), y.to(device)

    @torch.no_grad()
    def estimate_loss():
        model.eval()
        out = []
        for data in (train_data, val_data):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.autocast):
                losses = [model(*get_batch(data)).item() for _ in range(a.eval_iters)]
            out.append(sum(losses) / len(losses))
        model.train()
        return out

    eval_at, train_losses, val_losses = [], [], []
    train_seconds, window, timed = 0.0, 0.0, 0
    # torch.compile compiles in its first iterations: those are left out of the timing
    untimed = 2 if a.compile else 0
    for it in range(a.iters + 1):
        if it % a.eval_interval == 0 or it == a.iters:
            tl, vl = estimate_loss()
            eval_at.append(it)
            train_losses.append(tl)
            val_losses.append(vl)
            print(f"step {it}: train loss {tl:.4f}, val loss {vl:.4f}", flush=True)
        if it == a.iters:
            break
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it)
        model.train()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.autocast):
            loss = step_model(*get_batch(train_data))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:  # the step's kernels done, as Ember's step (which reads its loss) waits for them
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        if it >= untimed:
            train_seconds += seconds
            timed += 1
        window += seconds
        if (it + 1) % a.log_every == 0:
            print(f"iter {it + 1}: loss {loss.item():.4f}, {1e3 * window / a.log_every:.1f} "
                  f"ms/iter", flush=True)
            window = 0.0
    per_iter = train_seconds / max(timed, 1)
    metrics = {
        "side": f"pytorch {torch.__version__}",
        "config": {k: v for k, v in vars(a).items() if k not in ("out", "log_every")},
        "vocab_size": len(chars),
        "train_chars": len(train_data),
        "val_chars": len(val_data),
        "eval_iter": eval_at,
        "train_loss": train_losses,
        "val_loss": val_losses,
        "iters": a.iters,
        "train_seconds": train_seconds,
        "ms_per_iter": 1e3 * per_iter,
        "tokens_per_second": a.batch * a.block / per_iter,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
        f.write("\n")
    print(f"val loss {val_losses[-1]:.4f} after {a.iters} iterations, {1e3 * per_iter:.1f} ms/iter")


if __name__ == "__main__":
    main()
