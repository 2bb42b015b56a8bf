// Recurrent layers over a whole sequence, one layer in one direction per call, as one layer of
// torch's _VF.lstm, _VF.gru, _VF.rnn_tanh and _VF.rnn_relu: the input projections of every step in
// one product, then per step one hidden product and one fused gate kernel; the backward through
// time is one Node per call (ops/rnn.cpp). nn::LSTM, nn::GRU and nn::RNN (nn/rnn.h) stack them
// into layers and directions.
//
// Shapes: T steps, B sequences, I input features, H hidden features, G gates (LSTM 4: i, f, g, o;
// GRU 3: r, z, n; RNN 1). x is (T, B, I) time-major; or, given batch_sizes, the data of a packed
// sequence (N, I), N = Σ batch_sizes, whose step t is the next batch_sizes[t] rows, the first
// batch_sizes[t] sequences (batch_sizes non-increasing, as torch's PackedSequence). h0 and c0 are
// (B, H), undefined for zeros; w_ih (G·H, I), w_hh (G·H, H), b_ih and b_hh (G·H) or undefined for
// none. output is (T, B, H) (packed: (N, H)); h_n and c_n (B, H) hold each sequence's state after
// its last step (reverse: after step 0). reverse runs the steps from the last to the first, each
// sequence from its own last step.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "graph/tensor.h"

namespace ember {

struct RNNLayerResult {
  Tensor output, h_n, c_n;  // c_n: LSTM only
};

// i, f, g, o = σ, σ, tanh, σ (x w_ihᵀ + b_ih + h w_hhᵀ + b_hh);  c' = f c + i g;  h' = o tanh(c')
RNNLayerResult lstm_layer(const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                          const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh,
                          const std::vector<int64_t>& batch_sizes = {}, bool reverse = false);

// r, z = σ(x w_ihᵀ + b_ih + h w_hhᵀ + b_hh) (their parts);  n = tanh(x W_inᵀ + b_in + r (h W_hnᵀ
// + b_hn));  h' = (1 - z) n + z h
RNNLayerResult gru_layer(const Tensor& x, const Tensor& h0, const Tensor& w_ih, const Tensor& w_hh,
                         const Tensor& b_ih, const Tensor& b_hh,
                         const std::vector<int64_t>& batch_sizes = {}, bool reverse = false);

// h' = act(x w_ihᵀ + b_ih + h w_hhᵀ + b_hh), act "tanh" or "relu"
RNNLayerResult rnn_layer(const Tensor& x, const Tensor& h0, const Tensor& w_ih, const Tensor& w_hh,
                         const Tensor& b_ih, const Tensor& b_hh,
                         std::string_view nonlinearity = "tanh",
                         const std::vector<int64_t>& batch_sizes = {}, bool reverse = false);

}  // namespace ember
