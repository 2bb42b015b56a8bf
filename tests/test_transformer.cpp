// The Annotated Transformer: shapes through every module, masks, parameter names and count,
// cloning, gradcheck of attention and a tiny model in Float64, parity with the PyTorch original
// (tests/golden/gen_transformer.py), Batch and LabelSmoothing, the copy task's pieces
// (examples/copy_task.h) and a short copy-task training run.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "examples/copy_task.h"
#include "helpers.h"

using namespace ember;
using namespace ember::testing;
using nn::EncoderDecoder;

namespace {

// The copy-task run of copy_task_learns_to_copy.
constexpr int64_t kWarmup = 100;
constexpr int kEpochs = 8;

std::string golden_path(const std::string& file) {
  return fmt::format("{}/{}", golden_dir(), file);
}

// A padded source batch (pad 0) of B rows and length S over tokens 1..V-1, deterministic.
Tensor padded_tokens(int64_t B, int64_t S, int64_t V) {
  std::vector<int64_t> data(B * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) data[b * S + s] = s < S - b ? 1 + (3 * b + 5 * s) % (V - 1) : 0;
  return from_vector(data, {B, S});
}

// The loaded golden model: parameters from the PyTorch file, positional tables Ember's own.
std::shared_ptr<EncoderDecoder> golden_model() {
  auto model = nn::make_model(11, 11, 2, 32, 64, 4);
  nn::load(*model, golden_path("transformer_model.safetensors"), /*strict=*/false);
  model->eval();
  return model;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_transformer)

BOOST_AUTO_TEST_CASE(shapes_through_every_module) {
  manual_seed(0);
  const int64_t B = 3, S = 7, T = 5, D = 16, h = 4, V = 9;
  const Tensor x = randn({B, S, D}), y = randn({B, T, D});
  const Tensor src = padded_tokens(B, S, V), tgt = padded_tokens(B, T, V);
  const Tensor src_mask = src.ne(0.0).unsqueeze(-2);  // (B, 1, S)
  const Tensor tgt_mask = nn::Batch::make_std_mask(tgt, 0);

  nn::MultiHeadedAttention mha(h, D);
  BOOST_TEST((mha(y, x, x, src_mask).shape() == Shape{B, T, D}));
  BOOST_TEST((mha.attn.shape() == Shape{B, h, T, S}));
  BOOST_TEST(!mha.attn.requires_grad());
  BOOST_TEST((mha(x, x, x).shape() == Shape{B, S, D}));
  BOOST_TEST((nn::PositionwiseFeedForward(D, 32)(x).shape() == Shape{B, S, D}));
  BOOST_TEST((nn::Embeddings(D, V)(src).shape() == Shape{B, S, D}));
  nn::PositionalEncoding pe(D, 0.1, 50);
  BOOST_TEST((pe.pe.shape() == Shape{1, 50, D}));
  BOOST_TEST((pe(x).shape() == Shape{B, S, D}));
  nn::SublayerConnection sc(D, 0.1);
  BOOST_TEST((sc(x, [](const Tensor& z) { return z * 2.0; }).shape() == Shape{B, S, D}));

  auto attn = std::make_shared<nn::MultiHeadedAttention>(h, D);
  auto ff = std::make_shared<nn::PositionwiseFeedForward>(D, 32);
  nn::EncoderLayer enc_layer(D, attn, ff, 0.1);
  BOOST_TEST((enc_layer(x, src_mask).shape() == Shape{B, S, D}));
  nn::Encoder encoder(enc_layer, 2);
  const Tensor memory = encoder(x, src_mask);
  BOOST_TEST((memory.shape() == Shape{B, S, D}));
  nn::DecoderLayer dec_layer(D, std::make_shared<nn::MultiHeadedAttention>(h, D),
                             std::make_shared<nn::MultiHeadedAttention>(h, D), ff, 0.1);
  BOOST_TEST((dec_layer(y, memory, src_mask, tgt_mask).shape() == Shape{B, T, D}));
  nn::Decoder decoder(dec_layer, 2);
  BOOST_TEST((decoder(y, memory, src_mask, tgt_mask).shape() == Shape{B, T, D}));
  BOOST_TEST((decoder.layer(1).src_attn->attn.shape() == Shape{B, h, T, S}));
  BOOST_TEST((decoder.layer(0).self_attn->attn.shape() == Shape{B, h, T, T}));
  BOOST_TEST((nn::Generator(D, V)(y).shape() == Shape{B, T, V}));

  auto model = nn::make_model(V, V, 2, D, 32, h);
  BOOST_TEST(model->d_model() == D);
  const Tensor mem = model->encode(src, src_mask);
  BOOST_TEST((mem.shape() == Shape{B, S, D}));
  BOOST_TEST((model->decode(mem, src_mask, tgt, tgt_mask).shape() == Shape{B, T, D}));
  const Tensor out = model->forward(src, tgt, src_mask, tgt_mask);
  BOOST_TEST((out.shape() == Shape{B, T, D}));
  // log-probabilities: every row sums to 1 in probability
  const Tensor p = model->generator->forward(out).exp().sum({-1});
  expect_close(p, ones({B, T}), 1e-5, 1e-5, "generator rows");
}

BOOST_AUTO_TEST_CASE(attention_with_causal_mask_matches_pytorch) {
  // gen_attention.py: the original's attention() with subsequent_mask, values and gradients.
  const Golden g("attention.json");
  Tensor q = g["q"].detach().requires_grad_(), k = g["k"].detach().requires_grad_(),
         v = g["v"].detach().requires_grad_();
  const Tensor mask = nn::subsequent_mask(5).unsqueeze(1);
  BOOST_TEST((mask.to_vector<int64_t>() == g["mask"].to_vector<int64_t>()));
  const nn::AttentionOutput out = nn::attention(q, k, v, mask);
  expect_close(out.values, g["out"], 1e-10, 1e-12, "attention values");
  expect_close(out.p_attn, g["p_attn"], 1e-10, 1e-12, "p_attn");
  out.values.backward(g["grad_out"]);
  expect_close(q.grad(), g["grad_q"], 1e-9, 1e-12, "grad q");
  expect_close(k.grad(), g["grad_k"], 1e-9, 1e-12, "grad k");
  expect_close(v.grad(), g["grad_v"], 1e-9, 1e-12, "grad v");
  // Float32 agrees with the Float64 reference.
  const nn::AttentionOutput out32 =
      nn::attention(g["q"].to(kFloat32), g["k"].to(kFloat32), g["v"].to(kFloat32), mask);
  expect_close(out32.values, g["out"], 1e-5, 1e-5, "attention values (Float32)");
}

BOOST_AUTO_TEST_CASE(attention_masks_keys_and_normalises) {
  manual_seed(1);
  const Tensor q = randn({2, 3, 4, 8}), k = randn({2, 3, 6, 8}), v = randn({2, 3, 6, 8});
  // key 4 and 5 masked in batch 0, none in batch 1; (B, 1, 1, Tk) broadcasts over heads/queries
  const Tensor mask =
      from_vector(std::vector<double>{1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1}, {2, 1, 1, 6}, kBool);
  const nn::AttentionOutput out = nn::attention(q, k, v, mask);
  BOOST_TEST((out.values.shape() == Shape{2, 3, 4, 8}));
  BOOST_TEST((out.p_attn.shape() == Shape{2, 3, 4, 6}));
  expect_close(out.p_attn.sum({-1}), ones({2, 3, 4}), 1e-6, 1e-6, "rows sum to 1");
  const Tensor masked = out.p_attn.narrow(0, 0, 1).narrow(-1, 4, 2);
  BOOST_TEST(masked.abs().max().item<double>() == 0.0);
  BOOST_TEST(neg(out.p_attn.narrow(0, 1, 1).narrow(-1, 4, 2)).max().item<double>() < 0.0);
  // the same as the formula written out with a -1e9 fill
  const Tensor scores =
      masked_fill(matmul(q, k.transpose(-2, -1)) / std::sqrt(8.0), mask.eq(0.0), -1e9);
  expect_close(out.p_attn, softmax(scores, -1), 1e-6, 1e-7, "p_attn");
  expect_close(out.values, matmul(softmax(scores, -1), v), 1e-5, 1e-6, "values");
}

// Note [Mask polarity] in nn/transformer.h: MultiHeadedAttention's mask is true where attending
// is allowed. A PyTorch-style key padding mask (true = pad) is not an error: it attends only to
// the padding; inverted, it is the right mask; and sdpa reads a Bool mask the same way.
BOOST_AUTO_TEST_CASE(multi_headed_attention_mask_polarity) {
  manual_seed(2);
  nn::MultiHeadedAttention mha(2, 8, 0.0);
  const Tensor x = randn({2, 4, 8});
  // key 3 is padding in batch 0, keys 2 and 3 in batch 1, as torch's key_padding_mask (B, Tk)
  const Tensor pad = from_vector(std::vector<double>{0, 0, 0, 1, 0, 0, 1, 1}, {2, 4}, kBool);
  mha.forward(x, x, x, logical_not(pad).unsqueeze(1));  // (B, 1, Tk), true = attend
  const Tensor right = mha.attn;                        // (B, h, Tq, Tk)
  BOOST_TEST(right.select(0, 0).select(-1, 3).abs().max().item<double>() == 0.0);
  BOOST_TEST(right.select(0, 1).narrow(-1, 2, 2).abs().max().item<double>() == 0.0);
  mha.forward(x, x, x, pad.unsqueeze(1));  // the PyTorch polarity: only the padding is attended
  const Tensor wrong = mha.attn;
  expect_close(wrong.select(0, 0).select(-1, 3), ones({2, 4}), 0, 1e-6, "pad only, batch 0");
  expect_close(wrong.select(0, 1).narrow(-1, 2, 2).sum({-1}), ones({2, 4}), 0, 1e-6,
               "pad only, batch 1");
  // scaled_dot_product_attention: the same polarity for a Bool mask, true = takes part
  const Tensor q = randn({2, 2, 4, 4}), k = randn({2, 2, 4, 4}), v = randn({2, 2, 4, 4});
  const Tensor keep = logical_not(pad).reshape({2, 1, 1, 4});
  expect_close(scaled_dot_product_attention(q, k, v, keep), nn::attention(q, k, v, keep).values,
               1e-5, 1e-6, "sdpa and nn::attention agree on a Bool mask");
}

BOOST_AUTO_TEST_CASE(subsequent_mask_is_the_lower_triangle) {
  const Tensor m = nn::subsequent_mask(5);
  BOOST_TEST((m.dtype() == kBool));
  BOOST_TEST((m.shape() == Shape{1, 5, 5}));
  std::vector<int64_t> expected;
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j) expected.push_back(j <= i);
  BOOST_TEST((m.to_vector<int64_t>() == expected));
  BOOST_TEST((nn::subsequent_mask(1).to_vector<int64_t>() == std::vector<int64_t>{1}));
  expect_error([] { nn::subsequent_mask(-1); }, {"subsequent_mask", "-1"});
}

