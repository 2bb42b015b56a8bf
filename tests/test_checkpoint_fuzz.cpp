// The checkpoint reader under fuzzing (tests/checkpoint_fuzz.h): every structural attack and a
// few thousand seeded mutations of valid files load or throw a short ember::Error, through
// nn::load (strict and not) and nn::read_safetensors. A few seconds in Release; the sanitizer
// build runs the same inputs. tests/fuzz_checkpoint runs as many more as one likes.
#include <unistd.h>

#include <filesystem>
#include <set>

#include "tests/checkpoint_fuzz.h"
#include "tests/helpers.h"

using namespace ember;

namespace {

std::string scratch_file() {
  std::error_code ec;
  const auto dir = std::filesystem::is_directory("/dev/shm", ec)
                       ? std::filesystem::path("/dev/shm")
                       : std::filesystem::temp_directory_path();
  return (dir / fmt::format("ember_test_checkpoint_fuzz_{}.safetensors", getpid())).string();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_checkpoint_fuzz)

BOOST_AUTO_TEST_CASE(structural_attacks_load_or_throw_ember_error) {
  fuzz::Fuzzer fuzzer(scratch_file());
  // The valid ones among them load; the rest must be refused.
  const std::set<std::string> valid = {"valid",         "space padding", "shape -0",
                                       "shape 16 dims", "BOM in a name", "escaped NUL in a name",
                                       "empty object",  "empty tensors", "10,000 empty tensors"};
  std::set<std::string> seen;
  for (const auto& [name, bytes] : fuzz::structural_attacks()) {
    seen.insert(name);
    for (const uint64_t which : {0, 1, 2}) {
      const int64_t loaded = fuzzer.loaded;
      const std::string failure = fuzzer.check(bytes, which);
      BOOST_TEST(failure.empty(), name << " (reader " << which << "): " << failure);
      if (which == 2) BOOST_TEST((fuzzer.loaded > loaded) == valid.contains(name), name);
    }
  }
  for (const std::string& name : valid) BOOST_TEST(seen.contains(name), name);
}

BOOST_AUTO_TEST_CASE(seeded_mutations_load_or_throw_ember_error) {
  constexpr uint64_t kSeed = 1, kInputs = 5000;
  fuzz::Fuzzer fuzzer(scratch_file());
  for (uint64_t i = 0; i < kInputs; ++i) {
    const std::string failure = fuzzer.check(fuzzer.input(kSeed, i), i);
    BOOST_TEST_REQUIRE(failure.empty(), "input " << i << ": " << failure
                                                 << " (fuzz_checkpoint --seed " << kSeed
                                                 << " --only " << i << " reproduces it)");
  }
  BOOST_TEST_MESSAGE("checkpoint fuzz: " << fuzzer.loaded << " loaded, " << fuzzer.rejected
                                         << " rejected");
  BOOST_TEST(fuzzer.rejected > int64_t(kInputs) / 2);
  BOOST_TEST(fuzzer.loaded > int64_t(kInputs) / 10);
}

BOOST_AUTO_TEST_SUITE_END()
