// lstm_layer, gru_layer and rnn_layer: one recurrent layer in one direction over a whole sequence
// (padded (T, B, I) or packed (N, I) with batch sizes). On the CPU: the input projections of
// every step in one product (biases folded in), then per step one hidden product and one fused
// gate kernel, which keeps the activations the backward reads; the backward through time is one
// Node (RNNLayerBackward) running, per step in reverse, one fused gate-derivative kernel and one
// product, then three products for dX, dW_ih and dW_hh over all steps at once. Under
// create_graph the Node's backward is the same recurrence written in ops (the forward recomputed
// in ops for the activations), so it differentiates again; on a device the forward is composed
// of ops (linear, sigmoid, tanh, mul, cat, ...) and autograd follows them.
//
// Note [Packed steps]
// Step t holds the first size[t] sequences: rows offset[t] .. offset[t] + size[t] of the data.
// The state is a (B, H) buffer whose first size[t] rows a step reads and overwrites; the rows of
// sequences that have no step t keep their state. Forwards, sizes shrink, so a finished
// sequence's row keeps its last state: h_n. In reverse, sizes grow, so a sequence starts from
// its h0 row at its own last step, and h_n is the state after step 0. The backward walks the
// steps in the opposite order with a (B, H) carry of dL/dh (and dL/dc) treated the same way:
// the rows left at the end are dh0 (and dc0).
//
// Note [Tangents through time]
// Forward mode runs the steps in the forward order with a (B, H) carry of the state's tangent dh
// (and dc), from dh0 (dc0) or zeros, rows as the state's. The terms that do not pass through
// time come first, for every row at once: the input side dGx = dX W_ihᵀ + X dW_ihᵀ + db_ih and
// the hidden side's dH_prev-free part H_prev dW_hhᵀ + db_hh; a step adds dh_prev W_hhᵀ and then
// differentiates its gates (σ' = y (1 - y), tanh' = 1 - y²):
//   LSTM: dpre = dgx + dgh; di, df, dg, do = dpre's parts times the gates' derivatives;
//         dc' = df c + f dc + di g + i dg;  dh' = do tanh(c') + o (1 - tanh²c') dc'
//   GRU:  dr, dz = (dgx + dgh)'s parts times σ';  dn = (dgx_n + dr hn + r dgh_n)(1 - n²);
//         dh' = dn + dz (h - n) + z (dh - dn)   (hn = h W_hnᵀ + b_hn, dgh_n its tangent)
//   RNN:  dh' = (dgx + dgh) tanh'(h') or [h' > 0]
// All in ops. The step values are the kernels' workspace when they are constants (no outer
// level open, no input requiring grad: the common case, no second pass); else forward_in_ops
// recomputes them from the inputs, so that the tangent carries the outer levels' tangents (a jvp
// of a jvp) and differentiates backward to the inputs (reverse over forward).
#include "ops/rnn.h"

#include <algorithm>
#include <string>

#include "graph/autograd.h"
#include "graph/creation.h"
#include "graph/profile.h"
#include "graph/strided.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/linalg.h"
#include "ops/reduce.h"
#include "ops/vec_math.h"

