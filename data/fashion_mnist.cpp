// The IDX reader (a gzip or plain stream through zlib, checked as Note [Hostile IDX files] says)
// and the Fashion-MNIST dataset built on it.
#include "data/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "graph/creation.h"
#include "graph/error.h"
#include "graph/strided.h"

namespace ember::data {

namespace {

constexpr size_t kChunk = size_t{1} << 20;         // bytes per read of the data
constexpr size_t kFirstReserve = size_t{1} << 26;  // the most reserved before data arrives

std::string errno_text(int err) { return std::generic_category().message(err); }

// One file, gzipped or plain (zlib reads a file without the gzip magic as it is), read in order.
class IdxStream {
 public:
  IdxStream(std::string_view op, const std::string& path) : op_(op), path_(path) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    EMBER_CHECK(std::filesystem::exists(status), "{}: cannot open '{}': {}", op_, path_,
                ec ? ec.message() : errno_text(ENOENT));
    EMBER_CHECK(std::filesystem::is_regular_file(status),
                "{}: cannot read '{}': it is not a regular file", op_, path_);
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    EMBER_CHECK(file_ != nullptr, "{}: cannot open '{}': {}", op_, path_,
                errno != 0 ? errno_text(errno) : "zlib is out of memory");
    gzbuffer(file_, 1 << 17);
  }
  ~IdxStream() { gzclose(file_); }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  // Up to n bytes into dst; fewer only where the data ends. A read or gzip error throws.
  size_t read(uint8_t* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const auto want = static_cast<unsigned>(std::min(n - done, kChunk));
      const int got = gzread(file_, dst + done, want);
      if (got < 0) throw_stream_error();
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

  // Reads on through a small buffer to the end of the file, or past `limit` bytes (a stream that
  // inflates without end is not read to its end); the number of bytes read.
  uint64_t skip_rest(uint64_t limit) {
    uint8_t buffer[1 << 14];
    uint64_t rest = 0;
    for (size_t got; rest <= limit && (got = read(buffer, sizeof buffer)) > 0;) rest += got;
    return rest;
  }

  // Said after "is truncated": why the data ended, where zlib knows.
  std::string why_short() const {
    int err = Z_OK;
    gzerror(file_, &err);
    return err == Z_BUF_ERROR ? " (its gzip stream is cut short)" : "";
  }
  // The data ended where it should: a gzip stream must have ended there too.
  void check_complete() const {
    int err = Z_OK;
    gzerror(file_, &err);
    EMBER_CHECK(err != Z_BUF_ERROR,
                "{}: '{}' is truncated: its gzip stream is cut short after the data", op_, path_);
  }

 private:
  [[noreturn]] void throw_stream_error() const {
    int err = Z_OK;
    const char* what = gzerror(file_, &err);
    if (err == Z_ERRNO)
      throw Error(fmt::format("{}: error reading '{}': {}", op_, path_, errno_text(errno)));
    throw Error(fmt::format("{}: '{}' is not a valid gzip file: {}", op_, path_,
                            what != nullptr ? what : "zlib error"));
  }

  std::string op_, path_;
  gzFile file_ = nullptr;
};

uint32_t big_endian(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

struct Idx {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};

// What the dims declare, for messages: "60000 images of 28 x 28", "60000 labels".
std::string declared(const std::vector<int64_t>& dims) {
  return dims.size() == 3 ? fmt::format("{} images of {} x {}", dims[0], dims[1], dims[2])
                          : fmt::format("{} labels", dims[0]);
}

// The dims and data of the IDX file at path holding unsigned bytes in `rank` dims (3: images,
// 1: labels), checked as Note [Hostile IDX files] says.
Idx read_idx(std::string_view op, const std::string& path, int rank) {
  IdxStream in(op, path);
  const uint32_t magic_expected = 0x0800u + static_cast<uint32_t>(rank);
  const char* kind = rank == 3 ? "images" : "labels";
  uint8_t header[16] = {};
  size_t got = in.read(header, 4);
  EMBER_CHECK(got == 4,
              "{}: '{}' is truncated: {} bytes, an IDX file starts with a 4-byte magic "
              "number{}",
              op, path, got, in.why_short());
  const uint32_t magic = big_endian(header);
  EMBER_CHECK(header[0] == 0 && header[1] == 0,
              "{}: '{}' is not an IDX file: its magic number is {} (0x{:08x}), an IDX file of {} "
              "has {} (0x{:08x})",
              op, path, magic, magic, kind, magic_expected, magic_expected);
  EMBER_CHECK(header[2] == 0x08,
              "{}: '{}' has magic number {} (0x{:08x}): elements of type 0x{:02x}, where only "
              "unsigned bytes (0x08: magic number {} for {}) are read",
              op, path, magic, magic, header[2], magic_expected, kind);
  EMBER_CHECK(header[3] == rank,
              "{}: '{}' has magic number {} (0x{:08x}): {} dims, where an IDX file of {} has {} "
              "(magic number {})",
              op, path, magic, magic, header[3], kind, rank, magic_expected);
  const auto dims_bytes = static_cast<size_t>(4 * rank);
  got = in.read(header + 4, dims_bytes);
  EMBER_CHECK(got == dims_bytes,
              "{}: '{}' is truncated: its header ends after {} bytes, an IDX file of {} has {}{}",
              op, path, 4 + got, kind, 4 + dims_bytes, in.why_short());

  Idx idx;
  for (int d = 0; d < rank; ++d) idx.dims.push_back(big_endian(header + 4 + 4 * d));
  // An empty file (no images) is fine, an image of no rows or columns is not.
  EMBER_CHECK(rank == 1 || (idx.dims[1] >= 1 && idx.dims[2] >= 1),
              "{}: '{}' declares {}: an image needs a row and a column", op, path,
              declared(idx.dims));
  uint64_t total = 1;  // stays within kMaxIdxBytes (< 2^32), so total * dim never overflows
  for (int64_t dim : idx.dims) {
    total *= static_cast<uint64_t>(dim);
    EMBER_CHECK(total <= kMaxIdxBytes,
                "{}: '{}' declares {}: over the {} bytes of data an IDX file may hold (a corrupt "
                "header?)",
                op, path, declared(idx.dims), kMaxIdxBytes);
  }
  // The buffer grows with the data actually read, from at most kFirstReserve.
  idx.bytes.reserve(std::min<uint64_t>(total, kFirstReserve));
  while (idx.bytes.size() < total) {
    const size_t at = idx.bytes.size();
    const size_t want = std::min<uint64_t>(kChunk, total - at);
    idx.bytes.resize(at + want);
    got = in.read(idx.bytes.data() + at, want);
    EMBER_CHECK(got == want,
                "{}: '{}' is truncated: its header declares {} ({} bytes of data) but the "
                "file holds {}{}",
                op, path, declared(idx.dims), total, at + got, in.why_short());
  }
  const uint64_t rest = in.skip_rest(kChunk);
  EMBER_CHECK(rest == 0,
              "{}: '{}' has {}{} bytes after the {} bytes of data its header declares ({})", op,
              path, rest > kChunk ? "more than " : "", std::min<uint64_t>(rest, kChunk), total,
              declared(idx.dims));
  in.check_complete();
  return idx;
}

// (N, 1, H, W) Float32 in [0, 1] of an IDX file of images: byte / 255, as torchvision's ToTensor.
Tensor images_tensor(const Idx& idx) {
  Tensor out = empty({idx.dims[0], 1, idx.dims[1], idx.dims[2]}, kFloat32);
  float* dout = out.data<float>();
  const uint8_t* din = idx.bytes.data();
  parallel_for(static_cast<int64_t>(idx.bytes.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dout[i] = static_cast<float>(din[i]) / 255.0f;
  });
  return out;
}

Tensor labels_tensor(const Idx& idx) {
  Tensor out = empty({idx.dims[0]}, kInt64);
  std::copy(idx.bytes.begin(), idx.bytes.end(), out.data<int64_t>());
  return out;
}

// root/stem.gz, else root/stem.
std::string find_file(const std::string& root, const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(root) / (stem + ".gz"), plain = fs::path(root) / stem;
  if (fs::exists(gz)) return gz.string();
  if (fs::exists(plain)) return plain.string();
  EMBER_CHECK(fs::is_directory(root),
              "FashionMNIST: cannot open the directory '{}': {} (Debian's "
              "dataset-fashion-mnist installs the data in {})",
              root, errno_text(ENOENT), kFashionMNISTRoot);
  throw Error(fmt::format("FashionMNIST: cannot open '{}': {} (nor '{}')", gz.string(),
                          errno_text(ENOENT), plain.string()));
}

constexpr int64_t kSide = 28, kPixels = kSide * kSide;

}  // namespace

Tensor read_idx_images(const std::string& path) {
  return images_tensor(read_idx("read_idx_images", path, 3));
}

Tensor read_idx_labels(const std::string& path) {
  return labels_tensor(read_idx("read_idx_labels", path, 1));
}

FashionMNIST::FashionMNIST(const std::string& root, bool train) {
  const std::string split = train ? "train" : "t10k";
  images_file_ = find_file(root, split + "-images-idx3-ubyte");
  labels_file_ = find_file(root, split + "-labels-idx1-ubyte");
  const Idx labels = read_idx("FashionMNIST", labels_file_, 1);
  for (size_t i = 0; i < labels.bytes.size(); ++i)
    EMBER_CHECK(labels.bytes[i] < classes().size(),
                "FashionMNIST: '{}' has label {} at index {}, "
                "where Fashion-MNIST's classes are 0..{}",
                labels_file_, labels.bytes[i], i, classes().size() - 1);
  const Idx images = read_idx("FashionMNIST", images_file_, 3);
  EMBER_CHECK(images.dims[1] == kSide && images.dims[2] == kSide,
              "FashionMNIST: '{}' holds images of {} x {}, where Fashion-MNIST's are {} x {}",
              images_file_, images.dims[1], images.dims[2], kSide, kSide);
  EMBER_CHECK(images.dims[0] == labels.dims[0],
              "FashionMNIST: '{}' holds {} images but '{}' holds {} labels", images_file_,
              images.dims[0], labels_file_, labels.dims[0]);
  data_ = images_tensor(images);
  targets_ = labels_tensor(labels);
}

const std::vector<std::string>& FashionMNIST::classes() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                 "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                 "Bag",         "Ankle boot"};
  return names;
}

ImageExample FashionMNIST::get(int64_t index) const {
  EMBER_CHECK(index >= 0 && index < size(), "FashionMNIST: index {} out of range for {} images",
              index, size());
  Tensor image = empty({1, kSide, kSide}, kFloat32);
  std::memcpy(image.data<float>(), data_.data<float>() + index * kPixels, kPixels * sizeof(float));
  return {image, targets_.data<int64_t>()[index]};
}

ImageBatch FashionMNIST::batch(const std::vector<int64_t>& indices) const {
  const auto b = static_cast<int64_t>(indices.size());
  Tensor images = empty({b, 1, kSide, kSide}, kFloat32), labels = empty({b}, kInt64);
  const float* src = data_.data<float>();
  float* dst = images.data<float>();
  int64_t* dlabels = labels.data<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t index = indices[static_cast<size_t>(i)];
    EMBER_CHECK(index >= 0 && index < size(),
                "FashionMNIST::batch: index {} (at {}) out of range for {} images", index, i,
                size());
    std::memcpy(dst + i * kPixels, src + index * kPixels, kPixels * sizeof(float));
    dlabels[i] = targets_.data<int64_t>()[index];
  }
  return {images, labels};
}

}  // namespace ember::data
