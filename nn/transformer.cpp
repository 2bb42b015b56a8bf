// The Annotated Transformer's modules, make_model, subsequent_mask, greedy_decode, Batch and
// LabelSmoothing. Each forward is the original's, line for line; see nn/transformer.h for shapes
// and names.
#include "nn/transformer.h"

#include <cmath>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "nn/init.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/linalg.h"
#include "ops/loss.h"
#include "ops/nn_functional.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace ember::nn {

// --- attention

AttentionOutput attention(const Tensor& query, const Tensor& key, const Tensor& value,
                          const Tensor& mask, const Dropout* dropout) {
  EMBER_CHECK(query.dim() >= 2 && key.dim() >= 2 && value.dim() >= 2,
              "attention: query {}, key {} and value {} need at least 2 dims", query.shape(),
              key.shape(), value.shape());
  EMBER_CHECK(query.size(-1) == key.size(-1),
              "attention: query {} and key {} differ in their last dim (d_k)", query.shape(),
              key.shape());
  const double d_k = static_cast<double>(query.size(-1));
  // q (..., Tq, d_k) · kᵀ (..., d_k, Tk): the transposed view is a BLAS flag, not a copy.
  Tensor scores = matmul(query, key.transpose(-2, -1)) / std::sqrt(d_k);
  if (mask.defined()) scores = masked_fill(scores, mask.eq(0.0), -1e9);
  Tensor p_attn = softmax(scores, -1);
  if (dropout != nullptr) p_attn = dropout->forward(p_attn);
  return {matmul(p_attn, value), p_attn};
}

// --- MultiHeadedAttention

// Up to this many multiply-adds per head and product (Tq · Tk · d_k), the heads run as one
// head_attention op; longer sequences take the original's steps, whose batched products go to
// BLAS.
constexpr int64_t kHeadAttentionWork = int64_t{1} << 17;

MultiHeadedAttention::MultiHeadedAttention(int64_t h, int64_t d_model, double dropout_p)
    : d_k(h > 0 ? d_model / h : 0), h(h) {
  EMBER_CHECK(h > 0 && d_model > 0 && d_model % h == 0,
              "MultiHeadedAttention: d_model {} must be a positive multiple of h {}", d_model, h);
  // The original's clones(nn.Linear(d_model, d_model), 4): deep copies of one Linear, so the
  // four projections start from the same bias (make_model re-draws every weight).
  const Linear projection(d_model, d_model);
  register_module("linears", linears, std::make_shared<ModuleList>());
  for (int i = 0; i < 4; ++i) linears->push_back(projection.clone());
  register_module("dropout", dropout, std::make_shared<Dropout>(dropout_p));
}

Tensor MultiHeadedAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                     const Tensor& mask) {
  EMBER_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3,
              "MultiHeadedAttention: query {}, key {} and value {} must be (batch, len, d_model)",
              query.shape(), key.shape(), value.shape());
  const auto project = [&](size_t i, const Tensor& x) {
    return linears->at<Linear>(i)->forward(x);
  };
  const Tensor q = project(0, query), k = project(1, key), v = project(2, value);
  if (query.size(1) * key.size(1) * d_k <= kHeadAttentionWork) {
    // The heads in one op, read and written where the projections lie (Note [Head attention]).
    HeadAttention out = head_attention(q, k, v, h, mask, dropout->is_training() ? dropout->p : 0.0);
    attn = out.p_attn;
    return linears->at<Linear>(3)->forward(out.values);
  }
  // The original's steps. The same mask applies to every head: (B, 1, Tq or 1, Tk) broadcasts
  // over h. Split into heads: (B, T, D) -> (B, T, h, d_k) -> (B, h, T, d_k), all views.
  const Tensor head_mask = mask.defined() ? mask.unsqueeze(1) : mask;
  const int64_t nbatches = query.size(0);
  const auto split = [&](const Tensor& x) {
    return x.view({nbatches, -1, h, d_k}).transpose(1, 2);
  };
  AttentionOutput out = attention(split(q), split(k), split(v), head_mask, dropout.get());
  attn = out.p_attn.detach();
  // Merge the heads: (B, h, Tq, d_k) -> (B, Tq, h * d_k), the one copy of the layer.
  const Tensor x = out.values.transpose(1, 2).contiguous().view({nbatches, -1, h * d_k});
  return linears->at<Linear>(3)->forward(x);
}