namespace ember {

namespace {

enum class Cell { LSTM, GRU, Tanh, Relu };

int64_t gate_count(Cell cell) { return cell == Cell::LSTM ? 4 : cell == Cell::GRU ? 3 : 1; }

std::string_view op_of(Cell cell) {
  return cell == Cell::LSTM ? "lstm_layer" : cell == Cell::GRU ? "gru_layer" : "rnn_layer";
}

// The steps of one call (Note [Packed steps]).
struct Steps {
  int64_t T = 0, B = 0, N = 0, I = 0, H = 0;
  std::vector<int64_t> size, offset;
  bool packed = false, reverse = false;
  int64_t at(int64_t k) const { return reverse ? T - 1 - k : k; }  // the step run k-th
};

void check_operand(const Tensor& x, const Tensor& t, const Shape& want, std::string_view what,
                   std::string_view op) {
  if (!t.defined()) return;
  EMBER_CHECK(t.shape() == want, "{}: {} should have shape {}, got {} (input of shape {})", op,
              what, want, t.shape(), x.shape());
  EMBER_CHECK(t.dtype() == x.dtype(), "{}: {} is {} but the input is {}", op, what, t.dtype(),
              x.dtype());
  check_same_device(x, t, op);
}

// The shapes of a call, checked: every message names the argument and the shapes.
Steps check_layer(Cell cell, const Tensor& x, const Tensor& h0, const Tensor& c0,
                  const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh,
                  const std::vector<int64_t>& batch_sizes, bool reverse) {
  const std::string_view op = op_of(cell);
  check_floating(x, op);
  check_defined(w_ih, op);
  check_defined(w_hh, op);
  Steps s;
  s.packed = !batch_sizes.empty();
  s.reverse = reverse;
  EMBER_CHECK(x.dim() == (s.packed ? 2 : 3), "{}: expected input of shape {}, got {}", op,
              s.packed ? "(N, input_size) for packed data" : "(T, B, input_size)", x.shape());
  EMBER_CHECK(w_hh.dim() == 2 && w_hh.size(0) == gate_count(cell) * w_hh.size(1),
              "{}: w_hh should have shape ({} * hidden_size, hidden_size), got {}", op,
              gate_count(cell), w_hh.shape());
  s.H = w_hh.size(1);
  s.I = x.size(-1);
  const int64_t GH = gate_count(cell) * s.H;
  EMBER_CHECK(w_ih.dim() == 2 && w_ih.size(0) == GH,
              "{}: w_ih should have shape ({}, input_size), got {} (w_hh {})", op, GH, w_ih.shape(),
              w_hh.shape());
  EMBER_CHECK(w_ih.size(1) == s.I,
              "{}: input has {} features (shape {}) but w_ih expects input_size {} (shape {})", op,
              s.I, x.shape(), w_ih.size(1), w_ih.shape());
  check_operand(x, w_ih, w_ih.shape(), "w_ih", op);
  check_operand(x, w_hh, w_hh.shape(), "w_hh", op);
  check_operand(x, b_ih, {GH}, "b_ih", op);
  check_operand(x, b_hh, {GH}, "b_hh", op);
  if (s.packed) {
    s.T = static_cast<int64_t>(batch_sizes.size());
    s.B = batch_sizes[0];
    int64_t sum = 0;
    for (int64_t t = 0; t < s.T; ++t) {
      EMBER_CHECK(batch_sizes[t] > 0 && (t == 0 || batch_sizes[t] <= batch_sizes[t - 1]),
                  "{}: batch_sizes must be positive and non-increasing, got {}", op,
                  fmt::join(batch_sizes, ", "));
      sum += batch_sizes[t];
    }
    EMBER_CHECK(sum == x.size(0),
                "{}: batch_sizes {} sum to {} but the packed data has {} rows (shape {})", op,
                fmt::join(batch_sizes, ", "), sum, x.size(0), x.shape());
    s.size = batch_sizes;
  } else {
    s.T = x.size(0);
    s.B = x.size(1);
    EMBER_CHECK(s.T > 0, "{}: expected a sequence of at least one step, got input of shape {}", op,
                x.shape());
    s.size.assign(static_cast<size_t>(s.T), s.B);
  }
  s.offset.resize(static_cast<size_t>(s.T));
  for (int64_t t = 0; t < s.T; ++t) {
    s.offset[t] = s.N;
    s.N += s.size[t];
  }
  check_operand(x, h0, {s.B, s.H}, "h0", op);
  check_operand(x, c0, {s.B, s.H}, "c0", op);
  return s;
}

// --- CPU kernels

// c = a · b + beta · c without autograd, zero sizes included (a BLAS call needs k > 0).
void product(const Tensor& a, const Tensor& b, const Tensor& c, double beta = 0) {
  if (c.numel() == 0) return;
  if (a.size(1) == 0) {
    if (beta == 0) Tensor(c).zero_();
    return;
  }
  gemm(a, b, c, 1.0, beta);
}

// The kernel's data, as rows of the (N, ·) data; the backward reads them.
struct Workspace {
  Tensor x;      // (N, I) contiguous
  Tensor hprev;  // (N, H): the state each row's step read
  Tensor cprev;  // LSTM (N, H)
  Tensor act;    // (N, G·H): LSTM i, f, g, o; GRU r, z, n; RNN h'
  Tensor aux;    // (N, H): LSTM tanh(c'); GRU h W_hnᵀ + b_hn
};

// One step's gates for rows [begin, end) of the step: gx (rows, G·H) the input projections with
// the biases folded in (GRU: all but b_hn), gh (rows, G·H) the hidden products, hp and cp (rows,
// H) the state read; writes act and aux rows, the new state into hs and cs (the state buffer's
// rows) and the output rows ho. Row stride G·H or H throughout.
template <Cell cell, class T>
void gates_forward(int64_t H, int64_t begin, int64_t end, const T* __restrict gx,
                   const T* __restrict gh, const T* __restrict bhn, const T* __restrict hp,
                   const T* __restrict cp, T* __restrict act, T* __restrict aux, T* __restrict hs,
                   T* __restrict cs, T* __restrict ho) {
  constexpr int64_t GH_per_H = cell == Cell::LSTM ? 4 : cell == Cell::GRU ? 3 : 1;
  const int64_t GH = GH_per_H * H;
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict a = gx + r * GH, * __restrict b = gh + r * GH;
    T* __restrict ac = act + r * GH, * __restrict h = hs + r * H, * __restrict out = ho + r * H;
    if constexpr (cell == Cell::LSTM) {
      const T* __restrict cpr = cp + r * H;
      T* __restrict c = cs + r * H, * __restrict tc = aux + r * H;
      for (int64_t j = 0; j < H; ++j) {
        const T i = vsigmoid(a[j] + b[j]), f = vsigmoid(a[H + j] + b[H + j]);
        const T g = vtanh(a[2 * H + j] + b[2 * H + j]), o = vsigmoid(a[3 * H + j] + b[3 * H + j]);
        const T cn = f * cpr[j] + i * g, t = vtanh(cn);
        ac[j] = i, ac[H + j] = f, ac[2 * H + j] = g, ac[3 * H + j] = o;
        c[j] = cn, tc[j] = t;
        h[j] = out[j] = o * t;
      }
    } else if constexpr (cell == Cell::GRU) {
      const T* __restrict hpr = hp + r * H;
      T* __restrict hn = aux + r * H;
      for (int64_t j = 0; j < H; ++j) {
        const T rg = vsigmoid(a[j] + b[j]), z = vsigmoid(a[H + j] + b[H + j]);
        const T hnj = b[2 * H + j] + bhn[j];
        const T n = vtanh(a[2 * H + j] + rg * hnj);
        ac[j] = rg, ac[H + j] = z, ac[2 * H + j] = n, hn[j] = hnj;
        h[j] = out[j] = n + z * (hpr[j] - n);
      }
    } else if constexpr (cell == Cell::Tanh) {
      for (int64_t j = 0; j < H; ++j) h[j] = out[j] = ac[j] = vtanh(a[j] + b[j]);
    } else {
      for (int64_t j = 0; j < H; ++j) h[j] = out[j] = ac[j] = std::max(a[j] + b[j], T(0));
    }
  }
}

// f.template operator()<cell>(): a kernel instantiated for the cell at hand.
template <class F>
void with_cell(Cell cell, F&& f) {
  switch (cell) {
    case Cell::LSTM:
      return f.template operator()<Cell::LSTM>();
    case Cell::GRU:
      return f.template operator()<Cell::GRU>();
    case Cell::Tanh:
      return f.template operator()<Cell::Tanh>();
    case Cell::Relu:
      return f.template operator()<Cell::Relu>();
  }
}

// The derivatives of gates_forward for rows [begin, end) of a step, go the output's gradient
// rows, ch and cc the carried dL/dh and dL/dc rows (in: from later steps and h_n,
// c_n; out: what reaches the state read, less the hidden product's term, which the caller adds);
// writes dgi (rows, G·H), the gradient of the pre-activations on the input side, and dgh that of
// the hidden product h W_hhᵀ + b_hh (GRU only; else the same as dgi).
//   LSTM: dc = dc' + dh o (1 - tanh²c');  dpre = [dc g i(1-i), dc c f(1-f), dc i (1-g²),
//         dh tanh(c') o(1-o)];  dc ← dc f
//   GRU:  dz = dh (h - n), dn = dh (1 - z), dpn = dn (1 - n²);  dgi = [dpn hn r(1-r),
//         dz z(1-z), dpn], dgh = dgi with dpn r for n;  dh ← dh z
//   RNN:  dpre = dh (1 - h'²) (tanh) or dh [h' > 0] (relu);  dh ← 0
template <Cell cell, class T>
void gates_backward(int64_t H, int64_t begin, int64_t end, const T* __restrict go,
                    const T* __restrict act, const T* __restrict aux, const T* __restrict hp,
                    const T* __restrict cp, T* __restrict ch, T* __restrict cc, T* __restrict dgi,
                    T* __restrict dgh) {
  constexpr int64_t GH_per_H = cell == Cell::LSTM ? 4 : cell == Cell::GRU ? 3 : 1;
  const int64_t GH = GH_per_H * H;
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict ac = act + r * GH, * __restrict gor = go + r * H;
    T* __restrict dh = ch + r * H, * __restrict di = dgi + r * GH;
    if constexpr (cell == Cell::LSTM) {
      const T* __restrict tc = aux + r * H, * __restrict cpr = cp + r * H;
      T* __restrict dcr = cc + r * H;
      for (int64_t j = 0; j < H; ++j) {
        const T d = dh[j] + gor[j];
        const T i = ac[j], f = ac[H + j], g = ac[2 * H + j], o = ac[3 * H + j], t = tc[j];
        const T dc = dcr[j] + d * o * (1 - t * t);
        di[j] = dc * g * i * (1 - i);
        di[H + j] = dc * cpr[j] * f * (1 - f);
        di[2 * H + j] = dc * i * (1 - g * g);
        di[3 * H + j] = d * t * o * (1 - o);
        dcr[j] = dc * f;
        dh[j] = 0;
      }
    } else if constexpr (cell == Cell::GRU) {
      const T* __restrict hn = aux + r * H, * __restrict hpr = hp + r * H;
      T* __restrict dhh = dgh + r * GH;
      for (int64_t j = 0; j < H; ++j) {
        const T d = dh[j] + gor[j];
        const T rg = ac[j], z = ac[H + j], n = ac[2 * H + j];
        const T dpn = d * (1 - z) * (1 - n * n);
        const T dpr = dpn * hn[j] * rg * (1 - rg), dpz = d * (hpr[j] - n) * z * (1 - z);
        di[j] = dhh[j] = dpr;
        di[H + j] = dhh[H + j] = dpz;
        di[2 * H + j] = dpn;
        dhh[2 * H + j] = dpn * rg;
        dh[j] = d * z;
      }
    } else {
      for (int64_t j = 0; j < H; ++j) {
        const T d = dh[j] + gor[j], y = ac[j];
        di[j] = cell == Cell::Tanh ? d * (1 - y * y) : (y > 0 ? d : T(0));
        dh[j] = 0;
      }
    }
  }
}

