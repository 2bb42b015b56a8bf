// No input crashes Ember: empty tensors, sizes that overflow, undefined tensors and conversions
// that C++ leaves undefined. Each case once ended in a signal or a silently wrong value; each now
// gives PyTorch's result or an ember::Error naming the op.
#include <boost/test/unit_test.hpp>

#include <climits>
#include <cmath>
#include <limits>

#include "tests/helpers.h"

using namespace ember;
using namespace ember::testing;

BOOST_AUTO_TEST_SUITE(test_safety)

constexpr int64_t kBig = int64_t{1} << 62;

BOOST_AUTO_TEST_CASE(empty_tensors_give_empty_results) {
  const Tensor e = zeros({2, 0});
  BOOST_TEST((e.is_contiguous()));
  BOOST_TEST(((e + 1.0).shape() == Shape{2, 0}));
  BOOST_TEST(((e.clone()).numel() == 0));
  BOOST_TEST((exp(e).shape() == Shape{2, 0}));
  BOOST_TEST((where(e > 0.0, e, e).shape() == Shape{2, 0}));
  BOOST_TEST((zeros({0, 2}).transpose(0, 1).contiguous().shape() == Shape{2, 0}));
  BOOST_TEST((e.to_vector<float>().empty()));
  BOOST_TEST((zeros({3, 0}).to(kInt64).numel() == 0));
  BOOST_TEST((zeros({2, 0, 3}).sum({1}).to_vector<float>() == std::vector<float>(6, 0.0f)));
}

BOOST_AUTO_TEST_CASE(sizes_that_overflow_are_errors) {
  expect_error([] { zeros({kBig}); }, {"tensor", "bytes"});
  expect_error([] { zeros({int64_t{1} << 31, int64_t{1} << 31, 4}); }, {"tensor", "overflow"});
  expect_error([] { ones({3037000500, 3037000500}); }, {"tensor", "overflow"});
  expect_error([] { zeros({0, kBig, 8}); }, {"tensor", "overflow"});
  expect_error([] { rand({kBig}); }, {"tensor", "bytes"});
  expect_error([] { randn({kBig}); }, {"tensor", "bytes"});
  expect_error([] { normal(0, 1, {kBig}); }, {"tensor", "bytes"});
  expect_error([] { randint(0, 5, {kBig}); }, {"tensor", "bytes"});
  expect_error([] { eye(int64_t{1} << 32); }, {"tensor"});
  expect_error([] { arange(0, 1e30); }, {"arange", "too many"});
  expect_error([] { arange(0, double(kBig / 2)); }, {"tensor", "bytes"});
  // Within an int64 but beyond this machine's memory: refused before allocating.
  expect_error([] { zeros({int64_t{1} << 40}); }, {"tensor", "cannot allocate", "GiB"});
}

BOOST_AUTO_TEST_CASE(empty_inputs_of_fused_ops) {
  // softmax over rows of 0 elements once divided by the row length (SIGFPE).
  for (const Shape& shape : {Shape{0}, Shape{1, 0}, Shape{0, 3}}) {
    const Tensor x = zeros(shape, kFloat64).requires_grad_();
    const Tensor y = softmax(x, -1) + log_softmax(x, 0);
    BOOST_TEST((y.shape() == shape));
    y.backward(ones_like(y));
    BOOST_TEST((x.grad().shape() == shape));
  }
  // layer_norm with no rows: empty output, zero gradients for weight and bias (not garbage).
  const Tensor x = zeros({0, 4}, kFloat64).requires_grad_();
  const Tensor w = ones({4}, kFloat64).requires_grad_(), b = zeros({4}, kFloat64).requires_grad_();
  layer_norm(x, {4}, w, b).sum().backward();
  BOOST_TEST((w.grad().to_vector<double>() == std::vector<double>(4, 0.0)));
  BOOST_TEST((b.grad().to_vector<double>() == std::vector<double>(4, 0.0)));
  BOOST_TEST((layer_norm(zeros({3, 0}), {0}).shape() == Shape{3, 0}));
  // Products with a zero dim: k = 0 gives zeros, linear with no input features the bias.
  BOOST_TEST((matmul(zeros({2, 0}), zeros({0, 3})).to_vector<float>() == std::vector<float>(6, 0)));
  BOOST_TEST((linear(zeros({2, 0}), zeros({3, 0}), ones({3})).to_vector<float>() ==
              std::vector<float>(6, 1.0f)));
  BOOST_TEST((linear(zeros({2, 3}), zeros({0, 3})).shape() == Shape{2, 0}));
  // var of nothing, and unbiased var of one element, are NaN as in torch (not -0).
  BOOST_TEST(std::isnan(var(zeros({0}), {0}).item<float>()));
  BOOST_TEST(std::isnan(var(ones({1}), {0}).item<float>()));
  BOOST_TEST((zeros({2, 0}).view({-1}).shape() == Shape{0}));
  expect_error([] { zeros({2, 0}).view({-1, 0}); }, {"view", "[-1, 0]", "size 0"});
  expect_error([] { argmax(zeros({0}), 0); }, {"argmax:", "size 0"});
}