void MultiHeadedAttention::rebind(const CloneMap&) { attn = Tensor(); }

// --- PositionwiseFeedForward

PositionwiseFeedForward::PositionwiseFeedForward(int64_t d_model, int64_t d_ff, double dropout_p) {
  register_module("w_1", w_1, std::make_shared<Linear>(d_model, d_ff));
  register_module("w_2", w_2, std::make_shared<Linear>(d_ff, d_model));
  register_module("dropout", dropout, std::make_shared<Dropout>(dropout_p));
}

Tensor PositionwiseFeedForward::forward(const Tensor& x) const {
  return w_2->forward(dropout->forward(relu(w_1->forward(x))));
}

// --- Embeddings and PositionalEncoding

Embeddings::Embeddings(int64_t d_model, int64_t vocab) : d_model(d_model) {
  register_module("lut", lut, std::make_shared<Embedding>(vocab, d_model));
}

Tensor Embeddings::forward(const Tensor& x) const {
  return lut->forward(x) * std::sqrt(static_cast<double>(d_model));
}

PositionalEncoding::PositionalEncoding(int64_t d_model, double dropout_p, int64_t max_len) {
  EMBER_CHECK(d_model > 0 && max_len > 0,
              "PositionalEncoding: d_model {} and max_len {} must be positive", d_model, max_len);
  register_module("dropout", dropout, std::make_shared<Dropout>(dropout_p));
  // pe (max_len, D), computed in double (the original computes pos * div_term in float32).
  Tensor table = empty({1, max_len, d_model});
  float* dpe = table.data<float>();
  for (int64_t i = 0; i < d_model; i += 2) {
    const double div_term = std::exp(static_cast<double>(i) * -(std::log(10000.0) / d_model));
    for (int64_t pos = 0; pos < max_len; ++pos) {
      const double angle = static_cast<double>(pos) * div_term;
      dpe[pos * d_model + i] = static_cast<float>(std::sin(angle));
      if (i + 1 < d_model) dpe[pos * d_model + i + 1] = static_cast<float>(std::cos(angle));
    }
  }
  register_buffer("pe", pe, table);
}

Tensor PositionalEncoding::forward(const Tensor& x) const {
  EMBER_CHECK(x.dim() == 3 && x.size(2) == pe.size(2) && x.size(1) <= pe.size(1),
              "PositionalEncoding: input {} must be (batch, len <= {}, {})", x.shape(), pe.size(1),
              pe.size(2));
  return dropout->forward(x + pe.narrow(1, 0, x.size(1)));
}

// --- SublayerConnection, EncoderLayer, Encoder

SublayerConnection::SublayerConnection(int64_t size, double dropout_p) {
  register_module("norm", norm, std::make_shared<LayerNorm>(size, 1e-6));
  register_module("dropout", dropout, std::make_shared<Dropout>(dropout_p));
}

Tensor SublayerConnection::forward(const Tensor& x, const Sublayer& sublayer) const {
  return x + dropout->forward(sublayer(norm->forward(x)));
}

namespace {

// n SublayerConnections in a ModuleList (the original's clones(SublayerConnection(...), n)).
std::shared_ptr<ModuleList> sublayers(int64_t size, double dropout, int n) {
  auto list = std::make_shared<ModuleList>();
  for (int i = 0; i < n; ++i) list->push_back(std::make_shared<SublayerConnection>(size, dropout));
  return list;
}

template <class M>
std::shared_ptr<M> checked(std::shared_ptr<M> m, std::string_view who, std::string_view what) {
  EMBER_CHECK(m != nullptr, "{}: {} is null", who, what);
  return m;
}

// N deep copies of layer in a ModuleList (the original's clones).
std::shared_ptr<ModuleList> clones(const Module& layer, int64_t N, std::string_view who) {
  EMBER_CHECK(N >= 1, "{}: N must be at least 1, got {}", who, N);
  auto list = std::make_shared<ModuleList>();
  for (int64_t i = 0; i < N; ++i) list->push_back(layer.clone());
  return list;
}

}  // namespace

