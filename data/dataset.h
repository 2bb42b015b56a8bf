// The dataset interface, in the spirit of torch.utils.data.Dataset: a size and the item at an
// index. Example is the item of sequence-to-sequence data, the one DataLoader batches.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/error.h"

namespace ember::data {

template <class Item>
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The item at index in [0, size()); the same item every call.
  virtual Item get(int64_t index) const = 0;
};

// Token ids of one source sequence and its target, as they go into the padded tensors: tgt
// usually starts with <s> and ends with </s> (Vocab::encode(tokens, true, true)), src as the
// task reads it. An empty tgt means "no target" (inference).
struct Example {
  std::vector<int64_t> src, tgt;
  bool operator==(const Example&) const = default;
};

// Examples held in memory.
class ExampleDataset final : public Dataset<Example> {
 public:
  explicit ExampleDataset(std::vector<Example> examples) : examples_(std::move(examples)) {}
  int64_t size() const override { return static_cast<int64_t>(examples_.size()); }
  Example get(int64_t index) const override {
    EMBER_CHECK(index >= 0 && index < size(), "ExampleDataset: index {} out of range for {}", index,
                size());
    return examples_[static_cast<size_t>(index)];
  }
  const std::vector<Example>& examples() const { return examples_; }

 private:
  std::vector<Example> examples_;
};

}  // namespace ember::data
