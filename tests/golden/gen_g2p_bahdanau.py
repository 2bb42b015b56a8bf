"""Golden values for examples/g2p_bahdanau.h: D2L's Seq2SeqEncoder, Seq2SeqAttentionDecoder and
their additive attention (section "Bahdanau Attention"), written out below as d2l defines them,
in Float64 with PyTorch. One change, as the Ember model makes it: the encoder packs its sources
(pack_padded_sequence), so each row's state is its last step's. Saves the parameters (d2l's
names), a batch, the teacher-forced scores, the attention weights and every parameter's gradient
for a random upstream gradient.
Run: /usr/bin/python3 tests/golden/gen_g2p_bahdanau.py  -> tests/golden/g2p_bahdanau.json"""
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


class Seq2SeqEncoder(nn.Module):  # d2l's, its GRU fed packed sources
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0, **kwargs):
        super(Seq2SeqEncoder, self).__init__(**kwargs)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size, num_hiddens, num_layers, dropout=dropout)

    def forward(self, X, valid_lens):
        X = self.embedding(X)
        X = X.permute(1, 0, 2)
        packed = nn.utils.rnn.pack_padded_sequence(X, valid_lens, enforce_sorted=False)
        output, state = self.rnn(packed)
        output, _ = nn.utils.rnn.pad_packed_sequence(output, total_length=X.shape[0])
        return output, state


class Seq2SeqAttentionDecoder(nn.Module):  # d2l's
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0, **kwargs):
        super(Seq2SeqAttentionDecoder, self).__init__(**kwargs)
        self.attention = AdditiveAttention(num_hiddens, num_hiddens, num_hiddens, dropout)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, num_layers, dropout=dropout)
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, enc_valid_lens, *args):
        outputs, hidden_state = enc_outputs
        return (outputs.permute(1, 0, 2), hidden_state, enc_valid_lens)

    def forward(self, X, state):
        enc_outputs, hidden_state, enc_valid_lens = state
        X = self.embedding(X).permute(1, 0, 2)
        outputs, self._attention_weights = [], []
        for x in X:
            query = torch.unsqueeze(hidden_state[-1], dim=1)
            context = self.attention(query, enc_outputs, enc_outputs, enc_valid_lens)
            x = torch.cat((context, torch.unsqueeze(x, dim=1)), dim=-1)
            out, hidden_state = self.rnn(x.permute(1, 0, 2), hidden_state)
            outputs.append(out)
            self._attention_weights.append(self.attention.attention_weights)
        outputs = self.dense(torch.cat(outputs, dim=0))
        return outputs.permute(1, 0, 2), [enc_outputs, hidden_state, enc_valid_lens]


class EncoderDecoder(nn.Module):  # d2l's
    def __init__(self, encoder, decoder, **kwargs):
        super(EncoderDecoder, self).__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, enc_X, dec_X, valid_lens):
        enc_outputs = self.encoder(enc_X, valid_lens)
        dec_state = self.decoder.init_state(enc_outputs, valid_lens)
        return self.decoder(dec_X, dec_state)[0]


torch.manual_seed(0)
V_src, V_tgt, H, L = 9, 7, 6, 2
model = EncoderDecoder(Seq2SeqEncoder(V_src, H, H, L), Seq2SeqAttentionDecoder(V_tgt, H, H, L))
model.double().eval()
src = torch.tensor([[4, 5, 6, 7, 8], [5, 4, 6, 0, 0], [8, 7, 0, 0, 0]])
lens = torch.tensor([5, 3, 2])
dec_X = torch.tensor([[1, 4, 5, 6], [1, 3, 3, 0], [1, 6, 0, 0]])
scores = model(src, dec_X, lens)
gy = torch.randn_like(scores)
scores.backward(gy)
values = {"src": src, "lens": lens, "dec_X": dec_X, "scores": scores, "gy": gy,
          "attention_weights": torch.cat(model.decoder._attention_weights, 1),
          "names": " ".join(name for name, _ in model.named_parameters())}
for name, p in model.named_parameters():
    values["param." + name] = p
    values["grad." + name] = p.grad
write("g2p_bahdanau", values, one_per_line=True)