template <class Derived, class Layer>
LayerStack<Derived, Layer>::LayerStack(const Layer& layer, int64_t N, std::string_view who) {
  this->register_module("layers", layers, clones(layer, N, who));
  this->register_module("norm", norm, std::make_shared<LayerNorm>(layer.size, 1e-6));
}

template class LayerStack<Encoder, EncoderLayer>;
template class LayerStack<Decoder, DecoderLayer>;

EncoderLayer::EncoderLayer(int64_t size, std::shared_ptr<MultiHeadedAttention> self_attn_,
                           std::shared_ptr<PositionwiseFeedForward> feed_forward_, double dropout)
    : size(size) {
  register_module("self_attn", self_attn, checked(self_attn_, "EncoderLayer", "self_attn"));
  register_module("feed_forward", feed_forward,
                  checked(feed_forward_, "EncoderLayer", "feed_forward"));
  register_module("sublayer", sublayer, sublayers(size, dropout, 2));
}

Tensor EncoderLayer::forward(const Tensor& x, const Tensor& mask) const {
  const Tensor y = sublayer->at<SublayerConnection>(0)->forward(
      x, [&](const Tensor& z) { return self_attn->forward(z, z, z, mask); });
  return sublayer->at<SublayerConnection>(1)->forward(
      y, [&](const Tensor& z) { return feed_forward->forward(z); });
}

Tensor Encoder::forward(const Tensor& x, const Tensor& mask) const {
  Tensor y = x;
  for (size_t i = 0; i < layers->size(); ++i) y = layer(i).forward(y, mask);
  return norm->forward(y);
}

// --- DecoderLayer, Decoder

DecoderLayer::DecoderLayer(int64_t size, std::shared_ptr<MultiHeadedAttention> self_attn_,
                           std::shared_ptr<MultiHeadedAttention> src_attn_,
                           std::shared_ptr<PositionwiseFeedForward> feed_forward_, double dropout)
    : size(size) {
  register_module("self_attn", self_attn, checked(self_attn_, "DecoderLayer", "self_attn"));
  register_module("src_attn", src_attn, checked(src_attn_, "DecoderLayer", "src_attn"));
  register_module("feed_forward", feed_forward,
                  checked(feed_forward_, "DecoderLayer", "feed_forward"));
  register_module("sublayer", sublayer, sublayers(size, dropout, 3));
}

Tensor DecoderLayer::forward(const Tensor& x, const Tensor& memory, const Tensor& src_mask,
                             const Tensor& tgt_mask) const {
  const Tensor& m = memory;
  Tensor y = sublayer->at<SublayerConnection>(0)->forward(
      x, [&](const Tensor& z) { return self_attn->forward(z, z, z, tgt_mask); });
  y = sublayer->at<SublayerConnection>(1)->forward(
      y, [&](const Tensor& z) { return src_attn->forward(z, m, m, src_mask); });
  return sublayer->at<SublayerConnection>(2)->forward(
      y, [&](const Tensor& z) { return feed_forward->forward(z); });
}

Tensor Decoder::forward(const Tensor& x, const Tensor& memory, const Tensor& src_mask,
                        const Tensor& tgt_mask) const {
  Tensor y = x;
  for (size_t i = 0; i < layers->size(); ++i) y = layer(i).forward(y, memory, src_mask, tgt_mask);
  return norm->forward(y);
}

// --- Generator, EncoderDecoder

Generator::Generator(int64_t d_model, int64_t vocab) {
  register_module("proj", proj, std::make_shared<Linear>(d_model, vocab));
}

Tensor Generator::forward(const Tensor& x) const { return log_softmax(proj->forward(x), -1); }

EncoderDecoder::EncoderDecoder(std::shared_ptr<Encoder> encoder_, std::shared_ptr<Decoder> decoder_,
                               std::shared_ptr<Sequential> src_embed_,
                               std::shared_ptr<Sequential> tgt_embed_,
                               std::shared_ptr<Generator> generator_) {
  const char* who = "EncoderDecoder";
  register_module("encoder", encoder, checked(encoder_, who, "encoder"));
  register_module("decoder", decoder, checked(decoder_, who, "decoder"));
  register_module("src_embed", src_embed, checked(src_embed_, who, "src_embed"));
  register_module("tgt_embed", tgt_embed, checked(tgt_embed_, who, "tgt_embed"));
  register_module("generator", generator, checked(generator_, who, "generator"));
}