// Rows [0, n) of an (R, C) contiguous tensor, or those from row `first`.
Tensor rows(const Tensor& t, int64_t first, int64_t n) { return narrow_view(t, 0, first, n); }

// A (B, H) state buffer: a copy of the given state, or zeros.
Tensor state_buffer(const Tensor& given, const Steps& s, const Tensor& x) {
  if (!given.defined()) return zeros({s.B, s.H}, x.dtype(), x.device());
  NoGradGuard no_grad;
  return given.contiguous().clone();
}

// The forward on the CPU: fills the workspace, returns output (N, H), h_n, c_n.
RNNLayerResult forward_cpu(Cell cell, const Steps& s, const Tensor& x2d, const Tensor& h0,
                           const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                           const Tensor& b_ih, const Tensor& b_hh, Workspace& ws) {
  NoGradGuard no_grad;
  const int64_t H = s.H, GH = gate_count(cell) * H;
  const DType dtype = x2d.dtype();
  ws.x = x2d.contiguous();
  ws.hprev = empty({s.N, H}, dtype);
  ws.act = empty({s.N, GH}, dtype);
  if (cell == Cell::LSTM || cell == Cell::GRU) ws.aux = empty({s.N, H}, dtype);
  if (cell == Cell::LSTM) ws.cprev = empty({s.N, H}, dtype);
  // gx = x W_ihᵀ + b_ih + b_hh (GRU: b_hh's r and z parts only), one product for every step
  Tensor gx = empty({s.N, GH}, dtype);
  product(ws.x, w_ih.transpose(0, 1), gx);
  Tensor bias = zeros({GH}, dtype);
  if (b_ih.defined()) bias.add_(b_ih);
  if (b_hh.defined()) {
    if (cell == Cell::GRU)
      bias.narrow(0, 0, 2 * H).add_(b_hh.narrow(0, 0, 2 * H));
    else
      bias.add_(b_hh);
  }
  if (b_ih.defined() || b_hh.defined()) gx.add_(bias);
  const Tensor bhn = cell == Cell::GRU && b_hh.defined() ? b_hh.narrow(0, 2 * H, H).contiguous()
                                                         : zeros({H}, dtype);
  Tensor h = state_buffer(h0, s, x2d), c = cell == Cell::LSTM ? state_buffer(c0, s, x2d) : Tensor();
  Tensor out = empty({s.N, H}, dtype), gh = empty({s.B, GH}, dtype);
  const Tensor whh_t = w_hh.transpose(0, 1);
  dispatch_float(dtype, op_of(cell), [&]<class T>() {
    for (int64_t k = 0; k < s.T; ++k) {
      const int64_t t = s.at(k), bs = s.size[t], off = s.offset[t];
      rows(ws.hprev, off, bs).copy_(rows(h, 0, bs));
      if (c.defined()) rows(ws.cprev, off, bs).copy_(rows(c, 0, bs));
      product(rows(ws.hprev, off, bs), whh_t, rows(gh, 0, bs));
      const T* pgx = gx.data<T>() + off * GH;
      const T* php = ws.hprev.data<T>() + off * H;
      const T* pcp = c.defined() ? ws.cprev.data<T>() + off * H : nullptr;
      T* paux = ws.aux.defined() ? ws.aux.data<T>() + off * H : nullptr;
      T* pact = ws.act.data<T>() + off * GH;
      T* pout = out.data<T>() + off * H;
      const T* pbhn = bhn.data<T>();
      parallel_for(
          bs,
          [&](int64_t begin, int64_t end) {
            with_cell(cell, [&]<Cell C>() {
              gates_forward<C, T>(H, begin, end, pgx, gh.data<T>(), pbhn, php, pcp, pact, paux,
                                  h.data<T>(), c.defined() ? c.data<T>() : nullptr, pout);
            });
          },
          row_grain(GH * 8));
    }
  });
  return {out, h, c};
}

