// Vocab: tokens <-> ids, as torchtext's Vocab. Ids 0..3 are the specials <pad> <s> </s> <unk>;
// the other tokens follow by falling frequency (ties by byte order), as torchtext's
// build_vocab_from_iterator. A vocabulary saves as text, one token per line in id order, so it
// sits next to a model's safetensors file (or in its __metadata__ via to_text / from_text).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ember::data {

class Vocab {
 public:
  static constexpr int64_t kPad = 0, kBos = 1, kEos = 2, kUnk = 3;
  static constexpr std::string_view kSpecials[] = {"<pad>", "<s>", "</s>", "<unk>"};

  Vocab();  // the four specials only
  // tokens[i] is id i; the first four must be the specials, and no token may repeat, be empty
  // or hold a newline.
  explicit Vocab(std::vector<std::string> tokens);
  // Every token seen at least min_freq times in the sequences, after the specials.
  static Vocab build(const std::vector<std::vector<std::string>>& sequences, int64_t min_freq = 1);

  int64_t size() const { return static_cast<int64_t>(itos_.size()); }
  bool contains(const std::string& token) const { return stoi_.contains(token); }
  int64_t operator[](const std::string& token) const;  // kUnk when absent
  const std::string& token(int64_t id) const;          // throws when out of range
  const std::vector<std::string>& tokens() const { return itos_; }

  // Ids of the tokens, optionally between <s> and </s>.
  std::vector<int64_t> encode(const std::vector<std::string>& tokens, bool bos = false,
                              bool eos = false) const;
  // Tokens of the ids, skipping <pad> and <s> and stopping at the first </s>.
  std::vector<std::string> decode(const std::vector<int64_t>& ids) const;

  // One token per line, in id order; from_text checks as the constructor does and names `source`
  // (a file name) in its errors.
  std::string to_text() const;
  static Vocab from_text(std::string_view text, const std::string& source = "vocab");
  void save(const std::string& path) const;  // through a temporary file renamed into place
  static Vocab load(const std::string& path);

  bool operator==(const Vocab& other) const { return itos_ == other.itos_; }

 private:
  std::vector<std::string> itos_;
  std::unordered_map<std::string, int64_t> stoi_;
};

}  // namespace ember::data
