// Fashion-MNIST and its IDX reader: the real dataset against numbers read from the same files by
// tests/golden/gen_fashion_mnist.py (skipped when dataset-fashion-mnist is absent), classes(),
// hostile IDX files written here (each an Error naming the file and the fault), and the batch
// augmentations: shapes, flips and crops against references drawn from the same generator,
// determinism under manual_seed and across a restored generator state, and their errors.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;
namespace fs = std::filesystem;
using data::FashionMNIST;

namespace {

// --- writing IDX files ---------------------------------------------------------------------------

void put_be32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((v >> shift) & 0xff);
}
void put_le(std::string& out, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

// An IDX file: the magic number, the dims, then body.
std::string idx_file(uint32_t magic, const std::vector<uint32_t>& dims, const std::string& body) {
  std::string out;
  put_be32(out, magic);
  for (uint32_t d : dims) put_be32(out, d);
  return out + body;
}

// n bytes counting up from `first` (mod 256).
std::string ramp(size_t n, int first = 0) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>((first + i) & 0xff);
  return out;
}

uint32_t crc32(const std::string& data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// data as a gzip file of stored (uncompressed) deflate blocks, written without zlib (RFC 1951
// 3.2.4, RFC 1952): a reader that zlib did not write.
std::string gzip_stored(const std::string& data) {
  std::string out("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff", 10);
  size_t at = 0;
  do {
    const size_t n = std::min<size_t>(65535, data.size() - at);
    out += static_cast<char>(at + n == data.size() ? 1 : 0);  // BFINAL, BTYPE 00
    put_le(out, static_cast<uint32_t>(n), 2);
    put_le(out, static_cast<uint32_t>(~n & 0xffff), 2);
    out.append(data, at, n);
    at += n;
  } while (at < data.size());
  put_le(out, crc32(data), 4);
  put_le(out, static_cast<uint32_t>(data.size()), 4);
  return out;
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  BOOST_TEST_REQUIRE(out.good(), "cannot write " << path.string());
}

// A directory of its own for the hostile files, removed at the end.
struct TempDir {
  fs::path path = fs::temp_directory_path() / fmt::format("ember_fashion_mnist_{}", ::getpid());
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  // Writes bytes to name and returns its path.
  std::string file(const std::string& name, const std::string& bytes) const {
    write_file(path / name, bytes);
    return (path / name).string();
  }
};

// A Fashion-MNIST directory of n images (28 x 28, pixel i of image k: (k + i) mod 256) and labels
// k mod 10, gzipped or plain; `labels` replaces the labels when given.
void write_split(const fs::path& dir, const std::string& split, uint32_t n, bool gz,
                 const std::string& labels = "") {
  std::string pixels;
  for (uint32_t k = 0; k < n; ++k) pixels += ramp(784, static_cast<int>(k));
  std::string label_bytes = labels;
  for (uint32_t k = 0; labels.empty() && k < n; ++k) label_bytes += static_cast<char>(k % 10);
  const std::string images = idx_file(2051, {n, 28, 28}, pixels);
  const std::string label_file =
      idx_file(2049, {static_cast<uint32_t>(label_bytes.size())}, label_bytes);
  const std::string ext = gz ? ".gz" : "";
  write_file(dir / (split + "-images-idx3-ubyte" + ext), gz ? gzip_stored(images) : images);
  write_file(dir / (split + "-labels-idx1-ubyte" + ext), gz ? gzip_stored(label_file) : label_file);
}

// Same shape, dtype and values.
bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         a.to_vector<double>() == b.to_vector<double>();
}

// --- the real dataset ----------------------------------------------------------------------------

bool have_dataset() {
  if (fs::exists(fs::path(data::kFashionMNISTRoot) / "t10k-labels-idx1-ubyte.gz")) return true;
  BOOST_TEST_MESSAGE("skipped: " << data::kFashionMNISTRoot
                                 << " is absent (make deps installs dataset-fashion-mnist)");
  return false;
}

// The byte behind a pixel: ToTensor's x = b / 255 gives b back exactly.
int64_t byte_of(float x) { return std::lround(static_cast<double>(x) * 255.0); }

