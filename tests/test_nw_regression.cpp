// D2L attention pooling: the pieces of examples/nw_regression.cpp as unit tests (leave-one-out
// keys and values, nonparametric pooling against a direct evaluation of the Nadaraya-Watson
// formula, NWKernelRegression's gradient, training and PyTorch golden values), then a smoke test
// that runs the built program and checks every file it writes.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "helpers.h"
#include "xml_check.h"

using namespace ember;
using ember::testing::check_gradient;
using ember::testing::expect_close;
using ember::testing::expect_error;
using ember::testing::Golden;
using ember::testing::leaf;
using ember::testing::read_text;

namespace {

// D2L's data: sorted x_train in [0, 5), y = 2 sin(x) + x^0.8 + N(0, 0.5) noise, x_test on a 0.1
// grid and its noiseless truth.
struct Data {
  Tensor x_train, y_train, x_test, y_truth;
};

Tensor f(const Tensor& x) { return 2 * sin(x) + x.pow(0.8); }

Data make_data(int64_t n_train, DType dtype = kFloat32) {
  Data d;
  d.x_train = sort(rand({n_train}, dtype) * 5).values;
  d.y_train = f(d.x_train) + normal(0.0, 0.5, {n_train}, dtype);
  d.x_test = arange(0, 5, 0.1, dtype);
  d.y_truth = f(d.x_test);
  return d;
}

// Row i of `tile` without its element i, as the example builds keys and values.
Tensor leave_one_out(const Tensor& v) {
  const int64_t n = v.numel();
  const Tensor mask = (1 - eye(n)).to(kBool);
  return v.repeat({n, 1}).masked_select(mask).reshape({n, -1});
}

// Nonparametric attention pooling as the example writes it.
Tensor nonparametric(const Data& d) {
  const int64_t n_train = d.x_train.numel();
  const Tensor X_repeat = d.x_test.repeat_interleave(n_train).reshape({-1, n_train});
  return matmul(softmax(-(X_repeat - d.x_train).pow(2) / 2, 1), d.y_train);
}

// D2L's training loop; the summed loss before each step.
std::vector<double> train(nn::NWKernelRegression& net, const Data& d, int epochs, double lr) {
  const Tensor keys = leave_one_out(d.x_train), values = leave_one_out(d.y_train);
  optim::SGD trainer(net.parameters(), {.lr = lr});
  std::vector<double> losses;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    trainer.zero_grad();
    const Tensor l = mse_loss(net(d.x_train, keys, values), d.y_train, Reduction::None);
    l.sum().backward();
    trainer.step();
    losses.push_back(l.sum().item<double>());
  }
  return losses;
}

double mse(const Tensor& a, const Tensor& b) { return (a - b).pow(2).mean().item<double>(); }

}  // namespace

BOOST_AUTO_TEST_SUITE(test_nw_regression)

BOOST_AUTO_TEST_CASE(leave_one_out_keys_and_values) {
  manual_seed(3);
  const Data d = make_data(50);
  const Tensor keys = leave_one_out(d.x_train), values = leave_one_out(d.y_train);
  BOOST_TEST((keys.shape() == Shape{50, 49}));
  BOOST_TEST((values.shape() == Shape{50, 49}));
  const std::vector<float> x = d.x_train.to_vector<float>(), y = d.y_train.to_vector<float>();
  const std::vector<float> k = keys.to_vector<float>(), v = values.to_vector<float>();
  for (size_t i = 0; i < 50; ++i) {
    // Row i is x_train (y_train) in order with element i removed.
    std::vector<float> x_rest = x, y_rest = y;
    x_rest.erase(x_rest.begin() + i);
    y_rest.erase(y_rest.begin() + i);
    BOOST_TEST((std::vector<float>(k.begin() + 49 * i, k.begin() + 49 * (i + 1)) == x_rest), i);
    BOOST_TEST((std::vector<float>(v.begin() + 49 * i, v.begin() + 49 * (i + 1)) == y_rest), i);
    BOOST_TEST(
        (std::find(k.begin() + 49 * i, k.begin() + 49 * (i + 1), x[i]) == k.begin() + 49 * (i + 1)),
        "row " << i << " holds x_" << i);
  }
}