// --- forward and backward in ops (devices, create_graph)

// One step's values in ops, kept for the backward in ops.
struct StepValues {
  Tensor hp, cp, a0, a1, a2, a3, c, hn;  // a*: the gates' activations (RNN: a0 = h')
  Tensor tc;                             // LSTM: tanh(c)
};

struct InOps {
  Tensor output, h_n, c_n;  // output (N, H)
  std::vector<StepValues> steps;
};

// The rows of `state` (B, H) after a step wrote `fresh` into its first rows.
Tensor with_rows(const Tensor& fresh, const Tensor& state) {
  if (fresh.size(0) == state.size(0)) return fresh;
  return cat({fresh, state.narrow(0, fresh.size(0), state.size(0) - fresh.size(0))}, 0);
}

Tensor cat_rows(const std::vector<Tensor>& parts, int64_t width, const Tensor& like) {
  if (parts.empty()) return zeros({0, width}, like.dtype(), like.device());
  return cat(parts, 0);
}

// The layer's forward in differentiable ops, step by step as the kernels.
InOps forward_in_ops(Cell cell, const Steps& s, const Tensor& x2d, const Tensor& h0,
                     const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                     const Tensor& b_hh, bool keep) {
  const int64_t H = s.H;
  const Tensor gx = linear(x2d, w_ih, b_ih);
  Tensor h = h0.defined() ? h0 : zeros({s.B, H}, x2d.dtype(), x2d.device());
  Tensor c;
  if (cell == Cell::LSTM) c = c0.defined() ? c0 : zeros({s.B, H}, x2d.dtype(), x2d.device());
  InOps r;
  std::vector<Tensor> outs(static_cast<size_t>(s.T));
  if (keep) r.steps.resize(static_cast<size_t>(s.T));
  for (int64_t k = 0; k < s.T; ++k) {
    const int64_t t = s.at(k), bs = s.size[t];
    const Tensor hp = h.narrow(0, 0, bs), gxt = gx.narrow(0, s.offset[t], bs);
    const Tensor gh = linear(hp, w_hh, b_hh);
    const auto part = [&](const Tensor& m, int64_t i) { return m.narrow(1, i * H, H); };
    StepValues v;
    v.hp = hp;
    Tensor hn;
    if (cell == Cell::LSTM) {
      const Tensor pre = add(gxt, gh);
      v.cp = c.narrow(0, 0, bs);
      v.a0 = sigmoid(part(pre, 0)), v.a1 = sigmoid(part(pre, 1));
      v.a2 = tanh(part(pre, 2)), v.a3 = sigmoid(part(pre, 3));
      v.c = add(mul(v.a1, v.cp), mul(v.a0, v.a2));
      v.tc = tanh(v.c);
      hn = mul(v.a3, v.tc);
      c = with_rows(v.c, c);
    } else if (cell == Cell::GRU) {
      v.a0 = sigmoid(add(part(gxt, 0), part(gh, 0)));
      v.a1 = sigmoid(add(part(gxt, 1), part(gh, 1)));
      v.hn = part(gh, 2);
      v.a2 = tanh(add(part(gxt, 2), mul(v.a0, v.hn)));
      hn = add(v.a2, mul(v.a1, sub(hp, v.a2)));
    } else {
      const Tensor pre = add(gxt, gh);
      hn = v.a0 = cell == Cell::Tanh ? tanh(pre) : relu(pre);
    }
    outs[t] = hn;
    h = with_rows(hn, h);
    if (keep) r.steps[t] = v;
  }
  r.output = cat_rows(outs, H, x2d);
  r.h_n = h;
  r.c_n = c;
  return r;
}