BOOST_AUTO_TEST_CASE(batch_masks_shift_and_count_tokens) {
  // src/tgt with padding 0 at the ends of rows 1 and 2
  const Tensor src = from_vector(std::vector<int64_t>{1, 4, 5, 6, 1, 7, 0, 0}, {2, 4});
  const Tensor tgt = from_vector(std::vector<int64_t>{1, 4, 5, 6, 1, 7, 3, 0}, {2, 4});
  const nn::Batch batch(src, tgt, 0);
  BOOST_TEST((batch.src_mask.shape() == Shape{2, 1, 4}));
  BOOST_TEST((batch.src_mask.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0}));
  BOOST_TEST((batch.tgt.to_vector<int64_t>() == std::vector<int64_t>{1, 4, 5, 1, 7, 3}));
  BOOST_TEST((batch.tgt_y.to_vector<int64_t>() == std::vector<int64_t>{4, 5, 6, 7, 3, 0}));
  BOOST_TEST(batch.ntokens == 5);
  BOOST_TEST((batch.tgt_mask.shape() == Shape{2, 3, 3}));
  // row 1: lower triangle; row 2 likewise (no pad in its decoder input 1 7 3)
  const std::vector<int64_t> tri{1, 0, 0, 1, 1, 0, 1, 1, 1};
  std::vector<int64_t> expected = tri;
  expected.insert(expected.end(), tri.begin(), tri.end());
  BOOST_TEST((batch.tgt_mask.to_vector<int64_t>() == expected));
  // a pad inside the decoder input hides that key from every query
  const Tensor m = nn::Batch::make_std_mask(from_vector(std::vector<int64_t>{1, 0, 2}, {1, 3}), 0);
  BOOST_TEST((m.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 1, 0, 0, 1, 0, 1}));
  const nn::Batch only_src(src, Tensor(), 0);
  BOOST_TEST(!only_src.tgt.defined());
  // The default pad is 0, as data::Vocab's <pad> and pad_sequence's padding: the same masks.
  const nn::Batch by_default(src, tgt);
  BOOST_TEST((by_default.src_mask.to_vector<int64_t>() == batch.src_mask.to_vector<int64_t>()));
  BOOST_TEST((by_default.tgt_mask.to_vector<int64_t>() == batch.tgt_mask.to_vector<int64_t>()));
  BOOST_TEST(by_default.ntokens == batch.ntokens);
  const Tensor padded = nn::utils::rnn::pad_sequence(
      {from_vector(std::vector<int64_t>{5, 6, 7}, {3}), from_vector(std::vector<int64_t>{8}, {1})},
      /*batch_first=*/true);
  BOOST_TEST(
      (nn::Batch(padded).src_mask.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 1, 0, 0}));
  // Another pad id is passed explicitly.
  const Tensor padded2 = from_vector(std::vector<int64_t>{5, 6, 2, 2}, {1, 4});
  BOOST_TEST((nn::Batch(padded2, Tensor(), 2).src_mask.to_vector<int64_t>() ==
              std::vector<int64_t>{1, 1, 0, 0}));
  expect_error([&] { nn::Batch(src.to(kFloat32)); }, {"Batch", "src", "Float32"});
  expect_error([&] { nn::Batch(src, tgt.narrow(1, 0, 1)); }, {"Batch", "tgt", "[2, 1]"});
}