BOOST_AUTO_TEST_CASE(nonparametric_pooling_is_the_nadaraya_watson_formula) {
  manual_seed(4);
  const Data d = make_data(50, kFloat64);
  const std::vector<double> x = d.x_train.to_vector<double>(), y = d.y_train.to_vector<double>();
  std::vector<double> expected;
  for (const double q : d.x_test.to_vector<double>()) {
    // f(q) = sum_i K(q - x_i) y_i / sum_j K(q - x_j), K(u) = exp(-u^2 / 2)
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double k = std::exp(-(q - x[i]) * (q - x[i]) / 2);
      num += k * y[i];
      den += k;
    }
    expected.push_back(num / den);
  }
  expect_close(nonparametric(d), from_vector(expected, {50}, kFloat64), 1e-12, 1e-12);
  // Float32 agrees with Float64.
  const Data d32{d.x_train.to(kFloat32), d.y_train.to(kFloat32), d.x_test.to(kFloat32), {}};
  expect_close(nonparametric(d32), from_vector(expected, {50}, kFloat64).to(kFloat32), 1e-5, 1e-5);
}

BOOST_AUTO_TEST_CASE(module_has_one_parameter_w) {
  manual_seed(5);
  nn::NWKernelRegression net;
  const auto named = net.named_parameters();
  BOOST_TEST_REQUIRE(named.size() == 1u);
  BOOST_TEST(named[0].first == "w");
  BOOST_TEST((net.w.shape() == Shape{1}));
  BOOST_TEST(net.w.requires_grad());
  const double w = net.w.item<double>();
  BOOST_TEST((w >= 0.0 && w < 1.0));
  BOOST_TEST(!net.attention_weights.defined());
}

BOOST_AUTO_TEST_CASE(forward_keeps_detached_weights) {
  manual_seed(6);
  nn::NWKernelRegression net;
  const Tensor queries = rand({4}), keys = rand({4, 3}), values = rand({4, 3});
  const Tensor out = net(queries, keys, values);
  BOOST_TEST((out.shape() == Shape{4}));
  BOOST_TEST(out.requires_grad());
  BOOST_TEST_REQUIRE(net.attention_weights.defined());
  BOOST_TEST((net.attention_weights.shape() == Shape{4, 3}));
  BOOST_TEST(!net.attention_weights.requires_grad());
  // Rows are distributions, and the output is their average of the values.
  expect_close(net.attention_weights.sum({1}), ones({4}), 1e-6, 1e-6, "row sums");
  expect_close(out, (net.attention_weights * values).sum({1}), 1e-6, 1e-6, "pooling");
}

BOOST_AUTO_TEST_CASE(gradcheck_in_w_and_inputs) {
  manual_seed(7);
  nn::NWKernelRegression net;
  net.to(kFloat64);
  BOOST_TEST((net.w.dtype() == kFloat64));
  const Tensor queries = leaf({6}), keys = leaf({6, 5}), values = leaf({6, 5});
  check_gradient([&](const std::vector<Tensor>&) { return net(queries, keys, values); }, {net.w},
                 "w");
  // Every input at once; w is the module's own tensor, so gradcheck perturbs it in place.
  check_gradient([&](const std::vector<Tensor>& v) { return net(v[0], v[1], v[2]); },
                 {queries, keys, values, net.w}, "queries, keys, values, w");
  // Non-contiguous keys and values (transposed), a (1, 1) case.
  check_gradient(
      [&](const std::vector<Tensor>& v) {
        return net(v[0], v[1].transpose(0, 1), v[2].transpose(0, 1));
      },
      {leaf({6}), leaf({5, 6}), leaf({5, 6}), net.w}, "transposed keys and values");
  check_gradient([&](const std::vector<Tensor>& v) { return net(v[0], v[1], v[2]); },
                 {leaf({1}), leaf({1, 1}), leaf({1, 1}), net.w}, "one pair");
}

