// Recurrent networks: lstm_layer, gru_layer and rnn_layer in one table of cases (tests/op_table.h:
// gradcheck and gradgradcheck on several layouts, the backward under create_graph against the
// kernels', PyTorch's golden values and gradients, edge shapes, anomaly mode and the emulated
// device), padded and packed, forwards and in reverse; then the modules nn::RNN, nn::GRU and
// nn::LSTM and the cells against torch.nn over every option (tests/golden/rnn.json, written by
// gen_rnn.py), a torch state dict loaded through nn::load, packed against padded, and every error.
#include <boost/test/unit_test.hpp>

#include "tests/edge_shapes.h"
#include "tests/forward_over_forward.h"

using namespace ember;
using namespace ember::testing;

namespace {

// A layer's results as one tensor: output, h_n and c_n flattened and joined (torch's order).
Tensor flat(const RNNLayerResult& r) {
  std::vector<Tensor> parts{r.output.flatten(), r.h_n.flatten()};
  if (r.c_n.defined()) parts.push_back(r.c_n.flatten());
  return cat(parts);
}

// One row per op case; tests/op_table.h says what the fields mean. After adding or changing a
// row, run /usr/bin/python3 tests/golden/gen_op_tables.py. T = 4 steps, B = 3 sequences, 5 input
// and 2 hidden features; the packed rows hold sequences of 4, 3 and 1 steps (batch sizes 3, 2, 2,
// 1). torch runs one layer through _VF.lstm / gru / rnn_tanh / rnn_relu; a reverse layer is the
// second direction of a bidirectional call with the same weights for both. Rows whose states (or
// biases) may be undefined are kOptionalInputs: undefined states are zeros.
// clang-format off
const OpTable kRNNOps = {
    // lstm_layer
    {"lstm_layer", "torch.cat([t.flatten() for t in torch._VF.lstm(a, (b[None], c[None]), (d.view(4, e.shape[1], d.shape[1]).flatten(0, 1), e.view(4, e.shape[1], e.shape[1]).flatten(0, 1), f, g), True, 1, 0.0, False, False, False)])",
     {{4, 3, 5}, {3, 2}, {3, 2}, {8, 5}, {8, 2}, {8}, {8}}, {},
     [](auto& v) { return flat(lstm_layer(v[0], v[1], v[2], v[3], v[4], v[5], v[6])); }, kOptionalInputs},
    {"lstm_layer reverse",
     "(lambda o, H: torch.cat([o[0][..., H:].flatten(), o[1][1].flatten(), o[2][1].flatten()]))"
     "(torch._VF.lstm(a, (torch.stack([b, b]), torch.stack([c, c])), (d.view(4, e.shape[1], d.shape[1]).flatten(0, 1), e.view(4, e.shape[1], e.shape[1]).flatten(0, 1), f, g) * 2, True, 1, 0.0, False, True, False), e.shape[1])",
     {{4, 3, 5}, {3, 2}, {3, 2}, {8, 5}, {8, 2}, {8}, {8}}, {},
     [](auto& v) { return flat(lstm_layer(v[0], v[1], v[2], v[3], v[4], v[5], v[6], {}, true)); }, kOptionalInputs},
    {"lstm_layer packed", "torch.cat([t.flatten() for t in torch._VF.lstm(a, torch.tensor([3, 2, 2, 1]), (b[None], c[None]), (d.view(4, e.shape[1], d.shape[1]).flatten(0, 1), e.view(4, e.shape[1], e.shape[1]).flatten(0, 1), f, g), True, 1, 0.0, False, False)])",
     {{8, 5}, {3, 2}, {3, 2}, {8, 5}, {8, 2}, {8}, {8}}, {},
     [](auto& v) { return flat(lstm_layer(v[0], v[1], v[2], v[3], v[4], v[5], v[6], {3, 2, 2, 1})); }, kOptionalInputs},
    {"lstm_layer packed reverse",
     "(lambda o, H: torch.cat([o[0][..., H:].flatten(), o[1][1].flatten(), o[2][1].flatten()]))"
     "(torch._VF.lstm(a, torch.tensor([3, 2, 2, 1]), (torch.stack([b, b]), torch.stack([c, c])), (d.view(4, e.shape[1], d.shape[1]).flatten(0, 1), e.view(4, e.shape[1], e.shape[1]).flatten(0, 1), f, g) * 2, True, 1, 0.0, False, True), e.shape[1])",
     {{8, 5}, {3, 2}, {3, 2}, {8, 5}, {8, 2}, {8}, {8}}, {},
     [](auto& v) { return flat(lstm_layer(v[0], v[1], v[2], v[3], v[4], v[5], v[6], {3, 2, 2, 1}, true)); }, kOptionalInputs},
    {"lstm_layer no bias zero state",
     "torch.cat([t.flatten() for t in torch._VF.lstm(a, (torch.zeros(1, a.shape[1], c.shape[1], dtype=a.dtype),) * 2, (b.view(4, c.shape[1], b.shape[1]).flatten(0, 1), c.view(4, c.shape[1], c.shape[1]).flatten(0, 1)), False, 1, 0.0, False, False, False)])",
     {{4, 3, 5}, {8, 5}, {8, 2}}, {},
     [](auto& v) { return flat(lstm_layer(v[0], {}, {}, v[1], v[2], {}, {})); }},
    // gru_layer
    {"gru_layer", "torch.cat([t.flatten() for t in torch._VF.gru(a, b[None], (c.view(3, d.shape[1], c.shape[1]).flatten(0, 1), d.view(3, d.shape[1], d.shape[1]).flatten(0, 1), e, f), True, 1, 0.0, False, False, False)])",
     {{4, 3, 5}, {3, 2}, {6, 5}, {6, 2}, {6}, {6}}, {},
     [](auto& v) { return flat(gru_layer(v[0], v[1], v[2], v[3], v[4], v[5])); }, kOptionalInputs},
    {"gru_layer reverse",
     "(lambda o, H: torch.cat([o[0][..., H:].flatten(), o[1][1].flatten()]))"
     "(torch._VF.gru(a, torch.stack([b, b]), (c.view(3, d.shape[1], c.shape[1]).flatten(0, 1), d.view(3, d.shape[1], d.shape[1]).flatten(0, 1), e, f) * 2, True, 1, 0.0, False, True, False), d.shape[1])",
     {{4, 3, 5}, {3, 2}, {6, 5}, {6, 2}, {6}, {6}}, {},
     [](auto& v) { return flat(gru_layer(v[0], v[1], v[2], v[3], v[4], v[5], {}, true)); }, kOptionalInputs},
    {"gru_layer packed", "torch.cat([t.flatten() for t in torch._VF.gru(a, torch.tensor([3, 2, 2, 1]), b[None], (c.view(3, d.shape[1], c.shape[1]).flatten(0, 1), d.view(3, d.shape[1], d.shape[1]).flatten(0, 1), e, f), True, 1, 0.0, False, False)])",
     {{8, 5}, {3, 2}, {6, 5}, {6, 2}, {6}, {6}}, {},
     [](auto& v) { return flat(gru_layer(v[0], v[1], v[2], v[3], v[4], v[5], {3, 2, 2, 1})); }, kOptionalInputs},
    {"gru_layer packed reverse",
     "(lambda o, H: torch.cat([o[0][..., H:].flatten(), o[1][1].flatten()]))"
     "(torch._VF.gru(a, torch.tensor([3, 2, 2, 1]), torch.stack([b, b]), (c.view(3, d.shape[1], c.shape[1]).flatten(0, 1), d.view(3, d.shape[1], d.shape[1]).flatten(0, 1), e, f) * 2, True, 1, 0.0, False, True), d.shape[1])",
     {{8, 5}, {3, 2}, {6, 5}, {6, 2}, {6}, {6}}, {},
     [](auto& v) { return flat(gru_layer(v[0], v[1], v[2], v[3], v[4], v[5], {3, 2, 2, 1}, true)); }, kOptionalInputs},
    {"gru_layer no bias zero state",
     "torch.cat([t.flatten() for t in torch._VF.gru(a, torch.zeros(1, a.shape[1], c.shape[1], dtype=a.dtype), (b.view(3, c.shape[1], b.shape[1]).flatten(0, 1), c.view(3, c.shape[1], c.shape[1]).flatten(0, 1)), False, 1, 0.0, False, False, False)])",
     {{4, 3, 5}, {6, 5}, {6, 2}}, {},
     [](auto& v) { return flat(gru_layer(v[0], {}, v[1], v[2], {}, {})); }},
    // rnn_layer, tanh and relu
    {"rnn_layer tanh", "torch.cat([t.flatten() for t in torch._VF.rnn_tanh(a, b[None], (c, d, e, f), True, 1, 0.0, False, False, False)])",
     {{4, 3, 5}, {3, 2}, {2, 5}, {2, 2}, {2}, {2}}, {},
     [](auto& v) { return flat(rnn_layer(v[0], v[1], v[2], v[3], v[4], v[5])); }, kOptionalInputs},
    {"rnn_layer relu", "torch.cat([t.flatten() for t in torch._VF.rnn_relu(a, b[None], (c, d, e, f), True, 1, 0.0, False, False, False)])",
     {{4, 3, 5}, {3, 2}, {2, 5}, {2, 2}, {2}, {2}}, {},
     [](auto& v) { return flat(rnn_layer(v[0], v[1], v[2], v[3], v[4], v[5], "relu")); }, kOptionalInputs},
    {"rnn_layer tanh packed reverse",
     "(lambda o, H: torch.cat([o[0][..., H:].flatten(), o[1][1].flatten()]))"
     "(torch._VF.rnn_tanh(a, torch.tensor([3, 2, 2, 1]), torch.stack([b, b]), (c, d, e, f) * 2, True, 1, 0.0, False, True), d.shape[1])",
     {{8, 5}, {3, 2}, {2, 5}, {2, 2}, {2}, {2}}, {},
     [](auto& v) { return flat(rnn_layer(v[0], v[1], v[2], v[3], v[4], v[5], "tanh", {3, 2, 2, 1}, true)); }, kOptionalInputs},
    {"rnn_layer relu packed", "torch.cat([t.flatten() for t in torch._VF.rnn_relu(a, torch.tensor([3, 2, 2, 1]), b[None], (c, d, e, f), True, 1, 0.0, False, False)])",
     {{8, 5}, {3, 2}, {2, 5}, {2, 2}, {2}, {2}}, {},
     [](auto& v) { return flat(rnn_layer(v[0], v[1], v[2], v[3], v[4], v[5], "relu", {3, 2, 2, 1})); }, kOptionalInputs},
    {"rnn_layer relu no bias zero state reverse",
     "(lambda o, H: torch.cat([o[0][..., H:].flatten(), o[1][1].flatten()]))"
     "(torch._VF.rnn_relu(a, torch.zeros(2, a.shape[1], c.shape[1], dtype=a.dtype), (b, c) * 2, False, 1, 0.0, False, True, False), c.shape[1])",
     {{4, 3, 5}, {2, 5}, {2, 2}}, {},
     [](auto& v) { return flat(rnn_layer(v[0], {}, v[1], v[2], {}, {}, "relu", {}, true)); }},
};
// clang-format on

constexpr int64_t T = 4, B = 3, I = 3, H = 2;  // the sizes of gen_rnn.py

// Values ((k·7 + 3·seed + 1) mod 17 − 8) / 10 over the flat index k, as value() in gen_rnn.py.
Tensor value(const Shape& shape, int64_t seed) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t k = 0; k < v.size(); ++k)
    v[k] = static_cast<double>(static_cast<int64_t>((k * 7 + 3 * seed + 1) % 17) - 8) / 10;
  return from_vector(v, shape, kFloat64);
}