// The backward through time in ops (Note [Packed steps]), from the step values of
// forward_in_ops; grads: output (N, H), h_n, c_n, each undefined for none. Returns dX (N, I),
// dh0, dc0, dW_ih, dW_hh, db_ih, db_hh (all computed; the caller drops what is not needed).
std::vector<Tensor> backward_in_ops(Cell cell, const Steps& s, const InOps& f, const Tensor& go,
                                    const Tensor& gh_n, const Tensor& gc_n, const Tensor& x2d,
                                    const Tensor& w_ih, const Tensor& w_hh) {
  const int64_t H = s.H, GH = gate_count(cell) * H;
  Tensor dh = gh_n.defined() ? gh_n : zeros({s.B, H}, x2d.dtype(), x2d.device());
  Tensor dc;
  if (cell == Cell::LSTM) dc = gc_n.defined() ? gc_n : zeros({s.B, H}, x2d.dtype(), x2d.device());
  std::vector<Tensor> dgi(static_cast<size_t>(s.T)), dgh(dgi.size()), hps(dgi.size());
  for (int64_t k = s.T - 1; k >= 0; --k) {
    const int64_t t = s.at(k), bs = s.size[t];
    const StepValues& v = f.steps[t];
    Tensor d = dh.narrow(0, 0, bs);
    if (go.defined()) d = add(go.narrow(0, s.offset[t], bs), d);
    const auto dsig = [](const Tensor& y) { return mul(y, rsub(y, 1.0)); };   // σ' = y (1 - y)
    const auto dtanh = [](const Tensor& y) { return rsub(mul(y, y), 1.0); };  // tanh' = 1 - y²
    Tensor direct;
    if (cell == Cell::LSTM) {
      const Tensor& tc = v.tc;
      const Tensor dct = add(dc.narrow(0, 0, bs), mul(mul(d, v.a3), dtanh(tc)));
      dgi[t] = dgh[t] = cat({mul(mul(dct, v.a2), dsig(v.a0)), mul(mul(dct, v.cp), dsig(v.a1)),
                             mul(mul(dct, v.a0), dtanh(v.a2)), mul(mul(d, tc), dsig(v.a3))},
                            1);
      dc = with_rows(mul(dct, v.a1), dc);
    } else if (cell == Cell::GRU) {
      const Tensor dpn = mul(mul(d, rsub(v.a1, 1.0)), dtanh(v.a2));
      const Tensor dpr = mul(mul(dpn, v.hn), dsig(v.a0));
      const Tensor dpz = mul(mul(d, sub(v.hp, v.a2)), dsig(v.a1));
      dgi[t] = cat({dpr, dpz, dpn}, 1);
      dgh[t] = cat({dpr, dpz, mul(dpn, v.a0)}, 1);
      direct = mul(d, v.a1);
    } else {
      dgi[t] = dgh[t] =
          cell == Cell::Tanh ? mul(d, dtanh(v.a0)) : mul(d, gt(v.a0, 0.0).to(v.a0.dtype()));
    }
    const Tensor dhp = matmul(dgh[t], w_hh);
    dh = with_rows(direct.defined() ? add(direct, dhp) : dhp, dh);
    hps[t] = v.hp;
  }
  const Tensor dGi = cat_rows(dgi, GH, x2d), dGh = cat_rows(dgh, GH, x2d);
  const Tensor hp = cat_rows(hps, H, x2d);
  return {matmul(dGi, w_ih),
          dh,
          dc,
          matmul(dGi.transpose(0, 1), x2d),
          matmul(dGh.transpose(0, 1), hp),
          sum(dGi, {0}),
          sum(dGh, {0})};
}

