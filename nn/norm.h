// Normalisation layers as torch.nn: BatchNorm1d, BatchNorm2d (with their running statistics as
// buffers) and GroupNorm. Parameter and buffer names, shapes, order and initialisation are
// torch's, so a torch state dict loads one to one; forward is one call of the functional op
// (ops/norm.h).
#pragma once

#include <string_view>

#include "nn/module.h"
#include "ops/norm.h"

namespace ember::nn {

namespace detail {

// What BatchNorm1d and BatchNorm2d share (torch's _BatchNorm): weight (ones) and bias (zeros) of
// shape (num_features) unless !affine; the buffers running_mean (zeros), running_var (ones) and
// num_batches_tracked (an Int64 0-d count of training batches) unless !track_running_stats.
// train(): batch statistics, the running ones updated with momentum and num_batches_tracked
// counted; eval(): the running statistics (batch statistics when none are tracked).
template <class D>
class BatchNormBase : public Cloneable<D> {
 public:
  Tensor forward(const Tensor& x);
  // relu(forward(x)) as one op (batch_norm_relu): what nn::Sequential calls for this module
  // followed by a ReLU.
  Tensor forward_relu(const Tensor& x);

  int64_t num_features;
  double eps, momentum;
  bool affine, track_running_stats;
  Tensor weight, bias;                                    // undefined without affine
  Tensor running_mean, running_var, num_batches_tracked;  // undefined without tracking

 protected:
  BatchNormBase(int64_t num_features, double eps, double momentum, bool affine,
                bool track_running_stats);
  BatchNormBase(const BatchNormBase&) = default;

 private:
  Tensor run(const Tensor& x, bool relu);  // forward, or forward_relu with relu
};

}  // namespace detail

// Batch normalisation of (N, C) or (N, C, L) inputs.
class BatchNorm1d : public detail::BatchNormBase<BatchNorm1d> {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
  static void check_input(const Tensor& x);  // an Error unless 2-D or 3-D
  static constexpr std::string_view kName = "BatchNorm1d";

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  BatchNorm1d(const BatchNorm1d&) = default;
};

// Batch normalisation of (N, C, H, W) inputs.
class BatchNorm2d : public detail::BatchNormBase<BatchNorm2d> {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
  static void check_input(const Tensor& x);  // an Error unless 4-D
  static constexpr std::string_view kName = "BatchNorm2d";

 private:
  friend Cloneable;
  BatchNorm2d(const BatchNorm2d&) = default;
};

// Group normalisation of (N, C, *) inputs over num_groups groups of channels; weight (ones) and
// bias (zeros) of shape (num_channels) unless !affine.
class GroupNorm : public Cloneable<GroupNorm> {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) const;

  int64_t num_groups, num_channels;
  double eps;
  bool affine;
  Tensor weight, bias;

 private:
  friend Cloneable;
  GroupNorm(const GroupNorm&) = default;
};

}  // namespace ember::nn
