// nn::Module: registration, dotted names, train/eval, zero_grad, to(DType), clone; ModuleList,
// Sequential; nn::init.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <type_traits>

#include "helpers.h"
#include "nn_modules.h"

using namespace ember;
using namespace ember::testing;

namespace {

std::vector<std::string> names(const nn::NamedTensors& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.first);
  return out;
}

// A module that registers without naming its member and forgets to rebind it: clone() must
// refuse it.
struct Forgetful : nn::Cloneable<Forgetful> {
  Forgetful() { w = register_parameter("w", zeros({2})); }
  Tensor w;
};

// A module that names a handle outside itself as its member.
struct Stray : nn::Cloneable<Stray> {
  explicit Stray(Tensor& elsewhere) { register_parameter("w", elsewhere, zeros({2})); }
};

// A class derived from a module that is Cloneable as its base only.
struct Wider : Affine {
  Wider() : Affine(2) { register_parameter("extra", extra, zeros({2})); }
  Tensor extra;
};

// One weight under two names (tied), each name with its member: y = (x Aᵀ) Bᵀ.
struct TiedPair : nn::Cloneable<TiedPair> {
  TiedPair() {
    register_parameter("a", a, randn({3, 3}));
    register_parameter("b", b, a);
  }
  Tensor forward(const Tensor& x) const { return linear(linear(x, a), b); }
  Tensor a, b;
};

// A module that is not Cloneable.
struct Plain : nn::Module {
  Plain() { register_parameter("w", zeros({2})); }
};

// Note [Modules are not copyable]: no library module can be copied or moved except by clone().
template <class... Ms>
constexpr bool none_copyable = (... && (!std::is_copy_constructible_v<Ms> &&
                                        !std::is_move_constructible_v<Ms>));
static_assert(
    none_copyable<nn::ModuleList, nn::Sequential, nn::Linear, nn::Embedding, nn::LayerNorm,
                  nn::Dropout, nn::MultiHeadedAttention, nn::PositionwiseFeedForward,
                  nn::Embeddings, nn::PositionalEncoding, nn::SublayerConnection, nn::EncoderLayer,
                  nn::Encoder, nn::DecoderLayer, nn::Decoder, nn::Generator, nn::EncoderDecoder,
                  nn::NWKernelRegression>);

}  // namespace

BOOST_AUTO_TEST_SUITE(test_nn)

