// Greedy and beam search over an EncoderDecoder (the algorithm is stated in nn/decoding.h).
#include "nn/decoding.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "ops/index.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace ember::nn {

double length_penalty(int64_t length, double alpha) {
  return std::pow((5.0 + static_cast<double>(length)) / 6.0, alpha);
}

namespace {

void check_inputs(const char* op, const Tensor& src, const Tensor& src_mask, int64_t max_len) {
  EMBER_CHECK(src.defined() && src.dim() == 2 && src.dtype() == kInt64,
              "{}: src must be Int64 (batch, len), got {}", op,
              src.defined() ? fmt::format("{} of shape {}", src.dtype(), src.shape()) : "none");
  EMBER_CHECK(src_mask.defined() && src_mask.shape() == (Shape{src.size(0), 1, src.size(1)}),
              "{}: src_mask must be (batch, 1, len) = [{}, 1, {}], got {}", op, src.size(0),
              src.size(1), src_mask.defined() ? fmt::format("{}", src_mask.shape()) : "none");
  EMBER_CHECK(max_len >= 1, "{}: max_len must be at least 1, got {}", op, max_len);
}

// The log-probabilities (n, V) of the token after each prefix, row-major. prefixes[i] (all of
// one length, start symbol included) reads the source of batch row rows[i].
std::vector<double> next_log_probs(EncoderDecoder& model, const Tensor& memory,
                                   const Tensor& src_mask, const std::vector<int64_t>& rows,
                                   const std::vector<std::vector<int64_t>>& prefixes) {
  const auto n = static_cast<int64_t>(prefixes.size());
  const auto t = static_cast<int64_t>(prefixes.front().size());
  std::vector<int64_t> ys;
  ys.reserve(n * t);
  for (const auto& p : prefixes) ys.insert(ys.end(), p.begin(), p.end());
  bool all_rows = n == memory.size(0);  // rows == 0, 1, ..., B - 1: no gather needed
  for (int64_t i = 0; all_rows && i < n; ++i) all_rows = rows[i] == i;
  const Tensor index = from_vector(rows, {n}, memory.device());
  const Tensor mem = all_rows ? memory : memory.index_select(0, index);
  const Tensor mask = all_rows ? src_mask : src_mask.index_select(0, index);
  const Tensor out = model.decode(mem, mask, from_vector(ys, {n, t}, mem.device()),
                                  subsequent_mask(t).to(mem.device()));
  return model.generator->forward(out.narrow(1, t - 1, 1).squeeze(1)).to_vector<double>();
}

// Live hypotheses of one batch row.
struct Beam {
  std::vector<int64_t> tokens;  // after the start symbol
  double sum;                   // summed log-probabilities
};

// The best of hypotheses, the first on a tie.
Hypothesis best_of(const std::vector<Hypothesis>& hypotheses) {
  return *std::max_element(
      hypotheses.begin(), hypotheses.end(),
      [](const Hypothesis& a, const Hypothesis& b) { return a.score < b.score; });
}

// One step of one row: the live beams' extensions (log_probs rows offset .. offset + beams - 1)
// ranked, finished ones moved to `finished`, the live ones returned.
std::vector<Beam> advance(const std::vector<Beam>& beams, const std::vector<double>& log_probs,
                          size_t offset, int64_t V, int64_t k, int64_t end_symbol, double alpha,
                          std::vector<Hypothesis>& finished) {
  std::vector<int64_t> order(beams.size() * V);
  std::iota(order.begin(), order.end(), 0);
  const auto score = [&](int64_t c) { return beams[c / V].sum + log_probs[offset * V + c]; };
  const auto top = std::min<int64_t>(2 * k, static_cast<int64_t>(order.size()));
  std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int64_t a, int64_t b) {
    const double sa = score(a), sb = score(b);
    return sa > sb || (sa == sb && a < b);
  });
  std::vector<Beam> live;
  for (int64_t rank = 0; rank < top; ++rank) {
    const int64_t c = order[rank], token = c % V;
    Beam next{beams[c / V].tokens, score(c)};
    next.tokens.push_back(token);
    if (token == end_symbol) {
      if (rank < k) {
        const double lp = length_penalty(static_cast<int64_t>(next.tokens.size()), alpha);
        finished.push_back({std::move(next.tokens), next.sum / lp});
      }
    } else if (static_cast<int64_t>(live.size()) < k) {
      live.push_back(std::move(next));
    }
  }
  return live;
}

}  // namespace