// The tangent recurrence of Note [Tangents through time]: the step values (per step, from
// forward_in_ops or the kernels' workspace), hprev (N, H) every row's state read, and the inputs'
// tangents t (x, h0, c0, w_ih, w_hh, b_ih, b_hh; undefined: zero). Returns the tangents of
// output (N, H), h_n and c_n (LSTM; else undefined).
std::vector<Tensor> tangent_in_ops(Cell cell, const Steps& s, const std::vector<StepValues>& steps,
                                   const Tensor& hprev, const Tensor& x2d, const Tensor& w_ih,
                                   const Tensor& w_hh, const std::vector<Tensor>& t) {
  const int64_t H = s.H, GH = gate_count(cell) * H;
  const Shape rows_shape{s.N, GH};
  // every step's input side at once: dX W_ihᵀ + X dW_ihᵀ + db_ih, and the hidden side's terms
  // that do not carry through time: H_prev dW_hhᵀ + db_hh
  Tensor agx, agh;
  if (t[0].defined()) agx = matmul(t[0].reshape({s.N, s.I}), w_ih.transpose(0, 1));
  if (t[3].defined()) agx = fwd::add_tangents(agx, matmul(x2d, t[3].transpose(0, 1)));
  if (t[5].defined()) agx = fwd::add_tangents(agx, fwd::broadcast_tangent(t[5], rows_shape));
  if (t[4].defined()) agh = matmul(hprev, t[4].transpose(0, 1));
  if (t[6].defined()) agh = fwd::add_tangents(agh, fwd::broadcast_tangent(t[6], rows_shape));
  if (cell != Cell::GRU) agx = fwd::add_tangents(agx, agh), agh = Tensor();
  const auto state = [&](const Tensor& d) {
    return d.defined() ? d : zeros({s.B, H}, x2d.dtype(), x2d.device());
  };
  Tensor dh = state(t[1]), dc = cell == Cell::LSTM ? state(t[2]) : Tensor();
  const Tensor whh_t = w_hh.transpose(0, 1);
  const auto part = [&](const Tensor& m, int64_t i) { return m.narrow(1, i * H, H); };
  const auto dsig = [](const Tensor& y) { return mul(y, rsub(y, 1.0)); };   // σ' = y (1 - y)
  const auto dtanh = [](const Tensor& y) { return rsub(mul(y, y), 1.0); };  // tanh' = 1 - y²
  std::vector<Tensor> outs(static_cast<size_t>(s.T));
  for (int64_t k = 0; k < s.T; ++k) {
    const int64_t step = s.at(k), bs = s.size[step], off = s.offset[step];
    const StepValues& v = steps[step];
    const Tensor dhp = dh.narrow(0, 0, bs);
    Tensor dgh = matmul(dhp, whh_t);  // (bs, G·H): the hidden product's tangent
    if (agh.defined()) dgh = add(dgh, agh.narrow(0, off, bs));
    const Tensor dgi = agx.defined() ? agx.narrow(0, off, bs) : Tensor();
    Tensor dhn;
    if (cell == Cell::LSTM) {
      const Tensor dpre = dgi.defined() ? add(dgi, dgh) : dgh;
      const Tensor di = mul(part(dpre, 0), dsig(v.a0)), df = mul(part(dpre, 1), dsig(v.a1));
      const Tensor dg = mul(part(dpre, 2), dtanh(v.a2)), dout = mul(part(dpre, 3), dsig(v.a3));
      const Tensor dcn = add(add(mul(df, v.cp), mul(v.a1, dc.narrow(0, 0, bs))),
                             add(mul(di, v.a2), mul(v.a0, dg)));
      dhn = add(mul(dout, v.tc), mul(mul(v.a3, dtanh(v.tc)), dcn));
      dc = with_rows(dcn, dc);
    } else if (cell == Cell::GRU) {
      const auto gate = [&](int64_t i) {
        return dgi.defined() ? add(part(dgi, i), part(dgh, i)) : part(dgh, i);
      };
      const Tensor dr = mul(gate(0), dsig(v.a0)), dz = mul(gate(1), dsig(v.a1));
      Tensor npre = add(mul(dr, v.hn), mul(v.a0, part(dgh, 2)));
      if (dgi.defined()) npre = add(part(dgi, 2), npre);
      const Tensor dn = mul(npre, dtanh(v.a2));
      dhn = add(add(dn, mul(dz, sub(v.hp, v.a2))), mul(v.a1, sub(dhp, dn)));
    } else {
      const Tensor dpre = dgi.defined() ? add(dgi, dgh) : dgh;
      dhn = cell == Cell::Tanh ? mul(dpre, dtanh(v.a0)) : mul(dpre, gt(v.a0, 0.0).to(v.a0.dtype()));
    }
    outs[step] = dhn;
    dh = with_rows(dhn, dh);
  }
  return {cat_rows(outs, H, x2d), dh, dc};
}

