// The Annotated Transformer (Rush et al., harvardnlp), module for module and with the original's
// names, so a PyTorch state dict of it maps one to one onto named_parameters():
// `encoder.layers.0.self_attn.linears.0.weight`, `src_embed.0.lut.weight`, buffer `src_embed.1.pe`.
// Also the training pieces any user of the model reuses: Batch (masks and the shifted target) and
// LabelSmoothing (the KL criterion); a task's own data and loss loop stay with its program (the
// copy task's in examples/copy_task.h).
// One deliberate difference: LayerNorm is torch.nn.LayerNorm's, (x - mean) / sqrt(biased var +
// eps), with `weight`/`bias`, where the original's hand-written one divides by (unbiased std +
// eps) with `a_2`/`b_2`. Masks are Bool; a position is attended where it is true.
//
// Shapes: B batch, S source length, T target length, D d_model, h heads, d_k = D / h, V vocab.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "nn/layers.h"
#include "nn/module.h"

namespace ember::nn {

// scores = q kᵀ / sqrt(d_k) masked where mask is false (mask == 0 -> -1e9), softmax over the keys,
// then dropout when given; returns p_attn · v and p_attn. q (..., Tq, d_k), k and v (..., Tk, d_k),
// mask broadcasting to (..., Tq, Tk), TRUE WHERE ATTENDING IS ALLOWED (Note [Mask polarity]).
//
// Note [Mask polarity]
// The Annotated Transformer's masks, used here and by every module below, are true (nonzero)
// where a query MAY attend to a key: src_mask = (src != pad), tgt_mask = that & subsequent_mask.
// This is the opposite of torch.nn.MultiheadAttention's key_padding_mask and Bool attn_mask,
// which are true where attending is NOT allowed. Passing a PyTorch-style padding mask (true = pad)
// is not an error: each query then attends only to the padding. Invert it first
// (logical_not(pad_mask)), broadcast as (B, 1, Tk). A mask is read as Bool (nonzero = attend), so
// an additive float mask (0 = attend, -inf = blocked) is inverted the same way: convert it with
// mask.eq(0.0) first. A row with no key allowed gets uniform weights (the -1e9 fill, as the
// original), not zeros. ember::scaled_dot_product_attention follows torch 2's F.sdpa instead: its
// Bool mask is also true where a key takes part, and its float masks are added.
struct AttentionOutput {
  Tensor values, p_attn;
};
AttentionOutput attention(const Tensor& query, const Tensor& key, const Tensor& value,
                          const Tensor& mask = {}, const Dropout* dropout = nullptr);

// h heads of scaled dot-product attention over projections of d_model / h features:
// linears 0..2 project q, k, v; linears 3 merges the heads. Keeps `attn` (B, h, Tq, Tk), the last
// attention probabilities (detached), for visualisation.
class MultiHeadedAttention : public Cloneable<MultiHeadedAttention> {
 public:
  MultiHeadedAttention(int64_t h, int64_t d_model, double dropout = 0.1);
  // query (B, Tq, D), key and value (B, Tk, D); mask (B or 1, 1 or Tq, Tk) -> (B, Tq, D).
  // The mask is TRUE WHERE ATTENDING IS ALLOWED (src != pad), the opposite of PyTorch's
  // key_padding_mask (true = pad): a PyTorch-style mask silently attends only to the padding.
  // See Note [Mask polarity].
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& mask = {});

  int64_t d_k, h;
  std::shared_ptr<ModuleList> linears;  // 4 x Linear(d_model, d_model)
  std::shared_ptr<Dropout> dropout;
  Tensor attn;

 protected:
  void rebind(const CloneMap& map) override;  // a copy has attended to nothing yet

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  MultiHeadedAttention(const MultiHeadedAttention&) = default;
};

// w_2(dropout(relu(w_1(x)))): (B, T, D) -> (B, T, D) through d_ff features.
class PositionwiseFeedForward : public Cloneable<PositionwiseFeedForward> {
 public:
  PositionwiseFeedForward(int64_t d_model, int64_t d_ff, double dropout = 0.1);
  Tensor forward(const Tensor& x) const;

  std::shared_ptr<Linear> w_1, w_2;
  std::shared_ptr<Dropout> dropout;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  PositionwiseFeedForward(const PositionwiseFeedForward&) = default;
};

// lut(x) * sqrt(d_model): Int64 tokens (B, T) -> (B, T, D).
class Embeddings : public Cloneable<Embeddings> {
 public:
  Embeddings(int64_t d_model, int64_t vocab);
  Tensor forward(const Tensor& x) const;

