// D2L's Bahdanau attention model (chapter "Attention Mechanisms", section "Bahdanau Attention")
// for examples/g2p.cpp's `--model bahdanau`: Seq2SeqEncoder (an embedding and a multi-layer GRU),
// Seq2SeqAttentionDecoder (a GRU whose input at each step joins the additive-attention context
// over the encoder outputs, masked by the source lengths, with the step's embedding), and
// greedy and beam search over its step-by-step state. Names, parameter names and order are
// d2l's, so a state dict of d2l's torch model loads one to one. Unlike d2l's encoder, which runs
// its GRU over the padding too, the sources go in packed: each row's state is taken at its last
// grapheme, and a word decodes the same in any batch.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "ember.h"

namespace g2p {

using ember::Tensor;
namespace nn = ember::nn;

// src_mask (B, 1, S) Bool, true on the graphemes -> the source lengths (B) Int64.
inline Tensor source_lengths(const Tensor& src_mask) {
  return src_mask.to(ember::kInt64).sum({-1}).reshape({-1});
}

// The encoder: X (B, S) Int64 and its lengths (B) -> outputs (S, B, H), zero past each length,
// and state (num_layers, B, H) at each row's last step.
class Seq2SeqEncoder : public nn::Cloneable<Seq2SeqEncoder> {
 public:
  Seq2SeqEncoder(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens, int64_t num_layers,
                 double dropout) {
    register_module("embedding", embedding,
                    std::make_shared<nn::Embedding>(vocab_size, embed_size));
    register_module(
        "rnn", rnn,
        std::make_shared<nn::GRU>(embed_size, num_hiddens,
                                  nn::RNNOptions{.num_layers = num_layers, .dropout = dropout}));
  }
  nn::RNNOutput forward(const Tensor& X, const Tensor& valid_lens) const {
    namespace rnn_utils = nn::utils::rnn;
    // X: (B, S, E) -> time major (S, B, E), as d2l's X.permute(1, 0, 2)
    const Tensor emb = embedding->forward(X).permute({1, 0, 2});
    const auto packed = rnn_utils::pack_padded_sequence(emb, valid_lens.cpu(), false, false);
    const nn::PackedRNNOutput out = rnn->forward(packed);
    return {rnn_utils::pad_packed_sequence(out.output, false, 0, X.size(1)).padded, out.h_n};
  }

  std::shared_ptr<nn::Embedding> embedding;
  std::shared_ptr<nn::GRU> rnn;

 private:
  friend Cloneable;
  Seq2SeqEncoder(const Seq2SeqEncoder&) = default;
};

// d2l's decoder state: enc_outputs (B, S, H), hidden_state (num_layers, B, H), enc_valid_lens (B).
struct DecoderState {
  Tensor enc_outputs, hidden_state, enc_valid_lens;
  // The state of the rows `index` (Int64, on the state's device), in that order: beam search's.
  DecoderState select(const Tensor& index) const {
    return {enc_outputs.index_select(0, index), hidden_state.index_select(1, index),
            enc_valid_lens.index_select(0, index)};
  }
};

class Seq2SeqAttentionDecoder : public nn::Cloneable<Seq2SeqAttentionDecoder> {
 public:
  Seq2SeqAttentionDecoder(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                          int64_t num_layers, double dropout) {
    register_module(
        "attention", attention,
        std::make_shared<nn::AdditiveAttention>(num_hiddens, num_hiddens, num_hiddens, dropout));
    register_module("embedding", embedding,
                    std::make_shared<nn::Embedding>(vocab_size, embed_size));
    register_module(
        "rnn", rnn,
        std::make_shared<nn::GRU>(embed_size + num_hiddens, num_hiddens,
                                  nn::RNNOptions{.num_layers = num_layers, .dropout = dropout}));
    register_module("dense", dense, std::make_shared<nn::Linear>(num_hiddens, vocab_size));
  }

  DecoderState init_state(const nn::RNNOutput& enc, const Tensor& enc_valid_lens) const {
    // outputs (S, B, H) -> (B, S, H): the keys and values of the attention
    return {enc.output.permute({1, 0, 2}), enc.h_n, enc_valid_lens.to(enc.output.device())};
  }

