// Resampling as a layer, torch.nn's name and arguments: Upsample, interpolate (ops/resample.h) to
// a fixed output size over (N, C, spatial…) inputs. It holds no parameters or buffers, only its
// options, and runs in a Sequential.
#pragma once

#include <optional>
#include <string>

#include "nn/module.h"
#include "ops/resample.h"

namespace ember::nn {

// torch.nn.Upsample(size, mode, align_corners): interpolate with these options ("nearest" on 3-D
// to 5-D inputs, "linear" on 3-D, "bilinear" on 4-D; align_corners with the last two only). As
// torch's, the options are checked against the input by interpolate, at forward.
class Upsample : public Cloneable<Upsample> {
 public:
  explicit Upsample(IntList size, std::string mode = "nearest",
                    std::optional<bool> align_corners = {});
  Tensor forward(const Tensor& x) const;

  IntList size;
  std::string mode;
  std::optional<bool> align_corners;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  Upsample(const Upsample&) = default;
};

}  // namespace ember::nn