// The module in Float64 with gen_rnn.py's parameter values.
void fill(nn::Module& m) {
  m.to(kFloat64);
  NoGradGuard no_grad;
  int64_t p = 10;
  for (auto& [name, t] : m.named_parameters()) Tensor(t).copy_(value(t.shape(), p++));
}

// A recurrent module of any kind behind one interface (c_n undefined but for LSTM).
struct AnyRNN {
  std::shared_ptr<nn::Module> module;
  std::function<nn::LSTMOutput(const Tensor&, const Tensor&, const Tensor&)> padded;
  std::function<nn::PackedLSTMOutput(const nn::utils::rnn::PackedSequence&, const Tensor&,
                                     const Tensor&)>
      packed;
};

template <class M>
AnyRNN any_rnn(std::shared_ptr<M> m) {
  AnyRNN a{m, {}, {}};
  a.padded = [m](const Tensor& x, const Tensor& h0, const Tensor& c0) {
    if constexpr (std::is_same_v<M, nn::LSTM>) {
      return m->forward(x, h0, c0);
    } else {
      const nn::RNNOutput r = m->forward(x, h0);
      return nn::LSTMOutput{r.output, r.h_n, {}};
    }
  };
  a.packed = [m](const nn::utils::rnn::PackedSequence& x, const Tensor& h0, const Tensor& c0) {
    if constexpr (std::is_same_v<M, nn::LSTM>) {
      return m->forward(x, h0, c0);
    } else {
      const nn::PackedRNNOutput r = m->forward(x, h0);
      return nn::PackedLSTMOutput{r.output, r.h_n, {}};
    }
  };
  return a;
}

