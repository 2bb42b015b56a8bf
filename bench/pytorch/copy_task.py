#!/usr/bin/python3
"""The Annotated Transformer's copy task in PyTorch, as the original notebook runs it: the
reference side of benchmark workload 4 (`examples/transformer_copy` at its defaults, wall time to
finish 20 epochs). Same defaults, flags and steps as Ember's trainer: per epoch 20 training
batches (forward, loss, backward, Adam, LambdaLR) and 5 evaluation batches (eval mode, no
autograd graph), then greedy decoding of `1 2 ... 10` and exact copies over 200 fresh sequences.
Writes OUT/metrics.json with the keys of Ember's (plus `side`).

    OMP_NUM_THREADS=N OPENBLAS_NUM_THREADS=N /usr/bin/python3 bench/pytorch/copy_task.py \
        --threads N --out DIR
"""
import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from annotated_transformer import (Batch, LabelSmoothing, SimpleLossCompute,  # noqa: E402
                                   make_model, rate, subsequent_mask)

V = 11  # vocabulary: 0 (padding) and 1 .. 10


def data_gen(V, batch_size, nbatches):
    for _ in range(nbatches):
        data = torch.randint(1, V, size=(batch_size, 10))
        data[:, 0] = 1
        src = data.requires_grad_(False).clone().detach()
        tgt = data.requires_grad_(False).clone().detach()
        yield Batch(src, tgt, 0)


def run_epoch(data_iter, model, loss_compute, optimizer, scheduler, state, log_every):
    """The original's run_epoch; training when an optimizer is given. Returns loss per token."""
    train = optimizer is not None
    start = time.perf_counter()
    total_loss, total_tokens, tokens = 0.0, 0, 0
    for i, batch in enumerate(data_iter):
        step_start = time.perf_counter()
        with torch.set_grad_enabled(train):
            out = model.forward(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
            loss, loss_node = loss_compute(out, batch.tgt_y, batch.ntokens)
        if train:
            loss_node.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            state["train_seconds"] += time.perf_counter() - step_start
            state["steps"] += 1
            state["tokens"] += int(batch.ntokens)
        total_loss += float(loss)
        total_tokens += int(batch.ntokens)
        tokens += int(batch.ntokens)
        if train and i % log_every == 1 % log_every:
            elapsed = time.perf_counter() - start
            lr = optimizer.param_groups[0]["lr"]
            print(f"Epoch Step: {i:6d} | Accumulation Step: {state['steps']:3d} | Loss: "
                  f"{float(loss) / int(batch.ntokens):6.2f} | Tokens / Sec: "
                  f"{tokens / elapsed:7.1f} | Learning Rate: {lr:6.1e}", flush=True)
            start = time.perf_counter()
            tokens = 0
    return total_loss / total_tokens


def greedy_decode(model, src, src_mask, max_len, start_symbol):
    """The original's greedy_decode, for a batch of sources at once."""
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), start_symbol, dtype=src.dtype)
    for _ in range(max_len - 1):
        out = model.decode(memory, src_mask, ys, subsequent_mask(ys.size(1)).type_as(src.data))
        prob = model.generator(out[:, -1])
        next_word = torch.argmax(prob, dim=1, keepdim=True)
        ys = torch.cat([ys, next_word.to(src.dtype)], dim=1)
    return ys


def exact_copy_accuracy(model, n):
    exact = 0
    for done in range(0, n, 100):
        batch = next(data_gen(V, min(100, n - done), 1))
        ys = greedy_decode(model, batch.src, batch.src_mask, batch.src.size(1), 1)
        exact += int((ys == batch.src).all(dim=1).sum())
    return exact / n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=80)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--eval-batches", type=int, default=5)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=400)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--out", default="out/copy_task_pytorch")
    p.add_argument("--matmul-precision", choices=["highest", "high", "medium"],
                    default="highest", help="torch.set_float32_matmul_precision")
    p.add_argument("--autocast", action="store_true",
                    help="the whole run under torch.autocast('cpu', torch.bfloat16)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_float32_matmul_precision(a.matmul_precision)
    if a.autocast:  # entered for the rest of the process
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
    torch.manual_seed(a.seed)
    run_start, cpu_start = time.perf_counter(), time.process_time()
    os.makedirs(a.out, exist_ok=True)

    criterion = LabelSmoothing(size=V, padding_idx=0, smoothing=0.0)
    model = make_model(V, V, N=a.layers, d_model=a.d_model, d_ff=a.d_ff, h=a.heads,
                       dropout=a.dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.98), eps=1e-9)
    d_model = a.d_model
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda=lambda step: rate(step, d_model, factor=1.0, warmup=a.warmup))
    loss_compute = SimpleLossCompute(model.generator, criterion)
    state = dict(train_seconds=0.0, steps=0, tokens=0)
    train_losses, eval_losses = [], []
    for epoch in range(a.epochs):
        model.train()
        train_losses.append(run_epoch(data_gen(V, a.batch, a.batches), model, loss_compute,
                                      optimizer, scheduler, state, a.log_every))
        model.eval()
        eval_losses.append(run_epoch(data_gen(V, a.batch, a.eval_batches), model, loss_compute,
                                     None, None, state, a.log_every))
        print(f"epoch {epoch + 1}/{a.epochs} | train loss {train_losses[-1]:.4f} | eval loss "
              f"{eval_losses[-1]:.4f} | {state['tokens'] / max(state['train_seconds'], 1e-9):.0f}"
              f" tokens/s | elapsed {time.perf_counter() - run_start:.0f}s", flush=True)

    model.eval()
    with torch.no_grad():
        source = torch.arange(1, 11).unsqueeze(0)
        decoded = greedy_decode(model, source, torch.ones(1, 1, 10, dtype=torch.bool), 10, 1)
        accuracy = exact_copy_accuracy(model, 200)
    decoded = decoded[0].tolist()
    print(f"greedy decode of 1 .. 10 -> {' '.join(map(str, decoded))}")
    print(f"exact-copy accuracy over 200 fresh sequences: {accuracy:.3f}")
    torch.save(model.state_dict(), os.path.join(a.out, "model.pt"))
    metrics = dict(
        side="pytorch",
        config=dict(vocab=V, layers=a.layers, d_model=a.d_model, d_ff=a.d_ff, heads=a.heads,
                    dropout=a.dropout, batch=a.batch, batches=a.batches,
                    eval_batches=a.eval_batches, epochs=a.epochs, warmup=a.warmup, lr=a.lr,
                    betas=[0.9, 0.98], eps=1e-9, smoothing=0.0, seed=a.seed, threads=a.threads),
        train_loss=train_losses, eval_loss=eval_losses, decoded=decoded,
        exact_copy_accuracy=accuracy, train_seconds=state["train_seconds"],
        train_steps=state["steps"],
        tokens_per_second=state["tokens"] / max(state["train_seconds"], 1e-9),
        total_seconds=time.perf_counter() - run_start,
        cpu_seconds=time.process_time() - cpu_start,
        max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        torch=torch.__version__)
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
