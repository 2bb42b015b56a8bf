// BatchNorm1d, BatchNorm2d and GroupNorm: registration in torch's order, torch's initialisation,
// and the running statistics' bookkeeping of train() and eval().
#include "nn/norm.h"

#include "graph/autograd.h"
#include "graph/creation.h"

namespace ember::nn {

namespace detail {

template <class D>
BatchNormBase<D>::BatchNormBase(int64_t num_features, double eps, double momentum, bool affine,
                                bool track_running_stats)
    : num_features(num_features),
      eps(eps),
      momentum(momentum),
      affine(affine),
      track_running_stats(track_running_stats) {
  const std::string_view name = D::kName;
  EMBER_CHECK(num_features > 0, "{}: num_features must be positive, got {}", name, num_features);
  EMBER_CHECK(eps >= 0, "{}: eps must be non-negative, got {}", name, eps);
  if (affine) {
    this->register_parameter("weight", weight, ones({num_features}));
    this->register_parameter("bias", bias, zeros({num_features}));
  }
  if (track_running_stats) {
    this->register_buffer("running_mean", running_mean, zeros({num_features}));
    this->register_buffer("running_var", running_var, ones({num_features}));
    this->register_buffer("num_batches_tracked", num_batches_tracked, zeros({}, kInt64));
  }
}

// As torch's _BatchNorm.forward: batch statistics in training (or in eval when no running
// statistics are tracked); the running ones are updated only when tracked.
template <class D>
Tensor BatchNormBase<D>::forward(const Tensor& x) {
  return run(x, false);
}

template <class D>
Tensor BatchNormBase<D>::forward_relu(const Tensor& x) {
  return run(x, true);
}

template <class D>
Tensor BatchNormBase<D>::run(const Tensor& x, bool relu) {
  D::check_input(x);
  const bool training = this->is_training();
  if (training && track_running_stats) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(1.0);
  }
  const bool batch_stats = training || !running_mean.defined();
  const bool pass_running = !training || track_running_stats;
  const Tensor rm = pass_running ? running_mean : Tensor();
  const Tensor rv = pass_running ? running_var : Tensor();
  return relu ? batch_norm_relu(x, rm, rv, weight, bias, batch_stats, momentum, eps)
              : batch_norm(x, rm, rv, weight, bias, batch_stats, momentum, eps);
}

template class BatchNormBase<BatchNorm1d>;
template class BatchNormBase<BatchNorm2d>;

}  // namespace detail

BatchNorm1d::BatchNorm1d(int64_t num_features, double eps, double momentum, bool affine,
                         bool track_running_stats)
    : BatchNormBase(num_features, eps, momentum, affine, track_running_stats) {}

void BatchNorm1d::check_input(const Tensor& x) {
  EMBER_CHECK(x.defined() && (x.dim() == 2 || x.dim() == 3),
              "BatchNorm1d: expected a 2-D (N, C) or 3-D (N, C, L) input, got {}",
              x.defined() ? fmt::format("shape {}", x.shape()) : std::string("an undefined one"));
}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum, bool affine,
                         bool track_running_stats)
    : BatchNormBase(num_features, eps, momentum, affine, track_running_stats) {}

void BatchNorm2d::check_input(const Tensor& x) {
  EMBER_CHECK(x.defined() && x.dim() == 4, "BatchNorm2d: expected a 4-D (N, C, H, W) input, got {}",
              x.defined() ? fmt::format("shape {}", x.shape()) : std::string("an undefined one"));
}

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, double eps, bool affine)
    : num_groups(num_groups), num_channels(num_channels), eps(eps), affine(affine) {
  EMBER_CHECK(num_groups > 0 && num_channels > 0,
              "GroupNorm: num_groups {} and num_channels {} must be positive", num_groups,
              num_channels);
  EMBER_CHECK(num_channels % num_groups == 0,
              "GroupNorm: num_channels {} must be divisible by num_groups {}", num_channels,
              num_groups);
  EMBER_CHECK(eps >= 0, "GroupNorm: eps must be non-negative, got {}", eps);
  if (!affine) return;
  register_parameter("weight", weight, ones({num_channels}));
  register_parameter("bias", bias, zeros({num_channels}));
}

Tensor GroupNorm::forward(const Tensor& x) const {
  return group_norm(x, num_groups, weight, bias, eps);
}

}  // namespace ember::nn