Tensor EncoderDecoder::encode(const Tensor& src, const Tensor& src_mask) const {
  return encoder->forward(src_embed->forward(src), src_mask);
}

Tensor EncoderDecoder::decode(const Tensor& memory, const Tensor& src_mask, const Tensor& tgt,
                              const Tensor& tgt_mask) const {
  return decoder->forward(tgt_embed->forward(tgt), memory, src_mask, tgt_mask);
}

Tensor EncoderDecoder::forward(const Tensor& src, const Tensor& tgt, const Tensor& src_mask,
                               const Tensor& tgt_mask) const {
  return decode(encode(src, src_mask), src_mask, tgt, tgt_mask);
}

int64_t EncoderDecoder::d_model() const {
  const auto embeddings = std::dynamic_pointer_cast<Embeddings>((*src_embed)[0]);
  EMBER_CHECK(embeddings != nullptr, "EncoderDecoder: src_embed[0] is a {}, not Embeddings",
              (*src_embed)[0]->type_name());
  return embeddings->d_model;
}

// --- make_model, masks, decoding

std::shared_ptr<EncoderDecoder> make_model(int64_t src_vocab, int64_t tgt_vocab, int64_t N,
                                           int64_t d_model, int64_t d_ff, int64_t h,
                                           double dropout) {
  const auto c = [](const auto& m) {
    using M = std::decay_t<decltype(*m)>;
    return std::static_pointer_cast<M>(m->clone());
  };
  const auto attn = std::make_shared<MultiHeadedAttention>(h, d_model, dropout);
  const auto ff = std::make_shared<PositionwiseFeedForward>(d_model, d_ff, dropout);
  const auto position = std::make_shared<PositionalEncoding>(d_model, dropout);
  auto model = std::make_shared<EncoderDecoder>(
      std::make_shared<Encoder>(EncoderLayer(d_model, c(attn), c(ff), dropout), N),
      std::make_shared<Decoder>(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout), N),
      std::make_shared<Sequential>(std::make_shared<Embeddings>(d_model, src_vocab), c(position)),
      std::make_shared<Sequential>(std::make_shared<Embeddings>(d_model, tgt_vocab), c(position)),
      std::make_shared<Generator>(d_model, tgt_vocab));
  for (Tensor p : model->parameters())
    if (p.dim() > 1) init::xavier_uniform_(p);
  return model;
}

Tensor subsequent_mask(int64_t size) {
  EMBER_CHECK(size >= 0, "subsequent_mask: size must be non-negative, got {}", size);
  return triu(ones({1, size, size}), 1).eq(0.0);
}

Tensor greedy_decode(EncoderDecoder& model, const Tensor& src, const Tensor& src_mask,
                     int64_t max_len, int64_t start_symbol) {
  EMBER_CHECK(src.dim() == 2 && src.dtype() == kInt64,
              "greedy_decode: src must be Int64 (batch, len), got {} of shape {}", src.dtype(),
              src.shape());
  EMBER_CHECK(max_len >= 1, "greedy_decode: max_len must be at least 1, got {}", max_len);
  NoGradGuard no_grad;
  const Tensor memory = model.encode(src, src_mask);
  Tensor ys = full({src.size(0), 1}, static_cast<double>(start_symbol), kInt64, src.device());
  for (int64_t i = 0; i < max_len - 1; ++i) {
    const Tensor out =
        model.decode(memory, src_mask, ys, subsequent_mask(ys.size(1)).to(src.device()));
    const Tensor prob = model.generator->forward(out.narrow(1, ys.size(1) - 1, 1).squeeze(1));
    const Tensor next_word = argmax(prob, 1);  // (B)
    ys = cat({ys, next_word.unsqueeze(1)}, 1);
  }
  return ys;
}

// --- Batch, LabelSmoothing

