// Samplers, as torch.utils.data's: the order in which an epoch visits a dataset's indices. The
// order is a pure function of the epoch (torch's set_epoch made stateless), so a resumed run
// replays it and a DistributedSampler can give each rank its share of the same permutation.
//
// Shuffling is exactly reproducible outside Ember (bench/pytorch mirrors it): a draw is
// counter_bits(key, c) (SplitMix64, graph/random.h) for c = 0, 1, ...; shuffle() is Fisher-Yates,
// for i = n-1 down to 1 swap a[i] with a[j], j = bounded draw in [0, i]; a bounded draw in
// [0, m) rejects x >= 2^64 - (2^64 mod m) and returns x mod m. The key of (seed, epoch, stream)
// is counter_bits(seed, 2 * epoch + stream): stream 0 orders the examples, stream 1 the batches.
#pragma once

#include <cstdint>
#include <vector>

namespace ember::data {

uint64_t shuffle_key(uint64_t seed, int64_t epoch, uint64_t stream);
// Permutes values in place, the same way for the same key (the algorithm above).
void shuffle(std::vector<int64_t>& values, uint64_t key);

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The dataset indices that `epoch` visits, in order.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler final : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_;
};

// A permutation of 0..n-1 drawn from (seed, epoch): the same for the same pair, new each epoch.
class RandomSampler final : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_;
  uint64_t seed_;
};

}  // namespace ember::data
