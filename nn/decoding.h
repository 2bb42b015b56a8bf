// Decoding an EncoderDecoder, batched and with source padding masks: greedy search that stops
// each row at its end symbol, and beam search with the GNMT length penalty (Wu et al. 2016,
// "Google's Neural Machine Translation System", eq. 14):
//   score(Y) = log P(Y | X) / lp(Y),   lp(Y) = ((5 + |Y|) / 6)^alpha.
// Both decode without gradients and recompute the decoder over the whole prefix each step, as
// greedy_decode does; rows that are done leave the batch. Call model.eval() first.
//
// Beam search, per batch row, keeps `beam_size` live hypotheses ranked by their summed
// log-probability; each step ranks every live hypothesis's extensions and takes the best
// 2 x beam_size (ties: lower beam, then lower token first). Of those, an extension by end_symbol
// ranked within the first beam_size is finished (scored with lp); the first beam_size others
// live on. A row stops when it has beam_size finished hypotheses, or after max_len - 1 tokens,
// when its live hypotheses count as finished too; its result is the finished hypothesis of the
// highest score (the first found, on a tie). With beam_size 1 this is greedy search, and with
// beam_size at least the number of candidates of every step it is exhaustive search.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/transformer.h"

namespace ember::nn {

struct Hypothesis {
  std::vector<int64_t> tokens;  // after start_symbol; ends with end_symbol when one was chosen
  double score;                 // summed log-probabilities / length_penalty(tokens.size(), alpha)
};

// ((5 + length) / 6)^alpha.
double length_penalty(int64_t length, double alpha);

// src (B, S) Int64, src_mask (B, 1, S) -> the best hypothesis of each row (see above); at most
// max_len - 1 tokens, greedy_decode's bound.
std::vector<Hypothesis> beam_search(EncoderDecoder& model, const Tensor& src,
                                    const Tensor& src_mask, int64_t max_len, int64_t start_symbol,
                                    int64_t end_symbol, int64_t beam_size, double alpha = 0.6);

// Greedy decoding of each row up to its first end_symbol (or max_len - 1 tokens), the tokens
// greedy_decode picks; score as beam_search's.
std::vector<Hypothesis> greedy_search(EncoderDecoder& model, const Tensor& src,
                                      const Tensor& src_mask, int64_t max_len, int64_t start_symbol,
                                      int64_t end_symbol, double alpha = 0.6);

}  // namespace ember::nn
