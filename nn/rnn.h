// Recurrent layers as torch.nn: RNN, GRU and LSTM (stacked layers, bidirectional, dropout between
// layers, padded or packed input) and the cells RNNCell, GRUCell and LSTMCell. Parameters carry
// torch's names, shapes, gate order (LSTM i, f, g, o; GRU r, z, n) and initialisation U(-k, k),
// k = 1 / sqrt(hidden_size), so a torch state dict loads one to one. Each layer and direction is
// one call of the sequence ops of ops/rnn.h.
#pragma once

#include <string>
#include <string_view>

#include "nn/module.h"
#include "nn/rnn_utils.h"
#include "ops/rnn.h"

namespace ember::nn {

struct RNNOptions {
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;
  double dropout = 0;  // on every layer's output but the last, in training
  bool bidirectional = false;
  std::string nonlinearity = "tanh";  // RNN only: "tanh" or "relu"
};

struct RNNOutput {
  Tensor output, h_n;
};
struct LSTMOutput {
  Tensor output, h_n, c_n;
};
struct PackedRNNOutput {
  utils::rnn::PackedSequence output;
  Tensor h_n;
};
struct PackedLSTMOutput {
  utils::rnn::PackedSequence output;
  Tensor h_n, c_n;
};

namespace detail {

// What RNN, GRU and LSTM share (torch's RNNBase): per layer k and direction, registered in this
// order, weight_ih_l{k}[_reverse] (G·H, in), weight_hh_l{k}[_reverse] (G·H, H) and, with bias,
// bias_ih_l{k}[_reverse] and bias_hh_l{k}[_reverse] (G·H); in is input_size for layer 0, else
// H times the directions. Inputs (T, B, input_size), (B, T, input_size) with batch_first, or
// unbatched (T, input_size); states (num_layers · directions, B, H), or (…, H) unbatched.
template <class D>
class RNNBase : public Cloneable<D> {
 public:
  int64_t input_size, hidden_size;
  RNNOptions options;

 protected:
  RNNBase(int64_t input_size, int64_t hidden_size, RNNOptions options);
  RNNBase(const RNNBase&) = default;

  struct Run {
    Tensor output, h_n, c_n;
  };
  // Padded input: output in the input's layout, states as given (unbatched included).
  Run run_padded(const Tensor& x, const Tensor& h0, const Tensor& c0) const;
  Run run_packed(const utils::rnn::PackedSequence& x, const Tensor& h0, const Tensor& c0) const;

 private:
  // The stack over time-major x (T, B, in) or packed data (N, in), states (L · D, B, H) sorted.
  Run run(const Tensor& x, const std::vector<int64_t>& batch_sizes, const Tensor& h0,
          const Tensor& c0) const;
  void check_state(const Tensor& state, std::string_view what, int64_t batch, bool batched) const;
  void check_features(const Tensor& x, int64_t features) const;
};

}  // namespace detail

// Elman RNN: h' = tanh or relu (x W_ihᵀ + b_ih + h W_hhᵀ + b_hh) (options.nonlinearity).
class RNN : public detail::RNNBase<RNN> {
 public:
  RNN(int64_t input_size, int64_t hidden_size, RNNOptions options = {});
  RNNOutput forward(const Tensor& x, const Tensor& h0 = {}) const;
  PackedRNNOutput forward(const utils::rnn::PackedSequence& x, const Tensor& h0 = {}) const;
  static constexpr std::string_view kName = "RNN";
  static constexpr int64_t kGates = 1;

 private:
  friend Cloneable;  // the only copier; see Note [Modules are not copyable]
  RNN(const RNN&) = default;
};

class GRU : public detail::RNNBase<GRU> {
 public:
  GRU(int64_t input_size, int64_t hidden_size, RNNOptions options = {});
  RNNOutput forward(const Tensor& x, const Tensor& h0 = {}) const;
  PackedRNNOutput forward(const utils::rnn::PackedSequence& x, const Tensor& h0 = {}) const;
  static constexpr std::string_view kName = "GRU";
  static constexpr int64_t kGates = 3;

 private:
  friend Cloneable;
  GRU(const GRU&) = default;
};

class LSTM : public detail::RNNBase<LSTM> {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, RNNOptions options = {});
  LSTMOutput forward(const Tensor& x, const Tensor& h0 = {}, const Tensor& c0 = {}) const;
  PackedLSTMOutput forward(const utils::rnn::PackedSequence& x, const Tensor& h0 = {},
                           const Tensor& c0 = {}) const;
  static constexpr std::string_view kName = "LSTM";
  static constexpr int64_t kGates = 4;

 private:
  friend Cloneable;
  LSTM(const LSTM&) = default;
};

// One step: x (B, input_size) or unbatched (input_size); h (B, H) or (H), undefined for zeros.
// Parameters weight_ih (G·H, input_size), weight_hh (G·H, H), bias_ih, bias_hh (G·H).
class RNNCell : public Cloneable<RNNCell> {
 public:
  RNNCell(int64_t input_size, int64_t hidden_size, bool bias = true,
          std::string nonlinearity = "tanh");
  Tensor forward(const Tensor& x, const Tensor& h = {}) const;

  int64_t input_size, hidden_size;
  bool bias;
  std::string nonlinearity;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;  // biases undefined without bias

 private:
  friend Cloneable;
  RNNCell(const RNNCell&) = default;
};

class GRUCell : public Cloneable<GRUCell> {
 public:
  GRUCell(int64_t input_size, int64_t hidden_size, bool bias = true);
  Tensor forward(const Tensor& x, const Tensor& h = {}) const;

  int64_t input_size, hidden_size;
  bool bias;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;

 private:
  friend Cloneable;
  GRUCell(const GRUCell&) = default;
};

struct LSTMState {
  Tensor h, c;
};

class LSTMCell : public Cloneable<LSTMCell> {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, bool bias = true);
  LSTMState forward(const Tensor& x, const LSTMState& state = {}) const;

  int64_t input_size, hidden_size;
  bool bias;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;

 private:
  friend Cloneable;
  LSTMCell(const LSTMCell&) = default;
};

}  // namespace ember::nn