Batch::Batch(Tensor src_, const Tensor& tgt_, int64_t pad) : src(std::move(src_)) {
  EMBER_CHECK(src.defined() && src.dim() == 2 && src.dtype() == kInt64,
              "Batch: src must be Int64 (batch, len), got {}",
              src.defined() ? fmt::format("{} of shape {}", src.dtype(), src.shape()) : "none");
  src_mask = src.ne(static_cast<double>(pad)).unsqueeze(-2);
  if (!tgt_.defined()) return;
  EMBER_CHECK(
      tgt_.dim() == 2 && tgt_.dtype() == kInt64 && tgt_.size(1) >= 2 && tgt_.size(0) == src.size(0),
      "Batch: tgt must be Int64 (batch {}, len >= 2), got {} of shape {}", src.size(0),
      tgt_.dtype(), tgt_.shape());
  const int64_t T = tgt_.size(1) - 1;
  tgt = tgt_.narrow(1, 0, T);
  tgt_y = tgt_.narrow(1, 1, T);
  tgt_mask = make_std_mask(tgt, pad);
  ntokens = 0;
  for (int64_t token : tgt_y.to_vector<int64_t>()) ntokens += token != pad;
}

Tensor Batch::make_std_mask(const Tensor& tgt, int64_t pad) {
  return logical_and(tgt.ne(static_cast<double>(pad)).unsqueeze(-2),
                     subsequent_mask(tgt.size(-1)).to(tgt.device()));
}

Batch Batch::to(const Device& device) const {
  Batch out = *this;
  for (Tensor* t : {&out.src, &out.src_mask, &out.tgt, &out.tgt_y, &out.tgt_mask})
    if (t->defined()) *t = t->to(device);
  return out;
}

LabelSmoothing::LabelSmoothing(int64_t size, int64_t padding_idx, double smoothing)
    : size(size), padding_idx(padding_idx), confidence(1.0 - smoothing), smoothing(smoothing) {
  EMBER_CHECK(size > 2 && padding_idx >= 0 && padding_idx < size,
              "LabelSmoothing: need size > 2 and 0 <= padding_idx < size, got {} and {}", size,
              padding_idx);
  EMBER_CHECK(smoothing >= 0 && smoothing <= 1,
              "LabelSmoothing: smoothing must be in [0, 1], got {}", smoothing);
}

Tensor LabelSmoothing::forward(const Tensor& x, const Tensor& target) {
  EMBER_CHECK(x.dim() == 2 && x.size(1) == size,
              "LabelSmoothing: input {} must be (N, {}) log-probabilities", x.shape(), size);
  EMBER_CHECK(target.dtype() == kInt64 && target.shape() == Shape{x.size(0)},
              "LabelSmoothing: target {} of shape {} must be Int64 ({})", target.dtype(),
              target.shape(), x.size(0));
  // true_dist (N, size): smoothing / (size - 2) everywhere, confidence at the target, 0 in the
  // padding column and in rows whose target is padding.
  const int64_t N = x.size(0);
  const double base = smoothing / static_cast<double>(size - 2);
  if (!x.device().is_cpu()) {
    // On a device, in ops (no wait for the targets): confidence scattered at the targets (which
    // that op checks, Note [Checks on the device]), then the padding column and the rows whose
    // target is padding zeroed
    {
      NoGradGuard no_grad;
      const Tensor t = target.reshape({N, 1});
      true_dist =
          scatter_add(full({N, size}, base, x.dtype(), x.device()), 1, t,
                      full({N, 1}, confidence - base, x.dtype(), x.device()),
                      fmt::format("LabelSmoothing: target {{}} out of range for {} classes", size));
      const Tensor classes = arange(0, static_cast<double>(size), 1, kInt64, x.device());
      true_dist = masked_fill(true_dist,
                              logical_or(eq(classes, static_cast<double>(padding_idx)),
                                         eq(t, static_cast<double>(padding_idx))),
                              0.0);
    }
    return kl_div(x, true_dist, Reduction::Sum);
  }
  true_dist = full({N, size}, base, x.dtype());
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  dispatch_float(x.dtype(), "LabelSmoothing", [&]<class T>() {
    T* d = true_dist.data<T>();
    for (int64_t n = 0; n < N; ++n) {
      EMBER_CHECK(t[n] >= 0 && t[n] < size, "LabelSmoothing: target {} out of range for {} classes",
                  t[n], size);
      T* row = d + n * size;
      row[t[n]] = static_cast<T>(confidence);
      row[padding_idx] = T(0);
      if (t[n] == padding_idx)
        for (int64_t c = 0; c < size; ++c) row[c] = T(0);
    }
  });
  return kl_div(x, true_dist, Reduction::Sum);
}

}  // namespace ember::nn
