// D2L's attention scoring (nn/attention.h): masked_softmax, AdditiveAttention and
// DotProductAttention in one table of cases (tests/op_table.h: gradcheck, gradgradcheck, golden
// values and gradients, edge shapes, anomaly mode and the emulated device), the modules through
// functional_call with their weights as inputs; then d2l's own definitions run by torch
// (tests/golden/d2l_attention.json, written by gen_d2l_attention.py), parameter names, dropout,
// clone and every error.
#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"

using namespace ember;
using namespace ember::testing;

namespace {

// Lengths made from the input's shape, so the rows' edge shapes keep them consistent: (2i + 1) % 5
// for batch row i (1 and 3 for two rows), (3i + j) % 5 for query j of row i (0 included: a row
// masked whole), and i % 2 + 1.5 as floating lengths. An undefined x (the edge case that the op
// refuses it) gets lengths for 2 x 2.
int64_t dim_or(const Tensor& x, int64_t d) { return x.defined() ? x.size(d) : 2; }

Tensor row_lens(const Tensor& x) {
  const int64_t B = dim_or(x, 0);
  std::vector<int64_t> lens;
  for (int64_t i = 0; i < B; ++i) lens.push_back((2 * i + 1) % 5);
  return on_row_device(from_vector(std::move(lens), {B}));
}

Tensor query_lens(const Tensor& x) {
  const int64_t B = dim_or(x, 0), Q = dim_or(x, 1);
  std::vector<int64_t> lens;
  for (int64_t i = 0; i < B; ++i)
    for (int64_t j = 0; j < Q; ++j) lens.push_back((3 * i + j) % 5);
  return on_row_device(from_vector(std::move(lens), {B, Q}));
}

Tensor float_lens(const Tensor& x) {
  const int64_t B = dim_or(x, 0);
  std::vector<double> lens;
  for (int64_t i = 0; i < B; ++i) lens.push_back(static_cast<double>(i % 2) + 1.5);
  return on_row_device(from_vector(std::move(lens), {B}));
}

// AdditiveAttention with the weights v[3..5] (W_q.weight, W_k.weight, w_v.weight) in place of its
// own, on queries v[0], keys v[1] and values v[2]. Its sizes are the weights' (1 for an undefined
// one, which functional_call then refuses).
Tensor additive(const std::vector<Tensor>& v, const Tensor& valid_lens) {
  const auto size = [&](size_t i, int64_t d) { return v[i].defined() ? v[i].size(d) : 1; };
  nn::AdditiveAttention attention(size(4, 1), size(3, 1), size(3, 0), 0.0);
  return nn::functional_call(attention,
                             {{"W_q.weight", v[3]}, {"W_k.weight", v[4]}, {"w_v.weight", v[5]}},
                             [&] { return attention.forward(v[0], v[1], v[2], valid_lens); });
}

Tensor dot_product(const std::vector<Tensor>& v, const Tensor& valid_lens) {
  nn::DotProductAttention attention(0.0);
  return attention.forward(v[0], v[1], v[2], valid_lens);
}

// One row per case; tests/op_table.h says what the fields mean. After adding or changing a row,
// run /usr/bin/python3 tests/golden/gen_op_tables.py. torch writes d2l's mask as masked_fill of
// the positions at or past each length with -1e6, then softmax.
// kEdgeDiffers, AdditiveAttention: the row builds the module from its weights' shapes, and a
// size of 0 is refused there (torch.nn.Linear makes empty weights).
// clang-format off
const OpTable kAttentionOps = {
    {"masked_softmax 1-D valid_lens", "F.softmax(a.masked_fill(torch.arange(a.shape[2]) >= torch.tensor([(2 * i + 1) % 5 for i in range(a.shape[0])], dtype=torch.int64).reshape(-1, 1, 1), -1e6), -1)",
     {{2, 3, 4}}, {}, [](auto& v) { return nn::masked_softmax(v[0], row_lens(v[0])); }},
    {"masked_softmax 2-D valid_lens", "F.softmax(a.masked_fill(torch.arange(a.shape[2]) >= torch.tensor([[(3 * i + j) % 5 for j in range(a.shape[1])] for i in range(a.shape[0])], dtype=torch.int64).reshape(a.shape[0], a.shape[1], 1), -1e6), -1)",
     {{2, 3, 4}}, {}, [](auto& v) { return nn::masked_softmax(v[0], query_lens(v[0])); }},
    {"masked_softmax floating valid_lens", "F.softmax(a.masked_fill(torch.arange(a.shape[2]) >= torch.tensor([i % 2 + 1.5 for i in range(a.shape[0])], dtype=torch.float64).reshape(-1, 1, 1), -1e6), -1)",
     {{2, 2, 5}}, {}, [](auto& v) { return nn::masked_softmax(v[0], float_lens(v[0])); }},
    {"masked_softmax no valid_lens", "F.softmax(a, -1)", {{2, 3, 4}}, {},
     [](auto& v) { return nn::masked_softmax(v[0], {}); }},
    {"masked_softmax no valid_lens 4-D", "F.softmax(a, -1)", {{2, 1, 2, 3}}, {},
     [](auto& v) { return nn::masked_softmax(v[0], {}); }},
    {"DotProductAttention 1-D valid_lens", "torch.bmm(F.softmax((torch.bmm(a, b.transpose(1, 2)) / a.shape[2] ** 0.5).masked_fill(torch.arange(b.shape[1]) >= torch.tensor([(2 * i + 1) % 5 for i in range(a.shape[0])], dtype=torch.int64).reshape(-1, 1, 1), -1e6), -1), c)",
     {{2, 2, 3}, {2, 4, 3}, {2, 4, 2}}, {}, [](auto& v) { return dot_product(v, row_lens(v[0])); }},
    {"DotProductAttention 2-D valid_lens", "torch.bmm(F.softmax((torch.bmm(a, b.transpose(1, 2)) / a.shape[2] ** 0.5).masked_fill(torch.arange(b.shape[1]) >= torch.tensor([[(3 * i + j) % 5 for j in range(a.shape[1])] for i in range(a.shape[0])], dtype=torch.int64).reshape(a.shape[0], a.shape[1], 1), -1e6), -1), c)",
     {{2, 3, 2}, {2, 4, 2}, {2, 4, 3}}, {}, [](auto& v) { return dot_product(v, query_lens(v[0])); }},
    {"DotProductAttention no valid_lens", "torch.bmm(F.softmax(torch.bmm(a, b.transpose(1, 2)) / a.shape[2] ** 0.5, -1), c)",
     {{2, 2, 3}, {2, 4, 3}, {2, 4, 2}}, {}, [](auto& v) { return dot_product(v, {}); }},
    {"AdditiveAttention functional_call 1-D valid_lens", "torch.bmm(F.softmax((torch.tanh((a @ d.T).unsqueeze(2) + (b @ e.T).unsqueeze(1)) @ f.T).squeeze(-1).masked_fill(torch.arange(b.shape[1]) >= torch.tensor([(2 * i + 1) % 5 for i in range(a.shape[0])], dtype=torch.int64).reshape(-1, 1, 1), -1e6), -1), c)",
     {{2, 2, 3}, {2, 4, 2}, {2, 4, 2}, {5, 3}, {5, 2}, {1, 5}}, {},
     [](auto& v) { return additive(v, row_lens(v[0])); }, kEdgeDiffers},
    {"AdditiveAttention functional_call 2-D valid_lens", "torch.bmm(F.softmax((torch.tanh((a @ d.T).unsqueeze(2) + (b @ e.T).unsqueeze(1)) @ f.T).squeeze(-1).masked_fill(torch.arange(b.shape[1]) >= torch.tensor([[(3 * i + j) % 5 for j in range(a.shape[1])] for i in range(a.shape[0])], dtype=torch.int64).reshape(a.shape[0], a.shape[1], 1), -1e6), -1), c)",
     {{2, 3, 2}, {2, 4, 3}, {2, 4, 2}, {3, 2}, {3, 3}, {1, 3}}, {},
     [](auto& v) { return additive(v, query_lens(v[0])); }, kEdgeDiffers},
};
// clang-format on

// A Float64 copy of a golden tensor that requires grad.
Tensor leaf_of(const Tensor& t) { return t.detach().clone().requires_grad_(); }

// Copies golden weights into a module's parameters, by name.
void load_weights(nn::Module& module, const Golden& g, const std::string& prefix) {
  NoGradGuard no_grad;
  for (auto& [name, p] : module.named_parameters()) p.copy_(g[prefix + "." + name]);
}

// A d2l module (gen_d2l_attention.py) against the golden values: output, attention_weights and
// the gradients of queries, keys, values and every weight.
template <class M>
void expect_d2l_case(M& attention, const Golden& g, const std::string& prefix) {
  attention.to(kFloat64);
  attention.eval();
  load_weights(attention, g, prefix);
  Tensor q = leaf_of(g[prefix + ".queries"]), k = leaf_of(g[prefix + ".keys"]),
         v = leaf_of(g[prefix + ".values"]);
  const Tensor lens = g.contains(prefix + ".lens") ? g[prefix + ".lens"] : Tensor();
  const Tensor out = attention.forward(q, k, v, lens);
  expect_close(out, g[prefix + ".out"], 1e-10, 1e-12, prefix + " out");
  expect_close(attention.attention_weights, g[prefix + ".weights"], 1e-10, 1e-12,
               prefix + " attention_weights");
  out.backward(g[prefix + ".gy"]);
  expect_close(q.grad(), g[prefix + ".g_queries"], 1e-9, 1e-12, prefix + " grad queries");
  expect_close(k.grad(), g[prefix + ".g_keys"], 1e-9, 1e-12, prefix + " grad keys");
  expect_close(v.grad(), g[prefix + ".g_values"], 1e-9, 1e-12, prefix + " grad values");
  for (const auto& [name, p] : attention.named_parameters())
    expect_close(p.grad(), g[prefix + ".grad." + name], 1e-9, 1e-12, prefix + " grad " + name);
  // Float32 agrees with the Float64 reference
  attention.to(kFloat32);
  const Tensor out32 = attention.forward(q.detach().to(kFloat32), k.detach().to(kFloat32),
                                         v.detach().to(kFloat32), lens);
  expect_close(out32.to(kFloat64), g[prefix + ".out"], 1e-4, 1e-4, prefix + " out (Float32)");
}

std::string joined_names(const nn::Module& m) {
  std::string names;
  for (const auto& [name, p] : m.named_parameters()) names += (names.empty() ? "" : " ") + name;
  return names;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_attention)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kAttentionOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kAttentionOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kAttentionOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) { check_create_graph_gradients(kAttentionOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kAttentionOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kAttentionOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kAttentionOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kAttentionOps); }
