// A fuzzer of the checkpoint reader (nn::load, nn::read_safetensors), shared by the test suite
// test_checkpoint_fuzz (a few thousand inputs in every CI run, also under the sanitizers) and the
// fuzz_checkpoint program (long campaigns). Inputs are seeded mutations of valid files (bit
// flips, byte edits, insertions, deletions, truncations, length changes, splices, replaced
// numbers and strings, deep nesting) and a list of structural attacks. Every input must load or
// throw ember::Error whose message starts with the op and is short; a failed load must leave the
// module unchanged, a successful one its shapes. Anything else is a failure, and the harness
// says what happened instead.
#pragma once

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ember.h"
#include "tests/nn_modules.h"

namespace ember::fuzz {

// The longest message the reader may give, beyond the file's path (Note [Hostile checkpoints]:
// quotes are clipped, lists capped; a load's shape-mismatch list is the longest legitimate one).
constexpr size_t kMaxMessage = 4096;

// A checkpoint: 8-byte little-endian length (the header's size unless given), header, data.
std::string assemble(const std::string& header, const std::string& data, uint64_t length);
std::string assemble(const std::string& header, const std::string& data);
// `open` depth times, inner, `close` depth times.
std::string nest(const std::string& open, const std::string& inner, const std::string& close,
                 size_t depth);

// Named hostile files: deep nesting, huge lengths, overflowing shapes, bad offsets, duplicates,
// NUL, BOM, padding, non-UTF-8, long values. Built around a small valid file of three tensors.
std::vector<std::pair<std::string, std::string>> structural_attacks();

class Fuzzer {
 public:
  // scratch: the file each input is written to (best in memory, e.g. under /dev/shm).
  explicit Fuzzer(std::string scratch);
  ~Fuzzer();
  Fuzzer(const Fuzzer&) = delete;
  Fuzzer& operator=(const Fuzzer&) = delete;

  int64_t loaded = 0, rejected = 0;

  // Input i of the campaign `seed`: a function of (seed, i) only, so any input can be remade.
  std::string input(uint64_t seed, uint64_t i) const;
  // Writes bytes to the scratch file and reads them: which % 3 is 0 for a strict load, 1 for
  // a non-strict one, 2 for read_safetensors. "" when the outcome is allowed, else what happened.
  std::string check(const std::string& bytes, uint64_t which);

 private:
  // An edit of the header text; the length prefix will follow it.
  void edit_header(std::string& h, std::mt19937_64& rng) const;
  // An edit of the whole file, length prefix and data included.
  void edit_bytes(std::string& b, std::mt19937_64& rng) const;

  std::string scratch_;
  std::vector<std::string> seeds_;  // valid files that mutations start from
  testing::Block target_{3};
  std::vector<Shape> shapes_;  // of target_'s state
};

}  // namespace ember::fuzz
