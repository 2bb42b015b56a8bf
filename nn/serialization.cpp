// safetensors reading and writing; see Note [Hostile checkpoints] for how reading stays safe on
// any file, and write_safetensors for how a save replaces a file atomically.
#include "nn/serialization.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "graph/autograd.h"

namespace ember::nn {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; Ember copies it as is");

// Note [Hostile checkpoints]
// A checkpoint may come from anywhere, so reading one must end in tensors or an ember::Error,
// in time and memory proportional to the file, whatever its bytes:
// - only a regular file is opened (a FIFO would block, /dev/zero never ends), and the 8-byte
//   header length is checked against the file's size and the 100 MB cap before the header is
//   read; tensor bytes are read only after the whole header is validated, straight into the
//   new tensors;
// - the header's bytes must be UTF-8 without NUL (nlohmann stops at a NUL as at the end), start
//   with '{' (no byte order mark) and end in '}' padded with spaces only;
// - HeaderReader parses it through nlohmann's SAX interface, which keeps its nesting on a heap
//   stack (no recursion), and builds the entries itself (no JSON tree): the format has three
//   levels (top object, entry object, shape or data_offsets array), and a fourth is refused
//   when it opens, as is every value of the wrong kind, a duplicate name or field, and a shape
//   of more than kMaxDims dims or elements than an int64 counts;
// - a message quotes at most kQuoteBytes of any name or value from the file (clip).

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // as the reference implementation
constexpr size_t kQuoteBytes = 100;
constexpr size_t kListedNames = 20;  // names listed in a message, then "and N more"

// s for a message: at most `limit` bytes (cut at a UTF-8 boundary), control bytes escaped.
std::string clip(std::string_view s, size_t limit = kQuoteBytes) {
  size_t n = std::min(s.size(), limit);
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  std::string out;
  for (const char c : s.substr(0, n)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F)
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  if (n < s.size()) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

// "a, b, c" of at most kListedNames names, then "and N more" up to `total`; or "none".
std::string join(const std::vector<std::string>& names, size_t total = 0) {
  total = std::max(total, names.size());
  if (total == 0) return "none";
  std::string out;
  for (size_t i = 0; i < names.size() && i < kListedNames; ++i)
    out += fmt::format("{}{}", i == 0 ? "" : ", ", names[i]);
  if (total > kListedNames) out += fmt::format(" and {} more", total - kListedNames);
  return out;
}

std::string_view format_dtype(DType t) { return dtype_info(t).safetensors; }

std::optional<DType> parse_dtype(std::string_view s) {
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

// The offset of the first byte of s that is not valid UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or npos.
size_t invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;                        // continuation bytes
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the first continuation byte
    if (c < 0x80) {
      n = 0;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      lo = c == 0xE0 ? 0xA0 : 0x80;
      hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      lo = c == 0xF0 ? 0x90 : 0x80;
      hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
      return i;
    }
    if (s.size() - i <= n) return i;
    for (size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return i;
    }
    i += n + 1;
  }
  return std::string_view::npos;
}

// A file descriptor, closed when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, returning close's result (a write error may surface only here).
  int close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

std::string errno_text() { return std::strerror(errno); }

// --- reading

// One tensor of a validated file: its bytes are the data section's [begin, end).
struct Entry {
  std::string name;
  DType dtype = kFloat32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct ParsedFile {
  Fd fd;
  std::string path;
  uint64_t data_start = 0;  // 8 + header length
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};

// What a file that is not regular is, for messages.
std::string_view file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Opens path, which must be a regular file (checked before opening, so that opening a device
// has no effect, and again on the open file), and returns its size.
uint64_t open_regular(const std::string& path, std::string_view op, Fd& fd) {
  struct stat st {};
  EMBER_CHECK(::stat(path.c_str(), &st) == 0, "{}: cannot open '{}': {}", op, path, errno_text());
  EMBER_CHECK(S_ISREG(st.st_mode), "{}: cannot read '{}': it is {}, not a regular file", op, path,
              file_kind(st.st_mode));
  fd = Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  EMBER_CHECK(fd.get() >= 0, "{}: cannot open '{}': {}", op, path, errno_text());
  EMBER_CHECK(::fstat(fd.get(), &st) == 0, "{}: cannot read '{}': {}", op, path, errno_text());
  EMBER_CHECK(S_ISREG(st.st_mode), "{}: cannot read '{}': it is {}, not a regular file", op, path,
              file_kind(st.st_mode));
  return static_cast<uint64_t>(st.st_size);
}

// Reads exactly n bytes at offset `at` into dst; a short read means the file shrank meanwhile.
void read_at(const ParsedFile& f, char* dst, uint64_t n, uint64_t at, std::string_view op) {
  while (n > 0) {
    const ssize_t got =
        ::pread(f.fd.get(), dst, std::min<uint64_t>(n, 1 << 30), static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    EMBER_CHECK(got >= 0, "{}: error reading '{}': {}", op, f.path, errno_text());
    EMBER_CHECK(got > 0, "{}: '{}' is truncated: it ended at byte {} while being read", op, f.path,
                at);
    dst += got;
    n -= static_cast<uint64_t>(got);
    at += static_cast<uint64_t>(got);
  }
}

// Builds the entries of a header from nlohmann's SAX events (Note [Hostile checkpoints]),
// throwing ember::Error at the first thing the format does not allow. Its state is where in
// the format's three levels the next event lands.
class HeaderReader {
 public:
  HeaderReader(std::string_view op, const std::string& path, uint64_t data_size)
      : op_(op), path_(path), data_size_(data_size) {}

  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;

  // nlohmann::json::sax_parse's interface.
  bool null() { unexpected("null"); }
  bool boolean(bool b) { unexpected(b ? "true" : "false"); }
  bool number_integer(int64_t v) {
    return number(v >= 0 ? std::optional<uint64_t>(v) : std::nullopt, std::to_string(v));
  }
  bool number_unsigned(uint64_t v) { return number(v, std::to_string(v)); }
  bool number_float(double, const std::string& text) { return number(std::nullopt, text); }
  bool binary(nlohmann::json::binary_t&) { unexpected("binary data"); }
  bool string(std::string& s);
  bool start_object(size_t);
  bool key(std::string& k);
  bool end_object();
  bool start_array(size_t);
  bool end_array();
  // nlohmann's message quotes the token it stopped at, which may be the whole header.
  bool parse_error(size_t, const std::string& last_token, const nlohmann::json::exception& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
    if (const size_t at = what.find("] "); at != std::string::npos) what.erase(0, at + 2);
    const size_t at = what.find(last_token);
    if (!last_token.empty() && at != std::string::npos)
      what.replace(at, last_token.size(), clip(last_token));
    throw Error(fmt::format("{}: '{}' has a malformed header (invalid JSON: {})", op_, path_,
                            clip(what, 3 * kQuoteBytes)));
  }

 private:
  enum class At {
    kStart,
    kTop,
    kTopValue,
    kEntry,
    kField,
    kShape,
    kOffsets,
    kMeta,
    kMetaValue,
    kDone
  };
  enum class Field { kDtype, kShape, kOffsets };

  bool number(std::optional<uint64_t> v, const std::string& text);
  [[noreturn]] void unexpected(std::string_view found);
  void finish_entry();

  Error entry_error(std::string_view why) const {
    return Error(
        fmt::format("{}: tensor '{}' in '{}': {}", op_, clip(entries.back().name), path_, why));
  }

  std::string_view op_;
  const std::string& path_;
  uint64_t data_size_;
  At at_ = At::kStart;
  bool in_metadata_ = false, seen_metadata_ = false;
  Field field_ = Field::kDtype;
  bool has_[3] = {false, false, false};                      // by Field
  std::map<std::string, std::string>::iterator meta_value_;  // of the last metadata key
  int offsets_seen_ = 0;
  uint64_t offsets_[2] = {0, 0};
  std::string offsets_text_[2];
};

bool HeaderReader::start_object(size_t) {
  if (at_ == At::kStart) {
    at_ = At::kTop;
  } else if (at_ == At::kTopValue) {
    at_ = in_metadata_ ? At::kMeta : At::kEntry;
  } else {
    unexpected("an object");
  }
  return true;
}

bool HeaderReader::key(std::string& k) {
  if (at_ == At::kTop) {
    in_metadata_ = k == "__metadata__";
    if (in_metadata_) {
      EMBER_CHECK(!seen_metadata_, "{}: '{}' has __metadata__ twice in its header", op_, path_);
      seen_metadata_ = true;
    } else {
      entries.emplace_back().name = std::move(k);
      std::fill(std::begin(has_), std::end(has_), false);
      offsets_seen_ = 0;
    }
    at_ = At::kTopValue;
  } else if (at_ == At::kEntry) {
    if (k == "dtype")
      field_ = Field::kDtype;
    else if (k == "shape")
      field_ = Field::kShape;
    else if (k == "data_offsets")
      field_ = Field::kOffsets;
    else
      throw entry_error(fmt::format(
          "unknown field '{}' (an entry holds dtype, shape and data_offsets)", clip(k)));
    bool& has = has_[static_cast<int>(field_)];
    if (has) throw entry_error(fmt::format("field '{}' appears twice", k));
    has = true;
    at_ = At::kField;
  } else {                                                        // At::kMeta
    const auto [it, fresh] = metadata.try_emplace(std::move(k));  // k stays if not fresh
    EMBER_CHECK(fresh, "{}: __metadata__ key '{}' appears twice in '{}'", op_, clip(k), path_);
    meta_value_ = it;
    at_ = At::kMetaValue;
  }
  return true;
}

bool HeaderReader::end_object() {
  if (at_ == At::kEntry) finish_entry();
  at_ = at_ == At::kTop ? At::kDone : At::kTop;
  return true;
}

bool HeaderReader::start_array(size_t) {
  if (at_ == At::kField && field_ == Field::kShape)
    at_ = At::kShape;
  else if (at_ == At::kField && field_ == Field::kOffsets)
    at_ = At::kOffsets;
  else
    unexpected("an array");
  return true;
}

bool HeaderReader::end_array() {
  if (at_ == At::kOffsets && offsets_seen_ != 2)
    throw entry_error(
        fmt::format("data_offsets has {} values, not a pair [begin, end]", offsets_seen_));
  at_ = At::kEntry;
  return true;
}

bool HeaderReader::string(std::string& s) {
  if (at_ == At::kField && field_ == Field::kDtype) {
    const std::optional<DType> t = parse_dtype(s);
    if (!t)
      throw entry_error(
          fmt::format("unknown dtype '{}' (Ember reads {})", clip(s), known_dtypes()));
    entries.back().dtype = *t;
    at_ = At::kEntry;
  } else if (at_ == At::kMetaValue) {
    meta_value_->second = std::move(s);
    at_ = At::kMeta;
  } else {
    unexpected(fmt::format("the string '{}'", clip(s)));
  }
  return true;
}

// v: the number when it is a non-negative integer that fits a uint64.
bool HeaderReader::number(std::optional<uint64_t> v, const std::string& text) {
  if (at_ == At::kShape) {
    Shape& shape = entries.back().shape;
    if (!v || *v > uint64_t(INT64_MAX))
      throw entry_error(fmt::format("dim {} of the shape is {}, not a non-negative integer",
                                    shape.size(), clip(text)));
    if (shape.size() == kMaxDims)
      throw entry_error(fmt::format("the shape has more than {} dims", kMaxDims));
    shape.push_back(static_cast<int64_t>(*v));
  } else if (at_ == At::kOffsets) {
    if (offsets_seen_ == 2)
      throw entry_error("data_offsets has more than 2 values, not a pair [begin, end]");
    offsets_[offsets_seen_] = v.value_or(UINT64_MAX);  // UINT64_MAX: out of range below
    offsets_text_[offsets_seen_++] = clip(text);
  } else {
    unexpected(fmt::format("the number {}", clip(text)));
  }
  return true;
}

// A value of the wrong kind where the state expects another: the error says what was expected.
void HeaderReader::unexpected(std::string_view found) {
  switch (at_) {
    case At::kStart:
      throw Error(fmt::format("{}: '{}' has a malformed header (not a JSON object: {})", op_, path_,
                              found));
    case At::kTopValue:
      if (in_metadata_)
        throw Error(fmt::format("{}: __metadata__ in '{}' is not a JSON object (found {})", op_,
                                path_, found));
      throw entry_error(fmt::format("header entry is not a JSON object (found {})", found));
    case At::kField:
      if (field_ == Field::kDtype)
        throw entry_error(fmt::format("dtype is {}, not a string", found));
      if (field_ == Field::kShape)
        throw entry_error(fmt::format("shape is {}, not an array", found));
      throw entry_error(fmt::format("data_offsets is {}, not a pair [begin, end]", found));
    case At::kShape:
      throw entry_error(fmt::format("dim {} of the shape is {}, not a non-negative integer",
                                    entries.back().shape.size(), found));
    case At::kOffsets:
      throw entry_error(fmt::format("data_offsets holds {}, not a pair of integers", found));
    case At::kMetaValue:
      throw Error(fmt::format("{}: __metadata__ value of '{}' in '{}' is {}, not a string", op_,
                              clip(meta_value_->first), path_, found));
    default:  // kTop, kEntry, kMeta, kDone: the parser gives only keys and ends there
      throw Error(
          fmt::format("{}: '{}' has a malformed header ({} in an object)", op_, path_, found));
  }
}

// Checks the entry just closed against the data section.
void HeaderReader::finish_entry() {
  if (!(has_[0] && has_[1] && has_[2]))
    throw entry_error("header entry needs dtype, shape and data_offsets");
  Entry& e = entries.back();
  e.begin = offsets_[0];
  e.end = offsets_[1];
  const std::string offsets = fmt::format("[{}, {}]", offsets_text_[0], offsets_text_[1]);
  if (e.begin > e.end || e.end > data_size_)
    throw entry_error(fmt::format("data_offsets {} out of range for a data section of {} bytes",
                                  offsets, data_size_));
  // As shape_numel (Note [Checked sizes]): the product of the nonzero sizes fits an int64.
  int64_t reach = 1, numel = 1, nbytes = 0;
  bool overflow = false;
  for (const int64_t s : e.shape) {
    overflow = __builtin_mul_overflow(reach, std::max<int64_t>(s, 1), &reach);
    if (overflow) break;
    numel *= s;  // <= reach: cannot overflow
  }
  overflow = overflow || __builtin_mul_overflow(numel, int64_t(element_size(e.dtype)), &nbytes);
  if (overflow)
    throw entry_error(
        fmt::format("shape {} has too many elements (more than an int64 counts)", e.shape));
  if (uint64_t(nbytes) != e.end - e.begin)
    throw entry_error(fmt::format("shape {} of {} needs {} bytes, data_offsets {} hold {}", e.shape,
                                  dtype_name(e.dtype), nbytes, offsets, e.end - e.begin));
}

// The header's bytes before JSON parsing (Note [Hostile checkpoints]); returns the length of
// the JSON text without its padding.
size_t check_header_bytes(std::string_view h, std::string_view op, const std::string& path) {
  const auto fail = [&](std::string_view why) {
    return Error(fmt::format("{}: '{}' has a malformed header ({})", op, path, why));
  };
  if (h.empty()) throw fail("it is empty");
  if (h[0] != '{')
    throw fail(fmt::format("it starts with byte 0x{:02x}, not '{{'{}",
                           static_cast<unsigned char>(h[0]),
                           h.starts_with("\xEF\xBB\xBF") ? " (a UTF-8 byte order mark)" : ""));
  if (const size_t nul = h.find('\0'); nul != std::string_view::npos)
    throw fail(fmt::format("a NUL byte at byte {} of the header", nul));
  if (const size_t bad = invalid_utf8(h); bad != std::string_view::npos)
    throw fail(fmt::format("invalid UTF-8 at byte {} of the header", bad));
  const size_t end = h.find_last_not_of(' ') + 1;
  if (h[end - 1] != '}')
    throw fail(fmt::format("it ends in byte 0x{:02x}, not '}}' padded with spaces",
                           static_cast<unsigned char>(h[end - 1])));
  return end;
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
                prev ? clip(prev->name) : "", clip(e.name), path, prev ? prev->begin : 0, at,
                e.begin, e.end);
    EMBER_CHECK(e.begin == at, "{}: '{}' has a gap of {} unused bytes before tensor '{}'", op, path,
                e.begin - at, clip(e.name));
    at = e.end;
    prev = &e;
  }
  EMBER_CHECK(at == data_size, "{}: '{}' has {} bytes after the last tensor (data section of {})",
              op, path, data_size - at, data_size);
}

// A name given twice: nlohmann would keep the last, so the reader sees every one and refuses.
void check_unique_names(const std::vector<Entry>& entries, std::string_view op,
                        const std::string& path) {
  std::vector<const std::string*> names;
  names.reserve(entries.size());
  for (const Entry& e : entries) names.push_back(&e.name);
  std::sort(names.begin(), names.end(), [](auto* a, auto* b) { return *a < *b; });
  const auto twice =
      std::adjacent_find(names.begin(), names.end(), [](auto* a, auto* b) { return *a == *b; });
  EMBER_CHECK(twice == names.end(), "{}: tensor '{}' appears twice in the header of '{}'", op,
              clip(**twice), path);
}

ParsedFile parse_file(const std::string& path, std::string_view op) {
  ParsedFile f;
  f.path = path;
  const uint64_t size = open_regular(path, op, f.fd);
  EMBER_CHECK(size >= 8, "{}: '{}' is truncated: {} bytes, a safetensors file has at least 8", op,
              path, size);
  uint64_t header_len = 0;
  read_at(f, reinterpret_cast<char*>(&header_len), 8, 0, op);
  EMBER_CHECK(header_len <= size - 8,
              "{}: '{}' is truncated: header length {} runs past the end of the file ({} bytes)",
              op, path, header_len, size);
  EMBER_CHECK(header_len <= kMaxHeaderBytes, "{}: '{}' has a header of {} bytes (limit {})", op,
              path, header_len, kMaxHeaderBytes);
  f.data_start = 8 + header_len;
  std::string header(header_len, '\0');
  read_at(f, header.data(), header_len, 8, op);
  const size_t json_len = check_header_bytes(header, op, path);
  HeaderReader reader(op, path, size - f.data_start);
  EMBER_CHECK(nlohmann::json::sax_parse(header.data(), header.data() + json_len, &reader),
              "{}: '{}' has a malformed header", op, path);  // the reader throws first
  f.entries = std::move(reader.entries);
  f.metadata = std::move(reader.metadata);
  check_unique_names(f.entries, op, path);
  check_layout(f.entries, size - f.data_start, op, path);
  return f;
}

// A new tensor holding entry e's bytes, which are checked where the dtype demands.
Tensor make_tensor(const ParsedFile& f, const Entry& e, std::string_view op) {
  Tensor t;
  try {
    t = empty(e.shape, e.dtype);
  } catch (const Error& error) {  // the shape is valid, but may be beyond this machine's memory
    throw Error(fmt::format("{}: tensor '{}' in '{}': {}", op, clip(e.name), f.path, error.what()));
  }
  if (e.end == e.begin) return t;
  char* p = static_cast<char*>(t.impl()->storage->data());
  read_at(f, p, e.end - e.begin, f.data_start + e.begin, op);
  if (e.dtype == kBool) {  // C++ bool must hold 0 or 1; any other byte is corrupt
    for (uint64_t i = 0; i < e.end - e.begin; ++i)
      EMBER_CHECK(p[i] == 0 || p[i] == 1, "{}: tensor '{}' in '{}' has a BOOL byte {} (not 0 or 1)",
                  op, clip(e.name), f.path, static_cast<int>(static_cast<unsigned char>(p[i])));
  }
  return t;
}

// --- writing

// Writes all of [p, p + n) to fd; false (errno set) on failure.
bool write_whole(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t put = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

// A temporary file beside `path`, under a random name, created exclusively: never an existing
// file, nor a symlink planted at the name (O_EXCL and O_NOFOLLOW), nor another process's
// temporary. Removed when destroyed unless renamed into place.
class TempFile {
 public:
  explicit TempFile(const std::string& path) {
    const std::filesystem::path p(path);
    // At most 200 bytes of the file name, so that the suffix keeps it within NAME_MAX.
    const std::string stem = (p.parent_path() / p.filename().string().substr(0, 200)).string();
    std::random_device random;
    for (int attempt = 0;; ++attempt) {
      name_ = fmt::format("{}.tmp-{:08x}{:08x}", stem, random(), random());
      fd_ = Fd(::open(name_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666));
      if (fd_.get() >= 0) return;
      EMBER_CHECK(errno == EEXIST && attempt < 100, "save: cannot open '{}' for writing: {}", name_,
                  errno_text());
    }
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (!renamed_) ::unlink(name_.c_str());
  }

  int fd() const { return fd_.get(); }
  // Syncs the contents to disk, closes and renames the file to path.
  void commit(const std::string& path) {
    EMBER_CHECK(::fsync(fd_.get()) == 0, "save: error writing '{}': {}", name_, errno_text());
    EMBER_CHECK(fd_.close() == 0, "save: error writing '{}': {}", name_, errno_text());
    EMBER_CHECK(::rename(name_.c_str(), path.c_str()) == 0, "save: cannot rename '{}' to '{}': {}",
                name_, path, errno_text());
    renamed_ = true;
  }

 private:
  std::string name_;
  Fd fd_;
  bool renamed_ = false;
};

// Why `path` cannot be saved to, before anything is written: it is a directory, or its
// directory is missing or not one.
void check_target(const std::string& path) {
  const std::filesystem::path p(path);
  EMBER_CHECK(!path.empty() && p.has_filename(), "save: '{}' does not name a file", path);
  struct stat st {};
  EMBER_CHECK(::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode),
              "save: cannot open '{}' for writing: it is a directory", path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  EMBER_CHECK(::stat(dir.c_str(), &st) == 0,
              "save: cannot open '{}' for writing: directory '{}': {}", path, dir, errno_text());
  EMBER_CHECK(S_ISDIR(st.st_mode), "save: cannot open '{}' for writing: '{}' is not a directory",
              path, dir);
}

// After a rename, the directory entry itself must reach the disk for the save to be durable.
void sync_directory(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  EMBER_CHECK(fd.get() >= 0, "save: wrote '{}' but cannot open its directory to sync it: {}", path,
              errno_text());
  // EINVAL: a file system that cannot sync directories (nothing to do).
  EMBER_CHECK(::fsync(fd.get()) == 0 || errno == EINVAL,
              "save: wrote '{}' but cannot sync its directory: {}", path, errno_text());
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  ParsedFile f = parse_file(path, "read_safetensors");
  SafetensorsFile out;
  for (const Entry& e : f.entries)
    out.tensors.emplace(e.name, make_tensor(f, e, "read_safetensors"));
  out.metadata = std::move(f.metadata);
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
    const Tensor c = t.detach().cpu().contiguous();  // written from the host
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

  // Write a unique temporary beside `path`, sync it, and rename it over `path` (atomic on POSIX:
  // a reader sees the old file or the new one, never a part).
  check_target(path);
  TempFile tmp(path);
  bool ok = write_whole(tmp.fd(), reinterpret_cast<const char*>(&header_len), 8) &&
            write_whole(tmp.fd(), text.data(), text.size());
  for (size_t i = 0; ok && i < data.size(); ++i) {
    const Tensor& c = data[i];
    if (c.numel() == 0) continue;
    const size_t size = element_size(c.dtype());
    ok = write_whole(
        tmp.fd(), static_cast<const char*>(c.impl()->storage->data()) + c.storage_offset() * size,
        c.numel() * size);
  }
  EMBER_CHECK(ok, "save: error writing '{}': {}", path, errno_text());
  tmp.commit(path);
  sync_directory(path);
}

void save(const Module& module, const std::string& path) {
  write_safetensors(path, module.state_dict(), {{"format", "pt"}});
}

void load(Module& module, const std::string& path, bool strict) {
  const ParsedFile f = parse_file(path, "load");
  std::map<std::string_view, const Entry*> in_file;  // views of f's names
  for (const Entry& e : f.entries) in_file.emplace(e.name, &e);

  // Match names, then shapes and dtypes, reporting every problem of a kind at once.
  const NamedTensors state = module.state_dict();
  std::vector<std::string> missing, mismatched;
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
  if (strict) {
    std::vector<const std::string*> unexpected;
    for (const Entry& e : f.entries)
      if (!known.contains(e.name)) unexpected.push_back(&e.name);
    const size_t listed = std::min(unexpected.size(), kListedNames);
    std::partial_sort(unexpected.begin(), unexpected.begin() + listed, unexpected.end(),
                      [](auto* a, auto* b) { return *a < *b; });
    std::vector<std::string> names;
    for (size_t i = 0; i < listed; ++i) names.push_back(clip(*unexpected[i]));
    EMBER_CHECK(missing.empty() && unexpected.empty(),
                "load: '{}' does not match {}: missing {}; unexpected {}", path, module.type_name(),
                join(missing), join(names, unexpected.size()));
  }
  EMBER_CHECK(mismatched.empty(), "load: '{}' does not match {}: {}", path, module.type_name(),
              join(mismatched));

  // Build every source first so nothing can fail once the module starts changing.
  std::vector<Tensor> sources;
  // (On the module's device: the host's bytes go to a GPU's here, Module::to's way.)
  for (const auto& m : matched)
    sources.push_back(make_tensor(f, *m.second, "load").to(m.first.device()));
  NoGradGuard no_grad;
  for (size_t i = 0; i < matched.size(); ++i) matched[i].first.copy_(sources[i]);
}

}  // namespace ember::nn
