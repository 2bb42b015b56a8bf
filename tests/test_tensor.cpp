// Tensor basics: creation, views sharing storage, conversion, printing, errors.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>

#include "ember.h"

using namespace ember;

BOOST_AUTO_TEST_SUITE(test_tensor)

BOOST_AUTO_TEST_CASE(creation) {
  Tensor t = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  BOOST_TEST(t.dim() == 2);
  BOOST_TEST(t.numel() == 6);
  BOOST_TEST(t.size(-1) == 3);
  BOOST_TEST(t.dtype() == kFloat32);
  BOOST_TEST(t.is_contiguous());
  BOOST_TEST((t.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6}));
  BOOST_TEST(zeros({2, 2}).sum().item<double>() == 0.0);
  BOOST_TEST(ones({2, 3}, kFloat64).sum().item<double>() == 6.0);
  BOOST_TEST(full({3}, 2.5).to_vector<float>()[2] == 2.5f);
  BOOST_TEST((arange(0, 5, 1).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4}));
  BOOST_TEST(arange(0, 5, 0.1).numel() == 50);
  BOOST_TEST(eye(3).sum().item<double>() == 3.0);
  BOOST_TEST(tensor({1, 0, 2}, kBool).to_vector<int64_t>()[1] == 0);
}

BOOST_AUTO_TEST_CASE(buffers_are_aligned) {
  // Every buffer on 64 bytes (a cache line, an AVX-512 vector); from 2 MB on, on a 2 MB boundary
  // (Note [Huge pages]), also when it comes back from the buffer cache.
  const auto address = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data<float>()); };
  for (int64_t n : {1, 17, 1000, 524287, 524288, 1000001}) {
    for (int round = 0; round < 2; ++round) {
      const Tensor t = empty({n});
      BOOST_TEST(address(t) % 64 == 0, n << " floats");
      if (n * 4 >= (int64_t{2} << 20)) BOOST_TEST(address(t) % (uintptr_t{2} << 20) == 0, n);
      std::memset(t.data<float>(), 0, static_cast<size_t>(n) * 4);  // all of it is ours
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
