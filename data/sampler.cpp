// Samplers and the reproducible shuffle (the algorithm is spelled out in data/sampler.h).
#include "data/sampler.h"

#include <numeric>
#include <utility>

#include "graph/error.h"
#include "graph/random.h"

namespace ember::data {

uint64_t shuffle_key(uint64_t seed, int64_t epoch, uint64_t stream) {
  EMBER_CHECK(epoch >= 0, "shuffle_key: epoch must be non-negative, got {}", epoch);
  return counter_bits(seed, 2 * static_cast<uint64_t>(epoch) + stream);
}

void shuffle(std::vector<int64_t>& values, uint64_t key) {
  uint64_t counter = 0;
  // A uniform draw in [0, m) without modulo bias: reject the top 2^64 mod m values.
  const auto bounded = [&](uint64_t m) {
    const uint64_t limit = -(-m % m);  // 2^64 - (2^64 mod m); 0 stands for 2^64 when m | 2^64
    uint64_t x = counter_bits(key, counter++);
    while (limit != 0 && x >= limit) x = counter_bits(key, counter++);
    return x % m;
  };
  for (size_t i = values.size(); i-- > 1;) std::swap(values[i], values[bounded(i + 1)]);
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  EMBER_CHECK(n >= 0, "SequentialSampler: size must be non-negative, got {}", n);
}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), 0);
  return order;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  EMBER_CHECK(n >= 0, "RandomSampler: size must be non-negative, got {}", n);
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), 0);
  shuffle(order, shuffle_key(seed_, epoch, 0));
  return order;
}

DistributedSampler::DistributedSampler(int64_t n, int64_t num_replicas, int64_t rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : n_(n), num_replicas_(num_replicas), rank_(rank), shuffle_(shuffle), seed_(seed) {
  EMBER_CHECK(n >= 0, "DistributedSampler: size must be non-negative, got {}", n);
  EMBER_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas must be >= 1, got {}",
              num_replicas);
  EMBER_CHECK(rank >= 0 && rank < num_replicas,
              "DistributedSampler: rank {} out of range for {} replicas", rank, num_replicas);
  EMBER_CHECK(drop_last || n > 0 || num_replicas == 1,
              "DistributedSampler: an empty dataset cannot be padded to {} replicas", num_replicas);
  num_samples_ = drop_last ? n / num_replicas : (n + num_replicas - 1) / num_replicas;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), 0);
  if (shuffle_) shuffle(order, shuffle_key(seed_, epoch, 0));
  // Pad by repeating the order from its start (or cut) to num_samples per replica.
  const auto total = static_cast<size_t>(num_samples_ * num_replicas_);
  for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i]);
  order.resize(total);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(num_replicas_))
    mine.push_back(order[i]);
  return mine;
}

}  // namespace ember::data
