// The product layer (ops/blas.cpp): the library choice, its override (set_blas_library and
// EMBER_BLAS) and its errors; and every library this build and machine offer against an
// independent reference, over both dtypes, the four transpose pairs, alpha and beta, a C full of
// NaN under beta = 0, sizes off the kernels' tiles, batches, and both threading paths. ctest runs
// the suites with golden values and gradchecks once per library as well (blas_<library>).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "graph/profile.h"
#include "tests/helpers.h"

using namespace ember;
using namespace ember::testing;

namespace {

const std::vector<std::string> kLibraries = {"openblas", "blis", "dnnl"};

// The libraries set_blas_library accepts here (OpenBLAS always; BLIS and oneDNN where found).
std::vector<std::string> available_libraries() {
  const std::string before = get_blas_library();
  std::vector<std::string> out;
  for (const std::string& lib : kLibraries) {
    try {
      set_blas_library(lib);
      out.push_back(lib);
    } catch (const Error&) {
    }
  }
  set_blas_library(before);
  return out;
}

// Runs the scope on one library, then puts back the one before.
struct LibraryScope {
  std::string before = get_blas_library();
  explicit LibraryScope(const std::string& lib) { set_blas_library(lib); }
  ~LibraryScope() { set_blas_library(before); }
};

// a @ b summed in Float64 by broadcasting, without any product library.
Tensor reference(const Tensor& a, const Tensor& b) {
  const Tensor a64 = a.to(kFloat64), b64 = b.to(kFloat64);
  return (a64.unsqueeze(-1) * b64.unsqueeze(-3)).sum({-2});
}

// (rows, cols) read as the caller asks: a transposed view of a contiguous (cols, rows) when
// `transposed`, else contiguous.
Tensor operand(int64_t rows, int64_t cols, bool transposed, DType dtype) {
  return transposed ? randn({cols, rows}, dtype).transpose(0, 1) : randn({rows, cols}, dtype);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_blas)

// First in the suite, so that ctest's blas_env_* runs see EMBER_BLAS's effect before any case
// sets a library: the variable names the library; a bad value, or a library this machine lacks,
// is ignored with a warning.
BOOST_AUTO_TEST_CASE(environment_override) {
  const char* env = std::getenv("EMBER_BLAS");
  const std::string value = env != nullptr ? env : "";
  (void)matmul(ones({2, 2}), ones({2, 2}));  // the first product reads EMBER_BLAS
  const std::string info = blas_library_info();
  BOOST_TEST_MESSAGE("EMBER_BLAS=" << value << ": " << info);
  const std::string in_use = get_blas_library();
  const std::vector<std::string> have = available_libraries();  // sets and restores
  BOOST_TEST(get_blas_library() == in_use);
  if (std::find(have.begin(), have.end(), value) != have.end()) {
    BOOST_TEST(get_blas_library() == value);
    BOOST_TEST(info.find("set by EMBER_BLAS") != std::string::npos, info);
  } else {
    BOOST_TEST(info.find("chosen for this CPU") != std::string::npos, info);
  }
}

BOOST_AUTO_TEST_CASE(choice_is_named_and_auto_returns_to_it) {
  set_blas_library("auto");
  const std::string chosen = get_blas_library();
  BOOST_TEST((chosen == "openblas" || chosen == "blis" || chosen == "dnnl"));
  const std::string info = blas_library_info();
  BOOST_TEST(info.rfind(chosen + " (chosen for this CPU", 0) == 0, info);
  BOOST_TEST(info.find("Float32 on ") != std::string::npos, info);
  BOOST_TEST(info.find("Float64 on ") != std::string::npos, info);
  for (const std::string& lib : available_libraries()) {
    set_blas_library(lib);
    BOOST_TEST(get_blas_library() == lib);
    BOOST_TEST(blas_library_info().find("set by set_blas_library") != std::string::npos);
  }
  set_blas_library("auto");
  BOOST_TEST(get_blas_library() == chosen);
}

BOOST_AUTO_TEST_CASE(profiler_report_names_the_library) {
  profile::reset();
  profile::enable();
  (void)matmul(ones({8, 8}), ones({8, 8}));
  profile::disable();
  const std::string report = profile::report();
  profile::reset();
  BOOST_TEST(report.rfind("products: " + blas_library_info() + "\n", 0) == 0, report);
}

BOOST_AUTO_TEST_CASE(errors_name_the_library) {
  expect_error([] { set_blas_library("mkl"); },
               {"set_blas_library", "\"openblas\", \"blis\", \"dnnl\" or \"auto\"", "\"mkl\""});
  expect_error([] { set_blas_library(""); }, {"set_blas_library", "got \"\""});
  const std::vector<std::string> have = available_libraries();
  for (const std::string& lib : kLibraries) {
    if (std::find(have.begin(), have.end(), lib) == have.end())
      expect_error([&] { set_blas_library(lib); }, {"set_blas_library", lib, "not available"});
  }
  BOOST_TEST((std::find(have.begin(), have.end(), "openblas") != have.end()));
}

BOOST_AUTO_TEST_CASE(every_library_matches_the_reference) {
  manual_seed(48);
  // sizes off every kernel's register tile and past the narrow/small-product paths, on both
  // sides of oneDNN's smallest product (2^19 multiply-adds; smaller ones run on OpenBLAS); all
  // below BLIS's small-product thresholds, so both of its paths run (the transposed products with
  // that path off, Note [BLIS's small-product path] in ops/blis.cpp)
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> sizes = {
      {17, 33, 65}, {64, 96, 128}, {129, 7, 70}, {3, 250, 41}, {257, 130, 33}, {40, 300, 70}};
  for (const std::string& lib : available_libraries()) {
    LibraryScope scope(lib);
    for (DType dtype : {kFloat32, kFloat64}) {
      const double tol = dtype == kFloat32 ? 2e-4 : 1e-11;
      for (const auto& [m, k, n] : sizes) {
        for (int t = 0; t < 4; ++t) {
          const bool ta = t & 1, tb = t & 2;
          const Tensor a = operand(m, k, ta, dtype), b = operand(k, n, tb, dtype);
          const std::string what = fmt::format("{} {} {}x{}x{} {}{}", lib, dtype, m, n, k,
                                               ta ? 'T' : 'N', tb ? 'T' : 'N');
          expect_close(matmul(a, b).to(kFloat64), reference(a, b), tol, tol, what);
          // beta = 0 never reads C: NaN there must not come through
          Tensor c = full({m, n}, std::numeric_limits<double>::quiet_NaN(), dtype);
          gemm(a, b, c);
          expect_close(c.to(kFloat64), reference(a, b), tol, tol, what + ", beta 0 over NaN");
          const Tensor c0 = randn({m, n}, dtype);
          c = c0.clone();
          gemm(a, b, c, -1.5, 0.25);
          expect_close(c.to(kFloat64), reference(a, b) * -1.5 + c0.to(kFloat64) * 0.25, tol, tol,
                       what + ", alpha and beta");
        }
      }
      // a batch, and linear's product with its bias
      const Tensor x = randn({3, 20, 30}, dtype), y = randn({3, 30, 18}, dtype);
      expect_close(bmm(x, y).to(kFloat64), reference(x, y), tol, tol, lib + " bmm");
      const Tensor w = randn({24, 30}, dtype), bias = randn({24}, dtype);
      expect_close(linear(x, w, bias).to(kFloat64),
                   reference(x, w.transpose(0, 1)) + bias.to(kFloat64), tol, tol, lib + " linear");
    }
  }
}

BOOST_AUTO_TEST_CASE(every_library_splits_across_threads_alike) {
  manual_seed(49);
  // large enough to split (Note [Threads in products]), by rows and by columns
  const Tensor tall = randn({300, 200}, kFloat64), wide = randn({300, 310}, kFloat64);
  const Tensor expected_rows = reference(tall, tall.transpose(0, 1)),
               expected_cols = reference(tall.transpose(0, 1), tall);
  const int threads = get_num_threads();
  for (const std::string& lib : available_libraries()) {
    LibraryScope scope(lib);
    for (int n : {1, 2, 3}) {
      set_num_threads(n);
      const std::string what = fmt::format("{} at {} threads", lib, n);
      expect_close(matmul(tall, tall.transpose(0, 1)), expected_rows, 1e-10, 1e-10, what);
      expect_close(matmul(tall.transpose(0, 1), tall), expected_cols, 1e-10, 1e-10, what);
      expect_close(matmul(tall.to(kFloat32).transpose(0, 1), wide.to(kFloat32)).to(kFloat64),
                   reference(tall.transpose(0, 1), wide), 1e-3, 1e-3, what + ", Float32");
    }
  }
  set_num_threads(threads);
}

BOOST_AUTO_TEST_CASE(gradients_agree_across_libraries) {
  manual_seed(50);
  const Tensor a0 = randn({40, 30}, kFloat64), b0 = randn({30, 50}, kFloat64);
  const auto grads = [&] {
    Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    (matmul(a, b).tanh().sum()).backward();
    return std::pair{a.grad(), b.grad()};
  };
  const auto [ga, gb] = grads();
  for (const std::string& lib : available_libraries()) {
    LibraryScope scope(lib);
    const auto [la, lb] = grads();
    expect_close(la, ga, 1e-11, 1e-11, lib + " dA");
    expect_close(lb, gb, 1e-11, 1e-11, lib + " dB");
  }
}

BOOST_AUTO_TEST_SUITE_END()
