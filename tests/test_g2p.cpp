// The grapheme-to-phoneme task's pieces (examples/g2p_task.h): FNV-1a and the fixed split, the
// CMUdict reader on the real dictionary (skipped when pocketsphinx-en-us is not installed; make
// deps installs it) and its errors.
#include <filesystem>
#include <fstream>

#include "examples/g2p_task.h"
#include "helpers.h"

using namespace ember;
using namespace ember::testing;

namespace {

// Writes text to a fresh temporary file and returns its path.
std::string temp_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_g2p)

BOOST_AUTO_TEST_CASE(fnv1a_and_the_split) {
  BOOST_TEST(g2p::fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  BOOST_TEST(g2p::fnv1a64("") == 0xcbf29ce484222325ull);
  // FNV-1a("a") % 20 == 16: train.
  BOOST_TEST((g2p::split_of("a") == g2p::Split::Train));
  BOOST_TEST((g2p::graphemes("d'or") == std::vector<std::string>{"d", "'", "o", "r"}));
  BOOST_TEST(
      (g2p::graphemes("caf\xc3\xa9") == std::vector<std::string>{"c", "a", "f", "\xc3\xa9"}));
}

BOOST_AUTO_TEST_CASE(reads_variants_and_comments) {
  const std::string path = temp_file("ember_test_cmudict.dict",
                                     ";;; a comment\n"
                                     "read R IY D\n"
                                     "a AH\n"
                                     "read(2) R EH D\n"
                                     "a(2) EY # the letter\n"
                                     "abc1 AE1 B K\r\n");
  const g2p::CmuDict dict = g2p::read_cmudict(path);
  BOOST_TEST(dict.lines == 5);
  std::map<std::string, std::vector<std::vector<std::string>>> all;
  for (const auto* split : {&dict.train, &dict.dev, &dict.test})
    for (const g2p::Entry& e : *split) {
      BOOST_TEST(!all.contains(e.word));
      all[e.word] = e.pronunciations;
    }
  BOOST_TEST(all.size() == 3u);
  BOOST_TEST(
      (all["read"] == std::vector<std::vector<std::string>>{{"R", "IY", "D"}, {"R", "EH", "D"}}));
  BOOST_TEST((all["a"] == std::vector<std::vector<std::string>>{{"AH"}, {"EY"}}));
  BOOST_TEST((all["abc1"] == std::vector<std::vector<std::string>>{{"AE1", "B", "K"}}));
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_CASE(errors_name_the_file_and_line) {
  expect_error([] { g2p::read_cmudict("/nonexistent/cmudict.dict"); },
               {"/nonexistent/cmudict.dict", "pocketsphinx-en-us", "--data"});
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"a AH\nb\n", ":2: expected `word PHONEME ...`"},
      {"a AH\n\nb B IY\n", ":2: expected"},
      {"a AH\nb(x) B\n", ":2: malformed word 'b(x)'"},
      {"a AH\nb B iy\n", ":2: 'iy' is not a phoneme"},
      {"(2) AH\n", ":1: malformed word"},
      {";;; only a comment\n", "holds no entries"}};
  for (const auto& [text, message] : bad) {
    const std::string path = temp_file("ember_test_bad.dict", text);
    expect_error([&] { g2p::read_cmudict(path); }, {"cmudict", path, message});
    std::filesystem::remove(path);
  }
}

BOOST_AUTO_TEST_CASE(the_real_dictionary_splits_as_the_issue_says) {
  if (!std::filesystem::exists(g2p::kDefaultDict)) {
    BOOST_TEST_MESSAGE("skipped: " << g2p::kDefaultDict << " is absent (make deps installs it)");
    return;
  }
  const g2p::CmuDict dict = g2p::read_cmudict(g2p::kDefaultDict);
  BOOST_TEST(dict.lines == 134723);
  BOOST_TEST(dict.train.size() + dict.dev.size() + dict.test.size() == 125945u);
  BOOST_TEST(dict.train.size() == 113281u);
  BOOST_TEST(dict.dev.size() == 6340u);
  BOOST_TEST(dict.test.size() == 6324u);
  for (const g2p::Entry& e : dict.test)
    BOOST_TEST_REQUIRE((g2p::split_of(e.word) == g2p::Split::Test));
}

BOOST_AUTO_TEST_SUITE_END()
