#!/usr/bin/python3
"""Grapheme-to-phoneme on CMUdict in PyTorch: the reference side of `examples/g2p`.

The same data and recipe as Ember's trainer, so that test WER/PER and training time compare:
  - the split by 64-bit FNV-1a of the word (h % 20 == 0 test, == 1 dev, else train), words in
    order of first appearance, every pronunciation of a train word one training example;
  - vocabularies built from the train split as data::Vocab::build does (<pad> <s> </s> <unk>,
    then tokens by falling count, ties in byte order); targets are <s> phonemes </s>;
  - batches as data::DataLoader cuts them (the epoch's shuffled order, stably sorted by (source,
    target) length, cut where count x longest would pass --batch-tokens, the batches shuffled):
    the same algorithm with Python's generator, so the same kind of batches, not the same ones;
  - the project's PyTorch Annotated Transformer (annotated_transformer.py: make_model, Batch,
    LabelSmoothing, rate), or with --model bahdanau D2L's GRU encoder-decoder with additive
    attention (d2l_bahdanau.py, as examples/g2p_bahdanau.h; defaults 2 layers of 256, dropout
    0.2, as Ember's), Adam(betas 0.9/0.98, eps 1e-9) with the Noam rate, clipping at
    --clip, dropout; dev WER (greedy) after every epoch, the best model kept, early stopping
    after --patience epochs without a better dev WER;
  - test WER and PER with greedy decoding and with batched beam search (GNMT length penalty), as
    nn/decoding.h states the algorithm; WER: a word is wrong when its prediction matches none of
    its references; PER: edit distance to the closest reference over the summed lengths.
Writes OUT/metrics.json with the keys of Ember's (plus `side`).

    OMP_NUM_THREADS=N OPENBLAS_NUM_THREADS=N /usr/bin/python3 bench/pytorch/g2p.py \
        --threads N --epochs 3 --out DIR
"""
import argparse
import copy
import json
import math
import os
import random
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from annotated_transformer import (Batch, LabelSmoothing, make_model, rate,  # noqa: E402
                                   subsequent_mask)
from d2l_bahdanau import Bahdanau, bahdanau_search  # noqa: E402

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def fnv1a64(word):
    h = 0xCBF29CE484222325
    for b in word.encode("utf-8"):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_cmudict(path):
    """{split: [(word, [pronunciation, ...]), ...]} in order of first appearance."""
    splits = {"train": [], "dev": [], "test": []}
    where = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\r\n")
            if line.startswith(";;;"):
                continue
            line = line.split(" #")[0]
            fields = line.split()
            if len(fields) < 2:
                raise ValueError(f"{path}: malformed line {line!r}")
            word = fields[0]
            if word.endswith(")") and "(" in word:
                word = word[:word.index("(")]
            if word not in where:
                r = fnv1a64(word) % 20
                split = "test" if r == 0 else "dev" if r == 1 else "train"
                splits[split].append((word, []))
                where[word] = splits[split][-1]
            where[word][1].append(fields[1:])
    return splits


def build_vocab(sequences):
    counts = {}
    for s in sequences:
        for t in s:
            counts[t] = counts.get(t, 0) + 1
    ranked = sorted((t for t in counts if t not in SPECIALS), key=lambda t: t.encode("utf-8"))
    ranked.sort(key=lambda t: -counts[t])  # stable: falling count, then byte order
    tokens = SPECIALS + ranked
    return tokens, {t: i for i, t in enumerate(tokens)}


def encode(stoi, tokens, bos=False, eos=False):
    ids = [stoi.get(t, UNK) for t in tokens]
    return ([BOS] if bos else []) + ids + ([EOS] if eos else [])


def cut(order, length, batch_tokens):
    """Consecutive runs of `order` whose padded size (count x longest length) fits batch_tokens."""
    batches, batch, longest = [], [], 0
    for i in order:
        n = length(i)
        if batch and (len(batch) + 1) * max(longest, n) > batch_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, n)
    if batch:
        batches.append(batch)
    return batches


