"""D2L's Bahdanau attention model (chapter "Attention Mechanisms", section "Bahdanau Attention")
in PyTorch, as examples/g2p_bahdanau.h builds it in Ember, for bench/pytorch/g2p.py's
--model bahdanau: d2l's masked_softmax and AdditiveAttention, Seq2SeqEncoder (an embedding and a
multi-layer GRU, the sources packed so each row's state is its last grapheme's), and
Seq2SeqAttentionDecoder (a GRU whose input at each step joins the additive-attention context over
the encoder outputs with the step's embedding). Parameter names and order are d2l's, with torch's
default initialisation (as Ember's nn modules), and bahdanau_search is g2p_bahdanau.h's beam
search (greedy with beam 1).
"""
import torch
from torch import nn
from torch.nn.utils import rnn as rnn_utils


def masked_softmax(X, valid_lens):
    """softmax over the last dim with scores at key positions >= the valid length set to -1e6."""
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = X.reshape(-1, shape[-1])
    mask = torch.arange(shape[-1], dtype=torch.float32)[None, :] < valid_lens[:, None]
    X = X.masked_fill(~mask, -1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class AdditiveAttention(nn.Module):
    def __init__(self, key_size, query_size, num_hiddens, dropout):
        super().__init__()
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens):
        queries, keys = self.W_q(queries), self.W_k(keys)
        features = torch.tanh(queries.unsqueeze(2) + keys.unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class Seq2SeqEncoder(nn.Module):
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size, num_hiddens, num_layers, dropout=dropout)

    def forward(self, X, valid_lens):
        emb = self.embedding(X).permute(1, 0, 2)  # (S, B, E)
        packed = rnn_utils.pack_padded_sequence(emb, valid_lens.cpu(), enforce_sorted=False)
        output, state = self.rnn(packed)
        output, _ = rnn_utils.pad_packed_sequence(output, total_length=X.size(1))
        return output, state  # (S, B, H), (num_layers, B, H)


class Seq2SeqAttentionDecoder(nn.Module):
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout):
        super().__init__()
        self.attention = AdditiveAttention(num_hiddens, num_hiddens, num_hiddens, dropout)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, num_layers, dropout=dropout)
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, enc_valid_lens):
        outputs, hidden_state = enc_outputs
        return [outputs.permute(1, 0, 2), hidden_state, enc_valid_lens]

    def forward(self, X, state):
        enc_outputs, hidden_state, enc_valid_lens = state
        emb = self.embedding(X).permute(1, 0, 2)  # (T, B, E)
        outputs, weights = [], []
        for x in emb:
            query = hidden_state[-1].unsqueeze(1)  # (B, 1, H)
            context = self.attention(query, enc_outputs, enc_outputs, enc_valid_lens)
            x = torch.cat((context, x.unsqueeze(1)), dim=-1)
            out, hidden_state = self.rnn(x.permute(1, 0, 2), hidden_state)
            outputs.append(out)
            weights.append(self.attention.attention_weights)
        self.attention_weights = torch.cat(weights, 1)
        outputs = self.dense(torch.cat(outputs, dim=0))
        return outputs.permute(1, 0, 2), [enc_outputs, hidden_state, enc_valid_lens]


class Bahdanau(nn.Module):
    """d2l's EncoderDecoder of the two above; num_hiddens is the embedding and hidden size."""

    def __init__(self, src_vocab, tgt_vocab, num_hiddens, num_layers, dropout):
        super().__init__()
        self.encoder = Seq2SeqEncoder(src_vocab, num_hiddens, num_hiddens, num_layers, dropout)
        self.decoder = Seq2SeqAttentionDecoder(tgt_vocab, num_hiddens, num_hiddens, num_layers,
                                               dropout)

    def encode(self, src, src_valid_lens):
        return self.decoder.init_state(self.encoder(src, src_valid_lens), src_valid_lens)

    def forward(self, src, src_valid_lens, dec_X):
        return self.decoder(dec_X, self.encode(src, src_valid_lens))[0]


def length_penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def bahdanau_search(model, src, src_valid_lens, max_len, bos, eos, beam_size, alpha):
    """g2p_bahdanau.h's bahdanau_search: per row beam_size live hypotheses ranked by summed
    log-probability; each step ranks every live hypothesis's extensions and takes the best
    2 x beam_size (ties: lower beam, then lower token); an end-symbol extension ranked within the
    first beam_size is finished (GNMT length penalty), the first beam_size others live on. A row
    stops with beam_size finished, or after max_len - 1 tokens (its live ones then count as
    finished). Returns each row's best tokens, without the end symbol."""
    B = src.size(0)
    live = [([], 0.0, b) for b in range(B)]  # tokens, summed logp, row; state row i = live[i]
    finished = [[] for _ in range(B)]

    def finish(tokens, logp, row):
        finished[row].append((tokens, logp / length_penalty(len(tokens), alpha)))

    state = model.encode(src, src_valid_lens)
    step = 1
    while live:
        last = torch.tensor([[h[0][-1] if h[0] else bos] for h in live], dtype=torch.long)
        scores, state = model.decoder(last, state)
        lp = scores[:, 0].log_softmax(-1).double()
        V = lp.size(1)
        nxt, parents = [], []
        i = 0
        while i < len(live):
            j = i
            while j < len(live) and live[j][2] == live[i][2]:
                j += 1
            row = live[i][2]
            flat = (lp[i:j] + torch.tensor([h[1] for h in live[i:j]],
                                           dtype=torch.float64).unsqueeze(1)).reshape(-1)
            take = min(2 * beam_size, flat.numel())
            order = torch.sort(-flat, stable=True).indices[:take].tolist()
            row_next, row_parents = [], []
            for rank, f in enumerate(order):
                k, token = divmod(f, V)
                tokens = live[i + k][0] + [token]
                if token == eos:
                    if rank < beam_size:
                        finish(tokens, flat[f].item(), row)
                elif len(row_next) < beam_size:
                    row_next.append((tokens, flat[f].item(), row))
                    row_parents.append(i + k)
            if len(finished[row]) >= beam_size:
                pass
            elif step >= max_len - 1:
                for tokens, logp, r in row_next:
                    finish(tokens, logp, r)
            else:
                nxt += row_next
                parents += row_parents
            i = j
        live = nxt
        if live:
            index = torch.tensor(parents, dtype=torch.long)
            state = [state[0].index_select(0, index), state[1].index_select(1, index),
                     state[2].index_select(0, index)]
        step += 1
    out = []
    for hyps in finished:
        best = max(hyps, key=lambda h: h[1]) if hyps else ([eos], 0.0)  # max keeps the first
        tokens = best[0]
        out.append(tokens[:-1] if tokens and tokens[-1] == eos else tokens)
    return out