BOOST_AUTO_TEST_CASE(table_on_device) { check_on_device(kAttentionOps); }

BOOST_AUTO_TEST_CASE(masked_softmax_matches_d2l) {
  // d2l's examples: lengths per batch row [2, 3], per query [[1, 3], [2, 4]], floating, a
  // length of 0 (the row weighs its keys evenly), and none; values and gradients.
  const Golden g("d2l_attention.json");
  for (const std::string name : {"1d", "2d", "float", "zero", "none"}) {
    Tensor x = leaf_of(g["ms.X"]);
    const std::string p = "ms." + name;
    const Tensor lens = g.contains(p + ".lens") ? g[p + ".lens"] : Tensor();
    const Tensor out = nn::masked_softmax(x, lens);
    expect_close(out, g[p + ".out"], 1e-12, 1e-14, p + " out");
    out.backward(g[p + ".gy"]);
    expect_close(x.grad(), g[p + ".gx"], 1e-10, 1e-14, p + " grad");
  }
  // Int64 lengths as Float32 ones give the same mask; X is not changed (d2l's writes into it)
  const Tensor X = g["ms.X"].to(kFloat32);
  const Tensor before = X.clone();
  const Tensor lens = from_vector(std::vector<int64_t>{2, 3}, {2});
  expect_close(nn::masked_softmax(X, lens), nn::masked_softmax(X, lens.to(kFloat32)), 0, 0,
               "Int64 and Float32 lengths");
  expect_close(X, before, 0, 0, "X unchanged");
}

