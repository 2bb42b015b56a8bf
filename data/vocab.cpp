// Vocab: construction checks, frequency ordering, encode/decode and the text format.
#include "data/vocab.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "graph/error.h"

namespace ember::data {

Vocab::Vocab() : Vocab(std::vector<std::string>(std::begin(kSpecials), std::end(kSpecials))) {}

Vocab::Vocab(std::vector<std::string> tokens) : itos_(std::move(tokens)) {
  EMBER_CHECK(itos_.size() >= 4, "Vocab: needs at least the 4 specials, got {} tokens",
              itos_.size());
  for (size_t i = 0; i < 4; ++i)
    EMBER_CHECK(itos_[i] == kSpecials[i], "Vocab: id {} must be {}, got '{}'", i, kSpecials[i],
                itos_[i]);
  stoi_.reserve(itos_.size());
  for (size_t i = 0; i < itos_.size(); ++i) {
    const std::string& t = itos_[i];
    EMBER_CHECK(!t.empty() && t.find('\n') == std::string::npos,
                "Vocab: token {} is empty or holds a newline", i);
    const bool fresh = stoi_.emplace(t, static_cast<int64_t>(i)).second;
    EMBER_CHECK(fresh, "Vocab: token '{}' appears twice (ids {} and {})", t, stoi_.at(t), i);
  }
}

Vocab Vocab::build(const std::vector<std::vector<std::string>>& sequences, int64_t min_freq) {
  EMBER_CHECK(min_freq >= 1, "Vocab::build: min_freq must be at least 1, got {}", min_freq);
  std::map<std::string, int64_t> counts;
  for (const auto& sequence : sequences)
    for (const std::string& t : sequence) ++counts[t];
  std::vector<std::pair<std::string, int64_t>> ranked;
  for (const auto& [token, n] : counts) {
    const bool special =
        std::find(std::begin(kSpecials), std::end(kSpecials), token) != std::end(kSpecials);
    if (n >= min_freq && !special) ranked.emplace_back(token, n);
  }
  // Falling count, then byte order (the map's order, kept by the stable sort).
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::string> tokens(std::begin(kSpecials), std::end(kSpecials));
  for (auto& [token, n] : ranked) tokens.push_back(std::move(token));
  return Vocab(std::move(tokens));
}

int64_t Vocab::operator[](const std::string& token) const {
  const auto it = stoi_.find(token);
  return it == stoi_.end() ? kUnk : it->second;
}

const std::string& Vocab::token(int64_t id) const {
  EMBER_CHECK(id >= 0 && id < size(), "Vocab: id {} out of range for {} tokens", id, size());
  return itos_[static_cast<size_t>(id)];
}

std::vector<int64_t> Vocab::encode(const std::vector<std::string>& tokens, bool bos,
                                   bool eos) const {
  std::vector<int64_t> ids;
  ids.reserve(tokens.size() + 2);
  if (bos) ids.push_back(kBos);
  for (const std::string& t : tokens) ids.push_back((*this)[t]);
  if (eos) ids.push_back(kEos);
  return ids;
}

std::vector<std::string> Vocab::decode(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    if (id == kEos) break;
    if (id != kPad && id != kBos) tokens.push_back(token(id));
  }
  return tokens;
}

std::string Vocab::to_text() const {
  std::string text;
  for (const std::string& t : itos_) text += t + "\n";
  return text;
}

Vocab Vocab::from_text(std::string_view text, const std::string& source) {
  std::vector<std::string> tokens;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) tokens.push_back(line);
  try {
    return Vocab(std::move(tokens));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", source, e.what()));
  }
}

void Vocab::save(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << to_text();
    EMBER_CHECK(out.good(), "Vocab::save: cannot write {}", tmp);
  }
  std::filesystem::rename(tmp, path);
}

Vocab Vocab::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in.good(), "Vocab::load: cannot open {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_text(ss.str(), path);
}

}  // namespace ember::data