void check_split(const FashionMNIST& ds, const std::string& split) {
  const Golden golden("fashion_mnist.json");
  const int64_t n = golden[split + ".size"].item<int64_t>();
  BOOST_TEST(ds.size() == n);
  BOOST_TEST((ds.data().shape() == Shape{n, 1, 28, 28}));
  BOOST_TEST((ds.targets().shape() == Shape{n}));
  BOOST_TEST((ds.data().dtype() == kFloat32 && ds.targets().dtype() == kInt64));
  BOOST_TEST(ds.images_file().ends_with(split + "-images-idx3-ubyte.gz"));

  const auto labels = ds.targets().to_vector<int64_t>();
  const auto first = golden[split + ".first_labels"].to_vector<int64_t>();
  BOOST_TEST(std::vector<int64_t>(labels.begin(), labels.begin() + 16) == first,
             boost::test_tools::per_element());
  std::vector<int64_t> histogram(10);
  for (int64_t l : labels) ++histogram.at(static_cast<size_t>(l));
  BOOST_TEST(histogram == golden[split + ".histogram"].to_vector<int64_t>(),
             boost::test_tools::per_element());

  // Every pixel is a byte / 255 in float, the whole split sums to the file's bytes.
  const float* pixels = ds.data().data<float>();
  int64_t total = 0;
  bool exact = true;
  for (int64_t i = 0; i < ds.data().numel(); ++i) {
    const int64_t b = byte_of(pixels[i]);
    exact = exact && pixels[i] == static_cast<float>(b) / 255.0f;
    total += b;
  }
  BOOST_TEST(exact);
  BOOST_TEST(total == golden[split + ".total_sum"].item<int64_t>());
  const auto row = golden[split + ".row14"].to_vector<int64_t>();
  for (int64_t x = 0; x < 28; ++x)
    BOOST_TEST(pixels[14 * 28 + x] == static_cast<float>(row[static_cast<size_t>(x)]) / 255.0f);

  // get and batch give the same images and labels as data() and targets().
  const auto picks = golden[split + ".picks"].to_vector<int64_t>();
  const auto sums = golden[split + ".pick_sums"].to_vector<int64_t>();
  const auto pick_labels = golden[split + ".pick_labels"].to_vector<int64_t>();
  const data::ImageBatch batch = ds.batch(picks);
  BOOST_TEST((batch.images.shape() == Shape{5, 1, 28, 28}));
  for (size_t k = 0; k < picks.size(); ++k) {
    const data::ImageExample e = ds.get(picks[k]);
    BOOST_TEST((e.image.shape() == Shape{1, 28, 28}));
    BOOST_TEST(e.label == pick_labels[k]);
    BOOST_TEST(batch.labels.to_vector<int64_t>()[k] == pick_labels[k]);
    int64_t sum = 0;
    for (float x : e.image.to_vector<float>()) sum += byte_of(x);
    BOOST_TEST(sum == sums[k], split << " image " << picks[k]);
    BOOST_TEST(same(batch.images.select(0, static_cast<int64_t>(k)), e.image));
  }
  expect_error([&] { ds.get(n); }, {"FashionMNIST", std::to_string(n), "out of range"});
  expect_error([&] { ds.get(-1); }, {"FashionMNIST", "-1", "out of range"});
  expect_error([&] { ds.batch({0, n}); }, {"FashionMNIST::batch", std::to_string(n)});
}

// --- transforms ----------------------------------------------------------------------------------

// (N, C, H, W) Float32 of distinct values.
Tensor numbered(int64_t n, int64_t c, int64_t h, int64_t w) {
  return arange(1, 1 + static_cast<double>(n * c * h * w)).reshape({n, c, h, w});
}

// The crop of image n of x (N, C, H, W) at (top, left) of x zero-padded by padding: the plain loop.
std::vector<float> crop_reference(const Tensor& x, int64_t n, int64_t top, int64_t left,
                                  int64_t size, int64_t padding) {
  const int64_t C = x.size(1), H = x.size(2), W = x.size(3);
  std::vector<float> out;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < size; ++y)
      for (int64_t j = 0; j < size; ++j) {
        const int64_t r = top + y - padding, col = left + j - padding;
        const bool inside = r >= 0 && r < H && col >= 0 && col < W;
        out.push_back(inside ? x.data<float>()[((n * C + c) * H + r) * W + col] : 0.0f);
      }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_fashion_mnist)

BOOST_AUTO_TEST_CASE(classes_in_order) {
  const auto& c = FashionMNIST::classes();
  BOOST_TEST(c.size() == 10u);
  BOOST_TEST(c.front() == "T-shirt/top");
  BOOST_TEST(c[5] == "Sandal");
  BOOST_TEST(c.back() == "Ankle boot");
}