BOOST_AUTO_TEST_CASE(additive_attention_matches_d2l) {
  const Golden g("d2l_attention.json");
  nn::AdditiveAttention attention(2, 20, 8, 0.1);
  expect_d2l_case(attention, g, "add");
  BOOST_TEST((attention.attention_weights.shape() == Shape{2, 1, 10}));
  nn::AdditiveAttention per_query(3, 5, 4, 0.0);
  expect_d2l_case(per_query, g, "add2d");
  nn::AdditiveAttention unmasked(3, 5, 4, 0.0);
  expect_d2l_case(unmasked, g, "addnone");
}

BOOST_AUTO_TEST_CASE(dot_product_attention_matches_d2l) {
  const Golden g("d2l_attention.json");
  nn::DotProductAttention attention(0.5);
  expect_d2l_case(attention, g, "dot");
  nn::DotProductAttention per_query(0.0);
  expect_d2l_case(per_query, g, "dot2d");  // floating lengths per query, one of them 0
}

BOOST_AUTO_TEST_CASE(parameters_as_d2l) {
  // d2l's registration order and nn.Linear(bias=False) shapes; DotProductAttention has none.
  const Golden g("d2l_attention.json");
  nn::AdditiveAttention attention(2, 20, 8, 0.1);
  BOOST_TEST(joined_names(attention) == g.text("add.names"));
  BOOST_TEST((attention.W_k->weight.shape() == Shape{8, 2}));
  BOOST_TEST((attention.W_q->weight.shape() == Shape{8, 20}));
  BOOST_TEST((attention.w_v->weight.shape() == Shape{1, 8}));
  BOOST_TEST(!attention.W_k->bias.defined());
  BOOST_TEST(!attention.W_q->bias.defined());
  BOOST_TEST(!attention.w_v->bias.defined());
  BOOST_TEST(attention.state_dict().size() == 3u);
  BOOST_TEST(!attention.attention_weights.defined());
  nn::DotProductAttention dot(0.0);
  BOOST_TEST(dot.parameters().empty());
}