BOOST_AUTO_TEST_CASE(data_gen_makes_copy_batches) {
  manual_seed(3);
  const std::vector<nn::Batch> batches = copy_task::data_gen(11, 4, 3);
  BOOST_TEST(batches.size() == 3u);
  for (const nn::Batch& b : batches) {
    BOOST_TEST((b.src.shape() == Shape{4, 10}));
    const std::vector<int64_t> s = b.src.to_vector<int64_t>();
    for (size_t i = 0; i < s.size(); ++i) {
      BOOST_TEST((i % 10 == 0 ? s[i] == 1 : (s[i] >= 1 && s[i] < 11)));
    }
    BOOST_TEST((b.tgt_y.to_vector<int64_t>() == b.src.narrow(1, 1, 9).to_vector<int64_t>()));
    BOOST_TEST(b.ntokens == 36);
  }
}

BOOST_AUTO_TEST_CASE(label_smoothing_target_distribution) {
  nn::LabelSmoothing crit(5, 0, 0.4);
  const Tensor x = log_softmax(randn({3, 5}), -1).detach().requires_grad_();
  const Tensor target = from_vector(std::vector<int64_t>{2, 0, 4}, {3});
  const Tensor loss = crit(x, target);
  // smoothing / (size - 2) = 0.4 / 3 off target, 0.6 on it, 0 at padding and in padding rows
  const double s = 0.4 / 3;
  const std::vector<double> expected{0, s, 0.6, s, s, 0, 0, 0, 0, 0, 0, s, s, s, 0.6};
  expect_close(crit.true_dist.to(kFloat64), from_vector(expected, {3, 5}, kFloat64), 1e-6, 1e-7,
               "true_dist");
  const Tensor t = crit.true_dist;
  const Tensor manual = (t * (t.log().masked_fill(t.eq(0.0), 0.0) - x)).sum();
  BOOST_TEST(loss.item<double>() == manual.item<double>(), boost::test_tools::tolerance(1e-5));
  expect_error([&] { crit(x.narrow(1, 0, 4), target); }, {"LabelSmoothing", "[3, 4]"});
  expect_error(
      [&] {
        crit(x, from_vector(std::vector<int64_t>{2, 0, 5}, {3}));
      },
      {"LabelSmoothing", "5"});
  expect_error([] { nn::LabelSmoothing(2, 0); }, {"LabelSmoothing", "size"});
}

BOOST_AUTO_TEST_CASE(make_model_names_and_count) {
  auto model = nn::make_model(11, 11, 2);
  const nn::NamedTensors params = model->named_parameters();
  int64_t total = 0;
  for (const auto& [name, p] : params) total += p.numel();
  BOOST_TEST(total == 14731787);  // the original's count for make_model(11, 11, 2)

  // The names, in order, of PyTorch's named_parameters() of the original (N = 2).
  std::ifstream in(golden_path("transformer_names.json"));
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto names = golden.at("names").get<std::vector<std::string>>();
  const auto shapes = golden.at("shapes").get<std::vector<Shape>>();
  BOOST_TEST_REQUIRE(params.size() == names.size());
  auto small = nn::make_model(11, 11, 2, 32, 64, 4);  // the golden model's shapes
  const nn::NamedTensors small_params = small->named_parameters();
  for (size_t i = 0; i < names.size(); ++i) {
    BOOST_TEST(params[i].first == names[i]);
    BOOST_TEST(small_params[i].first == names[i]);
    BOOST_TEST((small_params[i].second.shape() == shapes[i]), names[i]);
  }
  std::vector<std::string> buffers;
  for (const auto& [name, b] : model->named_buffers()) buffers.push_back(name);
  BOOST_TEST((buffers == golden.at("buffers").get<std::vector<std::string>>()));
  BOOST_TEST((model->tgt_embed->named_buffers()[0].second.shape() == Shape{1, 5000, 512}));
  // xavier_uniform_ on matrices: |w| <= sqrt(6 / (fan_in + fan_out)); LayerNorm stays (1, 0)
  const Tensor w = model->encoder->layer(0).feed_forward->w_1->weight;
  BOOST_TEST(w.abs().max().item<double>() <= std::sqrt(6.0 / (512 + 2048)));
  BOOST_TEST(w.abs().max().item<double>() > 0.9 * std::sqrt(6.0 / (512 + 2048)));
  expect_close(model->encoder->norm->weight, ones({512}), 0, 0, "norm weight");
  BOOST_TEST(model->encoder->norm->eps == 1e-6);
}