// The layer's backward through time (gates_backward per step; see there for the derivatives).
// Inputs x, h0, c0, w_ih, w_hh, b_ih, b_hh; outputs output, h_n, c_n. Saves the inputs (for the
// backward in ops) and the workspace.
struct RNNLayerBackward final : Node {
  RNNLayerBackward(Cell cell, Steps steps, const std::vector<Tensor>& in, const Workspace& ws)
      : cell_(cell), s_(std::move(steps)) {
    for (size_t i = 0; i < 7; ++i) save(in_[i], in[i]);
    save(x_, ws.x), save(hprev_, ws.hprev), save(cprev_, ws.cprev);
    save(act_, ws.act), save(aux_, ws.aux);
  }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    const Tensor go = grads[0].defined() ? grads[0].reshape({s_.N, s_.H}) : Tensor();
    std::vector<Tensor> out =
        is_grad_enabled() ? in_ops(go, grads[1], grads[2]) : kernels(go, grads[1], grads[2]);
    for (size_t i = 0; i < out.size(); ++i)
      if (!needs_grad(i)) out[i] = Tensor();
    if (out[0].defined()) out[0] = out[0].reshape(input_shapes[0]);
    return out;
  }
  bool differentiable_backward() const override { return true; }
  // Forward: the tangent recurrence through time (Note [Tangents through time])
  std::vector<Tensor> jvp(const std::vector<Tensor>& in, const std::vector<Tensor>& t,
                          const std::vector<Tensor>& out) override {
    const Tensor x2d = in[0].reshape({s_.N, s_.I});
    std::vector<StepValues> steps(static_cast<size_t>(s_.T));
    Tensor hprev;
    if (detail::t_fw_visible == 0 && !any_requires_grad(in)) {
      // the values are constants here: the kernels' workspace, read as views
      const Tensor act = act_.get(), aux = aux_.get();
      const int64_t H = s_.H, GH = gate_count(cell_) * H;
      hprev = hprev_.get();
      for (int64_t step = 0; step < s_.T; ++step) {
        const int64_t bs = s_.size[step], off = s_.offset[step];
        StepValues& v = steps[step];
        const Tensor a = rows(act, off, bs);
        v.hp = rows(hprev, off, bs);
        v.a0 = a.narrow(1, 0, H);
        if (GH > H) v.a1 = a.narrow(1, H, H), v.a2 = a.narrow(1, 2 * H, H);
        if (cell_ == Cell::LSTM) {
          v.a3 = a.narrow(1, 3 * H, H);
          v.cp = rows(cprev_.get(), off, bs);
          v.tc = rows(aux, off, bs);
        }
        if (cell_ == Cell::GRU) v.hn = rows(aux, off, bs);
      }
    } else {
      // the values in ops of the inputs, which carry the outer levels' tangents and record
      const InOps f =
          forward_in_ops(cell_, s_, x2d, in[1], in[2], in[3], in[4], in[5], in[6], true);
      std::vector<Tensor> hps;
      for (const StepValues& v : f.steps) hps.push_back(v.hp);
      hprev = cat_rows(hps, s_.H, x2d);
      steps = f.steps;
    }
    std::vector<Tensor> d = tangent_in_ops(cell_, s_, steps, hprev, x2d, in[3], in[4], t);
    d[0] = d[0].reshape(out[0].shape());
    return d;
  }

 private:
  std::vector<Tensor> in_ops(const Tensor& go, const Tensor& gh_n, const Tensor& gc_n) {
    const Tensor x = in_[0].get(), x2d = x.reshape({s_.N, s_.I});
    const Tensor w_ih = in_[3].get(), w_hh = in_[4].get();
    const InOps f = forward_in_ops(cell_, s_, x2d, in_[1].get(), in_[2].get(), w_ih, w_hh,
                                   in_[5].get(), in_[6].get(), true);
    std::vector<Tensor> d = backward_in_ops(cell_, s_, f, go, gh_n, gc_n, x2d, w_ih, w_hh);
    return {d[0], d[1], d[2], d[3], d[4], d[5], d[6]};
  }

  std::vector<Tensor> kernels(const Tensor& go_in, const Tensor& gh_n, const Tensor& gc_n) {
    const Tensor x = x_.get(), act = act_.get(), aux = aux_.get();
    const Tensor hprev = hprev_.get(), cprev = cprev_.get(), w_ih = in_[3].get();
    const Tensor w_hh = in_[4].get();
    const int64_t H = s_.H, GH = gate_count(cell_) * H;
    const DType dtype = x.dtype();
    const Tensor go = go_in.defined() ? go_in.contiguous() : zeros({s_.N, s_.H}, dtype);
    Tensor ch = gh_n.defined() ? gh_n.contiguous().clone() : zeros({s_.B, H}, dtype);
    Tensor cc;
    if (cell_ == Cell::LSTM)
      cc = gc_n.defined() ? gc_n.contiguous().clone() : zeros({s_.B, H}, dtype);
    Tensor dgi = empty({s_.N, GH}, dtype);
    Tensor dgh = cell_ == Cell::GRU ? empty({s_.N, GH}, dtype) : dgi;
    dispatch_float(dtype, op(), [&]<class T>() {
      for (int64_t k = s_.T - 1; k >= 0; --k) {
        const int64_t t = s_.at(k), bs = s_.size[t], off = s_.offset[t];
        const T* pgo = go.data<T>() + off * H;
        const T* paux = aux.defined() ? aux.data<T>() + off * H : nullptr;
        const T* pcp = cprev.defined() ? cprev.data<T>() + off * H : nullptr;
        parallel_for(
            bs,
            [&](int64_t begin, int64_t end) {
              with_cell(cell_, [&]<Cell C>() {
                gates_backward<C, T>(H, begin, end, pgo, act.data<T>() + off * GH, paux,
                                     hprev.data<T>() + off * H, pcp, ch.data<T>(),
                                     cc.defined() ? cc.data<T>() : nullptr,
                                     dgi.data<T>() + off * GH, dgh.data<T>() + off * GH);
              });
            },
            row_grain(GH * 8));
        // dh ← dh + dpre W_hh  (the state read: (bs, G·H) · (G·H, H))
        product(rows(dgh, off, bs), w_hh, rows(ch, 0, bs), cell_ == Cell::GRU ? 1.0 : 0.0);
      }
    });
    std::vector<Tensor> out(7);
    if (needs_grad(0)) {  // dX = dGi W_ih
      out[0] = empty({s_.N, s_.I}, dtype);
      product(dgi, w_ih, out[0]);
    }
    out[1] = ch;
    out[2] = cc;
    if (needs_grad(3)) {  // dW_ih = dGiᵀ X
      out[3] = empty({GH, s_.I}, dtype);
      product(dgi.transpose(0, 1), x, out[3]);
    }
    if (needs_grad(4)) {  // dW_hh = Σ_t dGh_tᵀ h_{t-1}
      out[4] = empty({GH, H}, dtype);
      product(dgh.transpose(0, 1), hprev, out[4]);
    }
    if (needs_grad(5)) out[5] = sum(dgi, {0});
    if (needs_grad(6)) {
      // The LSTM's and RNN's dGh is dGi, and the GRU's differs from it in its n part alone
      // (gates_backward): their sums are shared.
      if (!out[5].defined())
        out[6] = sum(dgh, {0});
      else if (cell_ != Cell::GRU)
        out[6] = out[5].clone();
      else
        out[6] = cat({out[5].narrow(0, 0, 2 * H), sum(dgh.narrow(1, 2 * H, H), {0})}, 0);
    }
    return out;
  }

  Cell cell_;
  Steps s_;
  SavedTensor in_[7];                          // the op's inputs
  SavedTensor x_, hprev_, cprev_, act_, aux_;  // the kernel's data
};