def plan(examples, batch_tokens, rng):
    """data::DataLoader's epoch plan with one pool (the whole data set)."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    order.sort(key=lambda i: (len(examples[i][0]), len(examples[i][1])))
    batches = cut(order, lambda i: max(len(examples[i][0]), len(examples[i][1])), batch_tokens)
    rng.shuffle(batches)
    return batches


def pad(sequences):
    width = max(len(s) for s in sequences)
    return torch.tensor([s + [PAD] * (width - len(s)) for s in sequences], dtype=torch.long)


def collate(examples, indices):
    src = pad([examples[i][0] for i in indices])
    if not examples[indices[0]][1]:
        return Batch(src, None, PAD)
    return Batch(src, pad([examples[i][1] for i in indices]), PAD)


def source_lengths(src_mask):
    """src_mask (B, 1, S), true on the graphemes -> the source lengths (B)."""
    return src_mask.long().sum(-1).reshape(-1)


def length_penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def next_log_probs(model, memory, src_mask, rows, prefixes):
    ys = torch.tensor(prefixes, dtype=torch.long)
    index = torch.tensor(rows, dtype=torch.long)
    out = model.decode(memory.index_select(0, index), src_mask.index_select(0, index), ys,
                       subsequent_mask(ys.size(1)).type_as(ys))
    return model.generator(out[:, -1])


@torch.no_grad()
def beam_search(model, src, src_mask, max_len, beam_size, alpha):
    """nn/decoding.h's algorithm: per row, beam_size live hypotheses ranked by summed
    log-probability; each step takes the best 2 x beam_size extensions (ties: lower beam, then
    lower token); an end-symbol extension within the first beam_size is finished, the first
    beam_size others live on; a row stops at beam_size finished, or after max_len - 1 tokens
    (its live ones count as finished). Returns each row's best tokens (without </s>)."""
    memory = model.encode(src, src_mask)
    B = src.size(0)
    live = {b: [([], 0.0)] for b in range(B)}
    finished = {b: [] for b in range(B)}
    for t in range(max_len - 1):
        rows = [b for b in range(B) if live[b]]
        if not rows:
            break
        flat_rows, prefixes, owners = [], [], []
        for b in rows:
            for k, (tokens, _) in enumerate(live[b]):
                flat_rows.append(b)
                prefixes.append([BOS] + tokens)
                owners.append((b, k))
        logp = next_log_probs(model, memory, src_mask, flat_rows, prefixes).double()
        position = 0
        for b in rows:
            hyps = live[b]
            block = logp[position:position + len(hyps)]
            position += len(hyps)
            scores = block + torch.tensor([s for _, s in hyps], dtype=torch.float64).unsqueeze(1)
            flat = scores.reshape(-1)
            take = min(2 * beam_size, flat.numel())
            # Ties: lower beam, then lower token = lower flat index; sort is stable.
            order = torch.sort(-flat, stable=True).indices[:take].tolist()
            V = block.size(1)
            new_live = []
            for rank, f in enumerate(order):
                k, token = divmod(f, V)
                tokens = hyps[k][0] + [token]
                summed = flat[f].item()
                if token == EOS:
                    if rank < beam_size:
                        finished[b].append((tokens, summed / length_penalty(len(tokens), alpha)))
                elif len(new_live) < beam_size:
                    new_live.append((tokens, summed))
            live[b] = new_live
            if len(finished[b]) >= beam_size:
                live[b] = []
        if t == max_len - 2:
            for b in rows:
                for tokens, summed in live[b]:
                    finished[b].append((tokens, summed / length_penalty(len(tokens), alpha)))
                live[b] = []
    out = []
    for b in range(B):
        best = max(finished[b], key=lambda h: h[1]) if finished[b] else ([], 0.0)
        # max() keeps the first on a tie, as Ember's best_of.
        tokens = best[0]
        out.append(tokens[:-1] if tokens and tokens[-1] == EOS else tokens)
    return out


@torch.no_grad()
def greedy_search(model, src, src_mask, max_len):
    memory = model.encode(src, src_mask)
    B = src.size(0)
    ys = torch.full((B, 1), BOS, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_len - 1):
        out = model.decode(memory, src_mask, ys, subsequent_mask(ys.size(1)).type_as(ys))
        next_word = model.generator(out[:, -1]).argmax(dim=1)
        ys = torch.cat([ys, next_word.unsqueeze(1)], dim=1)
        done |= next_word == EOS
        if bool(done.all()):
            break
    result = []
    for row in ys[:, 1:].tolist():
        result.append(row[:row.index(EOS)] if EOS in row else row)
    return result