// The original deep-copies one MultiHeadedAttention (itself four copies of one Linear) and one
// PositionwiseFeedForward into every layer, then re-draws only the matrices: the parameters its
// make_model leaves equal (the golden groups) start equal in Ember's too, and no others do.
BOOST_AUTO_TEST_CASE(make_model_starts_equal_where_the_original_does) {
  manual_seed(3);
  auto model = nn::make_model(11, 11, 2, 32, 64, 4);
  std::ifstream in(golden_path("transformer_names.json"));
  const auto groups =
      nlohmann::json::parse(in).at("equal_at_init").get<std::vector<std::vector<std::string>>>();
  std::map<std::string, Tensor> params;
  for (const auto& [name, p] : model->named_parameters()) params.emplace(name, p);
  std::map<std::string, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const std::string& name : groups[g]) {
      BOOST_TEST_REQUIRE(params.count(name) == 1, name);
      group_of[name] = g;
      expect_close(params.at(name), params.at(groups[g][0]), 0, 0, name);
    }
  }
  BOOST_TEST(groups.size() == 5);  // attention biases, w_1 and w_2 biases, norm weights and biases
  for (const auto& [a, pa] : params) {
    for (const auto& [b, pb] : params) {
      if (a >= b || pa.shape() != pb.shape()) continue;
      if (group_of.count(a) && group_of.count(b) && group_of[a] == group_of[b]) continue;
      BOOST_TEST((pa - pb).abs().max().item<double>() > 0, a << " and " << b << " start equal");
    }
  }
}

BOOST_AUTO_TEST_CASE(positional_table_matches_pytorch) {
  const Golden g("transformer.json");
  nn::PositionalEncoding pe(32, 0.0);
  expect_close(pe.pe.narrow(1, 0, 12).squeeze(0).to(kFloat64), g["pe"], 0, 1e-7, "pe rows");
  // dropout(x + pe) with p = 0 adds the first rows
  const Tensor x = zeros({2, 3, 32});
  expect_close(pe(x), pe.pe.narrow(1, 0, 3).expand({2, 3, 32}), 0, 0, "forward");
  expect_error([&] { pe(zeros({1, 5001, 32})); }, {"PositionalEncoding", "5001"});
  expect_error([&] { pe(zeros({1, 3, 16})); }, {"PositionalEncoding", "[1, 3, 16]"});
}

BOOST_AUTO_TEST_CASE(clones_are_independent) {
  manual_seed(4);
  auto model = nn::make_model(7, 7, 2, 16, 32, 2);
  // The encoder's layers are clones of one layer: equal names, separate storage.
  nn::EncoderLayer& l0 = model->encoder->layer(0);
  nn::EncoderLayer& l1 = model->encoder->layer(1);
  BOOST_TEST(l0.self_attn.get() != l1.self_attn.get());
  BOOST_TEST(!l0.self_attn->linears->at<nn::Linear>(0)->weight.same(
      l1.self_attn->linears->at<nn::Linear>(0)->weight));
  BOOST_TEST(l0.self_attn.get() == l0.named_children()[0].second.get());

  // a copy has attended to nothing yet, whatever the original did
  model->eval();
  const Tensor src = padded_tokens(2, 5, 7);
  const Tensor mask = src.ne(0.0).unsqueeze(-2);
  const Tensor before = model->encode(src, mask);
  BOOST_TEST(model->encoder->layer(1).self_attn->attn.defined());
  auto copy = std::static_pointer_cast<EncoderDecoder>(model->clone());
  BOOST_TEST(!copy->encoder->layer(1).self_attn->attn.defined());
  BOOST_TEST(!copy->is_training());
  const auto a = model->named_parameters(), b = copy->named_parameters();
  BOOST_TEST_REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    BOOST_TEST(a[i].first == b[i].first);
    BOOST_TEST(a[i].second.impl()->storage != b[i].second.impl()->storage);
    expect_close(a[i].second, b[i].second, 0, 0, a[i].first);
  }
  // members point into the copy's own registry
  BOOST_TEST(
      copy->encoder->layer(0).self_attn->linears->at<nn::Linear>(0)->weight.same(b[0].second));
  {
    NoGradGuard no_grad;
    copy->encoder->layer(0).self_attn->linears->at<nn::Linear>(0)->weight.fill_(0.5);
  }
  BOOST_TEST(a[0].second.abs().max().item<double>() < 0.5);
  // the original computes as before; the changed copy differently
  expect_close(model->encode(src, mask), before, 0, 0, "original after the copy changed");
  BOOST_TEST((before - copy->encode(src, mask)).abs().max().item<double>() > 0);
}

BOOST_AUTO_TEST_CASE(dropout_follows_train_and_eval) {
  manual_seed(5);
  auto model = nn::make_model(7, 7, 1, 16, 32, 2, 0.3);
  const Tensor src = padded_tokens(2, 5, 7), tgt = padded_tokens(2, 4, 7);
  const Tensor sm = src.ne(0.0).unsqueeze(-2), tm = nn::Batch::make_std_mask(tgt, 0);
  const auto diff = [&] {
    return (model->forward(src, tgt, sm, tm) - model->forward(src, tgt, sm, tm))
        .abs()
        .max()
        .item<double>();
  };
  BOOST_TEST(model->is_training());
  BOOST_TEST(diff() > 0);
  model->eval();
  BOOST_TEST(!model->encoder->layer(0).self_attn->dropout->is_training());
  BOOST_TEST(diff() == 0);
}

BOOST_AUTO_TEST_CASE(gradcheck_multi_headed_attention) {
  manual_seed(6);
  nn::MultiHeadedAttention mha(2, 6, 0.0);
  mha.to(kFloat64);
  mha.eval();
  const Tensor mask = from_vector(std::vector<double>{1, 1, 1, 1, 1, 1, 0, 0}, {2, 1, 4}, kBool);
  const Tensor q = leaf({2, 3, 6}), kv = leaf({6, 4, 2});  // kv read through a permuted view
  check_gradient(
      [&](const std::vector<Tensor>& in) {
        const Tensor k = in[1].permute({2, 1, 0});
        return mha(in[0], k, k * 0.5, mask);
      },
      {q, kv}, "MultiHeadedAttention wrt query, key/value");
  // self-attention with a causal mask, w.r.t. spot parameters (the module's own tensors)
  const Tensor x = randn({2, 3, 6}, kFloat64);
  const auto& lin = *mha.linears;
  check_gradient([&](const std::vector<Tensor>&) { return mha(x, x, x, nn::subsequent_mask(3)); },
                 {lin.at<nn::Linear>(0)->weight, lin.at<nn::Linear>(1)->bias,
                  lin.at<nn::Linear>(2)->weight, lin.at<nn::Linear>(3)->bias},
                 "MultiHeadedAttention wrt parameters");
  expect_error([] { nn::MultiHeadedAttention(4, 6); }, {"MultiHeadedAttention", "6", "4"});
  expect_error([&] { mha(x.narrow(0, 0, 1).squeeze(0), x, x); },
               {"MultiHeadedAttention", "[3, 6]"});
  expect_error([&] { nn::attention(x, x.narrow(-1, 0, 5), x); }, {"attention", "[2, 3, 5]"});
}