BOOST_AUTO_TEST_CASE(dropout_acts_on_weights_in_training) {
  // As d2l: dropout scales the weights applied to the values in training (the kept ones by
  // 1 / (1 - p)), and attention_weights keeps them undropped; eval() is deterministic.
  manual_seed(3);
  nn::AdditiveAttention attention(3, 4, 6, 0.5);
  const Tensor q = randn({2, 5, 4}), k = randn({2, 7, 3});
  const Tensor v = eye(7).unsqueeze(0).expand({2, 7, 7});  // the output is the weights used
  const Tensor lens = from_vector(std::vector<int64_t>{3, 7}, {2});
  attention.eval();
  const Tensor clean = attention.forward(q, k, v, lens);
  expect_close(clean, attention.attention_weights, 1e-6, 1e-7, "eval: the weights themselves");
  attention.train();
  const Tensor dropped = attention.forward(q, k, v, lens);
  expect_close(attention.attention_weights, clean, 1e-6, 1e-7, "attention_weights undropped");
  const std::vector<double> d = dropped.to_vector<double>(), c = clean.to_vector<double>();
  int zeros = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] == 0.0 && c[i] != 0.0) ++zeros;
    BOOST_TEST((d[i] == 0.0 || std::abs(d[i] - 2 * c[i]) <= 1e-6));
  }
  BOOST_TEST(zeros > 0);
}

BOOST_AUTO_TEST_CASE(clone_owns_its_weights) {
  manual_seed(4);
  nn::AdditiveAttention attention(3, 4, 6, 0.0);
  const Tensor q = randn({1, 2, 4}), k = randn({1, 3, 3}), v = randn({1, 3, 2});
  const Tensor out = attention.forward(q, k, v);
  auto copy = std::static_pointer_cast<nn::AdditiveAttention>(attention.clone());
  // the copy's attention_weights are its own data: writing them leaves the original's
  BOOST_TEST_REQUIRE(copy->attention_weights.defined());
  copy->attention_weights.fill_(0.0);
  BOOST_TEST(attention.attention_weights.abs().sum().item<double>() > 0.0);
  expect_close(copy->forward(q, k, v), out, 0, 0, "the copy computes the same");
  {
    NoGradGuard no_grad;
    copy->W_q->weight.fill_(0.0);
  }
  BOOST_TEST(attention.W_q->weight.abs().sum().item<double>() > 0.0);
  // With W_q zero the scores no longer depend on the query: every query weighs the keys alike
  copy->forward(q, k, v);
  expect_close(copy->attention_weights.select(1, 0), copy->attention_weights.select(1, 1), 1e-6,
               1e-7, "queries ignored");
}

BOOST_AUTO_TEST_CASE(attention_differentiates_twice) {
  // The modules' own parameters (not functional_call's) get second derivatives too.
  manual_seed(5);
  nn::AdditiveAttention attention(2, 3, 4, 0.0);
  attention.to(kFloat64);
  const Tensor lens = from_vector(std::vector<int64_t>{2, 3}, {2});
  const Tensor k = randn({2, 3, 2}, kFloat64), v = randn({2, 3, 2}, kFloat64);
  const auto f = [&](const std::vector<Tensor>& x) { return attention.forward(x[0], k, v, lens); };
  const std::vector<Tensor> inputs{leaf({2, 2, 3})};
  check_gradient(f, inputs, "AdditiveAttention gradcheck");
  const GradcheckResult r = gradgradcheck(f, inputs);
  BOOST_TEST(r.ok, "AdditiveAttention gradgradcheck: " << r.message);
  // Second derivative in the weight W_q: d/dW (sum of dL/dq) by create_graph
  Tensor q = leaf({2, 2, 3});
  const Tensor loss = attention.forward(q, k, v, lens).pow(2).sum();
  const auto grads = autograd::grad({loss}, {q}, {}, std::nullopt, true);
  const auto second = autograd::grad({grads[0].sum()}, {attention.W_q->weight});
  BOOST_TEST(second[0].abs().sum().item<double>() > 0.0);
}