BOOST_AUTO_TEST_CASE(float32_forward_agrees_with_float64) {
  manual_seed(8);
  nn::NWKernelRegression net;
  auto net64 = std::dynamic_pointer_cast<nn::NWKernelRegression>(net.clone());
  net64->to(kFloat64);
  const Tensor queries = rand({5}, kFloat64) * 5, keys = rand({5, 7}, kFloat64) * 5,
               values = randn({5, 7}, kFloat64);
  const Tensor out64 = (*net64)(queries, keys, values);
  const Tensor out32 = net(queries.to(kFloat32), keys.to(kFloat32), values.to(kFloat32));
  expect_close(out32, out64.to(kFloat32), 1e-5, 1e-5);
}

BOOST_AUTO_TEST_CASE(clone_owns_its_w) {
  manual_seed(9);
  nn::NWKernelRegression net;
  net(rand({2}), rand({2, 3}), rand({2, 3}));
  auto copy = std::dynamic_pointer_cast<nn::NWKernelRegression>(net.clone());
  BOOST_TEST_REQUIRE(copy != nullptr);
  BOOST_TEST(copy->w.item<float>() == net.w.item<float>());
  {
    NoGradGuard no_grad;
    copy->w.fill_(3.0);
  }
  BOOST_TEST(net.w.item<float>() != 3.0f);
  BOOST_TEST((copy->parameters()[0].item<float>() == 3.0f));
  BOOST_TEST(copy->attention_weights.impl() != net.attention_weights.impl());
}

BOOST_AUTO_TEST_CASE(five_epochs_lower_the_loss_and_nonparametric_beats_average) {
  manual_seed(2);  // the example's default seed
  const Data d = make_data(50);
  nn::NWKernelRegression net;
  const double w_initial = net.w.item<double>();
  const std::vector<double> losses = train(net, d, 5, 0.5);
  BOOST_TEST_REQUIRE(losses.size() == 5u);
  BOOST_TEST(losses.back() < 0.9 * losses.front(), "losses " << fmt::format("{}", losses));
  BOOST_TEST(std::abs(net.w.item<double>() - w_initial) > 0.5);

  // On the test grid: the flat average is worst, and kernel regression is close to the truth.
  const double average = mse(repeat_interleave(d.y_train.mean(), d.x_test.numel()), d.y_truth);
  const double kernel = mse(nonparametric(d), d.y_truth);
  BOOST_TEST(kernel < average, "nonparametric " << kernel << ", average " << average);
}

BOOST_AUTO_TEST_CASE(golden_against_pytorch) {
  const Golden g("nw_regression.json");
  const Data d{g["x_train"], g["y_train"], g["x_test"], {}};
  const int64_t n_train = d.x_train.numel();
  const Tensor X_repeat = d.x_test.repeat_interleave(n_train).reshape({-1, n_train});
  const Tensor attention_weights = softmax(-(X_repeat - d.x_train).pow(2) / 2, 1);
  expect_close(attention_weights, g["nonparametric.attention_weights"], 1e-12, 1e-14, "weights");
  expect_close(nonparametric(d), g["nonparametric.y_hat"], 1e-12, 1e-12, "y_hat");

  const Tensor keys = leave_one_out(d.x_train), values = leave_one_out(d.y_train);
  BOOST_TEST((keys.to_vector<double>() == g["keys"].to_vector<double>()));
  BOOST_TEST((values.to_vector<double>() == g["values"].to_vector<double>()));

  nn::NWKernelRegression net;
  net.to(kFloat64);
  {
    NoGradGuard no_grad;
    net.w.copy_(g["parametric.w"]);
  }
  const Tensor out = net(d.x_train, keys, values);
  expect_close(out, g["parametric.out"], 1e-12, 1e-12, "forward");
  expect_close(net.attention_weights, g["parametric.attention_weights"], 1e-12, 1e-14, "weights");
  const Tensor l = mse_loss(out, d.y_train, Reduction::None);
  expect_close(l, g["parametric.loss"], 1e-12, 1e-12, "loss");
  l.sum().backward();
  expect_close(net.w.grad(), g["parametric.w_grad"], 1e-10, 1e-12, "dL/dw");
}