BOOST_AUTO_TEST_CASE(size_arguments_that_overflow_are_errors) {
  const Tensor x = zeros({5});
  expect_error([&] { x.narrow(0, INT64_MAX, 1); }, {"narrow", "out of range"});
  expect_error([&] { x.narrow(0, 1, INT64_MAX); }, {"narrow", "out of range"});
  constexpr int64_t third = 6148914691236517206;  // 3 * third wraps around to 2
  expect_error([] { zeros({3}).repeat({third}); }, {"repeat", "overflows"});
  expect_error([] { zeros({3}).repeat({2, third}); }, {"repeat", "overflows"});
  expect_error([] { zeros({3}).repeat_interleave(third); }, {"repeat_interleave", "overflows"});
  expect_error([] { zeros({1, 3}).repeat_interleave(third, 1); }, {"repeat_interleave"});
  expect_error([] { zeros({2}).reshape({3, third}); }, {"reshape", "invalid for input of size 2"});
  expect_error([] { zeros({2}).reshape({-1, third, 3}); }, {"reshape", "invalid"});
  expect_error([] { zeros({1}).expand({kBig, kBig}); }, {"tensor", "overflow"});
}

BOOST_AUTO_TEST_CASE(undefined_tensors_raise) {
  const Tensor u;
  expect_error([&] { (void)u.dim(); }, {"dim", "undefined"});
  expect_error([&] { (void)u.shape(); }, {"shape", "undefined"});
  expect_error([&] { (void)u.numel(); }, {"numel", "undefined"});
  expect_error([&] { (void)u.dtype(); }, {"dtype", "undefined"});
  expect_error([&] { (void)u.is_leaf(); }, {"is_leaf", "undefined"});
  expect_error([&] { (void)u.size(0); }, {"undefined"});
  expect_error([&] { (void)u.contiguous(); }, {"undefined"});
  BOOST_TEST(!u.defined());
  BOOST_TEST(!u.requires_grad());
}

BOOST_AUTO_TEST_CASE(conversions_are_defined_for_every_value) {
  // As torch on x86: NaN and out-of-range floats become INT64_MIN.
  const Tensor x = tensor({std::nan(""), 1e300, -1e300, 2.7, -2.7}, kFloat64);
  const std::vector<int64_t> expected{INT64_MIN, INT64_MIN, INT64_MIN, 2, -2};
  BOOST_TEST((x.to(kInt64).to_vector<int64_t>() == expected));
  BOOST_TEST((x.to_vector<int64_t>() == expected));
  BOOST_TEST(tensor({std::nan("")}).item<int64_t>() == INT64_MIN);
}

BOOST_AUTO_TEST_CASE(set_grad_checks_the_dtype) {
  Tensor w = ones({2}).requires_grad_();
  expect_error([&] { w.set_grad(ones({2}, kInt64)); }, {"set_grad", "Int64", "Float32"});
}