  std::shared_ptr<Embedding> lut;
  int64_t d_model;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Embeddings(const Embeddings&) = default;
};

// dropout(x + pe[:, :T]) with the sinusoidal table, the buffer pe (1, max_len, D):
//   pe[pos, 2i] = sin(pos / 10000^(2i/D)),  pe[pos, 2i+1] = cos(pos / 10000^(2i/D)).
class PositionalEncoding : public Cloneable<PositionalEncoding> {
 public:
  PositionalEncoding(int64_t d_model, double dropout, int64_t max_len = 5000);
  Tensor forward(const Tensor& x) const;

  std::shared_ptr<Dropout> dropout;
  Tensor pe;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  PositionalEncoding(const PositionalEncoding&) = default;
};

using Sublayer = std::function<Tensor(const Tensor&)>;

// The pre-norm residual x + dropout(sublayer(norm(x))), norm = LayerNorm(size, 1e-6).
class SublayerConnection : public Cloneable<SublayerConnection> {
 public:
  SublayerConnection(int64_t size, double dropout);
  Tensor forward(const Tensor& x, const Sublayer& sublayer) const;

  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Dropout> dropout;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  SublayerConnection(const SublayerConnection&) = default;
};

// N clones of a layer and a final LayerNorm(size, 1e-6), the part Encoder and Decoder share
// (the original's clones(layer, N) and LayerNorm(layer.size)).
template <class Derived, class Layer>
class LayerStack : public Cloneable<Derived> {
 public:
  Layer& layer(size_t i) const { return *layers->template at<Layer>(i); }

  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<LayerNorm> norm;

 protected:
  LayerStack(const Layer& layer, int64_t N, std::string_view who);
};

// Self-attention then feed-forward, each in a SublayerConnection.
class EncoderLayer : public Cloneable<EncoderLayer> {
 public:
  EncoderLayer(int64_t size, std::shared_ptr<MultiHeadedAttention> self_attn,
               std::shared_ptr<PositionwiseFeedForward> feed_forward, double dropout);
  // x (B, S, D), mask (B, 1, S).
  Tensor forward(const Tensor& x, const Tensor& mask) const;

  std::shared_ptr<MultiHeadedAttention> self_attn;
  std::shared_ptr<PositionwiseFeedForward> feed_forward;
  std::shared_ptr<ModuleList> sublayer;  // 2 x SublayerConnection
  int64_t size;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  EncoderLayer(const EncoderLayer&) = default;
};

class Encoder : public LayerStack<Encoder, EncoderLayer> {
 public:
  Encoder(const EncoderLayer& layer, int64_t N) : LayerStack(layer, N, "Encoder") {}
  Tensor forward(const Tensor& x, const Tensor& mask) const;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Encoder(const Encoder&) = default;
};

// Masked self-attention, source attention over the encoder's memory, feed-forward.
class DecoderLayer : public Cloneable<DecoderLayer> {
 public:
  DecoderLayer(int64_t size, std::shared_ptr<MultiHeadedAttention> self_attn,
               std::shared_ptr<MultiHeadedAttention> src_attn,
               std::shared_ptr<PositionwiseFeedForward> feed_forward, double dropout);
  // x (B, T, D), memory (B, S, D), src_mask (B, 1, S), tgt_mask (B or 1, T, T).
  Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& src_mask,
                 const Tensor& tgt_mask) const;

  int64_t size;
  std::shared_ptr<MultiHeadedAttention> self_attn, src_attn;
  std::shared_ptr<PositionwiseFeedForward> feed_forward;
  std::shared_ptr<ModuleList> sublayer;  // 3 x SublayerConnection

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  DecoderLayer(const DecoderLayer&) = default;
};

class Decoder : public LayerStack<Decoder, DecoderLayer> {
 public:
  Decoder(const DecoderLayer& layer, int64_t N) : LayerStack(layer, N, "Decoder") {}
  Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& src_mask,
                 const Tensor& tgt_mask) const;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Decoder(const Decoder&) = default;
};

// log_softmax(proj(x), -1): (B, T, D) -> (B, T, V) log-probabilities.
class Generator : public Cloneable<Generator> {
 public:
  Generator(int64_t d_model, int64_t vocab);
  Tensor forward(const Tensor& x) const;

  std::shared_ptr<Linear> proj;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Generator(const Generator&) = default;
};

