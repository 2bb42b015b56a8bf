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

}  // namespace ember::data