BOOST_AUTO_TEST_CASE(real_training_set) {
  if (!have_dataset()) return;
  const auto start = std::chrono::steady_clock::now();
  const FashionMNIST train;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST_MESSAGE("FashionMNIST(train) loaded in " << seconds << " s");
  check_split(train, "train");
}

BOOST_AUTO_TEST_CASE(real_test_set_and_readers) {
  if (!have_dataset()) return;
  const FashionMNIST test(data::kFashionMNISTRoot, false);
  check_split(test, "t10k");
  // The free readers give the same tensors.
  const Tensor images = data::read_idx_images(test.images_file());
  const Tensor labels = data::read_idx_labels(test.labels_file());
  BOOST_TEST(same(images, test.data()));
  BOOST_TEST(same(labels, test.targets()));
}

BOOST_AUTO_TEST_CASE(written_dataset_gzipped_and_plain) {
  const TempDir dir;
  write_split(dir.path, "train", 3, true);
  write_split(dir.path, "t10k", 2, false);  // the names without .gz are read too
  const FashionMNIST train(dir.path.string()), test(dir.path.string(), false);
  BOOST_TEST(train.size() == 3);
  BOOST_TEST(test.size() == 2);
  BOOST_TEST(test.images_file() == (dir.path / "t10k-images-idx3-ubyte").string());
  BOOST_TEST((train.targets().to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2}));
  const data::ImageExample e = train.get(2);
  BOOST_TEST(e.label == 2);
  const auto px = e.image.to_vector<float>();
  for (int i : {0, 1, 253, 783}) BOOST_TEST(px[i] == static_cast<float>((2 + i) % 256) / 255.0f);
  // An empty batch, and a batch that repeats an index.
  BOOST_TEST((train.batch({}).images.shape() == Shape{0, 1, 28, 28}));
  const data::ImageBatch b = train.batch({1, 1, 0});
  BOOST_TEST((b.labels.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 0}));
  BOOST_TEST(same(b.images.select(0, 0), train.get(1).image));
  // read_idx_images of a file with other sizes: (N, 1, H, W).
  const std::string odd = dir.file("odd-idx3-ubyte", idx_file(2051, {2, 3, 5}, ramp(30)));
  const Tensor odd_images = data::read_idx_images(odd);
  BOOST_TEST((odd_images.shape() == Shape{2, 1, 3, 5}));
  BOOST_TEST(odd_images.to_vector<float>()[29] == 29.0f / 255.0f);
  const std::string none = dir.file("none-idx3-ubyte", idx_file(2051, {0, 28, 28}, ""));
  BOOST_TEST((data::read_idx_images(none).shape() == Shape{0, 1, 28, 28}));
}

BOOST_AUTO_TEST_CASE(missing_files) {
  const TempDir dir;
  const std::string missing = (dir.path / "nothing-idx3-ubyte.gz").string();
  expect_error([&] { data::read_idx_images(missing); },
               {"read_idx_images", missing, "No such file"});
  expect_error([&] { data::read_idx_labels(dir.path.string()); },
               {"read_idx_labels", dir.path.string(), "not a regular file"});
  const std::string no_root = (dir.path / "no-such-dir").string();
  expect_error([&] { FashionMNIST ds(no_root); },
               {"FashionMNIST", no_root, "cannot open the directory", "dataset-fashion-mnist"});
  expect_error(
      [&] { FashionMNIST ds(dir.path.string()); },
      {"FashionMNIST", (dir.path / "train-images-idx3-ubyte.gz").string(), "No such file"});
  write_split(dir.path, "train", 2, true);
  expect_error([&] { FashionMNIST ds(dir.path.string(), false); },
               {"FashionMNIST", "t10k-images-idx3-ubyte.gz"});
}

