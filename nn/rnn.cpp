// RNN, GRU, LSTM and their cells: registration in torch's order and initialisation, the checks
// of inputs and states (each message names the module, the argument and the shapes), and the
// stacking of layers and directions over the sequence ops of ops/rnn.h. Parameters are read from
// the registry at each call, so clone() and functional_call see the module's own.
#include "nn/rnn.h"

#include <cmath>

#include "graph/creation.h"
#include "graph/error.h"
#include "nn/init.h"
#include "ops/index.h"
#include "ops/nn_functional.h"

namespace ember::nn {

namespace {

// One layer in one direction of module `kind` ("RNN", "GRU", "LSTM").
RNNLayerResult layer(std::string_view kind, const std::string& nonlinearity, const Tensor& x,
                     const Tensor& h0, const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                     const Tensor& b_ih, const Tensor& b_hh, const std::vector<int64_t>& sizes,
                     bool reverse) {
  if (kind == "LSTM") return lstm_layer(x, h0, c0, w_ih, w_hh, b_ih, b_hh, sizes, reverse);
  if (kind == "GRU") return gru_layer(x, h0, w_ih, w_hh, b_ih, b_hh, sizes, reverse);
  return rnn_layer(x, h0, w_ih, w_hh, b_ih, b_hh, nonlinearity, sizes, reverse);
}

// A parameter of `shape` drawn from U(-1/sqrt(hidden), 1/sqrt(hidden)), torch's reset_parameters.
Tensor uniform_parameter(const Shape& shape, int64_t hidden_size) {
  Tensor t = empty(shape);
  const double k = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  init::uniform_(t, -k, k);
  return t;
}

void check_sizes(std::string_view name, int64_t input_size, int64_t hidden_size) {
  EMBER_CHECK(input_size >= 0 && hidden_size > 0,
              "{}: input_size must be non-negative and hidden_size positive, got {} and {}", name,
              input_size, hidden_size);
}

std::vector<int64_t> int_values(const Tensor& t) {
  return t.to(kCPU).to(kInt64).to_vector<int64_t>();
}

}  // namespace

namespace detail {

template <class D>
RNNBase<D>::RNNBase(int64_t input_size, int64_t hidden_size, RNNOptions o)
    : input_size(input_size), hidden_size(hidden_size), options(std::move(o)) {
  const std::string_view name = D::kName;
  check_sizes(name, input_size, hidden_size);
  EMBER_CHECK(options.num_layers > 0, "{}: num_layers must be positive, got {}", name,
              options.num_layers);
  EMBER_CHECK(options.dropout >= 0 && options.dropout <= 1,
              "{}: dropout must be a probability in [0, 1], got {}", name, options.dropout);
  const int64_t dirs = options.bidirectional ? 2 : 1, GH = D::kGates * hidden_size;
  for (int64_t l = 0; l < options.num_layers; ++l)
    for (int64_t d = 0; d < dirs; ++d) {
      const std::string suffix = fmt::format("_l{}{}", l, d == 1 ? "_reverse" : "");
      const int64_t in = l == 0 ? input_size : hidden_size * dirs;
      this->register_parameter("weight_ih" + suffix, uniform_parameter({GH, in}, hidden_size));
      this->register_parameter("weight_hh" + suffix,
                               uniform_parameter({GH, hidden_size}, hidden_size));
      if (options.bias) {
        this->register_parameter("bias_ih" + suffix, uniform_parameter({GH}, hidden_size));
        this->register_parameter("bias_hh" + suffix, uniform_parameter({GH}, hidden_size));
      }
    }
}

template <class D>
void RNNBase<D>::check_features(const Tensor& x, int64_t features) const {
  EMBER_CHECK(features == input_size, "{}: input has {} features (shape {}) but input_size is {}",
              D::kName, features, x.shape(), input_size);
}

template <class D>
void RNNBase<D>::check_state(const Tensor& state, std::string_view what, int64_t batch,
                             bool batched) const {
  if (!state.defined()) return;
  const int64_t LD = options.num_layers * (options.bidirectional ? 2 : 1);
  const Shape want = batched ? Shape{LD, batch, hidden_size} : Shape{LD, hidden_size};
  EMBER_CHECK(state.shape() == want,
              "{}: {} should have shape {} (num_layers · directions, {}hidden_size), got {}",
              D::kName, what, want, batched ? "batch, " : "", state.shape());
}

template <class D>
typename RNNBase<D>::Run RNNBase<D>::run(const Tensor& x, const std::vector<int64_t>& sizes,
                                         const Tensor& h0, const Tensor& c0) const {
  const std::vector<Tensor> p = this->parameters(false);
  const int64_t dirs = options.bidirectional ? 2 : 1, per = options.bias ? 4 : 2;
  Tensor input = x;
  std::vector<Tensor> hs, cs;
  for (int64_t l = 0; l < options.num_layers; ++l) {
    std::vector<Tensor> outs;
    for (int64_t d = 0; d < dirs; ++d) {
      const int64_t s = l * dirs + d;
      const Tensor* w = &p[static_cast<size_t>(s * per)];
      const RNNLayerResult r =
          layer(D::kName, options.nonlinearity, input, h0.defined() ? h0.select(0, s) : Tensor(),
                c0.defined() ? c0.select(0, s) : Tensor(), w[0], w[1],
                options.bias ? w[2] : Tensor(), options.bias ? w[3] : Tensor(), sizes, d == 1);
      outs.push_back(r.output);
      hs.push_back(r.h_n);
      if (r.c_n.defined()) cs.push_back(r.c_n);
    }
    input = dirs == 1 ? outs[0] : cat(outs, -1);
    if (l + 1 < options.num_layers && options.dropout > 0 && this->is_training())
      input = dropout(input, options.dropout, true);
  }
  return {input, stack(hs, 0), cs.empty() ? Tensor() : stack(cs, 0)};
}

template <class D>
typename RNNBase<D>::Run RNNBase<D>::run_padded(const Tensor& x, const Tensor& h0,
                                                const Tensor& c0) const {
  EMBER_CHECK(x.defined() && (x.dim() == 2 || x.dim() == 3),
              "{}: expected input of 3 dims ((T, B, input_size), or (B, T, input_size) with "
              "batch_first) or 2 (unbatched), got {}",
              D::kName, x.defined() ? fmt::format("shape {}", x.shape()) : "an undefined tensor");
  check_features(x, x.size(-1));
  const bool batched = x.dim() == 3;
  const Tensor xs = !batched ? x.unsqueeze(1) : options.batch_first ? x.transpose(0, 1) : x;
  check_state(h0, "h0", xs.size(1), batched);
  check_state(c0, "c0", xs.size(1), batched);
  const auto in = [&](const Tensor& s) { return batched || !s.defined() ? s : s.unsqueeze(1); };
  Run r = run(xs, {}, in(h0), in(c0));
  if (!batched) {
    r.output = r.output.squeeze(1);
    r.h_n = r.h_n.squeeze(1);
    if (r.c_n.defined()) r.c_n = r.c_n.squeeze(1);
  } else if (options.batch_first) {
    r.output = r.output.transpose(0, 1);
  }
  return r;
}

template <class D>
typename RNNBase<D>::Run RNNBase<D>::run_packed(const utils::rnn::PackedSequence& x,
                                                const Tensor& h0, const Tensor& c0) const {
  EMBER_CHECK(x.data.defined() && x.data.dim() == 2 && x.batch_sizes.defined() &&
                  x.batch_sizes.dim() == 1 && x.batch_sizes.numel() > 0,
              "{}: expected a PackedSequence with data (N, input_size) and batch_sizes of at least "
              "one step, got data {} and batch_sizes {}",
              D::kName, x.data.defined() ? fmt::format("{}", x.data.shape()) : "undefined",
              x.batch_sizes.defined() ? fmt::format("{}", x.batch_sizes.shape()) : "undefined");
  check_features(x.data, x.data.size(1));
  const std::vector<int64_t> sizes = int_values(x.batch_sizes);
  check_state(h0, "h0", sizes[0], true);
  check_state(c0, "c0", sizes[0], true);
  // states come in batch order; the layers run on the sorted sequences
  const auto sorted = [&](const Tensor& s) {
    return s.defined() && x.sorted_indices.defined() ? s.index_select(1, x.sorted_indices) : s;
  };
  const auto unsorted = [&](const Tensor& s) {
    return s.defined() && x.unsorted_indices.defined() ? s.index_select(1, x.unsorted_indices) : s;
  };
  Run r = run(x.data, sizes, sorted(h0), sorted(c0));
  r.h_n = unsorted(r.h_n);
  r.c_n = unsorted(r.c_n);
  return r;
}

template class RNNBase<RNN>;
template class RNNBase<GRU>;
template class RNNBase<LSTM>;

}  // namespace detail

RNN::RNN(int64_t input_size, int64_t hidden_size, RNNOptions options)
    : RNNBase(input_size, hidden_size, std::move(options)) {
  EMBER_CHECK(this->options.nonlinearity == "tanh" || this->options.nonlinearity == "relu",
              "RNN: nonlinearity must be \"tanh\" or \"relu\", got \"{}\"",
              this->options.nonlinearity);
}

RNNOutput RNN::forward(const Tensor& x, const Tensor& h0) const {
  const Run r = run_padded(x, h0, {});
  return {r.output, r.h_n};
}

PackedRNNOutput RNN::forward(const utils::rnn::PackedSequence& x, const Tensor& h0) const {
  const Run r = run_packed(x, h0, {});
  return {{r.output, x.batch_sizes, x.sorted_indices, x.unsorted_indices}, r.h_n};
}

GRU::GRU(int64_t input_size, int64_t hidden_size, RNNOptions options)
    : RNNBase(input_size, hidden_size, std::move(options)) {}

RNNOutput GRU::forward(const Tensor& x, const Tensor& h0) const {
  const Run r = run_padded(x, h0, {});
  return {r.output, r.h_n};
}

PackedRNNOutput GRU::forward(const utils::rnn::PackedSequence& x, const Tensor& h0) const {
  const Run r = run_packed(x, h0, {});
  return {{r.output, x.batch_sizes, x.sorted_indices, x.unsorted_indices}, r.h_n};
}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, RNNOptions options)
    : RNNBase(input_size, hidden_size, std::move(options)) {}