def decode_all(model, sources, batch_tokens, beam, alpha):
    model.eval()
    examples = [(s, []) for s in sources]
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    out = [None] * len(examples)
    batches = cut(order, lambda i: len(examples[i][0]), batch_tokens)
    for indices in batches:
        b = collate(examples, indices)
        max_len = b.src.size(1) + 6
        if isinstance(model, Bahdanau):
            hyps = bahdanau_search(model, b.src, source_lengths(b.src_mask), max_len, BOS, EOS,
                                   beam, alpha)
        else:
            hyps = (greedy_search(model, b.src, b.src_mask, max_len) if beam == 1 else
                    beam_search(model, b.src, b.src_mask, max_len, beam, alpha))
        for i, h in zip(indices, hyps):
            out[i] = h
    return out


def edit_distance(a, b):
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        diagonal, row[0] = row[0], i
        for j in range(1, len(b) + 1):
            up = row[j]
            row[j] = min(up + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1]))
            diagonal = up
    return row[len(b)]


def error_rates(predictions, references):
    wrong = edits = phonemes = 0
    for p, refs in zip(predictions, references):
        best, best_len = None, 0
        for r in refs:
            d = edit_distance(p, r)
            if best is None or d < best or (d == best and len(r) < best_len):
                best, best_len = d, len(r)
        wrong += best != 0
        edits += best
        phonemes += best_len
    return wrong / max(len(predictions), 1), edits / max(phonemes, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/usr/share/pocketsphinx/model/en-us/cmudict-en-us.dict")
    ap.add_argument("--model", choices=["transformer", "bahdanau"], default="transformer")
    ap.add_argument("--layers", type=int, default=None, help="default 3; bahdanau 2")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--d-ff", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dropout", type=float, default=None, help="default 0.1; bahdanau 0.2")
    ap.add_argument("--smoothing", type=float, default=0.1)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--lr-factor", type=float, default=1.0)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--patience", type=int, default=4)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--alpha", type=float, default=0.6)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--eval-limit", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=200)
    ap.add_argument("--max-steps", type=int, default=0,
                    help="stop after this many training steps, before any evaluation (timing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="out/g2p_pytorch")
    ap.add_argument("--matmul-precision", choices=["highest", "high", "medium"],
                    default="highest", help="torch.set_float32_matmul_precision")
    ap.add_argument("--autocast", action="store_true",
                    help="the whole run under torch.autocast('cpu', torch.bfloat16)")
    a = ap.parse_args()
    bahdanau = a.model == "bahdanau"
    if a.layers is None:
        a.layers = 2 if bahdanau else 3
    if a.dropout is None:
        a.dropout = 0.2 if bahdanau else 0.1
    torch.set_num_threads(a.threads)
    torch.set_float32_matmul_precision(a.matmul_precision)
    if a.autocast:  # entered for the rest of the process
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    run_start = time.perf_counter()

    splits = read_cmudict(a.data)
    train_words = splits["train"][:a.limit] if a.limit else splits["train"]
    dev_words = splits["dev"][:a.eval_limit] if a.eval_limit else splits["dev"]
    test_words = splits["test"][:a.eval_limit] if a.eval_limit else splits["test"]
    graphemes, g_stoi = build_vocab([list(w) for w, _ in train_words])
    phonemes, p_stoi = build_vocab([p for _, ps in train_words for p in ps])
    examples = [(encode(g_stoi, list(w)), encode(p_stoi, p, True, True))
                for w, ps in train_words for p in ps]
    print(f"words train {len(splits['train'])} / dev {len(splits['dev'])} / test "
          f"{len(splits['test'])}; {len(examples)} training pronunciations; {len(graphemes)} "
          f"graphemes, {len(phonemes)} phonemes", flush=True)

    def eval_set(words):
        return ([encode(g_stoi, list(w)) for w, _ in words],
                [[encode(p_stoi, p) for p in ps] for _, ps in words])

    dev, test = eval_set(dev_words), eval_set(test_words)
    if bahdanau:
        model = Bahdanau(len(graphemes), len(phonemes), a.d_model, a.layers, a.dropout)
    else:
        model = make_model(len(graphemes), len(phonemes), a.layers, a.d_model, a.d_ff, a.heads,
                           a.dropout)
    criterion = LabelSmoothing(len(phonemes), PAD, a.smoothing)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: rate(step, a.d_model, a.lr_factor, a.warmup))
    train_losses, dev_wers = [], []
    best = (2.0, 2.0)
    best_epoch, best_state, train_seconds, tokens = 0, None, 0.0, 0
    for epoch in range(a.epochs):
        model.train()
        epoch_loss, epoch_tokens, epoch_seconds = 0.0, 0, 0.0
        batches = plan(examples, a.batch_tokens, rng)
        for step, indices in enumerate(batches, 1):
            start = time.perf_counter()
            b = collate(examples, indices)
            ntokens = int(b.ntokens)
            if bahdanau:
                logits = model(b.src, source_lengths(b.src_mask), b.tgt).log_softmax(-1)
            else:
                logits = model.generator(model.forward(b.src, b.tgt, b.src_mask, b.tgt_mask))
            loss = criterion(logits.contiguous().view(-1, logits.size(-1)),
                             b.tgt_y.contiguous().view(-1)) / ntokens
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            epoch_loss += loss.item() * ntokens
            epoch_tokens += ntokens
            epoch_seconds += time.perf_counter() - start
            if epoch == 0 and step == a.max_steps:  # (within the first epoch: a timing run)
                print(f"stopped after --max-steps {step}: {epoch_tokens / epoch_seconds:.0f} "
                      f"tokens/s, {1e3 * epoch_seconds / step:.1f} ms/step", flush=True)
                return
            if step % a.log_every == 0:
                print(f"  epoch {epoch + 1} step {step:5d}/{len(batches)} | loss "
                      f"{epoch_loss / epoch_tokens:.4f} | {epoch_tokens / epoch_seconds:.0f} "
                      f"tokens/s | lr {optimizer.param_groups[0]['lr']:.2e}", flush=True)
        train_seconds += epoch_seconds
        tokens += epoch_tokens
        wer, per = error_rates(decode_all(model, dev[0], a.batch_tokens, 1, a.alpha), dev[1])
        loss = epoch_loss / max(epoch_tokens, 1)
        train_losses.append(loss)
        dev_wers.append(wer)
        better = (wer, per) < best
        print(f"epoch {epoch + 1}/{a.epochs} | train loss {loss:.4f} | "
              f"{epoch_tokens / epoch_seconds:.0f} tokens/s | dev WER {wer:.4f}"
              f"{' (best)' if better else ''} | trained {train_seconds:.0f}s", flush=True)
        if better:
            best, best_epoch = (wer, per), epoch + 1
            best_state = copy.deepcopy(model.state_dict())
        elif epoch + 1 - best_epoch >= a.patience:
            print(f"dev WER has not improved for {a.patience} epochs: stopping")
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    greedy = decode_all(model, test[0], a.batch_tokens, 1, a.alpha)
    beam = decode_all(model, test[0], a.batch_tokens, a.beam, a.alpha)
    g_wer, g_per = error_rates(greedy, test[1])
    b_wer, b_per = error_rates(beam, test[1])
    dev_beam_wer, _ = error_rates(decode_all(model, dev[0], a.batch_tokens, a.beam, a.alpha),
                                  dev[1])
    use_beam = dev_beam_wer <= best[0]
    print(f"test (best epoch {best_epoch}): greedy WER {g_wer:.4f} PER {g_per:.4f} | beam "
          f"{a.beam} WER {b_wer:.4f} PER {b_per:.4f} | predictions by "
          f"{'beam' if use_beam else 'greedy'}", flush=True)
    metrics = {
        "side": f"pytorch {torch.__version__}",
        "config": {k: v for k, v in vars(a).items() if k not in ("out", "log_every")},
        "split_sizes": {"train": len(splits["train"]), "dev": len(splits["dev"]),
                        "test": len(splits["test"])},
        "train_loss": train_losses,
        "dev_wer": dev_wers,
        "best_epoch": best_epoch,
        "decoding": "beam" if use_beam else "greedy",
        "test_wer": b_wer if use_beam else g_wer,
        "test_per": b_per if use_beam else g_per,
        "test_wer_greedy": g_wer,
        "test_per_greedy": g_per,
        "test_wer_beam": b_wer,
        "test_per_beam": b_per,
        "train_seconds": train_seconds,
        "epochs": len(train_losses),
        "tokens_per_second": tokens / max(train_seconds, 1e-9),
        "total_seconds": time.perf_counter() - run_start,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