BOOST_AUTO_TEST_CASE(truncated_files) {
  const TempDir dir;
  const std::string empty = dir.file("empty.gz", "");
  expect_error([&] { data::read_idx_images(empty); },
               {"read_idx_images", empty, "truncated", "0 bytes", "4-byte magic"});
  std::string header = idx_file(2051, {3, 2}, "");  // two of the three dims
  const std::string short_header = dir.file("short-header", header + "\x01");
  expect_error([&] { data::read_idx_images(short_header); },
               {short_header, "truncated", "header ends after 13 bytes", "has 16"});
  const std::string short_data = dir.file("short-data", idx_file(2051, {3, 2, 2}, ramp(10)));
  expect_error([&] { data::read_idx_images(short_data); },
               {short_data, "truncated", "3 images of 2 x 2 (12 bytes of data)", "holds 10"});
  const std::string short_labels = dir.file("short-labels", idx_file(2049, {1000}, ramp(999)));
  expect_error([&] { data::read_idx_labels(short_labels); },
               {"read_idx_labels", short_labels, "1000 labels", "holds 999"});
  // A gzip stream cut in the middle of its data, and one cut in its trailer (all data there).
  const std::string gz = gzip_stored(idx_file(2051, {3, 2, 2}, ramp(12)));
  const std::string cut = dir.file("cut.gz", gz.substr(0, gz.size() - 14));
  expect_error([&] { data::read_idx_images(cut); },
               {cut, "truncated", "holds 6", "gzip stream is cut short"});
  const std::string cut_trailer = dir.file("cut-trailer.gz", gz.substr(0, gz.size() - 3));
  expect_error([&] { data::read_idx_images(cut_trailer); },
               {cut_trailer, "truncated", "gzip stream is cut short"});
  // The whole stream reads (the writer above is a valid gzip writer).
  BOOST_TEST((data::read_idx_images(dir.file("whole.gz", gz)).shape() == Shape{3, 1, 2, 2}));
}

BOOST_AUTO_TEST_CASE(wrong_magic_numbers) {
  const TempDir dir;
  const std::string labels = dir.file("labels", idx_file(2049, {4}, ramp(4)));
  expect_error([&] { data::read_idx_images(labels); },
               {"read_idx_images", labels, "magic number 2049", "1 dims", "has 3", "2051"});
  const std::string images = dir.file("images", idx_file(2051, {1, 2, 2}, ramp(4)));
  expect_error([&] { data::read_idx_labels(images); },
               {"read_idx_labels", images, "magic number 2051", "3 dims", "has 1", "2049"});
  const std::string text = dir.file("text.gz", gzip_stored("hello, world"));
  expect_error([&] { data::read_idx_images(text); },
               {text, "not an IDX file", "0x68656c6c", "2051"});
  const std::string floats = dir.file("floats", idx_file(0x0d03, {1, 1, 1}, ramp(4)));
  expect_error([&] { data::read_idx_images(floats); },
               {floats, "type 0x0d", "only unsigned bytes (0x08"});
}

BOOST_AUTO_TEST_CASE(dims_that_overflow_or_exceed_the_file) {
  const TempDir dir;
  // 2^32 - 1 cubed overflows 64 bits; it is refused before any multiplication can wrap.
  const std::string huge =
      dir.file("huge", idx_file(2051, {0xffffffff, 0xffffffff, 0xffffffff}, ramp(16)));
  expect_error([&] { data::read_idx_images(huge); },
               {"read_idx_images", huge, "4294967295 images of 4294967295 x 4294967295",
                "over the 1073741824 bytes"});
  const std::string big = dir.file("big", idx_file(2051, {70000, 1000, 1000}, ramp(16)));
  expect_error([&] { data::read_idx_images(big); }, {big, "over the 1073741824 bytes"});
  // Within the cap but beyond the data: the reader stops at what the file holds.
  const std::string beyond = dir.file("beyond", idx_file(2051, {1000000, 28, 28}, ramp(100)));
  expect_error([&] { data::read_idx_images(beyond); },
               {beyond, "truncated", "1000000 images of 28 x 28", "holds 100"});
  const std::string no_rows = dir.file("no-rows", idx_file(2051, {5, 0, 28}, ""));
  expect_error([&] { data::read_idx_images(no_rows); },
               {no_rows, "5 images of 0 x 28", "needs a row and a column"});
}

BOOST_AUTO_TEST_CASE(trailing_bytes_are_an_error) {
  const TempDir dir;
  const std::string trailing = dir.file("trailing", idx_file(2049, {3}, ramp(8)));
  expect_error([&] { data::read_idx_labels(trailing); },
               {"read_idx_labels", trailing, "5 bytes after the 3 bytes of data", "3 labels"});
  const std::string gz = dir.file("trailing.gz", gzip_stored(idx_file(2051, {1, 2, 2}, ramp(5))));
  expect_error([&] { data::read_idx_images(gz); }, {gz, "1 bytes after the 4 bytes"});
  // Past 1 MiB the rest is not read on to its end.
  const std::string endless = dir.file("endless", idx_file(2049, {3}, std::string(3 << 20, 'x')));
  expect_error([&] { data::read_idx_labels(endless); },
               {endless, "more than 1048576 bytes after the 3 bytes"});
}