// The standard encoder-decoder; src_embed and tgt_embed are Sequential(Embeddings,
// PositionalEncoding).
class EncoderDecoder : public Cloneable<EncoderDecoder> {
 public:
  EncoderDecoder(std::shared_ptr<Encoder> encoder, std::shared_ptr<Decoder> decoder,
                 std::shared_ptr<Sequential> src_embed, std::shared_ptr<Sequential> tgt_embed,
                 std::shared_ptr<Generator> generator);
  // src (B, S) Int64, src_mask (B, 1, S) -> memory (B, S, D).
  Tensor encode(const Tensor& src, const Tensor& src_mask) const;
  // tgt (B, T) Int64, tgt_mask (B or 1, T, T) -> (B, T, D).
  Tensor decode(const Tensor& memory, const Tensor& src_mask, const Tensor& tgt,
                const Tensor& tgt_mask) const;
  // The decoder's output (before the generator).
  Tensor forward(const Tensor& src, const Tensor& tgt, const Tensor& src_mask,
                 const Tensor& tgt_mask) const;
  // d_model, read from src_embed's Embeddings (the original's model.src_embed[0].d_model).
  int64_t d_model() const;

  std::shared_ptr<Encoder> encoder;
  std::shared_ptr<Decoder> decoder;
  std::shared_ptr<Sequential> src_embed, tgt_embed;
  std::shared_ptr<Generator> generator;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  EncoderDecoder(const EncoderDecoder&) = default;
};

// The full model, LayerNorm(d_model, 1e-6) everywhere and xavier_uniform_ on every parameter of
// dim > 1. Unlike the original, whose attention always drops out 0.1, every dropout is `dropout`.
std::shared_ptr<EncoderDecoder> make_model(int64_t src_vocab, int64_t tgt_vocab, int64_t N = 6,
                                           int64_t d_model = 512, int64_t d_ff = 2048,
                                           int64_t h = 8, double dropout = 0.1);

// Bool (1, size, size), true on and below the diagonal: position i may attend to j <= i.
Tensor subsequent_mask(int64_t size);

// Decodes src (B, S) greedily from start_symbol, without gradients: each step feeds the tokens so
// far and appends the most likely next one -> Int64 (B, max_len), starting with start_symbol.
Tensor greedy_decode(EncoderDecoder& model, const Tensor& src, const Tensor& src_mask,
                     int64_t max_len, int64_t start_symbol);

// One batch of Int64 src (B, S) and tgt (B, T + 1) with padding `pad`:
//   src_mask (B, 1, S)  true at non-pad source tokens;
//   tgt      (B, T)     tgt without its last token (the decoder input, shifted right);
//   tgt_y    (B, T)     tgt without its first token (what the decoder predicts);
//   tgt_mask (B, T, T)  non-pad target tokens that are not in the future;
//   ntokens             non-pad tokens of tgt_y.
// Without tgt, only src and src_mask are set.
// The pad id defaults to 0 (kDefaultPad), as data::Vocab's <pad>, data::DataLoader's padding and
// pad_sequence's padding_value: a batch built from them gets the right masks without naming it.
// (The Annotated Transformer's Batch defaults to 2, its vocabulary's <blank>; a vocabulary whose
// pad is not 0 passes its id.)
struct Batch {
  static constexpr int64_t kDefaultPad = 0;
  explicit Batch(Tensor src, const Tensor& tgt = {}, int64_t pad = kDefaultPad);
  // (tgt != pad).unsqueeze(-2) & subsequent_mask(T).
  static Tensor make_std_mask(const Tensor& tgt, int64_t pad);
  // The same batch with every tensor on `device` (a training loop's batch.to(device)).
  Batch to(const Device& device) const;

  Tensor src, src_mask, tgt, tgt_y, tgt_mask;
  int64_t ntokens = 0;
};

// KL divergence (summed) of log-probabilities x (N, size) against the smoothed target
// distribution: `confidence` = 1 - smoothing on the target class, smoothing / (size - 2) on each
// other class but padding_idx, and an all-zero row where the target is padding_idx.
class LabelSmoothing {
 public:
  LabelSmoothing(int64_t size, int64_t padding_idx, double smoothing = 0.0);
  // x (N, size) log-probabilities, target (N) Int64 -> scalar loss.
  Tensor forward(const Tensor& x, const Tensor& target);
  Tensor operator()(const Tensor& x, const Tensor& target) { return forward(x, target); }

  int64_t size, padding_idx;
  double confidence, smoothing;
  Tensor true_dist;  // the last target distribution (N, size)
};

}  // namespace ember::nn