// head_attention (Note [Head attention]) against the original's steps it replaces in
// MultiHeadedAttention: split into heads, attention(), merge; values, p_attn and the gradients.
namespace {

struct HeadsRun {
  Tensor values, p_attn, dq, dk, dv;
};

HeadsRun heads_run(bool fused, const Tensor& q0, const Tensor& k0, const Tensor& v0, int64_t h,
                   const Tensor& keep, double p, uint64_t seed) {
  const Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(),
               v = v0.detach().requires_grad_();
  manual_seed(seed);
  Tensor values, p_attn;
  if (fused) {
    HeadAttention out = head_attention(q, k, v, h, keep, p);
    values = out.values, p_attn = out.p_attn;
  } else {
    const int64_t B = q.size(0), dk = q.size(2) / h;
    const auto split = [&](const Tensor& x) { return x.view({B, -1, h, dk}).transpose(1, 2); };
    const nn::Dropout dropout(p);
    const nn::AttentionOutput out = nn::attention(
        split(q), split(k), split(v), keep.defined() ? keep.unsqueeze(1) : keep, &dropout);
    values = out.values.transpose(1, 2).contiguous().view({B, -1, h * dk});
    p_attn = out.p_attn.detach();
  }
  const Tensor w = arange(0, static_cast<double>(values.numel()), 1, values.dtype())
                       .view(values.shape())
                       .sin();  // a fixed, uneven upstream gradient
  (values * w).sum().backward();
  return {values.detach(), p_attn, q.grad(), k.grad(), v.grad()};
}

void expect_same_heads(const HeadsRun& a, const HeadsRun& b, double rtol, double atol,
                       const std::string& what) {
  expect_close(a.values, b.values, rtol, atol, what + " values");
  expect_close(a.p_attn, b.p_attn, rtol, atol, what + " p_attn");
  expect_close(a.dq, b.dq, rtol, atol, what + " dq");
  expect_close(a.dk, b.dk, rtol, atol, what + " dk");
  expect_close(a.dv, b.dv, rtol, atol, what + " dv");
}

}  // namespace

BOOST_AUTO_TEST_CASE(head_attention_matches_the_original_steps) {
  manual_seed(21);
  const int64_t B = 3, Tq = 5, Tk = 7, h = 2, D = 8;
  const Tensor q = randn({B, Tq, D}, kFloat64), k = randn({B, Tk, D}, kFloat64) * 2,
               v = randn({B, Tk, D}, kFloat64);
  // A padding mask (B, 1, Tk), a full (B, Tq, Tk) one with a row where no key is kept (uniform
  // weights, zero gradient to its scores), and none.
  Tensor pad = ones({B, 1, Tk}, kBool);
  pad.narrow(0, 1, 1).narrow(2, 4, 3).fill_(false);
  Tensor full = rand({B, Tq, Tk}, kFloat64).gt(0.3);
  full.narrow(0, 2, 1).narrow(1, 3, 1).fill_(false);
  for (const Tensor& keep : {pad, full, Tensor()}) {
    for (const double p : {0.0, 0.25, 1.0}) {
      const std::string what =
          fmt::format("keep {} p {}", keep.defined() ? keep.shape() : Shape{}, p);
      expect_same_heads(heads_run(true, q, k, v, h, keep, p, 5),
                        heads_run(false, q, k, v, h, keep, p, 5), 1e-12, 1e-12, what);
      expect_same_heads(
          heads_run(true, q.to(kFloat32), k.to(kFloat32), v.to(kFloat32), h, keep, p, 5),
          heads_run(false, q.to(kFloat32), k.to(kFloat32), v.to(kFloat32), h, keep, p, 5), 1e-5,
          1e-5, what + " Float32");
    }
  }
  // The fully masked row is uniform, as the original's -1e9 fill gives.
  const HeadsRun r = heads_run(true, q, k, v, h, full, 0.0, 5);
  expect_close(r.p_attn.select(0, 2).select(1, 3),
               full_like(r.p_attn.select(0, 2).select(1, 3), 1.0 / Tk), 1e-12, 1e-12,
               "uniform row");
  // A NaN score makes its row NaN and leaves the others.
  Tensor qn = q.clone();
  qn.select(0, 0).select(0, 1).select(0, 0).fill_(std::nan(""));
  const HeadAttention nan_out = head_attention(qn, k, v, h);
  BOOST_TEST(std::isnan(
      nan_out.p_attn.select(0, 0).select(0, 0).select(0, 1).select(0, 0).item<double>()));
  BOOST_TEST(!std::isnan(
      nan_out.p_attn.select(0, 0).select(0, 0).select(0, 0).select(0, 0).item<double>()));
}

