// safetensors reading and writing. Reading parses and validates the whole file into a list of
// entries before any tensor is built, so every corrupt file is one ember::Error and a failed
// load() leaves the module unchanged.
#include "nn/serialization.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "graph/autograd.h"

namespace ember::nn {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; Ember copies it as is");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // as the reference implementation

std::string_view format_dtype(DType t) { return dtype_info(t).safetensors; }

std::optional<DType> parse_dtype(const std::string& s) {
  for (const DTypeInfo& info : kDTypes)
    if (s == info.safetensors) return info.dtype;
  return std::nullopt;
}

// "F32, F64, I64, BOOL": the names parse_dtype reads, for messages.
std::string known_dtypes() {
  std::string out;
  for (const DTypeInfo& info : kDTypes)
    out += fmt::format("{}{}", out.empty() ? "" : ", ", info.safetensors);
  return out;
}

// One tensor of a validated file: its bytes are data[begin, end).
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

struct ParsedFile {
  std::string bytes;  // the whole file
  size_t data_start;  // 8 + header length
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;

  const char* data(const Entry& e) const { return bytes.data() + data_start + e.begin; }
};

std::string read_bytes(const std::string& path, std::string_view op) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in.good(), "{}: cannot open '{}'", op, path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EMBER_CHECK(!in.bad(), "{}: error reading '{}'", op, path);
  return bytes;
}

uint64_t get_offset(const nlohmann::json& v) {
  return v.is_number_unsigned() ? v.get<uint64_t>() : UINT64_MAX;
}

// Checks one header entry against the data section of `data_size` bytes.
Entry parse_entry(const std::string& name, const nlohmann::json& v, uint64_t data_size,
                  std::string_view op, const std::string& path) {
  const auto fail = [&](std::string_view why) {
    return Error(fmt::format("{}: tensor '{}' in '{}': {}", op, name, path, why));
  };
  if (!v.is_object()) throw fail("header entry is not a JSON object");
  const auto dtype = v.find("dtype"), shape = v.find("shape"), offsets = v.find("data_offsets");
  if (dtype == v.end() || shape == v.end() || offsets == v.end())
    throw fail("header entry needs dtype, shape and data_offsets");
  if (!dtype->is_string()) throw fail("dtype is not a string");
  const std::optional<DType> t = parse_dtype(dtype->get<std::string>());
  if (!t)
    throw fail(fmt::format("unknown dtype '{}' (Ember reads {})", dtype->get<std::string>(),
                           known_dtypes()));
  if (!shape->is_array()) throw fail("shape is not an array");
  Entry e{name, *t, {}, 0, 0};
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
      throw fail(
          fmt::format("shape {} has a dim that is not a non-negative integer", shape->dump()));
    const uint64_t n = d.get<uint64_t>();
    overflow = overflow || __builtin_mul_overflow(numel, n, &numel);
    e.shape.push_back(static_cast<int64_t>(n));
  }
  if (!offsets->is_array() || offsets->size() != 2)
    throw fail("data_offsets is not a pair [begin, end]");
  e.begin = get_offset((*offsets)[0]);
  e.end = get_offset((*offsets)[1]);
  if (e.begin > e.end || e.end > data_size)
    throw fail(fmt::format("data_offsets {} out of range for a data section of {} bytes",
                           offsets->dump(), data_size));
  uint64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, element_size(e.dtype), &nbytes);
  if (overflow || nbytes != e.end - e.begin)
    throw fail(fmt::format("shape {} of {} needs {} bytes, data_offsets {} hold {}", shape->dump(),
                           dtype_name(e.dtype), overflow ? "too many" : std::to_string(nbytes),
                           offsets->dump(), e.end - e.begin));
  return e;
}

// Tensors must tile the data section exactly: sorted by begin, each starts where the last ended.
void check_layout(std::vector<Entry>& entries, uint64_t data_size, std::string_view op,
                  const std::string& path) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    EMBER_CHECK(e.begin >= at,
                "{}: tensors '{}' and '{}' overlap in '{}' (bytes {}..{} and {}..{})", op,
                prev ? prev->name : "", e.name, path, prev ? prev->begin : 0, at, e.begin, e.end);
    EMBER_CHECK(e.begin == at, "{}: '{}' has a gap of {} unused bytes before tensor '{}'", op, path,
                e.begin - at, e.name);
    at = e.end;
    prev = &e;
  }
  EMBER_CHECK(at == data_size, "{}: '{}' has {} bytes after the last tensor (data section of {})",
              op, path, data_size - at, data_size);
}

// C++ bool must hold 0 or 1; any other byte is corrupt.
void check_bools(const ParsedFile& f, std::string_view op, const std::string& path) {
  for (const Entry& e : f.entries) {
    if (e.dtype != kBool) continue;
    const char* p = f.data(e);
    for (uint64_t i = 0; i < e.end - e.begin; ++i)
      EMBER_CHECK(p[i] == 0 || p[i] == 1, "{}: tensor '{}' in '{}' has a BOOL byte {} (not 0 or 1)",
                  op, e.name, path, static_cast<int>(static_cast<unsigned char>(p[i])));
  }
}