LSTMOutput LSTM::forward(const Tensor& x, const Tensor& h0, const Tensor& c0) const {
  const Run r = run_padded(x, h0, c0);
  return {r.output, r.h_n, r.c_n};
}

PackedLSTMOutput LSTM::forward(const utils::rnn::PackedSequence& x, const Tensor& h0,
                               const Tensor& c0) const {
  const Run r = run_packed(x, h0, c0);
  return {{r.output, x.batch_sizes, x.sorted_indices, x.unsorted_indices}, r.h_n, r.c_n};
}

// --- cells: one step of the sequence ops

namespace {

// A cell's parameters (G·H, input_size), (G·H, H) and biases (G·H), drawn as torch's.
struct CellParams {
  Tensor w_ih, w_hh, b_ih, b_hh;
};
CellParams cell_params(std::string_view name, int64_t gates, int64_t input_size,
                       int64_t hidden_size) {
  check_sizes(name, input_size, hidden_size);
  const int64_t GH = gates * hidden_size;
  return {uniform_parameter({GH, input_size}, hidden_size),
          uniform_parameter({GH, hidden_size}, hidden_size), uniform_parameter({GH}, hidden_size),
          uniform_parameter({GH}, hidden_size)};
}

// x (B, input_size) or (input_size) as one step (1, B, input_size); a state (B, H) or (H) as
// (B, H): checked against the module's sizes.
struct CellInput {
  Tensor x;
  bool batched;
};
CellInput cell_input(std::string_view name, const Tensor& x, int64_t input_size) {
  EMBER_CHECK(x.defined() && (x.dim() == 1 || x.dim() == 2),
              "{}: expected input of shape (B, input_size) or (input_size), got {}", name,
              x.defined() ? fmt::format("{}", x.shape()) : "an undefined tensor");
  EMBER_CHECK(x.size(-1) == input_size, "{}: input has {} features (shape {}) but input_size is {}",
              name, x.size(-1), x.shape(), input_size);
  const bool batched = x.dim() == 2;
  return {batched ? x.unsqueeze(0) : x.unsqueeze(0).unsqueeze(0), batched};
}
Tensor cell_state(std::string_view name, std::string_view what, const Tensor& s,
                  const CellInput& in, int64_t hidden_size) {
  if (!s.defined()) return s;
  const Shape want = in.batched ? Shape{in.x.size(1), hidden_size} : Shape{hidden_size};
  EMBER_CHECK(s.shape() == want, "{}: {} should have shape {} for input of shape {}, got {}", name,
              what, want, in.batched ? in.x.squeeze(0).shape() : in.x.squeeze(0).squeeze(0).shape(),
              s.shape());
  return in.batched ? s : s.unsqueeze(0);
}
Tensor cell_output(const Tensor& h, const CellInput& in) { return in.batched ? h : h.squeeze(0); }

}  // namespace