BOOST_AUTO_TEST_CASE(named_parameters_are_dotted_in_registration_order) {
  Block block(3);
  const std::vector<std::string> expected = {"scale",      "first.w",    "first.b",   "layers.0.w",
                                             "layers.0.b", "layers.1.w", "layers.1.b"};
  BOOST_TEST(names(block.named_parameters()) == expected, boost::test_tools::per_element());
  BOOST_TEST(names(block.named_parameters(false)) == std::vector<std::string>{"scale"},
             boost::test_tools::per_element());
  BOOST_TEST(block.parameters().size() == 7u);
  BOOST_TEST(block.parameters()[1].same(block.first->w));
  const std::vector<std::string> buffers = {"mask",        "empty_table",    "step",
                                            "first.count", "layers.0.count", "layers.1.count"};
  BOOST_TEST(names(block.named_buffers()) == buffers, boost::test_tools::per_element());
  // state_dict: each module's parameters, then its buffers, then its children
  const std::vector<std::string> state = {
      "scale",      "mask",        "empty_table",   "step",       "first.w",
      "first.b",    "first.count", "layers.0.w",    "layers.0.b", "layers.0.count",
      "layers.1.w", "layers.1.b",  "layers.1.count"};
  BOOST_TEST(names(block.state_dict()) == state, boost::test_tools::per_element());
  for (const Tensor& p : block.parameters()) BOOST_TEST(p.requires_grad());
  for (const auto& [name, b] : block.named_buffers()) BOOST_TEST(!b.requires_grad(), name);
  std::vector<std::string> modules;
  for (const auto& [name, m] : block.named_modules()) modules.push_back(name);
  BOOST_TEST(modules == (std::vector<std::string>{"", "first", "layers", "layers.0", "layers.1"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(shared_parameter_listed_once) {
  auto shared = std::make_shared<Affine>(2);
  Open m;
  m.register_module("a", shared);
  m.register_module("b", shared);
  BOOST_TEST(names(m.named_parameters()) == (std::vector<std::string>{"a.w", "a.b"}),
             boost::test_tools::per_element());
  BOOST_TEST(m.state_dict().size() == 6u);  // state_dict keeps every name, as PyTorch
}

BOOST_AUTO_TEST_CASE(registration_errors) {
  Open m;
  m.register_parameter("w", zeros({2}));
  expect_error([&] { m.register_parameter("w", zeros({2})); }, {"register_parameter", "'w'"});
  expect_error([&] { m.register_buffer("w", zeros({2})); }, {"register_buffer", "'w'"});
  expect_error([&] { m.register_parameter("a.b", zeros({2})); }, {"register_parameter", "'a.b'"});
  expect_error([&] { m.register_parameter("", zeros({2})); }, {"register_parameter", "empty"});
  expect_error([&] { m.register_parameter("i", zeros({2}, kInt64)); },
               {"register_parameter", "Int64", "[2]"});
  Tensor leaf = ones({2}).requires_grad_();
  expect_error([&] { m.register_parameter("x", leaf * 2); },
               {"register_parameter", "not a leaf", "MulBackward"});
  expect_error([&] { m.register_parameter("u", Tensor()); }, {"register_parameter", "undefined"});
  expect_error([&] { m.register_module("n", std::shared_ptr<Affine>()); },
               {"register_module", "null"});
  nn::ModuleList list;
  expect_error([&] { (void)list[0]; }, {"ModuleList", "index 0", "0 modules"});
  list.push_back(std::make_shared<Affine>(2));
  expect_error([&] { list.at<Block>(0); }, {"ModuleList", "Affine"});
  BOOST_TEST(list.at<Affine>(0)->w.numel() == 2);
}

BOOST_AUTO_TEST_CASE(train_eval_propagate) {
  Block block(3);
  BOOST_TEST(block.is_training());
  block.eval();
  BOOST_TEST(!block.is_training());
  BOOST_TEST(!block.first->is_training());
  for (const auto& m : *block.layers) BOOST_TEST(!m->is_training());
  block.layers->train();
  BOOST_TEST(block.layers->at<Affine>(1)->is_training());
  BOOST_TEST(!block.is_training());
  block.train();
  BOOST_TEST(block.first->is_training());
}

BOOST_AUTO_TEST_CASE(zero_grad_clears_every_parameter) {
  manual_seed(3);
  Block block(3);
  block.forward(randn({2, 3})).sum().backward();
  BOOST_TEST(block.first->w.grad().defined());
  BOOST_TEST(block.layers->at<Affine>(1)->b.grad().defined());
  block.zero_grad();
  for (const Tensor& p : block.parameters()) BOOST_TEST(!p.grad().defined());
}

BOOST_AUTO_TEST_CASE(clone_is_deep_and_independent) {
  manual_seed(4);
  auto block = std::make_shared<Block>(3);
  block->eval();
  auto copy = std::dynamic_pointer_cast<Block>(block->clone());
  BOOST_TEST_REQUIRE(copy != nullptr);
  BOOST_TEST(!copy->is_training());
  // Same names and values, no shared storage.
  const auto a = block->state_dict(), b = copy->state_dict();
  BOOST_TEST_REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    BOOST_TEST(a[i].first == b[i].first);
    BOOST_TEST((a[i].second.to_vector<double>() == b[i].second.to_vector<double>()), a[i].first);
    BOOST_TEST(a[i].second.impl()->storage != b[i].second.impl()->storage, a[i].first);
    BOOST_TEST(a[i].second.requires_grad() == b[i].second.requires_grad());
  }
  // Members point at the copy's registry, children are new objects.
  BOOST_TEST(copy->first != block->first);
  BOOST_TEST(copy->first->w.same(copy->named_parameters()[1].second));
  BOOST_TEST((*copy->layers)[0] != (*block->layers)[0]);
  BOOST_TEST(copy->layers->at<Affine>(0)->w.same(copy->named_parameters()[3].second));
  // Training the copy leaves the original alone.
  const Tensor x = randn({2, 3});
  const std::vector<double> before = block->forward(x).to_vector<double>();
  optim::SGD opt(copy->parameters(), {.lr = 0.5});
  copy->forward(x).sum().backward();
  opt.step();
  BOOST_TEST((block->forward(x).to_vector<double>() == before));
  BOOST_TEST((copy->forward(x).to_vector<double>() != before));
  for (const Tensor& p : block->parameters()) BOOST_TEST(!p.grad().defined());
}

BOOST_AUTO_TEST_CASE(clone_checks_members_and_cloneability) {
  Forgetful f;
  expect_error([&] { f.clone(); }, {"clone", "Forgetful", "'w'", "rebind"});
  Tensor outside;
  Stray stray(outside);
  expect_error([&] { stray.clone(); }, {"clone", "Stray", "'w'", "data member"});
  Wider wider;
  expect_error([&] { wider.clone(); }, {"clone", "Wider", "Affine", "Cloneable"});
  // A user module keeps the public copy constructor C++ gives it; using it throws.
  Affine affine(2);
  expect_error([&] { [[maybe_unused]] const Affine copy = affine; },
               {"Affine", "cannot be copied", "clone()"});
  Plain p;
  expect_error([&] { p.clone(); }, {"clone", "Plain", "Cloneable"});
  Open holder;
  holder.register_module("inner", std::make_shared<Plain>());
  expect_error([&] { holder.clone(); }, {"clone", "Plain"});
}

BOOST_AUTO_TEST_CASE(module_list_clones_n_layers) {
  // The transformer's clones(layer, N): N independent copies named 0..N-1.
  manual_seed(5);
  Affine layer(4);
  nn::ModuleList list;
  for (int i = 0; i < 3; ++i) list.push_back(layer.clone());
  BOOST_TEST(list.size() == 3u);
  BOOST_TEST(names(list.named_parameters()) ==
                 (std::vector<std::string>{"0.w", "0.b", "1.w", "1.b", "2.w", "2.b"}),
             boost::test_tools::per_element());
  {
    NoGradGuard no_grad;
    list.at<Affine>(1)->w.fill_(5.0);
  }
  BOOST_TEST(list.at<Affine>(0)->w.to_vector<double>() == layer.w.to_vector<double>(),
             boost::test_tools::per_element());
  BOOST_TEST(layer.w.to_vector<double>()[0] != 5.0);
  auto list_copy = std::dynamic_pointer_cast<nn::ModuleList>(list.clone());
  BOOST_TEST((*list_copy)[1] != list[1]);
  BOOST_TEST(list_copy->at<Affine>(1)->w.to_vector<double>()[2] == 5.0);
}

BOOST_AUTO_TEST_CASE(sequential_applies_in_order) {
  manual_seed(6);
  auto a = std::make_shared<Affine>(3), b = std::make_shared<Affine>(3);
  nn::Sequential seq(a, b);
  BOOST_TEST(seq.size() == 2u);
  BOOST_TEST(
      names(seq.named_parameters()) == (std::vector<std::string>{"0.w", "0.b", "1.w", "1.b"}),
      boost::test_tools::per_element());
  const Tensor x = randn({2, 3});
  expect_close(seq(x), b->forward(a->forward(x)), 0, 0);
  auto copy = std::dynamic_pointer_cast<nn::Sequential>(seq.clone());
  expect_close(copy->forward(x), seq(x), 0, 0);
  {
    NoGradGuard no_grad;
    std::static_pointer_cast<Affine>((*copy)[0])->b.fill_(100);
  }
  BOOST_TEST(a->b.max().item<double>() < 50);  // the original's first layer is untouched
  BOOST_TEST((-std::static_pointer_cast<Affine>((*copy)[0])->forward(x)).max().item<double>() <
             -50);
  BOOST_TEST((copy->forward(x).to_vector<double>() != seq(x).to_vector<double>()));
}

BOOST_AUTO_TEST_CASE(to_float64_converts_in_place) {
  manual_seed(7);
  Block block(3);
  const Tensor w_handle = block.first->w;
  const std::vector<double> values = w_handle.to_vector<double>();
  optim::Adam opt(block.parameters());
  block.to(kFloat64);
  for (const auto& [name, t] : block.state_dict()) {
    if (name == "mask") {
      BOOST_TEST(t.dtype() == kBool);
    } else if (name.ends_with("count")) {
      BOOST_TEST(t.dtype() == kInt64, name);  // integer buffers keep their dtype
    } else {
      BOOST_TEST(t.dtype() == kFloat64, name);
    }
  }
  // Every handle sees the conversion: members, copies held elsewhere, the optimizer's list.
  BOOST_TEST(w_handle.dtype() == kFloat64);
  BOOST_TEST(opt.params()[1].dtype() == kFloat64);
  BOOST_TEST(w_handle.to_vector<double>() == values, boost::test_tools::per_element());
  BOOST_TEST(w_handle.requires_grad());
  // The converted module trains in Float64 and gradchecks.
  const Tensor x = randn({2, 3}, kFloat64);
  block.forward(x).sum().backward();
  BOOST_TEST(block.first->w.grad().dtype() == kFloat64);
  opt.step();
  check_gradient([&](const std::vector<Tensor>& v) { return block.forward(v[0]); },
                 {x.detach().requires_grad_()}, "Block in Float64");
  expect_error([&] { block.to(kInt64); }, {"to", "Int64"});
}

BOOST_AUTO_TEST_CASE(init_functions) {
  manual_seed(8);
  Tensor t = empty({200, 100}).requires_grad_();  // in place on a parameter: no grad recorded
  nn::init::uniform_(t, -0.5, 2.0);
  BOOST_TEST(t.is_leaf());
  BOOST_TEST(t.max().item<double>() < 2.0);
  BOOST_TEST((-t).max().item<double>() <= 0.5);
  BOOST_TEST(t.mean().item<double>() == 0.75, boost::test_tools::tolerance(0.02));

  nn::init::normal_(t, 1.0, 2.0);
  BOOST_TEST(t.mean().item<double>() == 1.0, boost::test_tools::tolerance(0.05));
  BOOST_TEST(std::sqrt(t.var({0, 1}).item<double>()) == 2.0, boost::test_tools::tolerance(0.02));

  // xavier: U(-a, a), a = sqrt(6 / (fan_in + fan_out)); fans of (out, in, k) include k
  Tensor w = empty({30, 20, 2}, kFloat64);
  nn::init::xavier_uniform_(w);
  const double a = std::sqrt(6.0 / (40 + 60));
  BOOST_TEST(w.abs().max().item<double>() <= a);
  BOOST_TEST(w.abs().max().item<double>() > 0.95 * a);
  BOOST_TEST(w.var({0, 1, 2}).item<double>() == a * a / 3, boost::test_tools::tolerance(0.1));

  const uint64_t version = w.impl()->storage->version();
  nn::init::zeros_(w);
  BOOST_TEST(w.impl()->storage->version() > version);  // in-place writes bump the version
  BOOST_TEST(w.abs().sum().item<double>() == 0.0);
  nn::init::ones_(w);
  BOOST_TEST(w.sum().item<double>() == 1200.0);

  Tensor i = zeros({2, 2}, kInt64);
  expect_error([&] { nn::init::normal_(i, 0, 1); }, {"normal_", "Int64"});
  Tensor v = zeros({4});
  expect_error([&] { nn::init::xavier_uniform_(v); }, {"xavier_uniform_", "[4]"});
  expect_error([&] { nn::init::uniform_(v, 1, 0); }, {"uniform_", "1", "0"});
}

// --- layers

namespace {
// The small MLP of the training tests: two Linear layers and a relu.
struct MLP : nn::Cloneable<MLP> {
  MLP(int64_t in, int64_t hidden, int64_t out) {
    register_module("fc1", fc1, std::make_shared<nn::Linear>(in, hidden));
    register_module("fc2", fc2, std::make_shared<nn::Linear>(hidden, out));
  }
  Tensor forward(const Tensor& x) const { return fc2->forward(relu(fc1->forward(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// y = sin(x) on 64 points of [-3, 3]; returns the final training loss.
double train_sine(MLP& model, optim::Optimizer& opt, int steps) {
  const Tensor x = arange(-3, 3, 6.0 / 64).unsqueeze(1);
  const Tensor y = sin(x);
  double loss_value = 0;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    Tensor loss = mse_loss(model(x), y);
    loss.backward();
    opt.step();
    loss_value = loss.item<double>();
  }
  return loss_value;
}

}  // namespace

BOOST_AUTO_TEST_CASE(linear_init_and_forward) {
  manual_seed(20);
  nn::Linear fc(100, 200);
  BOOST_TEST((fc.weight.shape() == Shape{200, 100}));
  BOOST_TEST((fc.bias.shape() == Shape{200}));
  BOOST_TEST(names(fc.named_parameters()) == (std::vector<std::string>{"weight", "bias"}),
             boost::test_tools::per_element());
  // PyTorch's default: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias
  const double bound = 0.1;
  BOOST_TEST(fc.weight.abs().max().item<double>() <= bound);
  BOOST_TEST(fc.weight.abs().max().item<double>() > 0.99 * bound);
  BOOST_TEST(fc.weight.var({0, 1}).item<double>() == bound * bound / 3,
             boost::test_tools::tolerance(0.05));
  BOOST_TEST(fc.bias.abs().max().item<double>() <= bound);
  BOOST_TEST(fc.bias.var({0}).item<double>() > 0);
  // forward = x @ weight^T + bias, for any leading dims
  const Tensor x = randn({2, 5, 100});
  expect_close(fc(x), matmul(x, fc.weight.transpose(0, 1)) + fc.bias, 1e-5, 1e-5);
  nn::Linear no_bias(3, 2, false);
  BOOST_TEST(!no_bias.bias.defined());
  BOOST_TEST(no_bias.parameters().size() == 1u);
  expect_close(no_bias(ones({1, 3})), no_bias.weight.sum({1}).unsqueeze(0), 1e-6, 1e-6);
  auto copy = std::dynamic_pointer_cast<nn::Linear>(no_bias.clone());
  BOOST_TEST(!copy->bias.defined());
  BOOST_TEST(!copy->weight.same(no_bias.weight));
  expect_error([] { nn::Linear(-1, 3); }, {"Linear", "in_features -1"});
  // No input features, as torch: every output is the bias, which starts at 0.
  nn::Linear none_in(0, 3);
  BOOST_TEST((none_in(ones({2, 0})).to_vector<float>() == std::vector<float>(6, 0.0f)));
  expect_error([&] { fc(randn({2, 7})); }, {"linear"});
}

BOOST_AUTO_TEST_CASE(embedding_layer) {
  manual_seed(21);
  nn::Embedding emb(1000, 16);
  BOOST_TEST((emb.weight.shape() == Shape{1000, 16}));
  BOOST_TEST(emb.weight.mean().item<double>() == 0.0, boost::test_tools::tolerance(0.03));
  BOOST_TEST(emb.weight.var({0, 1}).item<double>() == 1.0, boost::test_tools::tolerance(0.03));
  const Tensor idx = from_vector(std::vector<int64_t>{3, 999, 3, 0}, {2, 2});
  const Tensor out = emb(idx);
  BOOST_TEST((out.shape() == Shape{2, 2, 16}));
  expect_close(out.narrow(0, 0, 1).squeeze(0).narrow(0, 0, 1).squeeze(0),
               emb.weight.narrow(0, 3, 1).squeeze(0), 0, 0);
  expect_close(out.narrow(0, 1, 1).squeeze(0).narrow(0, 1, 1).squeeze(0),
               emb.weight.narrow(0, 0, 1).squeeze(0), 0, 0);
  expect_error([] { nn::Embedding(0, 3); }, {"Embedding", "num_embeddings 0"});
}

BOOST_AUTO_TEST_CASE(layer_norm_layer) {
  manual_seed(22);
  nn::LayerNorm norm(6, 1e-6);
  BOOST_TEST(norm.weight.to_vector<double>() == std::vector<double>(6, 1.0),
             boost::test_tools::per_element());
  BOOST_TEST(norm.bias.to_vector<double>() == std::vector<double>(6, 0.0),
             boost::test_tools::per_element());
  {
    NoGradGuard no_grad;
    norm.weight.copy_(randn({6}));
    norm.bias.copy_(randn({6}));
  }
  const Tensor x = randn({2, 3, 6}) * 3 + 1;
  // torch.nn.LayerNorm: (x - mean) / sqrt(biased var + eps) * weight + bias
  const Tensor mean = x.mean({-1}, true), var = x.var({-1}, false, true);
  expect_close(norm(x), (x - mean) / (var + 1e-6).sqrt() * norm.weight + norm.bias, 1e-4, 1e-5);
}

BOOST_AUTO_TEST_CASE(dropout_layer) {
  manual_seed(23);
  nn::Dropout drop(0.5);
  const Tensor x = ones({1000});
  const Tensor y = drop(x);
  const double zeros_seen = y.eq(0.0).to(kFloat64).sum().item<double>();
  BOOST_TEST(zeros_seen == 500.0, boost::test_tools::tolerance(0.15));
  BOOST_TEST(y.max().item<double>() == 2.0);  // survivors scaled by 1/(1-p)
  drop.eval();
  expect_close(drop(x), x, 0, 0);
  expect_error([] { nn::Dropout(1.5); }, {"Dropout", "1.5"});
}

BOOST_AUTO_TEST_CASE(sequential_of_layers_names_and_gradcheck) {
  manual_seed(24);
  nn::Sequential seq(std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::LayerNorm>(4),
                     std::make_shared<nn::Dropout>(0.1), std::make_shared<nn::Linear>(4, 2));
  BOOST_TEST(
      names(seq.named_parameters()) == (std::vector<std::string>{"0.weight", "0.bias", "1.weight",
                                                                 "1.bias", "3.weight", "3.bias"}),
      boost::test_tools::per_element());
  seq.to(kFloat64).eval();
  // Gradients with respect to the input and every parameter, through the modules.
  std::vector<Tensor> inputs = {randn({5, 3}, kFloat64).requires_grad_()};
  for (const Tensor& p : seq.parameters()) inputs.push_back(p);
  check_gradient([&](const std::vector<Tensor>& v) { return seq(v[0]); }, inputs,
                 "Sequential(Linear, LayerNorm, Dropout, Linear)");
  MLP mlp(3, 5, 2);
  mlp.to(kFloat64);
  inputs = {randn({4, 3}, kFloat64).transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()};
  for (const Tensor& p : mlp.parameters()) inputs.push_back(p);
  check_gradient([&](const std::vector<Tensor>& v) { return mlp(v[0]); }, inputs, "MLP");
}

BOOST_AUTO_TEST_CASE(mlp_trains_with_sgd_and_adam) {
  // Fitting sin on [-3, 3] with 1-32-1: the loss starts near 0.5 and must fall below 0.01.
  manual_seed(25);
  MLP model(1, 32, 1);
  auto twin = std::dynamic_pointer_cast<MLP>(model.clone());
  const Tensor x = arange(-3, 3, 6.0 / 64).unsqueeze(1);
  const double initial = mse_loss(model(x), sin(x)).item<double>();
  optim::SGD sgd(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  const double sgd_loss = train_sine(model, sgd, 1500);
  BOOST_TEST_MESSAGE("sine MLP: initial " << initial << ", SGD " << sgd_loss);
  BOOST_TEST(sgd_loss < 0.01);
  optim::Adam adam(twin->parameters(), {.lr = 0.01});
  const double adam_loss = train_sine(*twin, adam, 1000);
  BOOST_TEST_MESSAGE("sine MLP: Adam " << adam_loss);
  BOOST_TEST(adam_loss < 0.01);
  BOOST_TEST(initial > 0.05);
}

BOOST_AUTO_TEST_CASE(readme_example_train_save_load) {
  // The README's "train a model in 20 lines": Module, Linear, Adam, save, load.
  manual_seed(26);
  auto model = std::make_shared<MLP>(2, 16, 1);
  optim::Adam opt(model->parameters(), {.lr = 0.02});
  const Tensor x = randn({128, 2});
  const Tensor y = (x.narrow(1, 0, 1) * x.narrow(1, 1, 1)).tanh();  // a smooth target
  double loss_value = 1;
  for (int epoch = 0; epoch < 400; ++epoch) {
    opt.zero_grad();
    Tensor loss = mse_loss((*model)(x), y);
    loss.backward();
    opt.step();
    loss_value = loss.item<double>();
  }
  BOOST_TEST(loss_value < 0.02);
  const std::string path = (std::filesystem::temp_directory_path() /
                            fmt::format("ember_readme_{}.safetensors", getpid()))
                               .string();
  nn::save(*model, path);
  MLP restored(2, 16, 1);
  nn::load(restored, path);
  std::filesystem::remove(path);
  restored.eval();
  expect_close(restored(x), (*model)(x), 0, 0);
}

BOOST_AUTO_TEST_CASE(embedding_padding_idx_layer_norm_flags_and_activation_modules) {
  manual_seed(4);
  nn::Embedding emb(5, 3, /*padding_idx=*/-1);  // the last row, as torch wraps it
  BOOST_TEST(*emb.padding_idx == 4);
  BOOST_TEST(emb.weight.narrow(0, 4, 1).abs().sum().item<double>() == 0.0);
  emb.forward(from_vector(std::vector<int64_t>{4, 1, 4, 0}, {4})).pow(2).sum().backward();
  const Tensor g = emb.weight.grad();
  BOOST_TEST(g.narrow(0, 4, 1).abs().sum().item<double>() == 0.0);  // no gradient for padding
  BOOST_TEST(g.narrow(0, 1, 1).abs().sum().item<double>() > 0.0);
  expect_error([] { nn::Embedding(5, 3, 5); }, {"Embedding", "padding_idx", "5"});

  nn::LayerNorm no_bias(4, 1e-5, true, false), plain(4, 1e-5, false);
  BOOST_TEST(no_bias.named_parameters().size() == 1);
  BOOST_TEST(no_bias.named_parameters()[0].first == "weight");
  BOOST_TEST(plain.named_parameters().empty());
  const Tensor x = randn({2, 4});
  expect_close(plain.forward(x), layer_norm(x, {4}), 0, 0, "no affine");

  nn::Sequential net(std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::GELU>("tanh"),
                     std::make_shared<nn::SiLU>(), std::make_shared<nn::Tanh>(),
                     std::make_shared<nn::ReLU>());
  const auto fc = std::dynamic_pointer_cast<nn::Linear>(net[0]);
  expect_close(net.forward(x), relu(tanh(silu(gelu(fc->forward(x), "tanh")))), 0, 0, "sequential");
  expect_error([] { nn::GELU("fast"); }, {"GELU", "approximate"});
}

// torch.func.functional_call: the forward computed with the given tensors (and differentiable in
// them), the module's own back afterwards, also after a throw; tied names; errors.
BOOST_AUTO_TEST_CASE(functional_call_swaps_and_restores) {
  manual_seed(3);
  auto net = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(3, 4),
                                              std::make_shared<nn::Tanh>(),
                                              std::make_shared<nn::Linear>(4, 2));
  const Tensor x = randn({5, 3}, kFloat64);
  net->to(kFloat64);
  const nn::NamedTensors own = net->named_parameters();
  nn::NamedTensors given;
  for (const auto& [name, t] : own) given.emplace_back(name, (t.detach() * 0.5).requires_grad_());
  const auto forward = [&] { return net->forward(x); };
  const Tensor y = nn::functional_call(*net, given, forward);
  // the same as the layers by hand with the given tensors
  const Tensor expected =
      linear(tanh(linear(x, given[0].second, given[1].second)), given[2].second, given[3].second);
  expect_close(y.detach(), expected.detach(), 1e-15, 0, "functional_call's forward");
  // differentiable in the given tensors, not the module's
  const std::vector<Tensor> g = autograd::grad({y.sum()}, {given[0].second, given[2].second});
  const std::vector<Tensor> ge =
      autograd::grad({expected.sum()}, {given[0].second, given[2].second});
  for (size_t i = 0; i < 2; ++i) expect_close(g[i], ge[i], 1e-15, 0, "its gradient");
  // the module's own are back, in the registry and in the members
  const nn::NamedTensors after = net->named_parameters();
  for (size_t i = 0; i < own.size(); ++i)
    BOOST_TEST(after[i].second.impl() == own[i].second.impl());
  expect_close(net->forward(x),
               linear(tanh(linear(x, own[0].second, own[1].second)), own[2].second, own[3].second),
               1e-15, 0, "the module's own forward");
  // also when fn throws
  BOOST_CHECK_THROW(nn::functional_call(*net, given, [&]() -> Tensor { throw Error("inside"); }),
                    Error);
  BOOST_TEST(net->named_parameters()[0].second.impl() == own[0].second.impl());
  // only some names: the others stay the module's
  const Tensor half = nn::functional_call(*net, {given[2]}, forward);
  expect_close(half.detach(),
               linear(tanh(linear(x, own[0].second, own[1].second)), given[2].second, own[3].second)
                   .detach(),
               1e-15, 0, "one name replaced");
  // tied weights: one tensor under two names is replaced under both (members too)
  TiedPair tied;
  const Tensor w = tied.a, w2 = randn({3, 3}), xf = randn({2, 3});
  const Tensor yt = nn::functional_call(tied, {{"a", w2}}, [&] {
    BOOST_TEST(tied.b.impl() == w2.impl());
    return tied.forward(xf);
  });
  expect_close(yt, linear(linear(xf, w2), w2), 1e-6, 0, "tied");
  BOOST_TEST((tied.a.impl() == w.impl() && tied.b.impl() == w.impl()));
  expect_error(
      [&] {
        nn::functional_call(tied, {{"a", w2}, {"b", randn({3, 3})}}, forward);
      },
      {"functional_call", "'b'", "tied"});
  expect_error(
      [&] {
        nn::functional_call(*net, {{"2.wieght", x}}, forward);
      },
      {"functional_call", "Sequential", "2.wieght"});
  expect_error(
      [&] {
        nn::functional_call(*net, {{"0.weight", own[2].second}}, forward);
      },
      {"functional_call", "0.weight", "own '2.weight'"});
}

BOOST_AUTO_TEST_SUITE_END()
