// The fuzzer of the checkpoint reader declared in tests/checkpoint_fuzz.h: the structural
// attacks, the mutations and the check of each outcome.
#include "tests/checkpoint_fuzz.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <typeinfo>

namespace ember::fuzz {

namespace {

// Snapshots equal bit for bit (a loaded NaN is not equal to itself).
bool same_bits(const std::vector<std::pair<std::string, std::vector<double>>>& a,
               const std::vector<std::pair<std::string, std::vector<double>>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || a[i].second.size() != b[i].second.size() ||
        (!a[i].second.empty() && std::memcmp(a[i].second.data(), b[i].second.data(),
                                             a[i].second.size() * sizeof(double)) != 0))
      return false;
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A value the reader must weigh: limits of each integer type, floats, signs.
std::string interesting_number(std::mt19937_64& rng) {
  static const char* const kNumbers[] = {"0",
                                         "1",
                                         "2",
                                         "3",
                                         "8",
                                         "-1",
                                         "-0",
                                         "00",
                                         "1.5",
                                         "2.0",
                                         "1e2",
                                         "1e999",
                                         "-1e999",
                                         "4294967296",
                                         "2147483648",
                                         "3037000500",
                                         "4611686018427387904",
                                         "9223372036854775807",
                                         "9223372036854775808",
                                         "18446744073709551615",
                                         "18446744073709551616",
                                         "-9223372036854775808",
                                         "99999999999999999999999",
                                         "24",
                                         "16",
                                         "17"};
  if (rng() % 4 == 0) return std::to_string(static_cast<int64_t>(rng()) >> (rng() % 64));
  return kNumbers[rng() % std::size(kNumbers)];
}
std::string interesting_string(std::mt19937_64& rng) {
  static const char* const kStrings[] = {"F32",
                                         "F64",
                                         "I64",
                                         "BOOL",
                                         "F16",
                                         "BF16",
                                         "U8",
                                         "",
                                         "__metadata__",
                                         "dtype",
                                         "shape",
                                         "data_offsets",
                                         "w",
                                         "first.w",
                                         "scale",
                                         "mask",
                                         "step",
                                         "format",
                                         "\\u0000",
                                         "\\ud800",
                                         "\xFF",
                                         "\xC0\xAF",
                                         "\xED\xA0\x80",
                                         "\xF4\x90\x80\x80",
                                         "\xEF\xBB\xBF",
                                         "\\\"",
                                         "\\"};
  return kStrings[rng() % std::size(kStrings)];
}

constexpr char kJsonish[] = "0123456789[]{},:\"-. eEFIBOL\\nutrfals";

}  // namespace

std::string assemble(const std::string& header, const std::string& data, uint64_t length) {
  std::string out(8, '\0');
  std::memcpy(out.data(), &length, 8);
  return out + header + data;
}
std::string assemble(const std::string& header, const std::string& data) {
  return assemble(header, data, header.size());
}

std::string nest(const std::string& open, const std::string& inner, const std::string& close,
                 size_t depth) {
  std::string out;
  out.reserve(depth * (open.size() + close.size()) + inner.size());
  for (size_t i = 0; i < depth; ++i) out += open;
  out += inner;
  for (size_t i = 0; i < depth; ++i) out += close;
  return out;
}

std::vector<std::pair<std::string, std::string>> structural_attacks() {
  const std::string data(24, '\x01');
  const auto entry = [](const std::string& shape, const std::string& offsets,
                        const std::string& dtype = "\"F32\"") {
    return R"({"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
  };
  const auto header = [&](const std::string& w) {
    return R"({"w":)" + w + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)" +
           R"("count":{"dtype":"I64","shape":[1],"data_offsets":[16,24]}})";
  };
  const std::string valid = header(entry("[2]", "[0,8]"));
  const std::string rest = valid.substr(1);  // after the '{'
  const size_t deep = 100'000;
  std::vector<std::pair<std::string, std::string>> out = {
      {"valid", assemble(valid, data)},
      {"deep shape", assemble(header(entry(nest("[", "2", "]", deep), "[0,8]")), data)},
      {"deep data_offsets", assemble(header(entry("[2]", nest("[", "0,8", "]", deep))), data)},
      {"deep entry", assemble(header(nest("[", "", "]", deep)), data)},
      {"deep entry objects", assemble(header(nest("{\"a\":", "1", "}", deep)), data)},
      {"deep metadata",
       assemble("{\"__metadata__\":" + nest("{\"a\":", "\"v\"", "}", deep) + "," + rest, data)},
      {"deep top", assemble(nest("[", "", "]", deep), data)},
      {"deep unclosed", assemble("{\"w\":" + nest("[", "", "", deep) + "}", data)},
      {"deep shape, unclosed",
       assemble(header(entry(nest("[", "", "", deep), "[0,8]")) + "}", data)},
      {"length 2^64 - 1", assemble(valid, data, UINT64_MAX)},
      {"length 2^63", assemble(valid, data, uint64_t(1) << 63)},
      {"length over the cap", assemble(valid, data, 100'000'001)},
      {"length to the end", assemble(valid, data, valid.size() + data.size())},
      {"length one short", assemble(valid, data, valid.size() - 1)},
      {"length zero", assemble(valid, data, 0)},
      {"shape 2^32 2^32 16", assemble(header(entry("[4294967296,4294967296,16]", "[0,8]")), data)},
      {"shape 0 2^62 2^62",
       assemble(
           R"({"e":)" + entry("[0,4611686018427387904,4611686018427387904]", "[0,0]") + "," + rest,
           data)},
      {"shape 0 int64max int64max",
       assemble(
           R"({"e":)" + entry("[0,9223372036854775807,9223372036854775807]", "[0,0]") + "," + rest,
           data)},
      {"shape 3037000500^2",
       assemble(R"({"e":)" + entry("[0,3037000500,3037000500]", "[0,0]") + "," + rest, data)},
      {"shape int64max", assemble(header(entry("[9223372036854775807]", "[0,8]")), data)},
      {"shape 2^63", assemble(header(entry("[9223372036854775808]", "[0,8]")), data)},
      {"shape uint64max", assemble(header(entry("[18446744073709551615]", "[0,8]")), data)},
      {"shape 2^64", assemble(header(entry("[18446744073709551616]", "[0,8]")), data)},
      {"shape -1", assemble(header(entry("[-1]", "[0,8]")), data)},
      {"shape -0", assemble(R"({"e":)" + entry("[-0,2]", "[0,0]") + "," + rest, data)},
      {"shape 1e999", assemble(header(entry("[1e999]", "[0,8]")), data)},
      {"shape 2.0", assemble(header(entry("[2.0]", "[0,8]")), data)},
      {"shape 17 dims",
       assemble(header(entry("[" + nest("1,", "", "", 16) + "2]", "[0,8]")), data)},
      {"shape 16 dims",
       assemble(header(entry("[" + nest("1,", "", "", 15) + "2]", "[0,8]")), data)},
      {"shape 100,000 dims",
       assemble(header(entry("[" + nest("1,", "", "", deep) + "2]", "[0,8]")), data)},
      {"shape a string", assemble(header(entry("\"[2]\"", "[0,8]")), data)},
      {"overlapping offsets",
       assemble(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                R"("count":{"dtype":"I64","shape":[1],"data_offsets":[16,24]}})",
                data)},
      {"same offsets twice",
       assemble(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("count":{"dtype":"I64","shape":[2],"data_offsets":[8,24]}})",
                data)},
      {"offsets out of range", assemble(header(entry("[2]", "[24,32]")), data)},
      {"offsets reversed", assemble(header(entry("[0]", "[8,0]")), data)},
      {"offsets uint64max",
       assemble(header(entry("[2]", "[18446744073709551615,18446744073709551615]")), data)},
      {"offsets wrap", assemble(header(entry("[2]", "[18446744073709551612,4]")), data)},
      {"offsets negative", assemble(header(entry("[2]", "[-8,0]")), data)},
      {"offsets three", assemble(header(entry("[2]", "[0,8,8]")), data)},
      {"offsets one", assemble(header(entry("[2]", "[0]")), data)},
      {"offsets null", assemble(header(entry("[2]", "null")), data)},
      {"duplicate name",
       assemble(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)" + rest, data)},
      {"duplicate field",
       assemble(header(R"({"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]})"), data)},
      {"duplicate __metadata__", assemble(R"({"__metadata__":{},"__metadata__":{},)" + rest, data)},
      {"duplicate metadata key", assemble(R"({"__metadata__":{"k":"a","k":"a"},)" + rest, data)},
      {"unknown field",
       assemble(header(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})"), data)},
      {"missing field", assemble(header(R"({"dtype":"F32","shape":[2]})"), data)},
      {"metadata null", assemble(R"({"__metadata__":null,)" + rest, data)},
      {"metadata array", assemble(R"({"__metadata__":["a"],)" + rest, data)},
      {"metadata number value", assemble(R"({"__metadata__":{"k":1},)" + rest, data)},
      {"NUL then garbage", assemble(valid + std::string("\0garbage}", 9), data)},
      {"NUL inside a name", assemble(std::string("{\"w\0\"", 5) + valid.substr(4), data)},
      {"escaped NUL in a name", assemble("{\"w\\u0000\"" + valid.substr(4), data)},
      {"BOM", assemble("\xEF\xBB\xBF" + valid, data)},
      {"BOM in a name", assemble("{\"w\xEF\xBB\xBF\"" + valid.substr(4), data)},
      {"leading space", assemble(" " + valid, data)},
      {"space padding", assemble(valid + "       ", data)},
      {"tab padding", assemble(valid + "\t", data)},
      {"newline padding", assemble(valid + "\n", data)},
      {"garbage then brace", assemble(valid + " x}", data)},
      {"two objects", assemble(valid + valid, data)},
      {"overlong UTF-8", assemble("{\"w\xC0\xAF\"" + valid.substr(4), data)},
      {"surrogate", assemble("{\"\xED\xA0\x80\"" + valid.substr(4), data)},
      {"beyond U+10FFFF", assemble("{\"\xF4\x90\x80\x80\"" + valid.substr(4), data)},
      {"lone continuation", assemble("{\"\x80\"" + valid.substr(4), data)},
      {"truncated sequence", assemble("{\"\xE2\x82\"" + valid.substr(4), data)},
      {"escaped lone surrogate", assemble("{\"\\ud800\"" + valid.substr(4), data)},
      {"non-UTF-8 metadata", assemble("{\"__metadata__\":{\"k\":\"\xFF\"}," + rest, data)},
      {"a megabyte name", assemble("{\"" + std::string(1 << 20, 'n') + "\":[]," + rest, data)},
      {"a megabyte dtype",
       assemble(header(entry("[2]", "[0,8]", '"' + std::string(1 << 20, 'd') + '"')), data)},
      {"a megabyte number",
       assemble(header(entry("[" + std::string(1 << 20, '7') + "]", "[0,8]")), data)},
      {"a megabyte bad string",
       assemble(header(entry("[2]", "[0,8]", '"' + std::string(1 << 20, 's') + "\x01\"")), data)},
      {"empty header", assemble("", data)},
      {"empty object", assemble("{}", "")},
      {"empty object with data", assemble("{}", data)},
      {"only a length", assemble("", "")},
      {"short file", std::string("\x02\x00\x00", 3)},
      {"empty file", ""},
      {"BOOL byte 2",
       assemble(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02")},
      {"empty tensors", assemble(R"({"a":)" + entry("[3,0]", "[0,0]") + R"(,"b":)" +
                                     entry("[0]", "[0,0]", "\"BOOL\"") + "}",
                                 "")},
  };
  std::string many = "{";  // 10,000 empty tensors
  for (int i = 0; i < 10'000; ++i)
    many += fmt::format("{}\"t{}\":{}", i ? "," : "", i, entry("[0]", "[0,0]"));
  out.emplace_back("10,000 empty tensors", assemble(many + "}", ""));
  return out;
}

Fuzzer::Fuzzer(std::string scratch) : scratch_(std::move(scratch)) {
  manual_seed(2024);
  testing::Block block(3);
  nn::save(block, scratch_);
  seeds_.push_back(read_file(scratch_));
  nn::write_safetensors(scratch_, block.state_dict(),
                        {{"format", "pt"},
                         {"note",
                          "\xC3\xBCnic\xC3\xB6"
                          "de \xE2\x9C\x93"}});
  seeds_.push_back(read_file(scratch_));
  nn::write_safetensors(scratch_, {{"a", randn({2, 2})}, {"b", zeros({0}, kInt64)}});
  seeds_.push_back(read_file(scratch_));
  for (const auto& e : target_.state_dict()) shapes_.push_back(e.second.shape());
}

Fuzzer::~Fuzzer() { std::remove(scratch_.c_str()); }

std::string Fuzzer::input(uint64_t seed, uint64_t i) const {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xBF58476D1CE4E5B9ull);
  const std::string& base = seeds_[rng() % seeds_.size()];
  uint64_t length = 0;
  std::memcpy(&length, base.data(), 8);
  std::string header = base.substr(8, length), data = base.substr(8 + length);
  if (rng() % 4 == 0 && !data.empty()) {  // data bytes only: most load (BOOL bytes may not)
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k)
      data[rng() % data.size()] = static_cast<char>(rng() % 2 ? rng() : rng() % 2);
    return assemble(header, data);
  }
  const int header_edits = static_cast<int>(rng() % 4), byte_edits = static_cast<int>(rng() % 3);
  for (int k = 0; k < header_edits; ++k) edit_header(header, rng);
  std::string bytes = assemble(header, data);
  for (int k = 0; k < byte_edits || (header_edits == 0 && k == 0); ++k) edit_bytes(bytes, rng);
  return bytes;
}

std::string Fuzzer::check(const std::string& bytes, uint64_t which) {
  {
    std::ofstream out(scratch_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.good()) return "cannot write the scratch file " + scratch_;
  }
  const std::string op = which % 3 == 2 ? "read_safetensors" : "load";
  decltype(testing::snapshot(target_)) before;
  if (op == "load") before = testing::snapshot(target_);
  try {
    if (which % 3 == 2)
      nn::read_safetensors(scratch_);
    else
      nn::load(target_, scratch_, /*strict=*/which % 3 == 0);
    ++loaded;
  } catch (const Error& e) {
    ++rejected;
    const std::string msg = e.what();
    if (!msg.starts_with(op + ": ")) return fmt::format("{} error without its name: {}", op, msg);
    if (msg.size() > kMaxMessage + 3 * scratch_.size())
      return fmt::format("{} error of {} characters: {}...", op, msg.size(), msg.substr(0, 300));
    if (op == "load" && !same_bits(testing::snapshot(target_), before))
      return "a failed load changed the module: " + msg;
    return "";
  } catch (const std::exception& e) {
    return fmt::format("{} threw {} (not ember::Error): {}", op, typeid(e).name(), e.what());
  } catch (...) {
    return op + " threw something that is not a std::exception";
  }
  size_t j = 0;
  for (const auto& e : target_.state_dict())
    if (e.second.shape() != shapes_[j++]) return "a load changed the shape of " + e.first;
  return "";
}

void Fuzzer::edit_header(std::string& h, std::mt19937_64& rng) const {
  if (h.empty()) h = "{}";
  const size_t at = rng() % h.size();
  const auto find_number = [&] {
    size_t b = h.find_first_of("-0123456789", at);
    if (b == std::string::npos) b = h.find_first_of("-0123456789");
    size_t e = b == std::string::npos ? b : h.find_first_not_of("-+.0123456789eE", b);
    return std::pair{b, e == std::string::npos ? h.size() : e};
  };
  switch (rng() % 10) {
    case 0:  // a JSON-ish character
      h[at] = kJsonish[rng() % (sizeof(kJsonish) - 1)];
      break;
    case 1:  // an inserted character, JSON-ish or any byte
      h.insert(at, 1,
               rng() % 2 ? kJsonish[rng() % (sizeof(kJsonish) - 1)] : static_cast<char>(rng()));
      break;
    case 2:  // a deleted range
      h.erase(at, 1 + rng() % 8);
      break;
    case 3: {  // a copied range (duplicate names, fields, entries)
      const size_t from = rng() % h.size(), n = 1 + rng() % 64;
      h.insert(rng() % h.size(), h.substr(from, n));
      break;
    }
    case 4: {  // a number replaced
      const auto [b, e] = find_number();
      if (b != std::string::npos) h.replace(b, e - b, interesting_number(rng));
      break;
    }
    case 5: {  // a string replaced
      size_t b = h.find('"', at);
      if (b == std::string::npos) b = h.find('"');
      const size_t e = b == std::string::npos ? b : h.find('"', b + 1);
      if (e != std::string::npos) h.replace(b + 1, e - b - 1, interesting_string(rng));
      break;
    }
    case 6: {  // a number wrapped in arrays or objects, shallow or deep
      const auto [b, e] = find_number();
      if (b == std::string::npos) break;
      static const size_t kDepths[] = {1, 2, 3, 4, 10, 1000, 50'000};
      const size_t depth = kDepths[rng() % std::size(kDepths)];
      const bool object = rng() % 4 == 0;
      h.replace(b, e - b,
                object ? nest("{\"a\":", h.substr(b, e - b), "}", depth)
                       : nest("[", h.substr(b, e - b), "]", depth));
      break;
    }
    case 7: {  // padding or garbage at either end
      static const char* const kEnds[] = {" ", "        ", "\t",           "\n", "}",
                                          "]", " x",       "\xEF\xBB\xBF", "{}"};
      const std::string piece =
          rng() % 5 == 4 ? std::string(1, '\0') : std::string(kEnds[rng() % std::size(kEnds)]);
      if (rng() % 3 == 0)
        h.insert(0, piece);
      else
        h += piece;
      break;
    }
    case 8: {  // an entry duplicated whole: from a '"' to the matching '}'
      const size_t b = h.find('"', at), e = b == std::string::npos ? b : h.find('}', b);
      if (e != std::string::npos) h.insert(b, h.substr(b, e - b + 1) + ",");
      break;
    }
    default:  // a bit flipped
      h[at] = static_cast<char>(h[at] ^ (1 << (rng() % 8)));
      break;
  }
}

void Fuzzer::edit_bytes(std::string& b, std::mt19937_64& rng) const {
  if (b.empty()) return;
  const size_t at = rng() % b.size();
  switch (rng() % 8) {
    case 0:
      b[at] = static_cast<char>(b[at] ^ (1 << (rng() % 8)));
      break;
    case 1:
      b[at] = static_cast<char>(rng());
      break;
    case 2:
      b.resize(at);
      break;
    case 3:
      b.insert(at, std::string(1 + rng() % 8, static_cast<char>(rng())));
      break;
    case 4:
      b.erase(at, 1 + rng() % 16);
      break;
    case 5: {  // the length prefix: near the real one, at a limit, or anything
      uint64_t length = 0;
      if (b.size() >= 8) std::memcpy(&length, b.data(), 8);
      static const uint64_t kLengths[] = {
          0, 1, 2, 7, 8, 100'000'000, 100'000'001, uint64_t(1) << 63, UINT64_MAX};
      const uint64_t choice = rng() % 4;
      length = choice == 0   ? length + (rng() % 17) - 8
               : choice == 1 ? kLengths[rng() % std::size(kLengths)]
               : choice == 2 ? b.size() - 8 - rng() % std::min<size_t>(b.size(), 16)
                             : rng();
      if (b.size() < 8) b.resize(8);
      std::memcpy(b.data(), &length, 8);
      break;
    }
    case 6: {  // a splice from a seed file
      const std::string& other = seeds_[rng() % seeds_.size()];
      const size_t from = rng() % other.size(), n = 1 + rng() % 256;
      const std::string piece = other.substr(from, n);
      if (rng() % 2)
        b.replace(at, piece.size(), piece);
      else
        b.insert(at, piece);
      break;
    }
    default:  // more data
      b.append(1 + rng() % 16, static_cast<char>(rng()));
      break;
  }
}

}  // namespace ember::fuzz
