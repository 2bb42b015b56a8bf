// Greedy and beam search (nn/decoding.h): beam size 1 is greedy search, greedy search is
// greedy_decode cut at the end symbol, beam search with a wide beam finds the best sequence of an
// exhaustive enumeration (Float64, GNMT-scored), batched results equal one-by-one results, and
// the checks.
#include <cmath>
#include <functional>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;
using nn::Hypothesis;

namespace {

constexpr int64_t kStart = 1, kEnd = 2;
constexpr double kEndBias = 3.0;

// A small random model whose generator is sharpened, so its choices are not near ties, and
// leans to the end symbol, so some rows end before max_len.
std::shared_ptr<nn::EncoderDecoder> tiny_model(int64_t V, uint64_t seed, DType dtype = kFloat32) {
  manual_seed(seed);
  auto model = nn::make_model(V, V, 1, 16, 32, 2, 0.0);
  {
    NoGradGuard no_grad;
    model->generator->proj->weight.mul_(2.0);
    model->generator->proj->bias.narrow(0, kEnd, 1).add_(kEndBias);
  }
  model->to(dtype);
  model->eval();
  return model;
}

// Rows of src tokens (3 .. V-1) with lengths `lengths`, padded with 0, and the mask.
struct Source {
  Tensor src, mask;
};
Source sources(const std::vector<int64_t>& lengths, int64_t V) {
  const auto B = static_cast<int64_t>(lengths.size());
  const int64_t S = *std::max_element(lengths.begin(), lengths.end());
  std::vector<int64_t> data(B * S, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < lengths[b]; ++s) data[b * S + s] = 3 + (5 * b + 3 * s) % (V - 3);
  const Tensor src = from_vector(data, {B, S});
  return {src, src.ne(0.0).unsqueeze(-2)};
}

// The GNMT score of tokens (after kStart) for source row b, by one teacher-forced decode.
double score_of(nn::EncoderDecoder& model, const Source& in, int64_t b,
                const std::vector<int64_t>& tokens, double alpha) {
  NoGradGuard no_grad;
  const auto n = static_cast<int64_t>(tokens.size());
  const Tensor src = in.src.narrow(0, b, 1), mask = in.mask.narrow(0, b, 1);
  std::vector<int64_t> ys{kStart};
  ys.insert(ys.end(), tokens.begin(), tokens.end() - 1);
  const Tensor out =
      model.decode(model.encode(src, mask), mask, from_vector(ys, {1, n}), nn::subsequent_mask(n));
  const std::vector<double> lp = model.generator->forward(out).to_vector<double>();
  const int64_t V = static_cast<int64_t>(lp.size()) / n;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += lp[i * V + tokens[i]];
  return sum / nn::length_penalty(n, alpha);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_decoding)

BOOST_AUTO_TEST_CASE(length_penalty_is_gnmt) {
  BOOST_TEST(nn::length_penalty(1, 0.6) == 1.0);
  BOOST_TEST(nn::length_penalty(7, 0.6) == std::pow(2.0, 0.6), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(nn::length_penalty(9, 0.0) == 1.0);
}

BOOST_AUTO_TEST_CASE(greedy_search_is_greedy_decode_cut_at_the_end) {
  const int64_t V = 9, max_len = 8;
  auto model = tiny_model(V, 1);
  const Source in = sources({5, 3, 6, 1}, V);
  const std::vector<Hypothesis> hyps =
      nn::greedy_search(*model, in.src, in.mask, max_len, kStart, kEnd);
  const std::vector<int64_t> ys =
      nn::greedy_decode(*model, in.src, in.mask, max_len, kStart).to_vector<int64_t>();
  int ended = 0;
  for (int64_t b = 0; b < 4; ++b) {
    std::vector<int64_t> want(ys.begin() + b * max_len + 1, ys.begin() + (b + 1) * max_len);
    if (auto end = std::find(want.begin(), want.end(), kEnd); end != want.end()) {
      want.erase(end + 1, want.end());
      ++ended;
    }
    BOOST_TEST(hyps[b].tokens == want);
    BOOST_TEST(hyps[b].score == score_of(*model, in, b, hyps[b].tokens, 0.6),
               boost::test_tools::tolerance(1e-4));
  }
  BOOST_TEST(ended >= 1);  // the end symbol is exercised
  BOOST_TEST(ended < 4);
}

BOOST_AUTO_TEST_CASE(beam_size_one_is_greedy) {
  const int64_t V = 9;
  for (uint64_t seed : {1, 2, 3}) {
    auto model = tiny_model(V, seed);
    const Source in = sources({5, 3, 6, 1, 4}, V);
    const auto greedy = nn::greedy_search(*model, in.src, in.mask, 10, kStart, kEnd, 0.6);
    const auto beam = nn::beam_search(*model, in.src, in.mask, 10, kStart, kEnd, 1, 0.6);
    for (size_t b = 0; b < greedy.size(); ++b) {
      BOOST_TEST(beam[b].tokens == greedy[b].tokens, "seed " << seed << " row " << b);
      BOOST_TEST(beam[b].score == greedy[b].score, boost::test_tools::tolerance(1e-9));
    }
  }
}

BOOST_AUTO_TEST_CASE(wide_beam_finds_the_exhaustive_best) {
  // V = 5: tokens 0, 1, 3, 4 go on, 2 ends. With max_len 4 (at most 3 tokens) there are at most
  // 16 live prefixes x 5 = 80 candidates a step and 1 + 4 + 16 finished sequences, so a beam of
  // 100 keeps everything: beam search must return the exhaustive maximum.
  const int64_t V = 5, max_len = 4;
  for (uint64_t seed : {4, 5, 6}) {
    auto model = tiny_model(V, seed, kFloat64);
    const Source in = sources({3, 2, 4}, V);
    for (double alpha : {0.0, 0.6, 1.0}) {
      const auto beam = nn::beam_search(*model, in.src, in.mask, max_len, kStart, kEnd, 100, alpha);
      for (int64_t b = 0; b < in.src.size(0); ++b) {
        // Every complete sequence: ended by kEnd within 3 tokens, or 3 tokens without it.
        std::vector<int64_t> best_tokens;
        double best = -INFINITY, second = -INFINITY;
        std::function<void(std::vector<int64_t>&)> enumerate = [&](std::vector<int64_t>& y) {
          const bool complete = (!y.empty() && y.back() == kEnd) || y.size() == max_len - 1;
          if (complete) {
            const double s = score_of(*model, in, b, y, alpha);
            if (s > best) {
              second = best;
              best = s;
              best_tokens = y;
            } else {
              second = std::max(second, s);
            }
            return;
          }
          for (int64_t v = 0; v < V; ++v) {
            y.push_back(v);
            enumerate(y);
            y.pop_back();
          }
        };
        std::vector<int64_t> y;
        enumerate(y);
        BOOST_TEST_REQUIRE(best - second > 1e-9, "a tie in the enumeration; pick another seed");
        BOOST_TEST(beam[b].tokens == best_tokens, "seed " << seed << " alpha " << alpha);
        BOOST_TEST(beam[b].score == best, boost::test_tools::tolerance(1e-9));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(batched_equals_one_by_one) {
  const int64_t V = 11;
  auto model = tiny_model(V, 7);
  const std::vector<int64_t> lengths{6, 2, 5, 1, 4, 6};
  const Source in = sources(lengths, V);
  for (int64_t k : {1, 3, 5}) {
    const auto batched = nn::beam_search(*model, in.src, in.mask, 9, kStart, kEnd, k, 0.6);
    for (size_t b = 0; b < lengths.size(); ++b) {
      // Row b alone, without padding.
      const auto bi = static_cast<int64_t>(b);
      const Tensor src = in.src.narrow(0, bi, 1).narrow(1, 0, lengths[b]).contiguous();
      const auto alone =
          nn::beam_search(*model, src, ones({1, 1, lengths[b]}, kBool), 9, kStart, kEnd, k, 0.6);
      BOOST_TEST(alone[0].tokens == batched[b].tokens, "k " << k << " row " << b);
      BOOST_TEST(alone[0].score == batched[b].score, boost::test_tools::tolerance(1e-4));
    }
  }
  const auto greedy = nn::greedy_search(*model, in.src, in.mask, 9, kStart, kEnd);
  for (size_t b = 0; b < lengths.size(); ++b) {
    const auto bi = static_cast<int64_t>(b);
    const auto alone = nn::greedy_search(*model, in.src.narrow(0, bi, 1), in.mask.narrow(0, bi, 1),
                                         9, kStart, kEnd);
    BOOST_TEST(alone[0].tokens == greedy[b].tokens);
  }
}

BOOST_AUTO_TEST_CASE(bounds_and_errors) {
  auto model = tiny_model(7, 8);
  const Source in = sources({3, 2}, 7);
  for (int64_t k : {1, 4}) {
    for (const Hypothesis& h : nn::beam_search(*model, in.src, in.mask, 3, kStart, kEnd, k)) {
      BOOST_TEST(h.tokens.size() <= 2u);
      BOOST_TEST(std::count(h.tokens.begin(), h.tokens.end(), kEnd) <= (h.tokens.empty() ? 0 : 1));
    }
    // max_len 1: nothing after the start symbol.
    for (const Hypothesis& h : nn::beam_search(*model, in.src, in.mask, 1, kStart, kEnd, k))
      BOOST_TEST(h.tokens.empty());
  }
  expect_error([&] { nn::beam_search(*model, in.src, in.mask, 5, kStart, kEnd, 0); },
               {"beam_search", "beam_size"});
  expect_error([&] { nn::beam_search(*model, in.src, in.mask, 0, kStart, kEnd, 2); },
               {"beam_search", "max_len"});
  expect_error([&] { nn::greedy_search(*model, in.src, in.mask.squeeze(1), 5, kStart, kEnd); },
               {"greedy_search", "src_mask", "[2, 3]"});
  expect_error([&] { nn::greedy_search(*model, in.src.to(kFloat32), in.mask, 5, kStart, kEnd); },
               {"greedy_search", "Int64"});
}

BOOST_AUTO_TEST_SUITE_END()
