// Random augmentations of a batch of images, as torchvision's RandomHorizontalFlip and
// RandomCrop applied to each image of a batch on its own. They draw from Ember's global generator
// (graph/random.h), so manual_seed gives the same augmented batches, and a run resumed from a
// checkpoint that restores the generator's state (set_rng_state) sees the batches the first run
// would have seen.
//
// Note [Augmentation draws]
// Each call draws a fixed count of numbers, whatever its arguments: one uniform per image for a
// flip (the image flips when it is < p, as torch.rand(1) < p), two bounded integers per image for
// a crop (its top row, then its left column, as RandomCrop.get_params; a bounded draw is
// randint's). The draws happen serially on the calling thread, before the copying, which splits
// over threads: the result does not depend on the thread count.
//
// Images are (N, C, H, W), or one image (C, H, W); any dtype (the values are only moved). The
// result is a new tensor on the images' device (the work is done on the CPU), outside autograd
// (augmented inputs need no gradient).
#pragma once

#include <cstdint>

#include "graph/tensor.h"

namespace ember::data {

// Each image reversed along its columns (W) with probability p in [0, 1].
Tensor random_horizontal_flip(const Tensor& images, double p = 0.5);

// A size x size window of each image, zero-padded by `padding` on every side first, at a
// uniformly random position: (N, C, size, size). size must fit the padded image.
Tensor random_crop(const Tensor& images, int64_t size, int64_t padding = 0);

}  // namespace ember::data