RNNCell::RNNCell(int64_t input_size, int64_t hidden_size, bool bias, std::string nonlinearity)
    : input_size(input_size),
      hidden_size(hidden_size),
      bias(bias),
      nonlinearity(std::move(nonlinearity)) {
  EMBER_CHECK(this->nonlinearity == "tanh" || this->nonlinearity == "relu",
              "RNNCell: nonlinearity must be \"tanh\" or \"relu\", got \"{}\"", this->nonlinearity);
  const CellParams p = cell_params("RNNCell", 1, input_size, hidden_size);
  register_parameter("weight_ih", weight_ih, p.w_ih);
  register_parameter("weight_hh", weight_hh, p.w_hh);
  if (bias) {
    register_parameter("bias_ih", bias_ih, p.b_ih);
    register_parameter("bias_hh", bias_hh, p.b_hh);
  }
}

Tensor RNNCell::forward(const Tensor& x, const Tensor& h) const {
  const CellInput in = cell_input("RNNCell", x, input_size);
  const Tensor h0 = cell_state("RNNCell", "h", h, in, hidden_size);
  return cell_output(rnn_layer(in.x, h0, weight_ih, weight_hh, bias_ih, bias_hh, nonlinearity).h_n,
                     in);
}

GRUCell::GRUCell(int64_t input_size, int64_t hidden_size, bool bias)
    : input_size(input_size), hidden_size(hidden_size), bias(bias) {
  const CellParams p = cell_params("GRUCell", 3, input_size, hidden_size);
  register_parameter("weight_ih", weight_ih, p.w_ih);
  register_parameter("weight_hh", weight_hh, p.w_hh);
  if (bias) {
    register_parameter("bias_ih", bias_ih, p.b_ih);
    register_parameter("bias_hh", bias_hh, p.b_hh);
  }
}