BOOST_AUTO_TEST_CASE(gradcheck_head_attention) {
  manual_seed(22);
  const Tensor keep = from_vector(std::vector<double>{1, 1, 1, 0, 1, 1, 1, 1}, {2, 1, 4}, kBool);
  // k read through a permuted view (not contiguous), v broadcast-free, two heads of 3.
  const Tensor q = leaf({2, 3, 6}), kt = leaf({6, 4, 2}), v = leaf({2, 4, 6});
  check_gradient(
      [&](const std::vector<Tensor>& in) {
        return head_attention(in[0], in[1].permute({2, 1, 0}), in[2], 2, keep).values;
      },
      {q, kt, v}, "head_attention");
  check_gradient(
      [&](const std::vector<Tensor>& in) {
        manual_seed(3);  // the same dropout mask at every evaluation
        return head_attention(in[0], in[1].permute({2, 1, 0}), in[2], 3, Tensor(), 0.3).values;
      },
      {q, kt, v}, "head_attention with dropout");
  // Empty: no batch rows, no keys.
  const HeadAttention none = head_attention(leaf({0, 3, 6}), leaf({0, 4, 6}), leaf({0, 4, 6}), 2);
  BOOST_TEST((none.values.shape() == Shape{0, 3, 6}));
  BOOST_TEST((none.p_attn.shape() == Shape{0, 2, 3, 4}));
  const Tensor q1 = leaf({1, 3, 6});
  const HeadAttention no_keys = head_attention(q1, leaf({1, 0, 6}), leaf({1, 0, 6}), 2);
  expect_close(no_keys.values, zeros({1, 3, 6}, kFloat64), 0, 0, "no keys");
  no_keys.values.sum().backward();
  expect_close(q1.grad(), zeros({1, 3, 6}, kFloat64), 0, 0, "no keys dq");
}

BOOST_AUTO_TEST_CASE(head_attention_errors) {
  const Tensor x = randn({2, 3, 6}), y = randn({2, 4, 6});
  expect_error([&] { head_attention(x, y, y, 4); }, {"head_attention", "6", "4 heads"});
  expect_error([&] { head_attention(x, y, y, 0); }, {"head_attention", "0 heads"});
  expect_error([&] { head_attention(x, y, y.narrow(1, 0, 3), 2); },
               {"head_attention", "[2, 3, 6]", "[2, 4, 6]"});
  expect_error([&] { head_attention(x, y.narrow(0, 0, 1), y, 2); },
               {"head_attention", "[1, 4, 6]"});
  expect_error([&] { head_attention(x.view({6, 6}), y, y, 2); }, {"head_attention", "[6, 6]"});
  expect_error([&] { head_attention(x, y.to(kFloat64), y, 2); }, {"head_attention", "Float64"});
  expect_error(
      [&] {
        head_attention(x, y, y, 2, ones({2, 3, 5}, kBool));
      },
      {"head_attention", "keep", "[2, 3, 5]", "[2, 3, 4]"});
  expect_error([&] { head_attention(x, y, y, 2, {}, 1.5); },
               {"head_attention", "dropout_p", "1.5"});
  expect_error([&] { head_attention(randint(0, 3, {2, 3, 6}), y, y, 2); }, {"head_attention"});
}

BOOST_AUTO_TEST_CASE(gradcheck_tiny_encoder_decoder) {
  manual_seed(7);
  auto model = nn::make_model(7, 7, 1, 8, 12, 2, 0.0);
  model->to(kFloat64);
  model->eval();
  const Tensor src = padded_tokens(2, 5, 7), tgt = padded_tokens(2, 4, 7);
  const Tensor sm = src.ne(0.0).unsqueeze(-2), tm = nn::Batch::make_std_mask(tgt, 0);
  const auto log_probs = [&](const std::vector<Tensor>&) {
    return model->generator->forward(model->forward(src, tgt, sm, tm));
  };
  const auto& enc = model->encoder->layer(0);
  const auto& dec = model->decoder->layer(0);
  check_gradient(log_probs,
                 {enc.self_attn->linears->at<nn::Linear>(0)->weight, enc.feed_forward->w_2->bias,
                  dec.src_attn->linears->at<nn::Linear>(1)->weight,
                  dec.sublayer->at<nn::SublayerConnection>(2)->norm->weight,
                  model->encoder->norm->bias, model->generator->proj->weight},
                 "EncoderDecoder wrt parameters");
  const auto lut = [](const std::shared_ptr<nn::Sequential>& s) {
    return std::static_pointer_cast<nn::Embeddings>((*s)[0])->lut->weight;
  };
  check_gradient(log_probs, {lut(model->src_embed), lut(model->tgt_embed)},
                 "EncoderDecoder wrt embeddings");
  // w.r.t. continuous inputs: the encoder on x, the decoder on y and memory (a transposed view)
  const Tensor x = leaf({2, 5, 8}), y = leaf({2, 4, 8}), mem = leaf({8, 5, 2});
  check_gradient([&](const std::vector<Tensor>& in) { return (*model->encoder)(in[0], sm); }, {x},
                 "Encoder wrt x");
  check_gradient(
      [&](const std::vector<Tensor>& in) {
        return (*model->decoder)(in[0], in[1].permute({2, 1, 0}), sm, tm);
      },
      {y, mem}, "Decoder wrt x, memory");
}

BOOST_AUTO_TEST_CASE(matches_the_pytorch_original) {
  const Golden g("transformer.json");
  // The file holds every parameter; the positional tables are recomputed (not in the file).
  const nn::SafetensorsFile file =
      nn::read_safetensors(golden_path("transformer_model.safetensors"));
  auto model = golden_model();
  for (const auto& [name, p] : model->named_parameters())
    BOOST_TEST(file.tensors.count(name) == 1u, name);
  BOOST_TEST(file.tensors.size() == model->named_parameters().size());

  const Tensor src = g["src"], tgt = g["tgt"];
  for (const DType dtype : {kFloat64, kFloat32}) {
    const double tol = dtype == kFloat64 ? 1e-9 : 1e-4;
    model->to(dtype);
    model->zero_grad();
    const nn::Batch batch(src, tgt, 0);
    BOOST_TEST(batch.ntokens == g["ntokens"].item<int64_t>());
    const Tensor log_probs = model->generator->forward(
        model->forward(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask));
    expect_close(log_probs, g["log_probs"], tol, tol, "log_probs");
    expect_close(model->decoder->layer(1).src_attn->attn.narrow(0, 2, 1).squeeze(0),
                 g["attn.decoder.layers.1.src_attn"], tol, tol, "attn");
    nn::LabelSmoothing criterion(11, 0, 0.1);
    const Tensor loss =
        criterion(log_probs.contiguous().view({-1, 11}), batch.tgt_y.contiguous().view({-1})) /
        static_cast<double>(batch.ntokens);
    expect_close(loss, g["loss"], tol, tol, "loss");
    loss.backward();
    for (const auto& [name, p] : model->named_parameters())
      if (g.contains("grad." + name)) expect_close(p.grad(), g["grad." + name], tol, tol, name);
  }
}