std::vector<Hypothesis> beam_search(EncoderDecoder& model, const Tensor& src,
                                    const Tensor& src_mask, int64_t max_len, int64_t start_symbol,
                                    int64_t end_symbol, int64_t beam_size, double alpha) {
  check_inputs("beam_search", src, src_mask, max_len);
  EMBER_CHECK(beam_size >= 1, "beam_search: beam_size must be at least 1, got {}", beam_size);
  NoGradGuard no_grad;
  const int64_t B = src.size(0);
  const Tensor memory = model.encode(src, src_mask);
  std::vector<std::vector<Beam>> live(B, std::vector<Beam>{{{}, 0.0}});
  std::vector<std::vector<Hypothesis>> finished(B);
  std::vector<int64_t> active(B);
  std::iota(active.begin(), active.end(), 0);
  for (int64_t step = 0; step < max_len - 1 && !active.empty(); ++step) {
    std::vector<int64_t> rows;
    std::vector<std::vector<int64_t>> prefixes;
    for (int64_t b : active)
      for (const Beam& beam : live[b]) {
        rows.push_back(b);
        prefixes.push_back({start_symbol});
        prefixes.back().insert(prefixes.back().end(), beam.tokens.begin(), beam.tokens.end());
      }
    const std::vector<double> log_probs = next_log_probs(model, memory, src_mask, rows, prefixes);
    const auto V = static_cast<int64_t>(log_probs.size() / rows.size());
    size_t offset = 0;
    std::vector<int64_t> still;
    for (int64_t b : active) {
      const size_t n = live[b].size();
      live[b] = advance(live[b], log_probs, offset, V, beam_size, end_symbol, alpha, finished[b]);
      offset += n;
      if (static_cast<int64_t>(finished[b].size()) < beam_size && !live[b].empty())
        still.push_back(b);
    }
    active = std::move(still);
  }
  // Rows that ran to max_len: their live hypotheses count too.
  std::vector<Hypothesis> best;
  best.reserve(B);
  for (int64_t b = 0; b < B; ++b) {
    if (static_cast<int64_t>(finished[b].size()) < beam_size)
      for (Beam& beam : live[b]) {
        const double lp = length_penalty(static_cast<int64_t>(beam.tokens.size()), alpha);
        finished[b].push_back({std::move(beam.tokens), beam.sum / lp});
      }
    best.push_back(best_of(finished[b]));
  }
  return best;
}

std::vector<Hypothesis> greedy_search(EncoderDecoder& model, const Tensor& src,
                                      const Tensor& src_mask, int64_t max_len, int64_t start_symbol,
                                      int64_t end_symbol, double alpha) {
  check_inputs("greedy_search", src, src_mask, max_len);
  NoGradGuard no_grad;
  const int64_t B = src.size(0);
  const Tensor memory = model.encode(src, src_mask);
  std::vector<std::vector<int64_t>> ys(B, std::vector<int64_t>{start_symbol});
  std::vector<double> sums(B, 0.0);
  std::vector<int64_t> active(B);
  std::iota(active.begin(), active.end(), 0);
  for (int64_t step = 0; step < max_len - 1 && !active.empty(); ++step) {
    std::vector<std::vector<int64_t>> prefixes;
    for (int64_t b : active) prefixes.push_back(ys[b]);
    const std::vector<double> log_probs = next_log_probs(model, memory, src_mask, active, prefixes);
    const size_t V = log_probs.size() / active.size();
    std::vector<int64_t> still;
    for (size_t i = 0; i < active.size(); ++i) {
      const auto row = log_probs.begin() + static_cast<std::ptrdiff_t>(i * V);
      const auto token = std::max_element(row, row + static_cast<std::ptrdiff_t>(V)) - row;
      const int64_t b = active[i];
      ys[b].push_back(token);
      sums[b] += row[token];
      if (token != end_symbol) still.push_back(b);
    }
    active = std::move(still);
  }
  std::vector<Hypothesis> result;
  result.reserve(B);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> tokens(ys[b].begin() + 1, ys[b].end());
    const double lp = length_penalty(static_cast<int64_t>(tokens.size()), alpha);
    result.push_back({std::move(tokens), sums[b] / lp});
  }
  return result;
}

}  // namespace ember::nn
