// Fashion-MNIST, as torchvision.datasets.FashionMNIST, and the IDX files it comes in (LeCun's
// format of MNIST: a big-endian magic number, the dims, then the elements row-major). The files
// are read through zlib, so a gzipped file (.gz, as Debian's dataset-fashion-mnist installs them)
// and a plain one read alike.
//
// Note [Hostile IDX files]
// A file is read as a stream through a bounded buffer; nothing is allocated from its header
// before the header is checked: the magic number (two zero bytes, the element type 0x08,
// unsigned bytes, and the rank: 2051 for images, 2049 for labels), dims of at least 1 whose
// product stays within kMaxIdxBytes, and then the data itself, which must hold exactly the
// declared number of bytes. A short file, bytes after the declared data (strict, as torchvision's
// reader, which asserts the element count), a corrupt gzip stream (a bad deflate block or
// checksum) and a missing file are each an ember::Error naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "graph/tensor.h"

namespace ember::data {

// The most bytes of data an IDX file may declare (1 GiB; Fashion-MNIST's training images are
// 47 MB); a larger header is taken for a corrupt one.
inline constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 30;

// The images of an IDX file (magic 2051: N x H x W unsigned bytes) as (N, 1, H, W) Float32 in
// [0, 1], each pixel byte / 255 as torchvision's ToTensor.
Tensor read_idx_images(const std::string& path);
// The labels of an IDX file (magic 2049: N unsigned bytes) as (N) Int64.
Tensor read_idx_labels(const std::string& path);

// One image (1, 28, 28) Float32 in [0, 1] and its class in 0..9.
struct ImageExample {
  Tensor image;
  int64_t label;
};

// Images (B, 1, 28, 28) Float32 and their labels (B) Int64: a batch for training.
struct ImageBatch {
  Tensor images;
  Tensor labels;
};

inline constexpr const char* kFashionMNISTRoot = "/usr/share/datasets/fashion-mnist";

class FashionMNIST final : public Dataset<ImageExample> {
 public:
  // Reads root's train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz (train) or the t10k-
  // ones (test), or the same names without .gz. A missing, short or malformed file, image and
  // label counts that differ, images that are not 28 x 28 and labels outside 0..9 are an Error
  // naming the file (Note [Hostile IDX files]).
  explicit FashionMNIST(const std::string& root = kFashionMNISTRoot, bool train = true);

  // "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
  // "Ankle boot": the name of class i.
  static const std::vector<std::string>& classes();

  int64_t size() const override { return data_.size(0); }
  // A copy of image index and its label.
  ImageExample get(int64_t index) const override;

  // The whole dataset at once, as torchvision's .data and .targets (but data is already as
  // ToTensor gives it): (N, 1, 28, 28) Float32 in [0, 1] and (N) Int64. Views of them alias
  // the dataset.
  const Tensor& data() const { return data_; }
  const Tensor& targets() const { return targets_; }
  // The images and labels at indices (a sampler's order, say), copied into new tensors: the
  // training loop's fast path, without an ImageExample per image.
  ImageBatch batch(const std::vector<int64_t>& indices) const;

  // The files read.
  const std::string& images_file() const { return images_file_; }
  const std::string& labels_file() const { return labels_file_; }

 private:
  std::string images_file_, labels_file_;
  Tensor data_, targets_;
};

}  // namespace ember::data