RNNLayerResult run_layer(Cell cell, const Tensor& x, const Tensor& h0, const Tensor& c0,
                         const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                         const Tensor& b_hh, const std::vector<int64_t>& batch_sizes,
                         bool reverse) {
  const std::string_view op = op_of(cell);
  profile::Scope scope(op);
  Steps s = check_layer(cell, x, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_sizes, reverse);
  const auto shaped = [&](const Tensor& out) {
    return s.packed ? out : out.reshape({s.T, s.B, s.H});
  };
  if (!x.device().is_cpu()) {
    const InOps r =
        forward_in_ops(cell, s, x.reshape({s.N, s.I}), h0, c0, w_ih, w_hh, b_ih, b_hh, false);
    return {shaped(r.output), r.h_n, r.c_n};
  }
  Workspace ws;
  Tensor x2d;
  {
    NoGradGuard no_grad;
    x2d = x.reshape({s.N, s.I});
  }
  RNNLayerResult r = forward_cpu(cell, s, x2d, h0, c0, w_ih, w_hh, b_ih, b_hh, ws);
  {
    NoGradGuard no_grad;
    r.output = shaped(r.output);
  }
  record<RNNLayerBackward>(op, {&r.output, &r.h_n, &r.c_n}, {x, h0, c0, w_ih, w_hh, b_ih, b_hh},
                           cell, std::move(s),
                           std::vector<Tensor>{x, h0, c0, w_ih, w_hh, b_ih, b_hh}, ws);
  return r;
}

}  // namespace

RNNLayerResult lstm_layer(const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                          const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh,
                          const std::vector<int64_t>& batch_sizes, bool reverse) {
  return run_layer(Cell::LSTM, x, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_sizes, reverse);
}

RNNLayerResult gru_layer(const Tensor& x, const Tensor& h0, const Tensor& w_ih, const Tensor& w_hh,
                         const Tensor& b_ih, const Tensor& b_hh,
                         const std::vector<int64_t>& batch_sizes, bool reverse) {
  return run_layer(Cell::GRU, x, h0, {}, w_ih, w_hh, b_ih, b_hh, batch_sizes, reverse);
}

RNNLayerResult rnn_layer(const Tensor& x, const Tensor& h0, const Tensor& w_ih, const Tensor& w_hh,
                         const Tensor& b_ih, const Tensor& b_hh, std::string_view nonlinearity,
                         const std::vector<int64_t>& batch_sizes, bool reverse) {
  EMBER_CHECK(nonlinearity == "tanh" || nonlinearity == "relu",
              "rnn_layer: nonlinearity must be \"tanh\" or \"relu\", got \"{}\"", nonlinearity);
  return run_layer(nonlinearity == "tanh" ? Cell::Tanh : Cell::Relu, x, h0, {}, w_ih, w_hh, b_ih,
                   b_hh, batch_sizes, reverse);
}

}  // namespace ember
