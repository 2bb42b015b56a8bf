// DataLoader: the epoch plan (sampler order, pools sorted by length, cut by the token budget,
// shuffled batches) and collation into nn::Batch. The steps are listed in data/dataloader.h.
#include "data/dataloader.h"

#include <algorithm>

#include "graph/creation.h"

namespace ember::data {

DataLoader::DataLoader(std::shared_ptr<const Dataset<Example>> dataset, DataLoaderOptions options,
                       std::shared_ptr<const Sampler> sampler)
    : dataset_(std::move(dataset)), options_(options), sampler_(std::move(sampler)) {
  EMBER_CHECK(dataset_ != nullptr, "DataLoader: no dataset");
  EMBER_CHECK(options_.batch_tokens >= 1, "DataLoader: batch_tokens must be positive, got {}",
              options_.batch_tokens);
  EMBER_CHECK(options_.batch_size >= 0 && options_.pool_size >= 0,
              "DataLoader: batch_size {} and pool_size {} must be non-negative",
              options_.batch_size, options_.pool_size);
  const int64_t n = dataset_->size();
  if (!sampler_) {
    if (options_.shuffle)
      sampler_ = std::make_shared<RandomSampler>(n, options_.seed);
    else
      sampler_ = std::make_shared<SequentialSampler>(n);
  }
  src_len_.resize(static_cast<size_t>(n));
  tgt_len_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const Example e = dataset_->get(i);
    src_len_[i] = static_cast<int64_t>(e.src.size());
    tgt_len_[i] = static_cast<int64_t>(e.tgt.size());
  }
}

std::vector<std::vector<int64_t>> DataLoader::cut(std::vector<int64_t> pool) const {
  std::stable_sort(pool.begin(), pool.end(), [&](int64_t a, int64_t b) {
    return std::pair(src_len_[a], tgt_len_[a]) < std::pair(src_len_[b], tgt_len_[b]);
  });
  std::vector<std::vector<int64_t>> batches;
  std::vector<int64_t> batch;
  int64_t longest = 0;  // max(src, tgt) length over the batch
  const auto fits = [&](int64_t count, int64_t len) {
    return count * len <= options_.batch_tokens &&
           (options_.batch_size == 0 || count <= options_.batch_size);
  };
  for (int64_t i : pool) {
    const int64_t len = std::max(src_len_[i], tgt_len_[i]);
    const auto count = static_cast<int64_t>(batch.size()) + 1;
    if (!batch.empty() && !fits(count, std::max(longest, len))) {
      batches.push_back(std::move(batch));
      batch.clear();
      longest = 0;
    }
    batch.push_back(i);
    longest = std::max(longest, len);
  }
  if (!batch.empty()) {
    // The pool ran out first when one more example as long as the batch's longest would fit.
    const bool incomplete = fits(static_cast<int64_t>(batch.size()) + 1, longest);
    if (!(options_.drop_last && incomplete)) batches.push_back(std::move(batch));
  }
  return batches;
}

std::vector<std::vector<int64_t>> DataLoader::plan(int64_t epoch) const {
  const std::vector<int64_t> order = sampler_->indices(epoch);
  const auto n = static_cast<int64_t>(order.size());
  const int64_t pool_size = options_.pool_size == 0 ? std::max<int64_t>(n, 1) : options_.pool_size;
  std::vector<std::vector<int64_t>> batches;
  for (int64_t begin = 0, p = 0; begin < n; begin += pool_size, ++p) {
    for (int64_t i = begin; i < std::min(n, begin + pool_size); ++i)
      EMBER_CHECK(order[i] >= 0 && order[i] < dataset_->size(),
                  "DataLoader: the sampler gave index {} for a dataset of {}", order[i],
                  dataset_->size());
    std::vector<std::vector<int64_t>> pool_batches = cut(std::vector<int64_t>(
        order.begin() + begin, order.begin() + std::min(n, begin + pool_size)));
    if (options_.shuffle) {
      // Shuffle positions, then move the batches into that order.
      std::vector<int64_t> where(pool_batches.size());
      for (size_t i = 0; i < where.size(); ++i) where[i] = static_cast<int64_t>(i);
      shuffle(where, shuffle_key(options_.seed, epoch, 1) + static_cast<uint64_t>(p));
      for (int64_t w : where) batches.push_back(std::move(pool_batches[w]));
    } else {
      for (auto& b : pool_batches) batches.push_back(std::move(b));
    }
  }
  return batches;
}

nn::Batch DataLoader::collate(const std::vector<int64_t>& indices) const {
  EMBER_CHECK(!indices.empty(), "DataLoader::collate: no examples");
  std::vector<Example> examples;
  examples.reserve(indices.size());
  int64_t S = 0, T = 0;
  for (int64_t i : indices) {
    examples.push_back(dataset_->get(i));
    S = std::max(S, static_cast<int64_t>(examples.back().src.size()));
    T = std::max(T, static_cast<int64_t>(examples.back().tgt.size()));
  }
  const auto B = static_cast<int64_t>(examples.size());
  std::vector<int64_t> src(B * S, options_.pad), tgt(B * T, options_.pad);
  for (int64_t b = 0; b < B; ++b) {
    const Example& e = examples[b];
    EMBER_CHECK(T == 0 || e.tgt.size() >= 2,
                "DataLoader::collate: example {} has a target of {} tokens; a batch needs every "
                "target to have at least 2 (<s> ... </s>) or all to be empty",
                indices[b], e.tgt.size());
    std::copy(e.src.begin(), e.src.end(), src.begin() + b * S);
    std::copy(e.tgt.begin(), e.tgt.end(), tgt.begin() + b * T);
  }
  const Tensor src_tensor = from_vector(src, {B, S});
  if (T == 0) return nn::Batch(src_tensor, {}, options_.pad);
  return nn::Batch(src_tensor, from_vector(tgt, {B, T}), options_.pad);
}

}  // namespace ember::data
