// Grapheme-to-phoneme on the CMU Pronouncing Dictionary: the parts of examples/g2p.cpp that
// belong to the task rather than to the library. read_cmudict reads the dictionary and splits it
// by word exactly as issue 14 fixes it, so results compare outside the project:
//   h = 64-bit FNV-1a of the word's bytes (without a "(n)" variant suffix);
//   h % 20 == 0 -> test, h % 20 == 1 -> dev, else train.
// On Debian's pocketsphinx-en-us dictionary that is 125,945 words: 113,281 train / 6,340 dev /
// 6,324 test. Graphemes are the word's characters (UTF-8 code points), phonemes its
// space-separated symbols. Also the metrics: WER and PER against every reference pronunciation.
// Shared by examples/g2p.cpp and tests/test_g2p.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ember.h"

namespace g2p {

inline constexpr const char* kDefaultDict =
    "/usr/share/pocketsphinx/model/en-us/cmudict-en-us.dict";

// 64-bit FNV-1a: offset basis 0xcbf29ce484222325, prime 0x100000001b3.
inline uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

enum class Split { Train, Dev, Test };
inline Split split_of(std::string_view word) {
  const uint64_t r = fnv1a64(word) % 20;
  return r == 0 ? Split::Test : r == 1 ? Split::Dev : Split::Train;
}

// A word and all its pronunciations, in the file's order.
struct Entry {
  std::string word;
  std::vector<std::vector<std::string>> pronunciations;
};

struct CmuDict {
  std::vector<Entry> train, dev, test;  // words in order of first appearance
  int64_t lines = 0;                    // pronunciation lines read (comments not counted)
  std::vector<Entry>& split(Split s) {
    return s == Split::Train ? train : s == Split::Dev ? dev : test;
  }
};

// The characters of a UTF-8 word, one string per code point.
inline std::vector<std::string> graphemes(std::string_view word) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < word.size();) {
    size_t n = 1;
    while (i + n < word.size() && (static_cast<unsigned char>(word[i + n]) & 0xC0) == 0x80) ++n;
    chars.emplace_back(word.substr(i, n));
    i += n;
  }
  return chars;
}

namespace detail {

// A phoneme symbol: upper-case ASCII letters, then an optional stress digit (full CMUdict).
inline bool is_phoneme(std::string_view p) {
  size_t letters = 0;
  while (letters < p.size() && p[letters] >= 'A' && p[letters] <= 'Z') ++letters;
  if (letters == 0) return false;
  return letters == p.size() || (letters + 1 == p.size() && p.back() >= '0' && p.back() <= '2');
}

// "word(2)" -> "word"; a word without a suffix stays. Empty when the suffix is malformed.
inline std::string strip_variant(std::string_view token) {
  const size_t open = token.find('(');
  if (open == std::string_view::npos) return std::string(token);
  const std::string_view digits = token.substr(open + 1);
  if (open == 0 || digits.size() < 2 || digits.back() != ')') return {};
  for (char c : digits.substr(0, digits.size() - 1))
    if (c < '0' || c > '9') return {};
  return std::string(token.substr(0, open));
}

}  // namespace detail

// Reads a CMUdict file: `word PH PH ...` per line, alternatives as `word(2) ...`; lines starting
// with ";;;" are comments, as is anything after " #" (the GitHub cmudict's notes). Every other
// line must be a word and at least one phoneme, or the reader throws naming the file and line:
// nothing is dropped.
inline CmuDict read_cmudict(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in.good(),
              "cmudict: cannot open {}; install the Debian package pocketsphinx-en-us (make deps) "
              "or point --data at a CMUdict file",
              path);
  CmuDict dict;
  std::map<std::string, std::pair<Split, size_t>> where;  // word -> its split and position
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.starts_with(";;;")) continue;
    if (const size_t hash = line.find(" #"); hash != std::string::npos) line.resize(hash);
    std::vector<std::string> fields;
    for (size_t i = 0; i < line.size();) {
      const size_t begin = line.find_first_not_of(" \t", i);
      if (begin == std::string::npos) break;
      const size_t end = std::min(line.find_first_of(" \t", begin), line.size());
      fields.push_back(line.substr(begin, end - begin));
      i = end;
    }
    EMBER_CHECK(fields.size() >= 2, "cmudict: {}:{}: expected `word PHONEME ...`, got '{}'", path,
                number, line);
    const std::string word = detail::strip_variant(fields[0]);
    EMBER_CHECK(!word.empty(), "cmudict: {}:{}: malformed word '{}'", path, number, fields[0]);
    std::vector<std::string> phonemes(fields.begin() + 1, fields.end());
    for (const std::string& p : phonemes)
      EMBER_CHECK(detail::is_phoneme(p), "cmudict: {}:{}: '{}' is not a phoneme symbol", path,
                  number, p);
    auto [it, fresh] = where.try_emplace(word, split_of(word), 0);
    std::vector<Entry>& entries = dict.split(it->second.first);
    if (fresh) {
      it->second.second = entries.size();
      entries.push_back({word, {}});
    }
    entries[it->second.second].pronunciations.push_back(std::move(phonemes));
    ++dict.lines;
  }
  EMBER_CHECK(dict.lines > 0, "cmudict: {} holds no entries", path);
  return dict;
}

}  // namespace g2p

namespace g2p {

// Levenshtein distance between two token sequences (unit costs).
inline int64_t edit_distance(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int64_t>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int64_t diagonal = row[0];
    row[0] = static_cast<int64_t>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int64_t up = row[j];
      row[j] = std::min({up + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// WER and PER over words, as issue 14 defines them: a word is wrong when its prediction matches
// none of its reference pronunciations; PER sums the edit distance to the closest reference
// (the shorter one on a tie) over the summed length of those references.
struct ErrorRates {
  int64_t words = 0, wrong = 0, edits = 0, reference_phonemes = 0;
  void add(const std::vector<int64_t>& prediction,
           const std::vector<std::vector<int64_t>>& references) {
    int64_t best = -1, best_len = 0;
    for (const auto& r : references) {
      const int64_t d = edit_distance(prediction, r);
      const auto len = static_cast<int64_t>(r.size());
      if (best < 0 || d < best || (d == best && len < best_len)) {
        best = d;
        best_len = len;
      }
    }
    ++words;
    wrong += best != 0;
    edits += best;
    reference_phonemes += best_len;
  }
  double wer() const { return words ? static_cast<double>(wrong) / static_cast<double>(words) : 0; }
  double per() const {
    return reference_phonemes ? static_cast<double>(edits) / static_cast<double>(reference_phonemes)
                              : 0;
  }
};

}  // namespace g2p
