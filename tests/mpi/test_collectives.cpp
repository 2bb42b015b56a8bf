// ember::distributed's process group and collectives on any number of ranks: all_reduce (Sum,
// Avg, Max) on Float32, Float64 and Int64, contiguous or not, broadcast from every root,
// all_gather, barrier, and the handshake's errors when the ranks disagree.
#include "distributed/distributed.h"
#include "helpers.h"
#include "mpi_helpers.h"

using namespace ember;
using namespace ember::testing;
namespace dist = ember::distributed;

BOOST_AUTO_TEST_SUITE(test_collectives)

BOOST_AUTO_TEST_CASE(rank_and_world_size) {
  const int r = dist::rank(), n = dist::world_size();
  BOOST_TEST(n >= 1);
  BOOST_TEST((r >= 0 && r < n));
  if (!dist::is_initialized()) BOOST_TEST((r == 0 && n == 1));
  dist::barrier();
}

BOOST_AUTO_TEST_CASE(all_reduce_sum_avg_max_on_every_dtype_and_layout) {
  const int r = dist::rank(), n = dist::world_size();
  // Rank r holds base + r on every element; the sum is n base + n(n-1)/2, the max base + n - 1.
  for (DType dtype : {kFloat32, kFloat64, kInt64}) {
    const auto base = arange(0, 6, 1, dtype).reshape({2, 3});
    const auto sum = base * n + n * (n - 1) / 2;
    const auto mine = [&] { return (base + r).contiguous(); };

    Tensor t = mine();
    dist::all_reduce(t);
    BOOST_TEST(equal(t, sum), dtype << " sum");
    t = mine();
    dist::all_reduce(t, dist::ReduceOp::Max);
    BOOST_TEST(equal(t, base + (n - 1)), dtype << " max");
    if (is_floating(dtype)) {
      t = mine();
      dist::all_reduce(t, dist::ReduceOp::Avg);
      expect_close(t, sum / n, 1e-6, 1e-6, "avg");
    }
    // A transposed view and a narrowed one: reduced through a contiguous copy and written back
    // in place, the rest of the storage untouched.
    Tensor whole = mine().transpose(0, 1).contiguous();  // (3, 2)
    Tensor view = whole.transpose(0, 1);                 // (2, 3), not contiguous
    const uint64_t version = view.impl()->storage->version();
    dist::all_reduce(view);
    BOOST_TEST(equal(view, sum), dtype << " transposed");
    if (dist::is_initialized()) BOOST_TEST(view.impl()->storage->version() > version);
    Tensor big = zeros({4, 3}, dtype);
    big.narrow(0, 1, 2).copy_(mine());
    Tensor part = big.narrow(0, 1, 2);
    dist::all_reduce(part);
    BOOST_TEST(equal(big.narrow(0, 1, 2), sum), dtype << " narrowed");
    BOOST_TEST(equal(big.narrow(0, 0, 1), zeros({1, 3}, dtype)));
    BOOST_TEST(equal(big.narrow(0, 3, 1), zeros({1, 3}, dtype)));
  }
}

BOOST_AUTO_TEST_CASE(broadcast_from_every_root) {
  const int r = dist::rank(), n = dist::world_size();
  for (int root = 0; root < n; ++root) {
    for (DType dtype : {kFloat32, kFloat64, kInt64}) {
      Tensor t =
          (arange(0, 6, 1, dtype).reshape({3, 2}) * (r + 1)).transpose(0, 1);  // not contiguous
      dist::broadcast(t, root);
      BOOST_TEST(equal(t, arange(0, 6, 1, dtype).reshape({3, 2}).transpose(0, 1) * (root + 1)),
                 "root " << root << " " << dtype);
    }
  }
}

BOOST_AUTO_TEST_CASE(all_gather_in_rank_order) {
  const int r = dist::rank(), n = dist::world_size();
  const Tensor mine = full({2, 2}, static_cast<double>(r), kFloat64).transpose(0, 1);
  const std::vector<Tensor> all = dist::all_gather(mine);
  BOOST_TEST(all.size() == static_cast<size_t>(n));
  for (int q = 0; q < static_cast<int>(all.size()); ++q) {
    BOOST_TEST((all[q].shape() == Shape{2, 2}));
    BOOST_TEST(equal(all[q], full({2, 2}, static_cast<double>(q), kFloat64)));
  }
  dist::barrier();
}

BOOST_AUTO_TEST_CASE(bad_tensors_are_refused_before_any_communication) {
  Tensor flags = ones({3}, kBool);
  expect_error([&] { dist::all_reduce(flags); }, {"all_reduce", "Bool", "not supported"});
  Tensor ids = ones({3}, kInt64);
  expect_error([&] { dist::all_reduce(ids, dist::ReduceOp::Avg); }, {"all_reduce", "Avg", "Int64"});
  Tensor expanded = ones({1, 3}).expand({4, 3});
  expect_error([&] { dist::all_reduce(expanded); }, {"all_reduce", "expanded"});
  Tensor t = ones({2});
  expect_error([&] { dist::broadcast(t, dist::world_size()); },
               {"broadcast", "root", "out of range"});
  Tensor undefined;
  expect_error([&] { dist::all_reduce(undefined); }, {"all_reduce", "undefined"});
}

// Every rank throws the same error, naming the collective, the ranks and their shapes, and the
// ranks stay in step for the next collective.
BOOST_AUTO_TEST_CASE(ranks_that_disagree_get_an_error_naming_them) {
  const int r = dist::rank(), n = dist::world_size();
  if (n < 2) return;
  Tensor t = ones({2, 2 + r});
  expect_error(
      [&] { dist::all_reduce(t); },
      {"all_reduce: the ranks disagree", fmt::format("this is rank {} of {}", r, n),
       "rank 0: all_reduce(Sum) of Float32 [2, 2]", "rank 1: all_reduce(Sum) of Float32 [2, 3]"});
  Tensor u = ones({3}, r == 0 ? kFloat32 : kFloat64);
  expect_error([&] { dist::broadcast(u); },
               {"broadcast", "rank 0: broadcast(root 0) of Float32 [3]",
                "rank 1: broadcast(root 0) of Float64 [3]"});
  Tensor v = ones({3});
  expect_error(
      [&] {
        if (r == 0)
          dist::all_reduce(v, dist::ReduceOp::Max);
        else
          dist::barrier();
      },
      {"the ranks disagree", "rank 0: all_reduce(Max) of Float32 [3]", "rank 1: barrier"});
  Tensor w = ones({3});
  dist::all_reduce(w);  // in step again
  BOOST_TEST(equal(w, full({3}, static_cast<double>(n))));
}

BOOST_AUTO_TEST_SUITE_END()