ParsedFile parse_file(const std::string& path, std::string_view op) {
  ParsedFile f;
  f.bytes = read_bytes(path, op);
  const uint64_t size = f.bytes.size();
  EMBER_CHECK(size >= 8, "{}: '{}' is truncated: {} bytes, a safetensors file has at least 8", op,
              path, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, f.bytes.data(), 8);
  EMBER_CHECK(header_len <= size - 8,
              "{}: '{}' is truncated: header length {} runs past the end of the file ({} bytes)",
              op, path, header_len, size);
  EMBER_CHECK(header_len <= kMaxHeaderBytes, "{}: '{}' has a header of {} bytes (limit {})", op,
              path, header_len, kMaxHeaderBytes);
  f.data_start = 8 + header_len;
  const char* h = f.bytes.data() + 8;
  const nlohmann::json header = nlohmann::json::parse(h, h + header_len, nullptr, false);
  EMBER_CHECK(!header.is_discarded() && header.is_object(),
              "{}: '{}' has a malformed header (not a JSON object)", op, path);
  const uint64_t data_size = size - f.data_start;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      EMBER_CHECK(v.is_object(), "{}: __metadata__ in '{}' is not a JSON object", op, path);
      for (const auto& [key, value] : v.items()) {
        EMBER_CHECK(value.is_string(), "{}: __metadata__ value of '{}' in '{}' is not a string", op,
                    key, path);
        f.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    f.entries.push_back(parse_entry(name, v, data_size, op, path));
  }
  check_layout(f.entries, data_size, op, path);
  check_bools(f, op, path);
  return f;
}

Tensor make_tensor(const ParsedFile& f, const Entry& e) {
  Tensor t = empty(e.shape, e.dtype);
  if (e.end > e.begin) std::memcpy(t.impl()->storage->data(), f.data(e), e.end - e.begin);
  return t;
}

std::string join(const std::vector<std::string>& names) {
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  const ParsedFile f = parse_file(path, "read_safetensors");
  SafetensorsFile out;
  for (const Entry& e : f.entries) out.tensors.emplace(e.name, make_tensor(f, e));
  out.metadata = f.metadata;
  return out;
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> data;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    EMBER_CHECK(t.defined(), "save: tensor '{}' is undefined", name);
    EMBER_CHECK(name != "__metadata__" && names.insert(name).second,
                "save: the name '{}' appears twice or is reserved", name);
    const Tensor c = t.detach().contiguous();
    const uint64_t nbytes = c.numel() * element_size(c.dtype());
    header[name] = {{"dtype", format_dtype(c.dtype())},
                    {"shape", c.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(c);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("save: a tensor name is not valid UTF-8 ({})", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  const uint64_t header_len = text.size();

  // Write a sibling temporary file, then rename it over `path` (atomic on POSIX).
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    EMBER_CHECK(out.good(), "save: cannot open '{}' for writing", tmp);
    out.write(reinterpret_cast<const char*>(&header_len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const Tensor& c : data)
      out.write(static_cast<const char*>(c.impl()->storage->data()) +
                    c.storage_offset() * element_size(c.dtype()),
                static_cast<std::streamsize>(c.numel() * element_size(c.dtype())));
    out.flush();
    if (!out.good()) {
      out.close();
      std::filesystem::remove(tmp);
      throw Error(fmt::format("save: error writing '{}'", tmp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw Error(fmt::format("save: cannot rename '{}' to '{}': {}", tmp, path, ec.message()));
  }
}

void save(const Module& module, const std::string& path) {
  write_safetensors(path, module.state_dict(), {{"format", "pt"}});
}

void load(Module& module, const std::string& path, bool strict) {
  const ParsedFile f = parse_file(path, "load");
  std::map<std::string, const Entry*> in_file;
  for (const Entry& e : f.entries) in_file.emplace(e.name, &e);

  // Match names, then shapes and dtypes, reporting every problem of a kind at once.
  const NamedTensors state = module.state_dict();
  std::vector<std::string> missing, unexpected, mismatched;
  std::vector<std::pair<Tensor, const Entry*>> matched;
  std::set<std::string> known;
  for (const auto& [name, t] : state) {
    known.insert(name);
    const auto it = in_file.find(name);
    if (it == in_file.end()) {
      missing.push_back(name);
    } else if (it->second->shape != t.shape() || it->second->dtype != t.dtype()) {
      mismatched.push_back(fmt::format("'{}' is {} {} in the file, {} {} in the module", name,
                                       it->second->dtype, it->second->shape, t.dtype(), t.shape()));
    } else {
      matched.emplace_back(t, it->second);
    }
  }
  for (const Entry& e : f.entries)
    if (!known.contains(e.name)) unexpected.push_back(e.name);
  std::sort(unexpected.begin(), unexpected.end());
  EMBER_CHECK(!strict || (missing.empty() && unexpected.empty()),
              "load: '{}' does not match {}: missing {}; unexpected {}", path, module.type_name(),
              join(missing), join(unexpected));
  EMBER_CHECK(mismatched.empty(), "load: '{}' does not match {}: {}", path, module.type_name(),
              join(mismatched));

  // Build every source first so nothing can fail once the module starts changing.
  std::vector<Tensor> sources;
  for (const auto& m : matched) sources.push_back(make_tensor(f, *m.second));
  NoGradGuard no_grad;
  for (size_t i = 0; i < matched.size(); ++i) matched[i].first.copy_(sources[i]);
}

}  // namespace ember::nn