// kind: "RNN tanh", "RNN relu", "GRU" or "LSTM".
AnyRNN make_rnn(const std::string& kind, int64_t input_size, int64_t hidden_size,
                nn::RNNOptions o) {
  if (kind == "GRU") return any_rnn(std::make_shared<nn::GRU>(input_size, hidden_size, o));
  if (kind == "LSTM") return any_rnn(std::make_shared<nn::LSTM>(input_size, hidden_size, o));
  o.nonlinearity = kind.substr(4);
  return any_rnn(std::make_shared<nn::RNN>(input_size, hidden_size, o));
}

// Results and gradients against gen_rnn.py's record(): the loss weighs out, h_n and c_n by
// value(·, 1), value(·, 2) and value(·, 3).
void expect_recorded(const Golden& g, const std::string& name, const nn::Module& m, const Tensor& x,
                     const std::vector<Tensor>& states, const Tensor& out, const Tensor& h_n,
                     const Tensor& c_n) {
  expect_close(out, g[name + ".out"], 1e-10, 1e-12, name + " output");
  expect_close(h_n, g[name + ".h_n"], 1e-10, 1e-12, name + " h_n");
  Tensor loss = add(sum(mul(out, value(out.shape(), 1))), sum(mul(h_n, value(h_n.shape(), 2))));
  if (c_n.defined()) {
    expect_close(c_n, g[name + ".c_n"], 1e-10, 1e-12, name + " c_n");
    loss = add(loss, sum(mul(c_n, value(c_n.shape(), 3))));
  }
  loss.backward();
  expect_close(x.grad(), g[name + ".gx"], 1e-10, 1e-12, name + " grad x");
  const char* state_names[] = {"h0", "c0"};
  for (size_t i = 0; i < states.size(); ++i)
    expect_close(states[i].grad(), g[name + ".g" + state_names[i]], 1e-10, 1e-12,
                 name + " grad " + state_names[i]);
  for (const auto& [pname, t] : m.named_parameters()) {
    BOOST_TEST_REQUIRE(t.grad().defined(), name << ": " << pname << " has no gradient");
    expect_close(t.grad(), g[name + ".g." + pname], 1e-10, 1e-12, name + " grad " + pname);
  }
}

const std::vector<std::string> kKinds = {"RNN tanh", "RNN relu", "GRU", "LSTM"};

// A module holding an LSTM and a GRU, as gen_rnn.py's Model.
class TwoRNNs : public nn::Cloneable<TwoRNNs> {
 public:
  TwoRNNs() {
    register_module(
        "lstm", lstm,
        std::make_shared<nn::LSTM>(
            I, H, nn::RNNOptions{.num_layers = 2, .batch_first = true, .bidirectional = true}));
    register_module("gru", gru, std::make_shared<nn::GRU>(2 * H, H));
  }
  std::shared_ptr<nn::LSTM> lstm;
  std::shared_ptr<nn::GRU> gru;

 private:
  friend Cloneable;
  TwoRNNs(const TwoRNNs&) = default;
};

// One layer call of a kind ("LSTM", "GRU", "RNN tanh", "RNN relu") on (x, h0, c0, w_ih, w_hh,
// b_ih, b_hh): c0 is passed to the LSTM only.
RNNLayerResult run_kind(const std::string& kind, const std::vector<Tensor>& v,
                        const std::vector<int64_t>& batch_sizes, bool reverse) {
  if (kind == "LSTM")
    return lstm_layer(v[0], v[1], v[2], v[3], v[4], v[5], v[6], batch_sizes, reverse);
  if (kind == "GRU") return gru_layer(v[0], v[1], v[3], v[4], v[5], v[6], batch_sizes, reverse);
  return rnn_layer(v[0], v[1], v[3], v[4], v[5], v[6], kind.substr(4), batch_sizes, reverse);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_rnn)