  // X (B, T) Int64 -> scores (B, T, vocab_size); state moves on T steps, and attention_weights
  // holds the steps' weights over the source (B, T, S).
  Tensor forward(const Tensor& X, DecoderState& state) {
    // X: (B, T, E) -> (T, B, E), one step at a time
    const Tensor emb = embedding->forward(X).permute({1, 0, 2});
    std::vector<Tensor> outputs, weights;
    for (int64_t t = 0; t < emb.size(0); ++t) {
      // query (B, 1, H): the last layer's hidden state
      const Tensor query = state.hidden_state.select(0, -1).unsqueeze(1);
      // context (B, 1, H)
      const Tensor context =
          attention->forward(query, state.enc_outputs, state.enc_outputs, state.enc_valid_lens);
      // the context joined with the step's embedding on the feature dim: (B, 1, H + E)
      const Tensor x = ember::cat({context, emb.select(0, t).unsqueeze(1)}, -1);
      nn::RNNOutput out = rnn->forward(x.permute({1, 0, 2}), state.hidden_state);
      state.hidden_state = out.h_n;
      outputs.push_back(out.output);
      weights.push_back(attention->attention_weights);
    }
    attention_weights = ember::cat(weights, 1);
    // After the dense layer, outputs (T, B, vocab_size) -> (B, T, vocab_size)
    return dense->forward(ember::cat(outputs, 0)).permute({1, 0, 2});
  }

  std::shared_ptr<nn::AdditiveAttention> attention;
  std::shared_ptr<nn::Embedding> embedding;
  std::shared_ptr<nn::GRU> rnn;
  std::shared_ptr<nn::Linear> dense;
  Tensor attention_weights;  // (B, T, S) of the last forward, detached

 protected:
  void rebind(const nn::CloneMap&) override { attention_weights = Tensor(); }

 private:
  friend Cloneable;
  Seq2SeqAttentionDecoder(const Seq2SeqAttentionDecoder&) = default;
};

// d2l's EncoderDecoder with the two above: --d-model is the embedding and the hidden size.
class Bahdanau : public nn::Cloneable<Bahdanau> {
 public:
  Bahdanau(int64_t src_vocab, int64_t tgt_vocab, int64_t num_hiddens, int64_t num_layers,
           double dropout) {
    register_module(
        "encoder", encoder,
        std::make_shared<Seq2SeqEncoder>(src_vocab, num_hiddens, num_hiddens, num_layers, dropout));
    register_module("decoder", decoder,
                    std::make_shared<Seq2SeqAttentionDecoder>(tgt_vocab, num_hiddens, num_hiddens,
                                                              num_layers, dropout));
  }
  DecoderState encode(const Tensor& src, const Tensor& src_valid_lens) const {
    return decoder->init_state(encoder->forward(src, src_valid_lens), src_valid_lens);
  }
  // Teacher forcing: src (B, S) with lengths (B), dec_X (B, T) -> scores (B, T, tgt_vocab).
  Tensor forward(const Tensor& src, const Tensor& src_valid_lens, const Tensor& dec_X) {
    DecoderState state = encode(src, src_valid_lens);
    return decoder->forward(dec_X, state);
  }

  std::shared_ptr<Seq2SeqEncoder> encoder;
  std::shared_ptr<Seq2SeqAttentionDecoder> decoder;