BOOST_AUTO_TEST_CASE(attention_errors) {
  const Tensor X = randn({2, 3, 4});
  // masked_softmax: valid_lens of the wrong shape or dtype, X not 3-D
  expect_error(
      [&] {
        nn::masked_softmax(X, from_vector(std::vector<int64_t>{1, 2, 3}, {3}));
      },
      {"masked_softmax", "1-D valid_lens [3]", "[2, 3, 4]"});
  expect_error(
      [&] {
        nn::masked_softmax(X, zeros({2, 2}, kInt64));
      },
      {"masked_softmax", "valid_lens [2, 2]", "(batch, queries)", "[2, 3, 4]"});
  expect_error(
      [&] {
        nn::masked_softmax(X, zeros({2, 3, 1}, kInt64));
      },
      {"masked_softmax", "valid_lens [2, 3, 1]"});
  expect_error([&] { nn::masked_softmax(X, zeros({2}, kBool)); },
               {"masked_softmax", "Int64 or floating", "Bool"});
  expect_error(
      [&] {
        nn::masked_softmax(randn({2, 4}), zeros({2}, kInt64));
      },
      {"masked_softmax", "(batch, queries, keys)", "[2, 4]"});
  expect_error([&] { nn::masked_softmax(Tensor(), {}); }, {"masked_softmax", "undefined"});
  // AdditiveAttention: sizes, feature sizes, batch and step mismatches, ranks
  expect_error([] { nn::AdditiveAttention(0, 3, 4, 0.0); },
               {"AdditiveAttention", "key_size 0", "must be positive"});
  expect_error([] { nn::AdditiveAttention(2, 3, 4, 1.5); }, {"Dropout", "1.5"});
  nn::AdditiveAttention additive(2, 3, 4, 0.0);
  const Tensor q = randn({2, 1, 3}), k = randn({2, 5, 2}), v = randn({2, 5, 6});
  expect_error(
      [&] {
        additive.forward(randn({2, 1, 4}), k, v);
      },
      {"AdditiveAttention", "queries [2, 1, 4]", "keys [2, 5, 2]", "query_size 3", "key_size 2"});
  expect_error(
      [&] {
        additive.forward(q, randn({2, 5, 3}), v);
      },
      {"AdditiveAttention", "keys [2, 5, 3]", "key_size 2"});
  expect_error(
      [&] {
        additive.forward(q, k, randn({2, 4, 6}));
      },
      {"AdditiveAttention", "keys [2, 5, 2]", "values [2, 4, 6]", "steps"});
  expect_error(
      [&] {
        additive.forward(randn({3, 1, 3}), k, v);
      },
      {"AdditiveAttention", "queries [3, 1, 3]", "same batch size"});
  expect_error(
      [&] {
        additive.forward(q, k, randn({5, 6}));
      },
      {"AdditiveAttention", "values [5, 6]", "3-D"});
  expect_error([&] { additive.forward(q, k, v, from_vector(std::vector<int64_t>{1}, {1})); },
               {"masked_softmax", "1-D valid_lens [1]", "[2, 1, 5]"});
  expect_error([&] { additive.forward(q, Tensor(), v); },
               {"AdditiveAttention", "keys is undefined"});
  // DotProductAttention: queries and keys of different d
  nn::DotProductAttention dot(0.0);
  expect_error(
      [&] {
        dot.forward(randn({2, 1, 3}), k, v);
      },
      {"DotProductAttention", "queries [2, 1, 3]", "keys [2, 5, 2]", "feature size"});
  expect_error(
      [&] {
        dot.forward(randn({2, 1, 2}), k, randn({2, 4, 6}));
      },
      {"DotProductAttention", "values [2, 4, 6]"});
  expect_error(
      [&] {
        dot.forward(randn({2, 1, 2}), k, v, zeros({2, 5}, kInt64));
      },
      {"masked_softmax", "valid_lens [2, 5]", "[2, 1, 5]"});
}

BOOST_AUTO_TEST_SUITE_END()