BOOST_AUTO_TEST_CASE(corrupt_gzip_streams) {
  const TempDir dir;
  std::string gz = gzip_stored(idx_file(2049, {3}, ramp(3)));
  gz[gz.size() - 6] ^= 0x01;  // the CRC-32 of the data
  const std::string bad_crc = dir.file("bad-crc.gz", gz);
  expect_error([&] { data::read_idx_labels(bad_crc); },
               {"read_idx_labels", bad_crc, "not a valid gzip file", "incorrect data check"});
  // A deflate block of type 3 (reserved).
  const std::string bad_block =
      dir.file("bad-block.gz", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff\x07\x00", 12));
  expect_error([&] { data::read_idx_labels(bad_block); },
               {bad_block, "not a valid gzip file", "invalid block type"});
}

BOOST_AUTO_TEST_CASE(inconsistent_datasets) {
  const TempDir dir;
  write_split(dir.path, "train", 3, true, std::string("\x01\x02", 2));
  expect_error([&] { FashionMNIST ds(dir.path.string()); },
               {"FashionMNIST", "train-images-idx3-ubyte.gz", "holds 3 images but",
                "train-labels-idx1-ubyte.gz", "holds 2 labels"});
  write_split(dir.path, "train", 3, true, std::string("\x01\x0a\x02", 3));
  expect_error([&] { FashionMNIST ds(dir.path.string()); },
               {"FashionMNIST", "train-labels-idx1-ubyte.gz", "label 10 at index 1", "0..9"});
  write_file(dir.path / "train-labels-idx1-ubyte.gz", gzip_stored(idx_file(2049, {1}, "\x03")));
  write_file(dir.path / "train-images-idx3-ubyte.gz",
             gzip_stored(idx_file(2051, {1, 32, 32}, ramp(1024))));
  expect_error([&] { FashionMNIST ds(dir.path.string()); },
               {"FashionMNIST", "train-images-idx3-ubyte.gz", "images of 32 x 32", "28 x 28"});
}

BOOST_AUTO_TEST_CASE(flip_reverses_columns) {
  const Tensor x = numbered(64, 2, 3, 5);
  const Tensor all = data::random_horizontal_flip(x, 1.0);
  BOOST_TEST((all.shape() == x.shape()));
  BOOST_TEST(same(all, x.index_select(3, from_vector(std::vector<int64_t>{4, 3, 2, 1, 0}, {5}))));
  BOOST_TEST(same(data::random_horizontal_flip(x, 0.0), x));
  // p = 0.5: image n flips where the generator's n-th uniform is below p (rand's draws).
  manual_seed(11);
  const Tensor half = data::random_horizontal_flip(x);
  manual_seed(11);
  const auto u = rand({64}, kFloat64).to_vector<double>();
  int flipped = 0;
  for (int64_t n = 0; n < 64; ++n) {
    const bool flip = u[static_cast<size_t>(n)] < 0.5;
    flipped += flip;
    BOOST_TEST(same(half.select(0, n), (flip ? all : x).select(0, n)), n);
  }
  BOOST_TEST((flipped > 10 && flipped < 54));
  // One image (C, H, W), other dtypes, a non-contiguous view.
  const Tensor one = data::random_horizontal_flip(x.select(0, 3), 1.0);
  BOOST_TEST(same(one, all.select(0, 3)));
  const Tensor ints = x.to(kInt64);
  BOOST_TEST(same(data::random_horizontal_flip(ints, 1.0), all.to(kInt64)));
  const Tensor doubles = x.to(kFloat64);
  BOOST_TEST(same(data::random_horizontal_flip(doubles, 1.0), all.to(kFloat64)));
  const Tensor bools = x.gt(100.0);
  BOOST_TEST(same(data::random_horizontal_flip(bools, 1.0), all.gt(100.0)));
  const Tensor strided = x.transpose(2, 3);  // (64, 2, 5, 3)
  BOOST_TEST(same(data::random_horizontal_flip(strided, 1.0),
                  data::random_horizontal_flip(strided.contiguous(), 1.0)));
  // Outside autograd.
  const Tensor leaf_images = x.detach().requires_grad_();
  BOOST_TEST(!data::random_horizontal_flip(leaf_images).requires_grad());
}

BOOST_AUTO_TEST_CASE(crop_matches_the_reference) {
  const Tensor x = numbered(40, 2, 6, 7);
  for (const auto& [size, padding] :
       {std::pair<int64_t, int64_t>{6, 2}, {4, 0}, {3, 1}, {10, 2}, {1, 5}}) {
    manual_seed(3);
    const Tensor out = data::random_crop(x, size, padding);
    BOOST_TEST((out.shape() == Shape{40, 2, size, size}));
    // The offsets: per image a top then a left, each one randint draw.
    manual_seed(3);
    for (int64_t n = 0; n < 40; ++n) {
      const int64_t top = randint(0, 6 + 2 * padding - size + 1, {1}).item<int64_t>();
      const int64_t left = randint(0, 7 + 2 * padding - size + 1, {1}).item<int64_t>();
      BOOST_TEST(
          out.select(0, n).to_vector<float>() == crop_reference(x, n, top, left, size, padding),
          boost::test_tools::per_element());
    }
  }
  // Torchvision's RandomCrop(28, padding=4) on Fashion-MNIST-sized images: every offset of the
  // 9 x 9 occurs across a large batch, and the zero border shows where expected.
  const Tensor ones_images = ones({512, 1, 28, 28});
  manual_seed(0);
  const Tensor crops = data::random_crop(ones_images, 28, 4);
  BOOST_TEST((crops.shape() == Shape{512, 1, 28, 28}));
  const auto sums = crops.sum({1, 2, 3}).to_vector<float>();
  BOOST_TEST(*std::min_element(sums.begin(), sums.end()) == 24.0f * 24.0f);  // both offsets at 4
  BOOST_TEST(*std::max_element(sums.begin(), sums.end()) == 28.0f * 28.0f);  // the centre
  // One image, and a crop as large as the padded image (the only offset).
  BOOST_TEST((data::random_crop(x.select(0, 0), 5).shape() == Shape{2, 5, 5}));
  const Tensor full = data::random_crop(x.narrow(3, 0, 6), 8, 1);
  BOOST_TEST(full.select(0, 0).to_vector<float>() ==
                 crop_reference(x.narrow(3, 0, 6).contiguous(), 0, 0, 0, 8, 1),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(augmentations_are_reproducible) {
  const Tensor x = numbered(300, 1, 28, 28);
  auto augment = [&] { return data::random_crop(data::random_horizontal_flip(x), 28, 4); };
  manual_seed(7);
  const Tensor a = augment();
  manual_seed(7);
  BOOST_TEST(same(augment(), a));
  manual_seed(8);
  BOOST_TEST(!same(augment(), a));
  // A resumed run restores the generator's state and sees the same batches.
  const Tensor state = get_rng_state();
  const Tensor next = augment();
  set_rng_state(state);
  BOOST_TEST(same(augment(), next));
  // The copying splits over threads (300 images is above the grain): same result on one.
  const int threads = get_num_threads();
  set_num_threads(1);
  manual_seed(7);
  const Tensor serial = augment();
  set_num_threads(threads);
  BOOST_TEST(same(serial, a));
  // p does not change how many numbers a flip draws (Note [Augmentation draws]).
  manual_seed(9);
  data::random_horizontal_flip(x, 0.0);
  const Tensor after0 = rand({4});
  manual_seed(9);
  data::random_horizontal_flip(x, 1.0);
  BOOST_TEST(same(rand({4}), after0));
}

BOOST_AUTO_TEST_CASE(augmentation_errors) {
  const Tensor x = zeros({2, 1, 28, 28});
  expect_error([&] { data::random_horizontal_flip(x, -0.1); },
               {"random_horizontal_flip", "p must be in [0, 1]", "-0.1"});
  expect_error([&] { data::random_horizontal_flip(x, 1.5); }, {"random_horizontal_flip", "1.5"});
  expect_error(
      [&] {
        data::random_horizontal_flip(zeros({28, 28}));
      },
      {"random_horizontal_flip", "(N, C, H, W) or (C, H, W)", "[28, 28]"});
  expect_error(
      [&] {
        data::random_crop(zeros({1, 2, 1, 28, 28}), 28);
      },
      {"random_crop", "[1, 2, 1, 28, 28]"});
  expect_error([&] { data::random_crop(x, 0); }, {"random_crop", "size must be at least 1", "0"});
  expect_error([&] { data::random_crop(x, 28, -1); },
               {"random_crop", "padding must be non-negative", "-1"});
  expect_error([&] { data::random_crop(x, 37, 4); },
               {"random_crop", "size 37", "28 x 28 padded by 4 (36 x 36)"});
}

BOOST_AUTO_TEST_SUITE_END()
