// DataLoader: batches of a sequence-to-sequence Dataset by a token budget with length bucketing,
// as the Annotated Transformer's torchtext BucketIterator / rebatch. An epoch:
//   1. the sampler gives the order of the examples (RandomSampler(seed) when shuffling);
//   2. that order is cut into pools of pool_size examples (0: one pool, the whole epoch);
//   3. each pool is stably sorted by (src length, tgt length), so ties keep the sampler's order,
//      and cut greedily into batches: an example joins the batch while the batch's padded size,
//      examples x max(longest src, longest tgt), stays within batch_tokens (and its example
//      count within batch_size, when set). An example longer than the budget is a batch alone;
//   4. with shuffle, the batches of pool p are put in a random order (key shuffle_key(seed,
//      epoch, 1) + p).
// collate pads a batch's examples into an nn::Batch: src (B, S) and tgt (B, T + 1) padded with
// `pad`, and the masks, tgt / tgt_y shift and ntokens nn::Batch derives from them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"
#include "data/vocab.h"
#include "nn/transformer.h"

namespace ember::data {

struct DataLoaderOptions {
  int64_t batch_tokens = 4096;  // padded tokens of src, and of tgt, per batch
  int64_t batch_size = 0;       // at most this many examples per batch (0: no limit)
  bool shuffle = true;          // examples and batches in a random order drawn from seed
  uint64_t seed = 0;
  // Drop each pool's last batch when the pool ran out before the budget did (its "incomplete"
  // batch, as torch's drop_last). Sorted by length, those are the pool's longest examples;
  // pools smaller than the epoch make them differ from epoch to epoch.
  bool drop_last = false;
  int64_t pool_size = 0;  // examples sorted together (0: the whole epoch)
  int64_t pad = Vocab::kPad;
};
static_assert(Vocab::kPad == nn::Batch::kDefaultPad, "one pad id by default everywhere");

class DataLoader {
 public:
  // The dataset must not change while the loader lives (it reads the lengths once). sampler:
  // the order of the examples; by default RandomSampler(size, seed) with shuffle, else
  // SequentialSampler.
  DataLoader(std::shared_ptr<const Dataset<Example>> dataset, DataLoaderOptions options = {},
             std::shared_ptr<const Sampler> sampler = nullptr);

  // The batches of an epoch as lists of dataset indices, in the order they are served.
  std::vector<std::vector<int64_t>> plan(int64_t epoch) const;
  // The examples at indices, padded into a Batch (src only when every tgt is empty).
  nn::Batch collate(const std::vector<int64_t>& indices) const;

  // plan(epoch), collated one batch at a time: `for (const nn::Batch& b : loader.epoch(e))`.
  class Epoch {
   public:
    class iterator {
     public:
      nn::Batch operator*() const { return epoch_->loader_->collate(epoch_->plan_[i_]); }
      iterator& operator++() {
        ++i_;
        return *this;
      }
      bool operator==(const iterator& other) const { return i_ == other.i_; }

     private:
      friend Epoch;
      iterator(const Epoch* epoch, size_t i) : epoch_(epoch), i_(i) {}
      const Epoch* epoch_;
      size_t i_;
    };
    iterator begin() const { return {this, 0}; }
    iterator end() const { return {this, plan_.size()}; }
    size_t size() const { return plan_.size(); }
    const std::vector<std::vector<int64_t>>& plan() const { return plan_; }

   private:
    friend DataLoader;
    Epoch(const DataLoader* loader, std::vector<std::vector<int64_t>> plan)
        : loader_(loader), plan_(std::move(plan)) {}
    const DataLoader* loader_;
    std::vector<std::vector<int64_t>> plan_;
  };
  Epoch epoch(int64_t epoch) const { return {this, plan(epoch)}; }

  const Dataset<Example>& dataset() const { return *dataset_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  // Cuts one pool, sorted by length, into batches within the budget.
  std::vector<std::vector<int64_t>> cut(std::vector<int64_t> pool) const;

  std::shared_ptr<const Dataset<Example>> dataset_;
  DataLoaderOptions options_;
  std::shared_ptr<const Sampler> sampler_;
  std::vector<int64_t> src_len_, tgt_len_;
};

}  // namespace ember::data