BOOST_AUTO_TEST_CASE(in_place_writes_that_torch_refuses_are_errors) {
  // Internal overlap: several elements of the written tensor are one memory location.
  expect_error([] { zeros({1}).expand({5}).add_(1.0); }, {"add_", "expanded", "clone"});
  expect_error([] { zeros({1}).expand({5}).mul_(ones({5})); }, {"mul_", "expanded"});
  expect_error([] { zeros({1}).expand({5}).copy_(ones({5})); }, {"copy_", "expanded"});
  expect_error([] { zeros({1}).expand({3}).masked_fill_(ones({3}, kBool), 1); },
               {"masked_fill_", "expanded"});
  // fill_ and zero_ write one value everywhere: allowed on an expanded view, as torch.
  Tensor base = zeros({1});
  base.expand({4}).fill_(3.0);
  BOOST_TEST(base.item<float>() == 3.0f);
  // Partial overlap: the operand reads what the write has already changed.
  Tensor a = arange(0, 9).reshape({3, 3});
  expect_error([&] { a.add_(a.transpose(0, 1)); }, {"add_", "share some memory", "clone"});
  expect_error([&] { a.mul_(a.transpose(0, 1)); }, {"mul_", "share some memory"});
  expect_error([&] { a.copy_(a.transpose(0, 1)); }, {"copy_", "share some memory"});
  Tensor v = arange(0, 6);
  expect_error([&] { v.narrow(0, 1, 5).copy_(v.narrow(0, 0, 5)); }, {"copy_", "share some"});
  // The same view is fine: each element reads itself first (a.add_(a) doubles).
  a.add_(a);
  BOOST_TEST(a.sum().item<double>() == 72.0);
  a.add_(a.transpose(0, 1).clone());
  // The result type must fit: torch's "result type Float can't be cast to Long".
  Tensor i = tensor({1, 2, 3}, kInt64);
  expect_error([&] { i.add_(0.5); }, {"add_", "Float32", "Int64"});
  expect_error([&] { i.mul_(0.5); }, {"mul_", "Float32", "Int64"});
  expect_error([&] { i.add_(ones({3})); }, {"add_", "Float32", "Int64"});
  expect_error([&] { ones({3}, kBool).add_(1.0); }, {"add_", "Int64", "Bool"});
  i.add_(2.0);  // a whole value is an integral scalar
  BOOST_TEST((i.to_vector<int64_t>() == std::vector<int64_t>{3, 4, 5}));
  ones({3}).copy_(i);  // copy_ converts, as torch's
}

BOOST_AUTO_TEST_CASE(bool_and_int64_arithmetic_as_torch) {
  const Tensor t = tensor({1, 1, 0, 0}, kBool), f = tensor({1, 0, 1, 0}, kBool);
  BOOST_TEST(((t + f).dtype() == kBool));
  BOOST_TEST(((t + f).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 0}));
  BOOST_TEST(((t * f).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0}));
  expect_error([&] { (void)(t - f); }, {"sub", "Bool", "logical_xor"});
  expect_error([&] { (void)(-t); }, {"neg", "Bool", "logical_not"});
  BOOST_TEST(((t + 1.0).dtype() == kInt64));
  // Int64 overflow wraps around, as torch (no undefined behaviour under UBSan).
  const Tensor big = tensor({9.2e18}, kInt64);
  BOOST_TEST(((big + big).item<int64_t>() ==
              static_cast<int64_t>(uint64_t(2) * uint64_t(9200000000000000000ull))));
  const Tensor lowest = from_vector(std::vector<int64_t>{INT64_MIN}, {1});
  BOOST_TEST((-lowest).item<int64_t>() == INT64_MIN);
  BOOST_TEST(((lowest * 2.0).item<int64_t>() == 0));
}

BOOST_AUTO_TEST_CASE(rng_state_round_trips_and_rejects_other_tensors) {
  manual_seed(11);
  (void)rand({5});
  const Tensor state = get_rng_state();
  const std::vector<double> next = randn({7}, kFloat64).to_vector<double>();
  (void)rand({100});
  set_rng_state(state);
  BOOST_TEST((randn({7}, kFloat64).to_vector<double>() == next));
  expect_error([] { set_rng_state(ones({3})); }, {"set_rng_state", "Float32", "[3]"});
  Tensor bad = state.clone();
  bad.narrow(0, 312, 1).fill_(100000);
  expect_error([&] { set_rng_state(bad); }, {"set_rng_state", "position"});
}

BOOST_AUTO_TEST_SUITE_END()