BOOST_AUTO_TEST_CASE(table_gradcheck) { check_gradients(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_gradgradcheck) { check_gradgradients(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad) { check_forward_gradients(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_forward) { check_forward_over_forward(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_forward_over_reverse) { check_forward_over_reverse(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_create_graph_gradients) { check_create_graph_gradients(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_golden) { check_golden(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_edge_cases) { check_edge_cases(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_edge_shapes) { check_edge_shapes(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_anomaly) { check_anomaly(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_on_device) { check_on_device(kRNNOps); }
BOOST_AUTO_TEST_CASE(table_forward_ad_on_device) { check_forward_on_device(kRNNOps); }

// Forward mode through time (Note [Tangents through time] in ops/rnn.cpp), every cell padded and
// packed, forwards and in reverse: the tangents of output, h_n and c_n from the kernels'
// workspace against the backward (<J v, u> = <v, Jᵀ u>) and against the tangents the ops give
// (inputs requiring grad); then reverse over forward (the gradient of <J v, u>) against the
// double backward (the gradient of <Jᵀ u, v>), both of the one function uᵀ J(θ) v.
BOOST_AUTO_TEST_CASE(forward_mode_through_time) {
  namespace fa = autograd::forward_ad;
  for (const std::string& kind : kKinds)
    for (const bool packed : {false, true})
      for (const bool reverse : {false, true}) {
        BOOST_TEST_CONTEXT(kind << (packed ? " packed" : "") << (reverse ? " reverse" : "")) {
          manual_seed(31);
          const int64_t G = kind == "LSTM" ? 4 : kind == "GRU" ? 3 : 1, Hs = 3, In = 4;
          const std::vector<int64_t> sizes =
              packed ? std::vector<int64_t>{3, 2, 2, 1} : std::vector<int64_t>{};
          const std::vector<Shape> shapes = {packed ? Shape{8, In} : Shape{4, 3, In},
                                             {3, Hs},
                                             {3, Hs},
                                             {G * Hs, In},
                                             {G * Hs, Hs},
                                             {G * Hs},
                                             {G * Hs}};
          std::vector<Tensor> primal, tangent;
          for (const Shape& sh : shapes) {
            primal.push_back(mul(randn(sh, kFloat64), 0.5));
            tangent.push_back(randn(sh, kFloat64));
          }
          const size_t outputs = kind == "LSTM" ? 3 : 2;
          const RNNLayerResult shape_of = run_kind(kind, primal, sizes, reverse);
          const std::vector<Tensor> results{shape_of.output, shape_of.h_n, shape_of.c_n};
          std::vector<Tensor> up;
          for (size_t k = 0; k < outputs; ++k) up.push_back(randn(results[k].shape(), kFloat64));
          const auto tangents = [&](const std::vector<Tensor>& inputs) {
            fa::DualLevel level;
            std::vector<Tensor> dual;
            for (size_t i = 0; i < inputs.size(); ++i)
              dual.push_back(fa::make_dual(inputs[i], tangent[i]));
            const RNNLayerResult r = run_kind(kind, dual, sizes, reverse);
            std::vector<Tensor> out;
            for (const Tensor& y : {r.output, r.h_n, r.c_n})
              if (y.defined()) out.push_back(fa::unpack_dual(y).tangent);
            return out;
          };
          const auto leaves = [&] {
            std::vector<Tensor> l;
            for (const Tensor& p : primal) l.push_back(p.detach().clone().requires_grad_());
            return l;
          };
          // from the workspace (nothing requires grad) against the backward
          const std::vector<Tensor> jv = tangents(primal);
          BOOST_TEST_REQUIRE(jv.size() == outputs);
          double forward = 0, backward = 0;
          const auto inner = [](const Tensor& a, const Tensor& b) {
            return a.defined() ? sum(mul(a, b)).item<double>() : 0.0;
          };
          for (size_t k = 0; k < outputs; ++k) forward += inner(jv[k], up[k]);
          const std::vector<Tensor> ls = leaves();
          const RNNLayerResult r = run_kind(kind, ls, sizes, reverse);
          const std::vector<Tensor> ys{r.output, r.h_n, r.c_n};
          const std::vector<Tensor> g = autograd::grad(
              std::vector<Tensor>(ys.begin(), ys.begin() + static_cast<long>(outputs)), ls, up,
              std::nullopt, false, true);
          for (size_t i = 0; i < g.size(); ++i) backward += inner(g[i], tangent[i]);
          BOOST_TEST(std::abs(forward - backward) <= 1e-10 * std::max(1.0, std::abs(backward)),
                     "forward " << forward << " against backward " << backward);
          // from the ops (the inputs require grad): the same tangents, then reverse over forward
          const std::vector<Tensor> lr = leaves();
          const std::vector<Tensor> jv_ops = tangents(lr);
          Tensor fwd_loss;
          for (size_t k = 0; k < outputs; ++k) {
            expect_close(jv_ops[k], jv[k], 1e-12, 1e-12, "tangent from the ops");
            const Tensor term = sum(mul(jv_ops[k], up[k]));
            fwd_loss = fwd_loss.defined() ? add(fwd_loss, term) : term;
          }
          const std::vector<Tensor> rof =
              autograd::grad({fwd_loss}, lr, {}, std::nullopt, false, true);
          const std::vector<Tensor> ld = leaves();
          const RNNLayerResult rd = run_kind(kind, ld, sizes, reverse);
          const std::vector<Tensor> yd{rd.output, rd.h_n, rd.c_n};
          const std::vector<Tensor> gd = autograd::grad(
              std::vector<Tensor>(yd.begin(), yd.begin() + static_cast<long>(outputs)), ld, up,
              std::nullopt, true, true);
          Tensor bwd_loss;
          for (size_t i = 0; i < gd.size(); ++i) {
            if (!gd[i].defined()) continue;
            const Tensor term = sum(mul(gd[i], tangent[i]));
            bwd_loss = bwd_loss.defined() ? add(bwd_loss, term) : term;
          }
          const std::vector<Tensor> dbl =
              autograd::grad({bwd_loss}, ld, {}, std::nullopt, false, true);
          for (size_t i = 0; i < dbl.size(); ++i) {
            const Tensor a = rof[i].defined() ? rof[i] : zeros(primal[i].shape(), kFloat64);
            const Tensor b = dbl[i].defined() ? dbl[i] : zeros(primal[i].shape(), kFloat64);
            expect_close(a, b, 1e-10, 1e-10, fmt::format("reverse over forward, input {}", i));
          }
        }
      }
}

// Every option of the modules against torch.nn (gen_rnn.py): outputs, states, and the gradients
// of the input, the states and every parameter.
BOOST_AUTO_TEST_CASE(modules_match_torch) {
  const Golden g("rnn.json");
  using nn::utils::rnn::pack_padded_sequence;
  using nn::utils::rnn::pad_packed_sequence;
  for (const std::string& kind : kKinds)
    for (int64_t layers : {1, 2})
      for (bool bias : {true, false})
        for (bool batch_first : {false, true})
          for (bool bidirectional : {false, true}) {
            for (bool state : {false, true})
              for (const std::string packed : {"padded", "sorted", "unsorted"}) {
                const std::string name =
                    fmt::format("{} L{} bias{} bf{} bi{} state{} {}", kind, layers, int(bias),
                                int(batch_first), int(bidirectional), int(state), packed);
                BOOST_TEST_CONTEXT(name) {
                  const nn::RNNOptions o{.num_layers = layers,
                                         .bias = bias,
                                         .batch_first = batch_first,
                                         .bidirectional = bidirectional};
                  AnyRNN m = make_rnn(kind, I, H, o);
                  fill(*m.module);
                  const int64_t D = bidirectional ? 2 : 1;
                  const Tensor x =
                      value(batch_first ? Shape{B, T, I} : Shape{T, B, I}, 4).requires_grad_();
                  std::vector<Tensor> states;
                  if (state) {
                    states.push_back(value({layers * D, B, H}, 5).requires_grad_());
                    if (kind == "LSTM")
                      states.push_back(value({layers * D, B, H}, 6).requires_grad_());
                  }
                  const Tensor h0 = state ? states[0] : Tensor();
                  const Tensor c0 = states.size() > 1 ? states[1] : Tensor();
                  nn::LSTMOutput r;
                  if (packed == "padded") {
                    r = m.padded(x, h0, c0);
                  } else {
                    const Tensor lengths =
                        from_vector(packed == "sorted" ? std::vector<int64_t>{4, 2, 1}
                                                       : std::vector<int64_t>{2, 4, 1},
                                    {3});
                    const auto seq =
                        pack_padded_sequence(x, lengths, batch_first, packed == "sorted");
                    const nn::PackedLSTMOutput p = m.packed(seq, h0, c0);
                    expect_close(p.output.data, g[name + ".data"], 1e-10, 1e-12, "packed data");
                    BOOST_TEST((p.output.batch_sizes.to_vector<int64_t>() ==
                                std::vector<int64_t>{3, 2, 1, 1}));
                    r = {pad_packed_sequence(p.output, batch_first, 0, T).padded, p.h_n, p.c_n};
                  }
                  expect_recorded(g, name, *m.module, x, states, r.output, r.h_n, r.c_n);
                }
              }
            AnyRNN m = make_rnn(
                kind, I, H, {.num_layers = layers, .bias = bias, .bidirectional = bidirectional});
            std::vector<std::string> entries;
            for (const auto& [key, t] : m.module->state_dict())
              entries.push_back(fmt::format("{}:{}", key, t.shape()));
            BOOST_TEST(fmt::format("{}", fmt::join(entries, " ")) ==
                       g.text(fmt::format("{} L{} bias{} bi{}.names", kind, layers, int(bias),
                                          int(bidirectional))));
          }
}

BOOST_AUTO_TEST_CASE(unbatched_inputs_match_torch) {
  const Golden g("rnn.json");
  for (const std::string& kind : kKinds)
    for (bool bidirectional : {false, true}) {
      const std::string name = fmt::format("{} unbatched bi{}", kind, int(bidirectional));
      AnyRNN m = make_rnn(kind, I, H, {.num_layers = 2, .bidirectional = bidirectional});
      fill(*m.module);
      const int64_t D = bidirectional ? 2 : 1;
      const Tensor x = value({T, I}, 4).requires_grad_();
      std::vector<Tensor> states{value({2 * D, H}, 5).requires_grad_()};
      if (kind == "LSTM") states.push_back(value({2 * D, H}, 6).requires_grad_());
      const nn::LSTMOutput r = m.padded(x, states[0], states.size() > 1 ? states[1] : Tensor());
      expect_recorded(g, name, *m.module, x, states, r.output, r.h_n, r.c_n);
    }
}

BOOST_AUTO_TEST_CASE(cells_match_torch) {
  const Golden g("rnn.json");
  for (const std::string kind : {"RNNCell tanh", "RNNCell relu", "GRUCell", "LSTMCell"})
    for (bool bias : {true, false})
      for (bool batched : {false, true})
        for (bool state : {false, true}) {
          const std::string name =
              fmt::format("{} bias{} batched{} state{}", kind, int(bias), int(batched), int(state));
          BOOST_TEST_CONTEXT(name) {
            const Tensor x = value(batched ? Shape{B, I} : Shape{I}, 4).requires_grad_();
            const Shape shape = batched ? Shape{B, H} : Shape{H};
            std::vector<Tensor> states;
            if (state) states.push_back(value(shape, 5).requires_grad_());
            if (state && kind == "LSTMCell") states.push_back(value(shape, 6).requires_grad_());
            const Tensor h0 = state ? states[0] : Tensor();
            if (kind == "LSTMCell") {
              nn::LSTMCell cell(I, H, bias);
              fill(cell);
              const nn::LSTMState s =
                  cell.forward(x, {h0, states.size() > 1 ? states[1] : Tensor()});
              expect_recorded(g, name, cell, x, states, s.h, s.h, s.c);
            } else if (kind == "GRUCell") {
              nn::GRUCell cell(I, H, bias);
              fill(cell);
              const Tensor h = cell(x, h0);
              expect_recorded(g, name, cell, x, states, h, h, {});
            } else {
              nn::RNNCell cell(I, H, bias, kind.substr(8));
              fill(cell);
              const Tensor h = cell(x, h0);
              expect_recorded(g, name, cell, x, states, h, h, {});
            }
          }
        }
}

// A torch state dict (tests/golden/rnn_model.safetensors: a 2-layer bidirectional batch_first
// LSTM and a GRU after an SGD step) loads one to one through nn::load and gives torch's outputs.
BOOST_AUTO_TEST_CASE(torch_state_dict_loads) {
  const Golden g("rnn.json");
  TwoRNNs model;
  nn::load(model, golden_dir() + "/rnn_model.safetensors");
  const Tensor x = g["model.x"].to(kFloat32);
  const nn::LSTMOutput l = model.lstm->forward(x);
  expect_close(l.output.to(kFloat64), g["model.lstm_out"], 1e-5, 1e-6, "LSTM output");
  expect_close(l.c_n.to(kFloat64), g["model.lstm_c_n"], 1e-5, 1e-6, "LSTM c_n");
  const nn::RNNOutput r = model.gru->forward(l.output.transpose(0, 1));
  expect_close(r.output.to(kFloat64), g["model.gru_out"], 1e-5, 1e-6, "GRU output");
  expect_close(r.h_n.to(kFloat64), g["model.gru_h_n"], 1e-5, 1e-6, "GRU h_n");
}

// Packed equals padded on the valid steps: each sequence run alone over its own length gives the
// packed run's outputs at its steps and its h_n and c_n, for every kind, two layers, both
// directions; the padded steps of pad_packed_sequence hold padding_value.
BOOST_AUTO_TEST_CASE(packed_equals_padded_on_valid_steps) {
  using namespace nn::utils::rnn;
  manual_seed(3);
  const std::vector<int64_t> lengths{2, 5, 3, 5};
  for (const std::string& kind : kKinds) {
    AnyRNN m = make_rnn(kind, 3, 4, {.num_layers = 2, .bidirectional = true});
    const Tensor x = randn({5, 4, 3}), h0 = randn({4, 4, 4}), c0 = randn({4, 4, 4});
    const Tensor cs = kind == "LSTM" ? c0 : Tensor();
    const nn::PackedLSTMOutput p =
        m.packed(pack_padded_sequence(x, from_vector(lengths, {4}), false, false), h0, cs);
    const PaddedSequence padded = pad_packed_sequence(p.output, false, -7.0, 6);
    BOOST_TEST((padded.padded.shape() == Shape{6, 4, 8}));
    BOOST_TEST((padded.lengths.to_vector<int64_t>() == lengths));
    for (int64_t b = 0; b < 4; ++b) {
      const int64_t L = lengths[b];
      const nn::LSTMOutput alone = m.padded(x.narrow(0, 0, L).narrow(1, b, 1), h0.narrow(1, b, 1),
                                            cs.defined() ? cs.narrow(1, b, 1) : Tensor());
      expect_close(padded.padded.narrow(0, 0, L).narrow(1, b, 1), alone.output, 1e-5, 1e-6,
                   kind + " output");
      expect_close(p.h_n.narrow(1, b, 1), alone.h_n, 1e-5, 1e-6, kind + " h_n");
      if (cs.defined()) expect_close(p.c_n.narrow(1, b, 1), alone.c_n, 1e-5, 1e-6, kind + " c_n");
      if (L < 6) {
        const std::vector<float> pad =
            padded.padded.narrow(0, L, 6 - L).narrow(1, b, 1).contiguous().to_vector<float>();
        BOOST_TEST(std::all_of(pad.begin(), pad.end(), [](float v) { return v == -7.0f; }));
      }
    }
  }
}

// pack_padded_sequence then pad_packed_sequence is the identity on the valid steps, batch_first
// or not, sorted or not, with trailing feature dims; the gradient reaches the valid steps only.
BOOST_AUTO_TEST_CASE(pack_and_pad_round_trip) {
  using namespace nn::utils::rnn;
  manual_seed(4);
  for (bool batch_first : {false, true}) {
    const Tensor x = randn(batch_first ? Shape{3, 4, 2, 2} : Shape{4, 3, 2, 2}).requires_grad_();
    const Tensor lengths = from_vector(std::vector<int64_t>{3, 4, 1}, {3});
    const PackedSequence p = pack_padded_sequence(x, lengths, batch_first, false);
    BOOST_TEST((p.batch_sizes.to_vector<int64_t>() == std::vector<int64_t>{3, 2, 2, 1}));
    BOOST_TEST((p.sorted_indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 2}));
    BOOST_TEST((p.unsorted_indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 2}));
    const PaddedSequence back = pad_packed_sequence(p, batch_first);
    BOOST_TEST((back.lengths.to_vector<int64_t>() == std::vector<int64_t>{3, 4, 1}));
    const Tensor mask = [&] {
      std::vector<double> m;
      for (int64_t i = 0; i < 4 * 3; ++i) {
        const int64_t t = batch_first ? i % 4 : i / 3, b = batch_first ? i / 4 : i % 3;
        m.push_back(t < std::vector<int64_t>{3, 4, 1}[b] ? 1.0 : 0.0);
      }
      return from_vector(m, batch_first ? Shape{3, 4, 1, 1} : Shape{4, 3, 1, 1});
    }();
    expect_close(back.padded, mul(x, mask).detach(), 0, 0, "round trip");
    sum(back.padded).backward();
    expect_close(x.grad(), mask.expand(x.shape()).contiguous(), 0, 0, "gradient");
  }
}

// The gate kernels split across threads above the grain (96 sequences): the gradients of the
// kernels' backward equal those of the backward in ops (create_graph), for each cell (the RNN
// cell below its grain), padded and packed, in both directions.
BOOST_AUTO_TEST_CASE(kernels_match_ops_above_the_grain) {
  const int threads = get_num_threads();
  set_num_threads(2);
  manual_seed(7);
  const std::vector<int64_t> sizes{96, 96, 60, 7};
  for (int64_t G : {4, 3, 1})
    for (bool packed : {false, true})
      for (bool reverse : {false, true}) {
        const int64_t N = 96 * 4 - (packed ? 96 * 2 - 60 - 7 : 0);
        std::vector<Tensor> in{randn(packed ? Shape{N, 6} : Shape{4, 96, 6}, kFloat64),
                               randn({96, 32}, kFloat64),
                               randn({96, 32}, kFloat64),
                               randn({G * 32, 6}, kFloat64),
                               randn({G * 32, 32}, kFloat64),
                               randn({G * 32}, kFloat64),
                               randn({G * 32}, kFloat64)};
        for (Tensor& t : in) t.requires_grad_();
        const std::vector<int64_t> bs = packed ? sizes : std::vector<int64_t>{};
        const auto f = [&] {
          if (G == 4)
            return flat(lstm_layer(in[0], in[1], in[2], in[3], in[4], in[5], in[6], bs, reverse));
          if (G == 3) return flat(gru_layer(in[0], in[1], in[3], in[4], in[5], in[6], bs, reverse));
          return flat(rnn_layer(in[0], in[1], in[3], in[4], in[5], in[6], "tanh", bs, reverse));
        };
        std::vector<Tensor> wrt = in;
        if (G != 4) wrt.erase(wrt.begin() + 2);
        const Tensor y = f(), up = randn(y.shape(), kFloat64);
        const auto kernels = autograd::grad({y}, wrt, {up});
        const auto in_ops = autograd::grad({f()}, wrt, {up}, std::nullopt, true);
        for (size_t i = 0; i < wrt.size(); ++i)
          expect_close(in_ops[i], kernels[i], 1e-10, 1e-12,
                       fmt::format("G {} packed {} reverse {} input {}", G, packed, reverse, i));
      }
  set_num_threads(threads);
}

// Dropout between layers draws from Ember's generator in training only.
BOOST_AUTO_TEST_CASE(dropout_between_layers) {
  manual_seed(5);
  nn::LSTM lstm(3, 4, {.num_layers = 2, .dropout = 0.5});
  const Tensor x = randn({5, 2, 3});
  manual_seed(9);
  const Tensor a = lstm(x).output;
  manual_seed(9);
  const Tensor b = lstm(x).output;
  const Tensor c = lstm(x).output;
  expect_close(a, b, 0, 0, "same seed");
  BOOST_TEST(max(abs(sub(a, c))).item<float>() > 1e-4, "another draw");
  lstm.eval();
  const Tensor e = lstm(x).output;
  nn::LSTM plain(3, 4, {.num_layers = 2});
  {
    NoGradGuard no_grad;
    const auto from = lstm.parameters(), to = plain.parameters();
    for (size_t i = 0; i < from.size(); ++i) Tensor(to[i]).copy_(from[i]);
  }
  expect_close(e, plain(x).output, 0, 0, "eval has no dropout");
  const auto clone = std::static_pointer_cast<nn::LSTM>(lstm.clone());
  expect_close(clone->forward(x).output, e, 0, 0, "clone");
}

// The modules on the emulated device agree with the CPU, packed and padded.
BOOST_AUTO_TEST_CASE(modules_on_device) {
  if (!cuda::is_available()) {
    BOOST_TEST_MESSAGE("skipped: no CUDA device (" << cuda::unavailable_reason() << ")");
    return;
  }
  using namespace nn::utils::rnn;
  manual_seed(6);
  for (const std::string& kind : kKinds) {
    AnyRNN m = make_rnn(kind, 3, 2, {.num_layers = 2, .bidirectional = true});
    fill(*m.module);
    const Tensor x = randn({4, 3, 3}, kFloat64), h0 = randn({4, 3, 2}, kFloat64);
    const Tensor lengths = from_vector(std::vector<int64_t>{2, 4, 3}, {3});
    const auto cpu = m.packed(pack_padded_sequence(x, lengths, false, false), h0, {});
    m.module->to(kCUDA);
    const auto dev =
        m.packed(pack_padded_sequence(x.to(kCUDA), lengths, false, false), h0.to(kCUDA), {});
    BOOST_TEST(dev.output.data.is_cuda());
    expect_close(dev.output.data.cpu(), cpu.output.data, 1e-10, 1e-12, kind + " output");
    expect_close(dev.h_n.cpu(), cpu.h_n, 1e-10, 1e-12, kind + " h_n");
  }
}

BOOST_AUTO_TEST_CASE(rnn_errors) {
  using namespace nn::utils::rnn;
  const Tensor x = randn({4, 3, 5});
  // pack_padded_sequence: unsorted lengths under enforce_sorted, a length 0 or above T
  expect_error(
      [&] {
        pack_padded_sequence(x, from_vector(std::vector<int64_t>{2, 4, 1}, {3}));
      },
      {"pack_padded_sequence", "sorted in decreasing order", "[2, 4, 1]"});
  expect_error(
      [&] {
        pack_padded_sequence(x, from_vector(std::vector<int64_t>{4, 0, 1}, {3}));
      },
      {"pack_padded_sequence", "lengths[1] is 0", "[4, 3, 5]"});
  expect_error(
      [&] {
        pack_padded_sequence(x, from_vector(std::vector<int64_t>{5, 2, 1}, {3}), false, false);
      },
      {"pack_padded_sequence", "lengths[0] is 5", "outside [1, 4]"});
  expect_error(
      [&] {
        pack_padded_sequence(x, from_vector(std::vector<int64_t>{4, 2}, {2}));
      },
      {"pack_padded_sequence", "lengths has 2 entries", "[4, 3, 5]"});
  expect_error([&] { pack_padded_sequence(x, randn({3})); },
               {"pack_padded_sequence", "1-D integer tensor"});
  const PackedSequence p = pack_padded_sequence(x, from_vector(std::vector<int64_t>{4, 2, 1}, {3}));
  expect_error([&] { pad_packed_sequence(p, false, 0, 3); },
               {"pad_packed_sequence", "total_length 3", "length 4"});
  // modules: states of the wrong shape, inputs of the wrong feature size
  nn::LSTM lstm(5, 2, {.num_layers = 2});
  expect_error([&] { lstm(x, randn({1, 3, 2})); }, {"LSTM", "h0", "[2, 3, 2]", "[1, 3, 2]"});
  expect_error(
      [&] {
        lstm.forward(x, Tensor(), randn({2, 3, 3}));
      },
      {"LSTM", "c0", "[2, 3, 2]", "[2, 3, 3]"});
  expect_error(
      [&] {
        lstm(randn({4, 3, 6}));
      },
      {"LSTM", "input has 6 features", "input_size is 5"});
  expect_error([&] { lstm(randn({4})); }, {"LSTM", "expected input of 3 dims", "[4]"});
  expect_error([&] { lstm(p, randn({2, 2, 2})); }, {"LSTM", "h0", "[2, 3, 2]", "[2, 2, 2]"});
  nn::GRU gru(5, 2, {.bidirectional = true});
  expect_error([&] { gru(x, randn({1, 3, 2})); }, {"GRU", "h0", "[2, 3, 2]"});
  expect_error(
      [&] {
        gru(pack_padded_sequence(randn({4, 3, 4}),
                                 from_vector(std::vector<int64_t>{4, 2, 1}, {3})));
      },
      {"GRU", "input has 4 features", "input_size is 5"});
  nn::RNN rnn(5, 2);
  expect_error([&] { rnn(x, randn({1, 2, 2})); }, {"RNN", "h0", "[1, 3, 2]", "[1, 2, 2]"});
  expect_error([&] { nn::RNN(5, 2, {.nonlinearity = "gelu"}); }, {"RNN", "nonlinearity", "gelu"});
  expect_error([&] { nn::LSTM(5, 0); }, {"LSTM", "hidden_size", "0"});
  expect_error([&] { nn::GRU(5, 2, {.dropout = 1.5}); }, {"GRU", "dropout", "1.5"});
  // cells
  nn::LSTMCell lstm_cell(5, 2);
  expect_error([&] { lstm_cell(randn({3, 4})); }, {"LSTMCell", "input has 4 features", "[3, 4]"});
  expect_error(
      [&] {
        lstm_cell.forward(randn({3, 5}), {randn({3, 2}), randn({2, 2})});
      },
      {"LSTMCell", "c should have shape [3, 2]", "[2, 2]"});
  nn::GRUCell gru_cell(5, 2);
  expect_error(
      [&] {
        gru_cell(randn({3, 5}), randn({3, 3}));
      },
      {"GRUCell", "h should have shape [3, 2]"});
  expect_error([&] { nn::RNNCell(5, 2, true, "sigmoid"); }, {"RNNCell", "nonlinearity", "sigmoid"});
  // the layer ops
  const Tensor w_ih = randn({8, 5}), w_hh = randn({8, 2});
  expect_error(
      [&] {
        lstm_layer(x, {}, {}, randn({8, 4}), w_hh, {}, {});
      },
      {"lstm_layer", "input has 5 features", "[8, 4]"});
  expect_error(
      [&] {
        lstm_layer(x, {}, {}, w_ih, randn({6, 2}), {}, {});
      },
      {"lstm_layer", "w_hh", "[6, 2]"});
  expect_error(
      [&] {
        lstm_layer(x, randn({3, 3}), {}, w_ih, w_hh, {}, {});
      },
      {"lstm_layer", "h0 should have shape [3, 2]", "[3, 3]"});
  expect_error([&] { lstm_layer(x, {}, {}, w_ih, w_hh, randn({7}), {}); },
               {"lstm_layer", "b_ih should have shape [8]", "[7]"});
  expect_error(
      [&] {
        lstm_layer(randn({0, 3, 5}), {}, {}, w_ih, w_hh, {}, {});
      },
      {"lstm_layer", "at least one step", "[0, 3, 5]"});
  expect_error(
      [&] {
        gru_layer(randn({6, 5}), {}, randn({6, 5}), randn({6, 2}), {}, {}, {2, 3, 1});
      },
      {"gru_layer", "non-increasing", "2, 3, 1"});
  expect_error(
      [&] {
        gru_layer(randn({7, 5}), {}, randn({6, 5}), randn({6, 2}), {}, {}, {3, 2, 1});
      },
      {"gru_layer", "sum to 6", "7 rows"});
  expect_error(
      [&] {
        rnn_layer(x, {}, randn({2, 5}), randn({2, 2}), {}, {}, "sigmoid");
      },
      {"rnn_layer", "nonlinearity", "sigmoid"});
  expect_error(
      [&] {
        rnn_layer(x, {}, randn({2, 5}, kFloat64), randn({2, 2}), {}, {});
      },
      {"rnn_layer", "w_ih is Float64"});
}

BOOST_AUTO_TEST_SUITE_END()
