// Shared test helpers: gradcheck as a Boost check, closeness of tensors, PyTorch golden files,
// reading a whole file, and expecting an ember::Error whose message contains given text.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "ember.h"

namespace ember::testing {

// Passes when gradcheck passes; otherwise reports gradcheck's message.
inline void check_gradient(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                           const std::vector<Tensor>& inputs, const std::string& what = "",
                           const GradcheckOptions& options = {}) {
  const GradcheckResult r = gradcheck(f, inputs, options);
  BOOST_TEST(r.ok, what << ": " << r.message);
}

// A Float64 leaf of `shape` with values from randn (seeded by the caller), requiring grad.
inline Tensor leaf(const Shape& shape, double scale = 1.0) {
  Tensor t = randn(shape, kFloat64) * scale;
  return t.detach().requires_grad_();
}

// Tensors agree elementwise: |a - b| <= atol + rtol |b|, with the same shape; NaN matches NaN and
// an infinity only the same infinity.
inline void expect_close(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-6,
                         const std::string& what = "") {
  BOOST_TEST_REQUIRE((a.shape() == b.shape()), what << ": shape " << fmt::format("{}", a.shape())
                                                    << " vs " << fmt::format("{}", b.shape()));
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  if (x.empty()) return;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double excess = std::abs(x[i] - y[i]) - (atol + rtol * std::abs(y[i]));
    const bool inf_differs = (std::isinf(x[i]) || std::isinf(y[i])) && x[i] != y[i];
    if (excess > worst || (std::isnan(x[i]) != std::isnan(y[i])) || inf_differs) {
      worst = std::isnan(excess) || inf_differs ? 1e300 : excess;
      at = i;
    }
  }
  BOOST_TEST(worst <= 0.0, what << ": element " << at << " is " << x[at] << ", expected " << y[at]);
}

// tests/golden: where the build saw it, or $EMBER_GOLDEN_DIR where the binary runs elsewhere (a
// GPU machine with a copy of the repository, tools/gpu-check.sh).
inline std::string golden_dir() {
  const char* dir = std::getenv("EMBER_GOLDEN_DIR");
  return dir != nullptr && *dir != '\0' ? dir : EMBER_GOLDEN_DIR;
}

// Golden values written by tests/golden/*.py with PyTorch: {"name": {"shape": [...],
// "dtype": "float64"|"int64"|"bool", "data": [...]}} (NaN as "nan", infinities "inf", "-inf"),
// or {"name": {"text": "..."}}.
class Golden {
 public:
  explicit Golden(const std::string& file) {
    std::ifstream in(golden_dir() + "/" + file);
    BOOST_TEST_REQUIRE(in.good(), "cannot open golden file " << file);
    json_ = nlohmann::json::parse(in);
  }
  Tensor operator[](const std::string& name) const {
    BOOST_TEST_REQUIRE(json_.contains(name), "golden value " << name << " missing");
    const auto& entry = json_.at(name);
    const Shape shape = entry.at("shape").get<Shape>();
    const std::string dtype = entry.value("dtype", "float64");
    if (dtype == "int64") return from_vector(entry.at("data").get<std::vector<int64_t>>(), shape);
    std::vector<double> data;  // NaN and infinities are the strings "nan", "inf", "-inf"
    for (const auto& v : entry.at("data"))
      data.push_back(v.is_string() ? std::strtod(v.get<std::string>().c_str(), nullptr)
                                   : v.get<double>());
    return from_vector(data, shape, dtype == "bool" ? kBool : kFloat64);
  }
  bool contains(const std::string& name) const { return json_.contains(name); }
  // A text entry {"text": "..."}.
  std::string text(const std::string& name) const {
    BOOST_TEST_REQUIRE(json_.contains(name), "golden value " << name << " missing");
    return json_.at(name).at("text").get<std::string>();
  }
  // The names that start with prefix, without it.
  std::vector<std::string> names_with_prefix(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const auto& [name, value] : json_.items())
      if (name.starts_with(prefix)) out.push_back(name.substr(prefix.size()));
    return out;
  }

 private:
  nlohmann::json json_;
};

// An optimizer's state dict holds exactly torch's entries, golden's "<prefix><key>" (the
// golden scripts flatten torch's state with Ember's names): the same names, dtypes and values.
inline void expect_torch_state_dict(const Golden& golden, const std::string& prefix,
                                    const optim::StateDict& state, double rtol,
                                    const std::string& name) {
  BOOST_TEST(state.size() == golden.names_with_prefix(prefix).size(), name);
  for (const auto& [key, t] : state) {
    BOOST_TEST_REQUIRE(golden.contains(prefix + key), name << ": " << key << " is not torch's");
    const Tensor expected = golden[prefix + key];
    BOOST_TEST(t.dtype() == expected.dtype(), name << ": " << key);
    expect_close(t, expected, rtol, 1e-12, name + " " + key);
  }
}

// The whole of a file, for tests that check what an example or a writer put on disk.
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  BOOST_TEST_REQUIRE(in.good(), "cannot read " << path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs f, expecting an ember::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      BOOST_TEST(msg.find(p) != std::string::npos, "message '" << msg << "' lacks '" << p << "'");
    return;
  }
  BOOST_ERROR("expected an ember::Error mentioning " << *parts.begin());
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

}  // namespace ember::testing