Tensor GRUCell::forward(const Tensor& x, const Tensor& h) const {
  const CellInput in = cell_input("GRUCell", x, input_size);
  const Tensor h0 = cell_state("GRUCell", "h", h, in, hidden_size);
  return cell_output(gru_layer(in.x, h0, weight_ih, weight_hh, bias_ih, bias_hh).h_n, in);
}

LSTMCell::LSTMCell(int64_t input_size, int64_t hidden_size, bool bias)
    : input_size(input_size), hidden_size(hidden_size), bias(bias) {
  const CellParams p = cell_params("LSTMCell", 4, input_size, hidden_size);
  register_parameter("weight_ih", weight_ih, p.w_ih);
  register_parameter("weight_hh", weight_hh, p.w_hh);
  if (bias) {
    register_parameter("bias_ih", bias_ih, p.b_ih);
    register_parameter("bias_hh", bias_hh, p.b_hh);
  }
}

LSTMState LSTMCell::forward(const Tensor& x, const LSTMState& state) const {
  const CellInput in = cell_input("LSTMCell", x, input_size);
  const Tensor h0 = cell_state("LSTMCell", "h", state.h, in, hidden_size);
  const Tensor c0 = cell_state("LSTMCell", "c", state.c, in, hidden_size);
  const RNNLayerResult r = lstm_layer(in.x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh);
  return {cell_output(r.h_n, in), cell_output(r.c_n, in)};
}

}  // namespace ember::nn
