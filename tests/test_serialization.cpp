// safetensors checkpoints: bit-exact round trips, the file layout checked by an independent
// parser, Python interop (golden/interop.safetensors written by gen_safetensors.py), strict and
// non-strict loading, every corrupt-file case, hostile headers and paths (issues 19 and 21),
// and saves that race. The seeded fuzz of the reader is test_checkpoint_fuzz.
#include <unistd.h>

#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>

#include "helpers.h"
#include "nn_modules.h"

using namespace ember;
using namespace ember::testing;
namespace fs = std::filesystem;

namespace {

// A module holding `tensors` under their dotted names (intermediate modules made on the way);
// floating tensors become parameters, the rest buffers.
std::shared_ptr<Open> module_of(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                const std::vector<std::string>& buffers = {}) {
  auto root = std::make_shared<Open>();
  std::map<std::string, std::shared_ptr<Open>> made{{"", root}};
  for (const auto& [name, t] : tensors) {
    std::string path;
    std::shared_ptr<Open> m = root;
    size_t start = 0;
    for (size_t dot; (dot = name.find('.', start)) != std::string::npos; start = dot + 1) {
      const std::string part = name.substr(start, dot - start);
      const std::string next = path.empty() ? part : path + "." + part;
      if (!made.contains(next)) made[next] = m->register_module(part, std::make_shared<Open>());
      m = made[next];
      path = next;
    }
    const std::string leaf = name.substr(start);
    const bool buffer =
        !is_floating(t.dtype()) || std::find(buffers.begin(), buffers.end(), name) != buffers.end();
    if (buffer)
      m->register_buffer(leaf, t);
    else
      m->register_parameter(leaf, t);
  }
  return root;
}

// A scratch directory per test process, in memory when /dev/shm exists (thousands of fuzz
// files: on a disk mounted with discard each rewrite costs milliseconds).
fs::path scratch_root() {
  std::error_code ec;
  return fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
}

struct TempDir {
  fs::path dir = scratch_root() / fmt::format("ember_test_serialization_{}", getpid());
  TempDir() { fs::create_directories(dir); }
  ~TempDir() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// 8-byte little-endian length, header text, data.
std::string file_bytes(const std::string& header, const std::string& data, int64_t length = -1) {
  const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

// Data for Affine(2): w (F32 [2]) at 0..8, b (F32 [2]) at 8..16, count (I64 [1]) at 16..24.
std::string affine_data() {
  const float w[2] = {1.5f, -2.0f}, b[2] = {0.25f, 4.0f};
  const int64_t count[1] = {9};
  std::string data(24, '\0');
  std::memcpy(data.data(), w, 8);
  std::memcpy(data.data() + 8, b, 8);
  std::memcpy(data.data() + 16, count, 8);
  return data;
}

std::string affine_header(const std::string& w_entry) {
  return R"({"w":)" + w_entry +
         R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
         R"("count":{"dtype":"I64","shape":[1],"data_offsets":[16,24]}})";
}
const std::string kValidW = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

}  // namespace

BOOST_AUTO_TEST_SUITE(test_serialization)

BOOST_AUTO_TEST_CASE(round_trip_is_bit_exact) {
  TempDir tmp;
  manual_seed(10);
  Block saved(3);
  saved.to(kFloat64);
  {
    NoGradGuard no_grad;
    Tensor(saved.first->count).fill_(-(int64_t(1) << 50));
    Tensor(saved.layers->at<Affine>(1)->count).fill_(42);
    saved.first->w.copy_(tensor({1e-310, -0.0, 1.0 / 3}, kFloat64));  // subnormal, -0, inexact
  }
  nn::save(saved, tmp / "block.safetensors");
  manual_seed(11);
  Block loaded(3);
  loaded.to(kFloat64);
  NoGradGuard no_grad;
  Tensor(loaded.mask).fill_(0);
  Tensor(loaded.step).fill_(0);
  BOOST_TEST((snapshot(loaded) != snapshot(saved)));
  nn::load(loaded, tmp / "block.safetensors");
  BOOST_TEST((snapshot(loaded) == snapshot(saved)));
  BOOST_TEST(std::signbit(loaded.first->w.to_vector<double>()[1]));
  // Handles stay the same objects (members and optimizers keep working).
  BOOST_TEST(loaded.first->w.same(loaded.named_parameters()[1].second));
  BOOST_TEST(!fs::exists(tmp / "block.safetensors.tmp"));
}

BOOST_AUTO_TEST_CASE(non_contiguous_tensors_save_in_logical_order) {
  TempDir tmp;
  manual_seed(12);
  const Tensor base = randn({3, 4});
  auto saved =
      module_of({{"t", base.transpose(0, 1).detach()}, {"n", base.narrow(1, 1, 2)}}, {"n"});
  nn::save(*saved, tmp / "views.safetensors");
  auto loaded = module_of({{"t", zeros({4, 3})}, {"n", zeros({3, 2})}}, {"n"});
  nn::load(*loaded, tmp / "views.safetensors");
  expect_close(loaded->state_dict()[0].second, base.transpose(0, 1), 0, 0);
  expect_close(loaded->state_dict()[1].second, base.narrow(1, 1, 2), 0, 0);
}

BOOST_AUTO_TEST_CASE(file_layout_parsed_independently) {
  // Ember's file checked against the format without Ember's reader: length prefix, JSON header
  // padded to 8 bytes, each tensor's raw little-endian bytes at its offsets, tiling the data.
  TempDir tmp;
  manual_seed(13);
  Block block(3);
  nn::save(block, tmp / "layout.safetensors");
  const std::string bytes = read_all(tmp / "layout.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  BOOST_TEST_REQUIRE(8 + n <= bytes.size());
  BOOST_TEST((8 + n) % 8 == 0u);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  BOOST_TEST(header.at("__metadata__").at("format").get<std::string>() == "pt");
  const std::string data = bytes.substr(8 + n);
  const auto state = block.state_dict();
  BOOST_TEST(header.size() == state.size() + 1);
  uint64_t at = 0;
  const std::map<DType, std::string> names = {
      {kFloat32, "F32"}, {kFloat64, "F64"}, {kInt64, "I64"}, {kBool, "BOOL"}};
  for (const auto& [name, t] : state) {  // written in state_dict order
    const auto& e = header.at(name);
    BOOST_TEST(e.at("dtype").get<std::string>() == names.at(t.dtype()), name);
    BOOST_TEST((e.at("shape").get<Shape>() == t.shape()), name);
    const auto offsets = e.at("data_offsets").get<std::vector<uint64_t>>();
    BOOST_TEST(offsets[0] == at, name);
    const Tensor c = t.contiguous();
    const size_t nbytes = c.numel() * element_size(c.dtype());
    BOOST_TEST(offsets[1] - offsets[0] == nbytes, name);
    BOOST_TEST(std::memcmp(data.data() + offsets[0], c.impl()->storage->data(), nbytes) == 0, name);
    at = offsets[1];
  }
  BOOST_TEST(at == data.size());
}

BOOST_AUTO_TEST_CASE(python_written_file_loads) {
  // golden/interop.safetensors was written by gen_safetensors.py from torch tensors.
  const Golden golden("interop.json");
  const std::vector<std::string> names = {"encoder.layers.0.weight",
                                          "encoder.layers.0.bias",
                                          "encoder.layers.1.weight",
                                          "encoder.norm.a_2",
                                          "pe",
                                          "steps",
                                          "mask",
                                          "scalar",
                                          "empty"};
  std::vector<std::pair<std::string, Tensor>> zeroed;
  for (const auto& name : names) {
    const Tensor g = golden[name];
    const DType dtype = name.starts_with("encoder.layers") || name == "scalar" || name == "empty"
                            ? kFloat32
                            : g.dtype();
    zeroed.emplace_back(name, zeros(g.shape(), dtype));
  }
  auto module = module_of(zeroed, {"pe"});
  const std::string path = golden_dir() + "/interop.safetensors";
  nn::load(*module, path);
  for (const auto& [name, t] : module->state_dict()) {
    expect_close(t.to(kFloat64), golden[name].to(kFloat64), 0, 0, name);
  }
  const nn::SafetensorsFile file = nn::read_safetensors(path);
  BOOST_TEST(file.metadata.at("format") == "pt");
  BOOST_TEST(file.tensors.size() == names.size());
  BOOST_TEST(file.tensors.at("steps").to_vector<int64_t>()[2] == int64_t(1) << 40);

  // The same tensors saved by Ember; gen_safetensors.py --verify FILE checks such a file with
  // torch (run by hand: EMBER_INTEROP_OUT=/tmp/x.safetensors, see the script).
  TempDir tmp;
  nn::save(*module, tmp / "ember.safetensors");
  const nn::SafetensorsFile again = nn::read_safetensors(tmp / "ember.safetensors");
  for (const auto& [name, t] : file.tensors) expect_close(again.tensors.at(name), t, 0, 0, name);
  if (const char* out = std::getenv("EMBER_INTEROP_OUT")) nn::save(*module, out);
}

BOOST_AUTO_TEST_CASE(strict_and_non_strict_names) {
  TempDir tmp;
  manual_seed(14);
  auto other = module_of({{"w", randn({2})},
                          {"b", randn({2})},
                          {"extra1", randn({1})},
                          {"zz.extra2", zeros({1}, kInt64)}});
  nn::save(*other, tmp / "other.safetensors");
  Affine target(2);
  const auto before = snapshot(target);
  expect_error([&] { nn::load(target, tmp / "other.safetensors"); },
               {"load", "Affine", "missing count", "unexpected extra1, zz.extra2"});
  BOOST_TEST((snapshot(target) == before));
  nn::load(target, tmp / "other.safetensors", /*strict=*/false);  // loads the overlap
  BOOST_TEST(target.w.to_vector<double>() == other->state_dict()[0].second.to_vector<double>(),
             boost::test_tools::per_element());
  BOOST_TEST(target.b.to_vector<double>() == other->state_dict()[1].second.to_vector<double>(),
             boost::test_tools::per_element());
  BOOST_TEST(target.count.to_vector<int64_t>()[0] == 0);
}

BOOST_AUTO_TEST_CASE(shape_and_dtype_mismatches) {
  TempDir tmp;
  Affine three(3), wide(2, kFloat64), target(2);
  nn::save(three, tmp / "three.safetensors");
  nn::save(wide, tmp / "wide.safetensors");
  const auto before = snapshot(target);
  for (bool strict : {true, false}) {
    expect_error([&] { nn::load(target, tmp / "three.safetensors", strict); },
                 {"load", "'w' is Float32 [3] in the file, Float32 [2] in the module", "'b'"});
    expect_error([&] { nn::load(target, tmp / "wide.safetensors", strict); },
                 {"load", "'w' is Float64 [2]", "Float32 [2]"});
  }
  BOOST_TEST((snapshot(target) == before));
}

BOOST_AUTO_TEST_CASE(save_is_atomic) {
  TempDir tmp;
  Affine a(2), b(2);
  nn::save(a, tmp / "m.safetensors");
  nn::save(b, tmp / "m.safetensors");  // replaces
  nn::load(a, tmp / "m.safetensors");
  BOOST_TEST(a.w.to_vector<double>() == b.w.to_vector<double>(), boost::test_tools::per_element());
  BOOST_TEST(std::distance(fs::directory_iterator(tmp.dir), fs::directory_iterator()) == 1);
  expect_error([&] { nn::save(a, tmp / "missing_dir/m.safetensors"); }, {"save", "cannot open"});
  expect_error([&] { nn::load(a, tmp / "nothing.safetensors"); }, {"load", "cannot open"});
}

BOOST_AUTO_TEST_CASE(corrupt_files_are_errors_and_change_nothing) {
  TempDir tmp;
  const std::string data = affine_data();
  struct Case {
    std::string what, bytes;
    std::vector<std::string> parts;
  };
  const auto entry = [](std::string dtype, std::string shape, std::string offsets) {
    return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets +
           "}";
  };
  const std::string valid = affine_header(kValidW);
  const std::vector<Case> cases = {
      {"shorter than 8 bytes", "\x01\x02\x03", {"truncated", "3 bytes"}},
      {"header length past the end",
       file_bytes(valid, data, 1000),
       {"truncated", "header length 1000", "past the end"}},
      {"huge header length", file_bytes(valid, data, int64_t(1) << 62), {"header length"}},
      {"truncated data", file_bytes(valid, data.substr(0, 20)), {"'count'", "out of range"}},
      {"malformed JSON", file_bytes(R"({"w": {"dtype":)", data), {"malformed"}},
      {"JSON not an object", file_bytes("[1, 2, 3]", data), {"malformed"}},
      {"empty header", file_bytes("", data), {"malformed"}},
      {"unknown dtype",
       file_bytes(affine_header(entry("F16", "[2]", "[0,8]")), data),
       {"'w'", "unknown dtype 'F16'"}},
      {"dtype not a string",
       file_bytes(affine_header(entry("F32", "[2]", "[0,8]").replace(9, 5, "32")), data),
       {"'w'", "dtype"}},
      {"overlapping offsets",
       file_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                  R"("count":{"dtype":"I64","shape":[1],"data_offsets":[16,24]}})",
                  data),
       {"overlap", "'w'", "'b'"}},
      {"offset out of range",
       file_bytes(affine_header(entry("F32", "[2]", "[24,32]")), data),
       {"'w'", "out of range", "24 bytes"}},
      {"begin after end",
       file_bytes(affine_header(entry("F32", "[0]", "[8,0]")), data),
       {"'w'", "out of range"}},
      {"size does not match shape",
       file_bytes(affine_header(entry("F32", "[3]", "[0,8]")), data),
       {"'w'", "needs 12 bytes", "hold 8"}},
      {"length not a multiple of the dtype",
       file_bytes(affine_header(entry("F32", "[2]", "[0,7]")), data),
       {"'w'", "needs 8 bytes", "hold 7"}},
      {"shape overflows",
       file_bytes(affine_header(entry("F64", "[4294967296,4294967296,16]", "[0,8]")), data),
       {"'w'", "too many"}},
      {"negative dim",
       file_bytes(affine_header(entry("F32", "[-2]", "[0,8]")), data),
       {"'w'", "not a non-negative integer"}},
      {"fractional dim",
       file_bytes(affine_header(entry("F32", "[2.0]", "[0,8]")), data),
       {"'w'", "not a non-negative integer"}},
      {"offsets not a pair",
       file_bytes(affine_header(entry("F32", "[2]", "[0]")), data),
       {"'w'", "data_offsets"}},
      {"negative offset",
       file_bytes(affine_header(entry("F32", "[2]", "[-8,0]")), data),
       {"'w'", "out of range"}},
      {"missing field",
       file_bytes(affine_header(R"({"dtype":"F32","shape":[2]})"), data),
       {"'w'", "needs dtype, shape and data_offsets"}},
      {"entry not an object", file_bytes(affine_header("[1]"), data), {"'w'", "not a JSON object"}},
      {"gap between tensors",
       file_bytes(affine_header(entry("F32", "[1]", "[0,4]")), data),
       {"gap of 4"}},
      {"trailing bytes", file_bytes(valid, data + "abcdefgh"), {"8 bytes after the last tensor"}},
      {"metadata not strings",
       file_bytes(R"({"__metadata__":{"format":1},)" + valid.substr(1), data),
       {"__metadata__"}},
      {"invalid UTF-8 in header", file_bytes("{\"w\xff\":1}", data), {"malformed"}},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      write_all(tmp / "bad.safetensors", c.bytes);
      manual_seed(15);
      Affine m(2);
      const auto before = snapshot(m);
      try {
        nn::load(m, tmp / "bad.safetensors");
        BOOST_ERROR("no error");
      } catch (const Error& e) {
        const std::string msg = e.what();
        BOOST_TEST(msg.starts_with("load: "), msg);
        for (const auto& part : c.parts)
          BOOST_TEST(msg.find(part) != std::string::npos, "'" << msg << "' lacks '" << part << "'");
      }
      BOOST_TEST((snapshot(m) == before));
    }
  }
  // The valid file of these cases loads.
  write_all(tmp / "good.safetensors", file_bytes(valid, data));
  Affine m(2);
  nn::load(m, tmp / "good.safetensors");
  BOOST_TEST(m.w.to_vector<double>() == (std::vector<double>{1.5, -2.0}),
             boost::test_tools::per_element());
  BOOST_TEST(m.count.to_vector<int64_t>()[0] == 9);
  // BOOL bytes must be 0 or 1.
  write_all(tmp / "bool.safetensors",
            file_bytes(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02"));
  expect_error([&] { nn::read_safetensors(tmp / "bool.safetensors"); },
               {"read_safetensors", "'m'", "BOOL byte 2"});
}

BOOST_AUTO_TEST_CASE(hostile_headers_are_short_errors) {
  // Issues 19 and 21: each of these once crashed the reader (a stack overflow in nlohmann's
  // recursion), was accepted, or gave a message as long as the file. Each is now an ember::Error
  // of a few hundred characters at most.
  TempDir tmp;
  const std::string data = affine_data();
  const auto nest = [](const std::string& open, const std::string& inner, const std::string& close,
                       int depth) {
    std::string out;
    for (int i = 0; i < depth; ++i) out += open;
    out += inner;
    for (int i = 0; i < depth; ++i) out += close;
    return out;
  };
  const auto entry = [](const std::string& shape, const std::string& offsets,
                        const std::string& dtype = "\"F32\"") {
    return R"({"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
  };
  const std::string valid = affine_header(kValidW);
  const std::string long_text(1'000'000, 'x');
  struct Case {
    std::string what, bytes;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"shape nested 100,000 deep",
       file_bytes(affine_header(entry(nest("[", "2", "]", 100'000), "[0,8]")), data),
       {"'w'", "dim 0 of the shape is an array"}},
      {"data_offsets nested 100,000 deep",
       file_bytes(affine_header(entry("[2]", nest("[", "0", "]", 100'000))), data),
       {"'w'", "data_offsets holds an array"}},
      {"entry nested 100,000 deep",
       file_bytes(affine_header(nest("[", "", "]", 100'000)), data),
       {"'w'", "not a JSON object"}},
      {"metadata nested 100,000 deep",
       file_bytes(
           R"({"__metadata__":{"k":)" + nest("{\"a\":", "1", "}", 100'000) + "}," + valid.substr(1),
           data),
       {"__metadata__ value of 'k'", "an object, not a string"}},
      {"top level nested 100,000 deep, unclosed",
       file_bytes("{\"w\":" + nest("{\"a\":", "", "", 100'000) + "}", data),
       {"'w'", "unknown field 'a'"}},
      {"a NUL byte, then garbage",
       file_bytes(valid + std::string("\0garbage}", 9), data),
       {"malformed", "NUL byte at byte " + std::to_string(valid.size())}},
      {"a byte order mark", file_bytes("\xEF\xBB\xBF" + valid, data), {"malformed", "order mark"}},
      {"padded with a tab", file_bytes(valid + "\t", data), {"malformed", "0x09"}},
      {"garbage after the object", file_bytes(valid + " {}", data), {"malformed", "invalid JSON"}},
      {"overlong UTF-8", file_bytes("{\"w\xC0\xAF\":1}", data), {"malformed", "UTF-8 at byte 3"}},
      {"a UTF-16 surrogate", file_bytes("{\"\xED\xA0\x80\":1}", data), {"malformed", "UTF-8"}},
      {"beyond U+10FFFF", file_bytes("{\"\xF4\x90\x80\x80\":1}", data), {"malformed", "UTF-8"}},
      {"the same tensor twice",
       file_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)" + valid.substr(1),
                  data),
       {"tensor 'w' appears twice"}},
      {"a field twice",
       file_bytes(affine_header(R"({"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]})"),
                  data),
       {"'w'", "field 'shape' appears twice"}},
      {"an unknown field",
       file_bytes(affine_header(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":[[1]]})"),
                  data),
       {"'w'", "unknown field 'x'"}},
      {"__metadata__ twice",
       file_bytes(R"({"__metadata__":{},"__metadata__":{},)" + valid.substr(1), data),
       {"__metadata__ twice"}},
      {"a __metadata__ key twice",
       file_bytes(R"({"__metadata__":{"k":"a","k":"b"},)" + valid.substr(1), data),
       {"key 'k' appears twice"}},
      {"elements overflow an int64 behind a zero",
       file_bytes(R"({"e":)" + entry("[0,4611686018427387904,4611686018427387904]", "[0,0]") + "," +
                      valid.substr(1),
                  data),
       {"'e'", "too many elements"}},
      {"a dim beyond int64",
       file_bytes(affine_header(entry("[9223372036854775808]", "[0,8]")), data),
       {"'w'", "9223372036854775808, not a non-negative integer"}},
      {"a dim beyond uint64",
       file_bytes(affine_header(entry("[18446744073709551616]", "[0,8]")), data),
       {"'w'", "not a non-negative integer"}},
      {"a dim beyond double",
       file_bytes(affine_header(entry("[1e999]", "[0,8]")), data),
       {"malformed", "invalid JSON", "overflow"}},
      {"17 dims",
       file_bytes(affine_header(entry("[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,2]", "[0,8]")), data),
       {"'w'", "more than 16 dims"}},
      {"a million dims",
       file_bytes(affine_header(entry("[" + nest("1,", "", "", 500'000) + "2]", "[0,8]")), data),
       {"'w'", "more than 16 dims"}},
      {"three offsets",
       file_bytes(affine_header(entry("[2]", "[0,8,8]")), data),
       {"'w'", "more than 2 values"}},
      {"offsets at the end of uint64",
       file_bytes(affine_header(entry("[2]", "[18446744073709551615,18446744073709551615]")), data),
       {"'w'", "out of range"}},
      {"a megabyte name",
       file_bytes(affine_header("[1]").replace(2, 1, long_text), data),
       {"tensor 'xxx", "... (1000000 bytes)", "not a JSON object"}},
      {"a megabyte dtype",
       file_bytes(affine_header(entry("[2]", "[0,8]", '"' + long_text + '"')), data),
       {"'w'", "unknown dtype 'xxx", "(1000000 bytes)"}},
      {"a megabyte number",
       file_bytes(affine_header(entry("[0." + std::string(999'998, '9') + "]", "[0,8]")), data),
       {"'w'", "dim 0 of the shape is 0.999", "(1000000 bytes)"}},
      {"a megabyte bad token",
       file_bytes(affine_header(entry("[2]", "[0,8]", '"' + long_text + "\x01\"")), data),
       {"malformed", "invalid JSON", "control character", "bytes)"}},
      {"a control character in a name",
       file_bytes(affine_header("[1]").replace(2, 1, "w\\u001b[2J"), data),
       {"tensor 'w\\x1b[2J'"}},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      write_all(tmp / "bad.safetensors", c.bytes);
      Affine m(2);
      const auto before = snapshot(m);
      for (const bool whole : {false, true}) {
        try {
          if (whole)
            nn::read_safetensors(tmp / "bad.safetensors");
          else
            nn::load(m, tmp / "bad.safetensors");
          BOOST_ERROR("no error");
        } catch (const Error& e) {
          const std::string msg = e.what();
          BOOST_TEST(msg.starts_with(whole ? "read_safetensors: " : "load: "), msg);
          BOOST_TEST(msg.size() < 400 + (tmp / "bad.safetensors").size(), msg);
          for (const auto& part : c.parts)
            BOOST_TEST(msg.find(part) != std::string::npos,
                       "'" << msg << "' lacks '" << part << "'");
        }
      }
      BOOST_TEST((snapshot(m) == before));
    }
  }
}

BOOST_AUTO_TEST_CASE(header_length_is_checked_before_reading) {
  TempDir tmp;
  Affine m(2);
  // The length prefix of a file larger than the cap: refused without reading the header.
  {
    const std::string big = tmp / "big.safetensors";
    write_all(big, file_bytes("", "", 100'000'001));
    fs::resize_file(big, 100'000'200);  // sparse
    expect_error([&] { nn::load(m, big); },
                 {"load", "header of 100000001 bytes (limit 100000000)"});
  }
  // Files that are not regular are refused, not read: a directory, a FIFO (would block until a
  // writer came), a device (/dev/zero never ends).
  expect_error([&] { nn::load(m, tmp.dir.string()); },
               {"load", "it is a directory, not a regular file"});
  expect_error([&] { nn::read_safetensors(tmp.dir.string()); }, {"read_safetensors", "directory"});
  BOOST_TEST_REQUIRE(::mkfifo((tmp / "fifo").c_str(), 0600) == 0);
  expect_error([&] { nn::load(m, tmp / "fifo"); }, {"load", "a FIFO, not a regular file"});
  if (fs::exists("/dev/zero"))
    expect_error([&] { nn::load(m, "/dev/zero"); }, {"load", "a character device"});
  // A symlink to a valid file is followed (only the final file's kind matters).
  nn::save(m, tmp / "m.safetensors");
  fs::create_symlink(tmp / "m.safetensors", tmp / "link.safetensors");
  nn::load(m, tmp / "link.safetensors");
}

BOOST_AUTO_TEST_CASE(empty_tensors_round_trip) {
  // A [3, 0] parameter once killed save with SIGFPE (an empty strided loop).
  TempDir tmp;
  auto saved = module_of({{"empty", zeros({3, 0})},
                          {"none", zeros({0}, kInt64)},
                          {"flag", zeros({0, 2}, kBool)},
                          {"scalar", scalar_tensor(2.5)},
                          {"wide", zeros({0, 4}, kFloat64).transpose(0, 1)}});
  nn::save(*saved, tmp / "empty.safetensors");
  auto loaded = module_of({{"empty", ones({3, 0})},
                           {"none", ones({0}, kInt64)},
                           {"flag", ones({0, 2}, kBool)},
                           {"scalar", scalar_tensor(0.0)},
                           {"wide", ones({4, 0}, kFloat64)}});
  nn::load(*loaded, tmp / "empty.safetensors");
  BOOST_TEST((snapshot(*loaded) == snapshot(*saved)));
  const nn::SafetensorsFile file = nn::read_safetensors(tmp / "empty.safetensors");
  BOOST_TEST((file.tensors.at("empty").shape() == Shape{3, 0}));
  BOOST_TEST((file.tensors.at("wide").shape() == Shape{4, 0}));
  BOOST_TEST(file.tensors.at("scalar").item<double>() == 2.5);
}

BOOST_AUTO_TEST_CASE(save_never_follows_a_planted_temporary) {
  // The temporary was once PATH.tmp, opened with O_TRUNC: a symlink planted there was followed
  // (its target overwritten, or created when dangling).
  TempDir tmp;
  Affine m(2);
  const std::string path = tmp / "m.safetensors";
  write_all(tmp / "victim", "keep me");
  fs::create_symlink(tmp / "victim", path + ".tmp");
  nn::save(m, path);
  BOOST_TEST(read_all(tmp / "victim") == "keep me");
  BOOST_TEST(fs::is_symlink(path + ".tmp"));
  fs::remove(path + ".tmp");
  fs::create_symlink(tmp / "created", path + ".tmp");  // dangling
  nn::save(m, path);
  BOOST_TEST(!fs::exists(tmp / "created"));
  fs::remove(path + ".tmp");
  nn::load(m, path);
  // Only the victim and the checkpoint remain: no temporary is left behind.
  BOOST_TEST(std::distance(fs::directory_iterator(tmp.dir), fs::directory_iterator()) == 2);
}

BOOST_AUTO_TEST_CASE(save_to_a_bad_path_is_a_clear_error) {
  TempDir tmp;
  Affine m(2);
  write_all(tmp / "file", "x");
  fs::create_directory(tmp / "dir");
  expect_error([&] { nn::save(m, tmp / "missing/m.safetensors"); },
               {"save", "cannot open", "missing", "No such file or directory"});
  expect_error([&] { nn::save(m, tmp / "file/m.safetensors"); },
               {"save", "cannot open", "is not a directory"});
  expect_error([&] { nn::save(m, tmp / "dir"); }, {"save", "it is a directory"});
  expect_error([&] { nn::save(m, ""); }, {"save", "does not name a file"});
  expect_error([&] { nn::save(m, tmp.dir.string() + "/"); }, {"save", "does not name a file"});
  BOOST_TEST(std::distance(fs::directory_iterator(tmp.dir), fs::directory_iterator()) == 2);
  BOOST_TEST(fs::is_empty(tmp / "dir"));
}

BOOST_AUTO_TEST_CASE(concurrent_saves_and_loads_see_whole_files) {
  // Two writers replace one path while a reader loads it: with the shared PATH.tmp, saves failed
  // and readers saw empty or truncated files. Each save now has its own temporary and renames
  // it into place, so every load sees one writer's whole file.
  TempDir tmp;
  const std::string path = tmp / "m.safetensors";
  manual_seed(18);
  Affine first(64), second(64);
  nn::save(first, path);
  const auto a = snapshot(first), b = snapshot(second);
  std::atomic<int> writers_done{0}, failures{0};
  std::vector<std::string> errors(3);
  const auto writer = [&](const Affine& m, int k) {
    try {
      for (int i = 0; i < 100; ++i) nn::save(m, path);
    } catch (const std::exception& e) {
      errors[k] = e.what();
      ++failures;
    }
    ++writers_done;
  };
  std::thread w1(writer, std::cref(first), 0), w2(writer, std::cref(second), 1);
  int reads = 0;
  try {
    Affine reader(64);
    while (writers_done < 2 || reads == 0) {
      nn::load(reader, path);
      const auto got = snapshot(reader);
      if (got != a && got != b) throw std::runtime_error("a mixture of two files");
      ++reads;
    }
  } catch (const std::exception& e) {
    errors[2] = e.what();
    ++failures;
  }
  w1.join();
  w2.join();
  BOOST_TEST(failures == 0, errors[0] << " | " << errors[1] << " | " << errors[2]);
  BOOST_TEST_MESSAGE("concurrent saves: " << reads << " loads");
  BOOST_TEST(std::distance(fs::directory_iterator(tmp.dir), fs::directory_iterator()) == 1);
}

BOOST_AUTO_TEST_SUITE_END()