 private:
  friend Cloneable;
  Bahdanau(const Bahdanau&) = default;
};

namespace detail {

// A live hypothesis of batch row `row`: its tokens after the start symbol, their log-probability.
struct Live {
  std::vector<int64_t> tokens;
  double logp;
  int64_t row;
};

// An extension of live hypothesis `beam` by `token`, and its summed log-probability.
struct Candidate {
  double logp;
  size_t beam;
  int64_t token;
};

// The best `take` extensions of the hypotheses live[i, j) (one row's), best first (ties: lower
// beam, then lower token); lp holds the next token's log-probabilities, V a row, live[b]'s at b.
inline std::vector<Candidate> best_extensions(const std::vector<Live>& live, size_t i, size_t j,
                                              const std::vector<double>& lp, int64_t V,
                                              size_t take) {
  std::vector<Candidate> candidates;
  for (size_t b = i; b < j; ++b)
    for (int64_t v = 0; v < V; ++v)
      candidates.push_back({live[b].logp + lp[b * static_cast<size_t>(V) + v], b, v});
  take = std::min(candidates.size(), take);
  std::partial_sort(candidates.begin(), candidates.begin() + static_cast<ptrdiff_t>(take),
                    candidates.end(), [](const Candidate& a, const Candidate& b) {
                      if (a.logp != b.logp) return a.logp > b.logp;
                      return a.beam != b.beam ? a.beam < b.beam : a.token < b.token;
                    });
  candidates.resize(take);
  return candidates;
}

// The finished hypothesis of the highest score (the first found, on a tie).
inline nn::Hypothesis best_of(const std::vector<nn::Hypothesis>& hyps, int64_t end_symbol) {
  if (hyps.empty()) return {{end_symbol}, 0.0};  // a vocabulary of the end symbol alone
  size_t k = 0;
  for (size_t i = 1; i < hyps.size(); ++i)
    if (hyps[i].score > hyps[k].score) k = i;
  return hyps[k];
}

}  // namespace detail

// Beam search over the decoder's state, with nn::beam_search's rules (nn/decoding.h): per row
// `beam_size` live hypotheses ranked by summed log-probability; each step ranks every live
// hypothesis's extensions and takes the best 2 x beam_size (ties: lower beam, then lower token);
// of those, an extension by end_symbol ranked within the first beam_size is finished (scored
// with the GNMT length penalty), the first beam_size others live on. A row stops with beam_size
// finished hypotheses, or after max_len - 1 tokens, when its live ones count as finished too; its
// result is the finished hypothesis of the highest score (the first found, on a tie). Each step
// runs the decoder once on every live hypothesis of every row. With beam_size 1 this is greedy
// search. src (B, S), src_valid_lens (B); call model.eval() first.
inline std::vector<nn::Hypothesis> bahdanau_search(Bahdanau& model, const Tensor& src,
                                                   const Tensor& src_valid_lens, int64_t max_len,
                                                   int64_t start_symbol, int64_t end_symbol,
                                                   int64_t beam_size, double alpha) {
  using detail::Live;
  ember::NoGradGuard no_grad;
  const int64_t B = src.size(0);
  const ember::Device device = src.device();
  const auto K = static_cast<size_t>(beam_size);
  std::vector<Live> live;  // every row's live hypotheses, row by row; state row i is live[i]
  for (int64_t b = 0; b < B; ++b) live.push_back({{}, 0.0, b});
  std::vector<std::vector<nn::Hypothesis>> finished(static_cast<size_t>(B));
  const auto finish = [&](const Live& h) {
    finished[static_cast<size_t>(h.row)].push_back(
        {h.tokens, h.logp / nn::length_penalty(static_cast<int64_t>(h.tokens.size()), alpha)});
  };
  DecoderState state = model.encode(src, src_valid_lens);
  for (int64_t step = 1; !live.empty(); ++step) {
    std::vector<int64_t> last;
    for (const Live& h : live) last.push_back(h.tokens.empty() ? start_symbol : h.tokens.back());
    const Tensor X = ember::from_vector(last, {static_cast<int64_t>(live.size()), 1}, device);
    // log-probabilities (N, V) of each live hypothesis's next token
    const Tensor logp = model.decoder->forward(X, state).select(1, 0).log_softmax(-1).cpu();
    const std::vector<double> lp = logp.to(ember::kFloat64).to_vector<double>();
    std::vector<Live> next;
    std::vector<int64_t> parents;
    for (size_t i = 0; i < live.size();) {  // the hypotheses of one row: live[i, j)
      size_t j = i;
      while (j < live.size() && live[j].row == live[i].row) ++j;
      const auto ranked = detail::best_extensions(live, i, j, lp, logp.size(1), 2 * K);
      std::vector<Live> row_next;
      std::vector<int64_t> row_parents;
      for (size_t r = 0; r < ranked.size(); ++r) {
        const detail::Candidate& c = ranked[r];
        Live h{live[c.beam].tokens, c.logp, live[i].row};
        h.tokens.push_back(c.token);
        if (c.token == end_symbol) {
          if (r < K) finish(h);
        } else if (row_next.size() < K) {
          row_next.push_back(std::move(h));
          row_parents.push_back(static_cast<int64_t>(c.beam));
        }
      }
      if (finished[static_cast<size_t>(live[i].row)].size() >= K) {
        // the row is done: its live hypotheses go
      } else if (step >= max_len - 1) {
        for (const Live& h : row_next) finish(h);
      } else {
        next.insert(next.end(), row_next.begin(), row_next.end());
        parents.insert(parents.end(), row_parents.begin(), row_parents.end());
      }
      i = j;
    }
    live = std::move(next);
    if (!live.empty())
      state =
          state.select(ember::from_vector(parents, {static_cast<int64_t>(parents.size())}, device));
  }
  std::vector<nn::Hypothesis> best;
  for (const auto& hyps : finished) best.push_back(detail::best_of(hyps, end_symbol));
  return best;
}

}  // namespace g2p