// Six steps of the original's training loop on the golden model in Float64: forward, the
// label-smoothed KL loss per token, backward, Adam (betas 0.9/0.98, eps 1e-9, base lr 0.5) and
// LambdaLR on rate(step, 32, 1, warmup 4), over transformer_train.json's three batches in turn.
// Each step's loss and learning rate, and the parameters afterwards, against PyTorch's under
// `prefix` ("" or "dropout.").
void expect_training_steps_match(const Golden& g, const std::string& prefix, bool training) {
  auto model = golden_model();
  model->to(kFloat64);
  model->train(training);
  if (training) manual_seed(static_cast<uint64_t>(g[prefix + "seed"].item<int64_t>()));
  nn::LabelSmoothing criterion(11, 0, 0.1);
  optim::Adam optimizer(model->parameters(), {.lr = 0.5, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  optim::LambdaLR scheduler(optimizer, [](int64_t step) { return optim::rate(step, 32, 1.0, 4); });
  const std::vector<double> losses = g[prefix + "losses"].to_vector<double>();
  const std::vector<double> lrs = g["lrs"].to_vector<double>();
  for (int step = 0; step < 6; ++step) {
    const Tensor data = g[fmt::format("batch{}", step % 3)];
    const nn::Batch batch(data, data, 0);
    const Tensor log_probs = model->generator->forward(
        model->forward(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask));
    const Tensor loss =
        criterion(log_probs.contiguous().view({-1, 11}), batch.tgt_y.contiguous().view({-1})) /
        static_cast<double>(batch.ntokens);
    loss.backward();
    BOOST_TEST(optimizer.lr() == lrs[step], boost::test_tools::tolerance(1e-12));
    optimizer.step();
    optimizer.zero_grad();
    scheduler.step();
    BOOST_TEST(loss.item<double>() == losses[step], boost::test_tools::tolerance(1e-9));
  }
  int compared = 0;
  for (const auto& [name, p] : model->named_parameters())
    if (g.contains(prefix + "param." + name)) {
      expect_close(p, g[prefix + "param." + name], 1e-8, 1e-9, name);
      ++compared;
    }
  BOOST_TEST(compared == 6);
}

BOOST_AUTO_TEST_CASE(training_steps_match_the_pytorch_original) {
  // Dropout off (eval mode): nothing random.
  expect_training_steps_match(Golden("transformer_train.json"), "", /*training=*/false);
}

BOOST_AUTO_TEST_CASE(training_steps_with_dropout_match_the_pytorch_original) {
  // Dropout on: gen_transformer.py puts Ember's masks (the same generator, seed and mask
  // function) into the original's 22 Dropout modules, so the two agree only if Ember drops at
  // the original's places, in its order, with its scaling and gradient.
  expect_training_steps_match(Golden("transformer_train.json"), "dropout.", /*training=*/true);
}

BOOST_AUTO_TEST_CASE(greedy_decode_follows_the_model) {
  auto model = golden_model();
  const Tensor src = padded_tokens(3, 6, 11);
  const Tensor src_mask = src.ne(0.0).unsqueeze(-2);
  const Tensor ys = nn::greedy_decode(*model, src, src_mask, 6, 1);
  BOOST_TEST((ys.shape() == Shape{3, 6}));
  BOOST_TEST((ys.dtype() == kInt64));
  // each token is the argmax of the model fed the tokens before it (teacher forcing)
  const Tensor prefix = ys.narrow(1, 0, 5);
  const Tensor log_probs =
      model->generator->forward(model->forward(src, prefix, src_mask, nn::subsequent_mask(5)));
  BOOST_TEST(
      (argmax(log_probs, -1).to_vector<int64_t>() == ys.narrow(1, 1, 5).to_vector<int64_t>()));
  BOOST_TEST((ys.narrow(1, 0, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1}));
  // one row at a time gives the same rows
  const Tensor row = nn::greedy_decode(*model, src.narrow(0, 1, 1), src_mask.narrow(0, 1, 1), 6, 1);
  BOOST_TEST((row.to_vector<int64_t>() == ys.narrow(0, 1, 1).to_vector<int64_t>()));
  BOOST_TEST(!ys.requires_grad());
  expect_error([&] { nn::greedy_decode(*model, src.to(kFloat32), src_mask, 6, 1); },
               {"greedy_decode", "Float32"});
}

BOOST_AUTO_TEST_CASE(greedy_decode_matches_the_pytorch_original) {
  // The original's greedy_decode of the golden model, row by row (gen_transformer.py), in
  // Float64 so that no near-tie of two tokens' log-probabilities can flip; batched rows too.
  const Golden g("transformer.json");
  auto model = golden_model();
  model->to(kFloat64);
  const Tensor src = g["src"];
  const nn::Batch batch(src, Tensor(), 0);
  const std::vector<int64_t> want = g["greedy"].to_vector<int64_t>();
  const int64_t B = src.size(0), S = src.size(1);
  for (int64_t i = 0; i < B; ++i) {
    const Tensor ys =
        nn::greedy_decode(*model, src.narrow(0, i, 1), batch.src_mask.narrow(0, i, 1), S, 1);
    BOOST_TEST((ys.to_vector<int64_t>() ==
                std::vector<int64_t>(want.begin() + i * S, want.begin() + (i + 1) * S)),
               "row " << i);
  }
  BOOST_TEST((nn::greedy_decode(*model, src, batch.src_mask, S, 1).to_vector<int64_t>() == want));
}

BOOST_AUTO_TEST_CASE(copy_task_learns_to_copy) {
  // The copy task at a small size (N=1, d_model=32, h=4, d_ff=64), the original's optimizer and
  // schedule with a shorter warmup; seeded, a few seconds.
  manual_seed(0);
  set_num_threads(1);  // tiny products: one thread is fastest, and steady on a busy machine
  struct Restore {
    ~Restore() { set_num_threads(0); }
  } restore;
  const int64_t V = 11;
  auto model = nn::make_model(V, V, 1, 32, 64, 4);
  nn::LabelSmoothing criterion(V, 0, 0.0);
  copy_task::SimpleLossCompute loss_compute(*model->generator, criterion);
  optim::Adam optimizer(model->parameters(), {.lr = 1.0, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  optim::LambdaLR scheduler(optimizer,
                            [](int64_t step) { return optim::rate(step, 32, 1.0, kWarmup); });
  double first = 0, last = 0;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    model->train();
    for (const nn::Batch& batch : copy_task::data_gen(V, 64, 20)) {
      const Tensor out = model->forward(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask);
      const copy_task::LossOutput loss = loss_compute(out, batch.tgt_y, batch.ntokens);
      loss.loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      scheduler.step();
      if (first == 0) first = loss.loss.item<double>();
      last = loss.loss.item<double>();
    }
  }
  BOOST_TEST_MESSAGE("copy task loss " << first << " -> " << last);
  BOOST_TEST(last < 0.1 * first);
  model->eval();
  const Tensor src = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {1, 10});
  const Tensor ys = nn::greedy_decode(*model, src, ones({1, 1, 10}, kBool), 10, 1);
  BOOST_TEST((ys.to_vector<int64_t>() == src.to_vector<int64_t>()));
  const nn::Batch fresh = copy_task::data_gen(V, 50, 1)[0];
  const Tensor decoded = nn::greedy_decode(*model, fresh.src, fresh.src_mask, 10, 1);
  const Tensor rows_equal = decoded.eq(fresh.src).to(kInt64).sum({1}).eq(10.0);
  const double accuracy = rows_equal.to(kFloat64).mean().item<double>();
  BOOST_TEST_MESSAGE("exact-copy accuracy " << accuracy);
  BOOST_TEST(accuracy >= 0.9);
}

#ifdef EMBER_EXAMPLES_DIR
// Runs `transformer_copy args` with stdout and stderr to files in dir; returns the exit status.
int run_example(const std::string& args, const std::filesystem::path& dir) {
  const std::string cmd = fmt::format("'{}/transformer_copy' {} > '{}' 2> '{}'", EMBER_EXAMPLES_DIR,
                                      args, (dir / "stdout").string(), (dir / "stderr").string());
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

BOOST_AUTO_TEST_CASE(example_trains_saves_and_decodes_a_loaded_model) {
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("ember_transformer_copy_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string out = (dir / "out").string();
  // The status first: Boost.Test may evaluate the message before the condition.
  const int trained =
      run_example(fmt::format("--layers 1 --d-model 16 --d-ff 32 --heads 2 --batch 16 "
                              "--batches 4 --epochs 2 --threads 1 --out '{}'",
                              out),
                  dir);
  BOOST_TEST_REQUIRE(trained == 0, read_text(dir / "stderr"));
  BOOST_TEST(read_text(dir / "stdout").find("ETA") != std::string::npos);
  for (const char* file :
       {"metrics.json", "model.safetensors", "loss.svg", "attn_encoder_self_layer1.svg",
        "attn_decoder_self_layer1.svg", "attn_decoder_src_layer1.svg"})
    BOOST_TEST(std::filesystem::exists(dir / "out" / file), file);
  const nlohmann::json metrics = nlohmann::json::parse(read_text(dir / "out" / "metrics.json"));
  for (const char* key : {"config", "train_loss", "eval_loss", "decoded", "exact_copy_accuracy",
                          "train_seconds", "train_steps", "tokens_per_second", "total_seconds"})
    BOOST_TEST(metrics.contains(key), key);
  BOOST_TEST(metrics["train_loss"].size() == 2u);
  BOOST_TEST(metrics["train_steps"].get<int64_t>() == 8);
  BOOST_TEST(metrics["config"]["d_model"].get<int64_t>() == 16);

  // --load/--decode prints what greedy_decode gives for the same weights in this process.
  const std::string model_path = out + "/model.safetensors";
  const int decoded =
      run_example(fmt::format("--load '{}' --decode \"1 5 2 7 7 3\"", model_path), dir);
  BOOST_TEST_REQUIRE(decoded == 0, read_text(dir / "stderr"));
  auto model = nn::make_model(11, 11, 1, 16, 32, 2);
  nn::load(*model, model_path);
  model->eval();
  const std::vector<int64_t> tokens{1, 5, 2, 7, 7, 3};
  const Tensor ys =
      nn::greedy_decode(*model, from_vector(tokens, {1, 6}), ones({1, 1, 6}, kBool), 6, 1);
  BOOST_TEST(read_text(dir / "stdout") ==
             fmt::format("{}\n", fmt::join(ys.to_vector<int64_t>(), " ")));

  // usage errors: exit 2 with a message naming the problem
  BOOST_TEST(run_example(fmt::format("--load '{}' --decode \"1 11 2\"", model_path), dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("outside the vocabulary") != std::string::npos);
  BOOST_TEST(run_example("--no-such-flag", dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("no-such-flag") != std::string::npos);
  BOOST_TEST(run_example("--d-model 30 --heads 4", dir) == 2);
  BOOST_TEST(read_text(dir / "stderr").find("multiple") != std::string::npos);
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(example_refuses_a_hostile_checkpoint) {
  // --load of a crafted file: a 100,000-deep shape overflowed the stack, a metadata value that
  // is not a number ended in an uncaught std::invalid_argument. Each is now exit status 1 and
  // a short message.
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("ember_transformer_hostile_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "bad.safetensors").string();
  const auto expect_refused = [&](const std::string& what, const std::string& part) {
    const int status = run_example(fmt::format("--load '{}'", path), dir);
    const std::string err = read_text(dir / "stderr");
    BOOST_TEST(status == 1, what << ": " << err);
    BOOST_TEST(err.find(part) != std::string::npos, what << ": " << err);
    BOOST_TEST(err.size() < 500u, what);
  };
  std::string header = R"({"w":{"dtype":"F32","shape":)" + std::string(100'000, '[') +
                       std::string(100'000, ']') + R"(,"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  { std::ofstream(path, std::ios::binary) << bytes << header; }
  expect_refused("deep shape", "dim 0 of the shape is an array");
  const nn::NamedTensors tensors = {{"w", zeros({4, 4})}};
  nn::write_safetensors(path, tensors, {{"layers", "abc"}});
  expect_refused("layers abc", "metadata layers = 'abc' is not an integer in 1 .. 1");
  nn::write_safetensors(path, tensors, {{"layers", "1"}, {"d_ff", "100000000000"}});
  expect_refused("huge d_ff", "metadata d_ff = '100000000000' is not an integer in 1 .. 4");
  std::filesystem::remove_all(dir);
}
#endif

BOOST_AUTO_TEST_SUITE_END()