BOOST_AUTO_TEST_CASE(error_paths) {
  nn::NWKernelRegression net;
  expect_error([&] { net(rand({5}), rand({5}), rand({5})); }, {"NWKernelRegression", "[5]"});
  expect_error(
      [&] {
        net(rand({2}), rand({2, 3}), rand({2, 4}));
      },
      {"NWKernelRegression", "[2, 4]", "[2, 3]"});
  expect_error(
      [&] {
        net(rand({3}), rand({2, 3}), rand({2, 3}));
      },
      {"NWKernelRegression", "3 queries", "[2, 3]"});
}

#ifdef EMBER_NW_REGRESSION
BOOST_AUTO_TEST_CASE(example_program_writes_every_file) {
  const std::filesystem::path out = std::filesystem::temp_directory_path() /
                                    ("ember_test_nw_regression_" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  const std::string log = out.string() + ".log";
  const std::string command = std::string("\"") + EMBER_NW_REGRESSION + "\" --threads 1 --out \"" +
                              out.string() + "\" > \"" + log + "\" 2>&1";
  const int status = std::system(command.c_str());
  const std::string printed = read_text(log);
  BOOST_TEST_REQUIRE(status == 0, printed);
  BOOST_TEST(printed.find("epoch 5, loss ") != std::string::npos, printed);

  for (const char* name : {"attention_cues.svg", "kernel_reg_average.svg",
                           "kernel_reg_nonparametric.svg", "attention_nonparametric.svg",
                           "loss.svg", "kernel_reg_parametric.svg", "attention_parametric.svg"}) {
    const std::filesystem::path svg = out / name;
    BOOST_TEST_REQUIRE(std::filesystem::exists(svg), name);
    std::vector<ember::testing::XmlElement> doc;
    BOOST_REQUIRE_NO_THROW(doc = ember::testing::parse_xml(read_text(svg)));
    BOOST_TEST(doc.front().name == "svg", name);
    const bool heatmap = std::string(name).starts_with("attention_");
    bool labelled = false;
    for (const auto& e : doc)
      if (e.name == "text" && (e.text == "Sorted training inputs" || e.text == "Keys" ||
                               e.text == "x" || e.text == "epoch"))
        labelled = true;
    BOOST_TEST(labelled, name << " lacks its x label");
    if (heatmap) BOOST_TEST(doc.size() > 100u, name << " has few elements");
  }

  const auto metrics = nlohmann::json::parse(read_text(out / "metrics.json"));
  BOOST_TEST(metrics.at("seed").get<uint64_t>() == 2u);
  BOOST_TEST(metrics.at("n_train").get<int64_t>() == 50);
  const auto losses = metrics.at("loss_per_epoch").get<std::vector<double>>();
  BOOST_TEST_REQUIRE(losses.size() == 5u);
  BOOST_TEST(losses.back() < losses.front());
  const double w_initial = metrics.at("w_initial").get<double>();
  const double w_learned = metrics.at("w_learned").get<double>();
  BOOST_TEST((w_initial >= 0.0 && w_initial < 1.0));
  BOOST_TEST(std::abs(w_learned - w_initial) > 0.5);
  const auto& test_mse = metrics.at("test_mse");
  const double average = test_mse.at("average").get<double>();
  const double nonparametric = test_mse.at("nonparametric").get<double>();
  const double parametric = test_mse.at("parametric").get<double>();
  BOOST_TEST(nonparametric < average);
  BOOST_TEST(parametric < average);

  // The flags reach the program.
  const std::string small = std::string("\"") + EMBER_NW_REGRESSION +
                            "\" --threads 1 --seed 11 --n-train 12 --epochs 2 --lr 0.1 --out \"" +
                            out.string() + "\" > \"" + log + "\" 2>&1";
  const int small_status = std::system(small.c_str());
  BOOST_TEST_REQUIRE(small_status == 0, read_text(log));
  const auto m2 = nlohmann::json::parse(read_text(out / "metrics.json"));
  BOOST_TEST(m2.at("seed").get<uint64_t>() == 11u);
  BOOST_TEST(m2.at("n_train").get<int64_t>() == 12);
  BOOST_TEST(m2.at("loss_per_epoch").size() == 2u);
  std::filesystem::remove_all(out);
  std::filesystem::remove(log);
}
#endif

BOOST_AUTO_TEST_SUITE_END()
