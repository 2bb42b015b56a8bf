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

// torch's DistributedSampler: rank `rank` of `num_replicas` gets every num_replicas-th index of
// the epoch's order (RandomSampler(n, seed)'s permutation when shuffling, else 0..n-1), starting
// at its rank, so the replicas' shares are disjoint and together cover the epoch. Every share has
// the same size, ceil(n / num_replicas): the order is padded by repeating its start (or, with
// drop_last, cut to floor(n / num_replicas) per share), so every rank runs the same number of
// steps. Every rank must use the same n and seed. data/ knows no MPI: pass
// distributed::world_size() and distributed::rank().
class DistributedSampler final : public Sampler {
 public:
  DistributedSampler(int64_t n, int64_t num_replicas, int64_t rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);
  std::vector<int64_t> indices(int64_t epoch) const override;
  // Indices per rank and epoch.
  int64_t num_samples() const { return num_samples_; }

 private:
  int64_t n_, num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  int64_t num_samples_;
};

}  // namespace ember::data
