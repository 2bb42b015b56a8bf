// Op tests from one table, as PyTorch's OpInfo or tinygrad's helper_test_op. Each test_<family>.cpp
// holds an `OpTable`; one row per op case drives
//   - gradcheck in Float64 on three layouts (contiguous leaves, transposed views with dims 0 and -1
//     swapped, narrowed views of wider leaves) and, with several inputs, the first one transposed
//     and the others contiguous; then with each floating input alone needing grad;
//   - forward mode (check_forward_gradients): the Jacobian's columns by dual passes against the
//     finite differences and the backward, on the same layouts;
//   - gradgradcheck (check_gradgradients) on the same layouts, and the first derivatives under
//     create_graph against the fused kernels' (check_create_graph_gradients);
//   - the PyTorch golden comparison (tests/golden/op_tables.json): the value in Float64 (tight)
//     and Float32 (loose), and the Float64 input gradients for a saved upstream gradient;
//   - edge cases every op must pass: an undefined Tensor() as any input throws an ember::Error
//     naming the op; the same values from non-contiguous copies of the inputs; the output
//     requires grad exactly when it should; the inputs are left unchanged; the graph is freed;
//   - edge shapes (tests/edge_shapes.h, check_edge_shapes): each input dim made 0, all dims 1,
//     on every layout, against PyTorch's result or its error;
//   - anomaly mode (check_anomaly): a NaN input whose result is not finite throws.
//
// Adding a row (the op itself lives in ops/) to the family's `const OpTable k…Ops = {…};`:
//     {"gelu", "F.gelu(a)", {{3, 4}}, {}, [](auto& v) { return gelu(v[0]); }},
//   name     "<op> <variant…>", unique over all tables and the row's key in op_tables.json. An
//            undefined input's error message must start with "<op>:" for an op among the
//            name's words: a row applying several ops names them ("transpose then reshape").
//   torch    the same computation in PyTorch over the inputs a, b, c, … (torch, F =
//            torch.nn.functional); one string literal.
//   shapes   one per input; {} is 0-d.
//   domains  one per input, missing trailing ones Real: Real (randn), Positive (uniform in
//            [0.5, 1.5)), Integer (integers in [-3, 3] as Float64: ties for comparisons),
//            Bool (a random mask; never needs grad).
//   f        the Ember computation over const std::vector<Tensor>&.
//   flags    optional: kNoGrad for results without a gradient (comparisons, argmax, indices);
//            kNoGradcheck where finite differences drown (values like -1e9): golden gradients
//            only; kOptionalInputs where the inputs after the first may be undefined (an
//            optional weight or bias); kBugUndefined skips the undefined-input check for a
//            known library bug (say which in a comment); kEdgeDiffers skips the edge shapes of
//            tests/edge_shapes.h (say why); kDeviceTieOrder where ties come out in another
//            order on a device.
// Then regenerate the golden values: /usr/bin/python3 tests/golden/gen_op_tables.py. It parses
// the rows of every OpTable in tests/test_*.cpp with a regex, so keep the first four fields
// literal; a test fails naming the row when op_tables.json is missing it or predates a change.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tests/helpers.h"

namespace ember::testing {

enum class Domain { Real, Positive, Integer, Bool };
using enum Domain;

enum Flags : unsigned {
  kNoGrad = 1u << 0,          // no gradient: no gradcheck, no golden gradients
  kNoGradcheck = 1u << 1,     // finite differences meaningless (huge values): golden gradients only
  kBugUndefined = 1u << 2,    // known library bug: an undefined input crashes instead of throwing
  kOptionalInputs = 1u << 3,  // inputs after the first may be undefined (weight, bias: none)
  kEdgeDiffers = 1u << 4,     // skips the edge shapes of tests/edge_shapes.h (say why)
  // Ties come out in another order on a device (topk: a stable sort there, torch's CPU order
  // here): the device check compares a floating result's values but not its gradient (it goes
  // to other tied positions), and an index result not at all (it still runs there).
  kDeviceTieOrder = 1u << 5,
};

struct OpCase {
  std::string name;
  std::string torch;
  std::vector<Shape> shapes;
  std::vector<Domain> domains;
  Fn f;
  unsigned flags = 0;

  Domain domain(size_t i) const { return i < domains.size() ? domains[i] : Real; }
  bool differentiable() const { return !(flags & kNoGrad); }
};
using OpTable = std::vector<OpCase>;

// The device of the row being run: the CPU, or the CUDA device while device_row runs the row
// there. A row's constants (index tensors, targets, masks) go on it with on_row_device, as a
// script's would go on its model's device.
inline Device& row_device() {
  static Device device = kCPU;
  return device;
}
inline Tensor on_row_device(const Tensor& t) { return t.to(row_device()); }

// row_device() set for one scope, back to the CPU however the scope ends.
class RowOnDevice {
 public:
  explicit RowOnDevice(const Device& device) { row_device() = device; }
  ~RowOnDevice() { row_device() = kCPU; }
  RowOnDevice(const RowOnDevice&) = delete;
  RowOnDevice& operator=(const RowOnDevice&) = delete;
};

namespace detail {

// Names as the rows spell them (and gen_op_tables.py reads them).
inline std::string_view domain_name(Domain d) {
  constexpr std::string_view names[] = {"Real", "Positive", "Integer", "Bool"};
  return names[static_cast<int>(d)];
}

// The row as gen_op_tables.py prints it: a golden entry made from another row is stale.
inline std::string signature(const OpCase& c) {
  std::vector<std::string_view> domains;
  for (size_t i = 0; i < c.shapes.size(); ++i) domains.push_back(domain_name(c.domain(i)));
  return fmt::format("{}; shapes {}; domains [{}]", c.torch, c.shapes, fmt::join(domains, ", "));
}

// A per-row seed (FNV-1a of the name): adding a row leaves the others' inputs alone.
inline uint64_t seed_of(const std::string& name) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// A Float64 input of `domain` (Bool for masks); floating ones are leaves requiring grad.
inline Tensor make_input(const Shape& shape, Domain domain) {
  switch (domain) {
    case Real:
      return randn(shape, kFloat64).requires_grad_();
    case Positive:
      return (rand(shape, kFloat64) + 0.5).requires_grad_();
    case Integer:
      return randint(-3, 4, shape).to(kFloat64).requires_grad_();
    case Bool:
      return rand(shape, kFloat64) > 0.5;
  }
  return {};
}

// Mixed: the first input transposed, the others contiguous (rows with several inputs).
enum class Layout { Contiguous, Transposed, Narrowed, Mixed };

inline std::vector<Layout> layouts(const OpCase& c) {
  if (c.shapes.size() < 2) return {Layout::Contiguous, Layout::Transposed, Layout::Narrowed};
  return {Layout::Contiguous, Layout::Transposed, Layout::Narrowed, Layout::Mixed};
}

inline std::string_view layout_name(Layout layout) {
  constexpr std::string_view names[] = {"contiguous", "transposed", "narrowed",
                                        "first input transposed"};
  return names[static_cast<int>(layout)];
}

// The layout of input i.
inline Layout of_input(Layout layout, size_t i) {
  if (layout != Layout::Mixed) return layout;
  return i == 0 ? Layout::Transposed : Layout::Contiguous;
}

// The leaf shape whose `view` has `shape`: dims 0 and -1 swapped, or the last dim 2 wider.
inline Shape leaf_shape(Shape shape, Layout layout) {
  if (layout == Layout::Transposed && shape.size() >= 2) std::swap(shape.front(), shape.back());
  if (layout == Layout::Narrowed && !shape.empty()) shape.back() += 2;
  return shape;
}
inline Tensor view(const Tensor& leaf, Layout layout) {
  if (layout == Layout::Transposed && leaf.dim() >= 2) return leaf.transpose(0, -1);
  if (layout == Layout::Narrowed && leaf.dim() >= 1) return leaf.narrow(-1, 1, leaf.size(-1) - 2);
  return leaf;
}

// The values of x in a non-contiguous tensor of `layout` (a copy, not a view of x).
inline Tensor relayout(const Tensor& x, Layout layout) {
  Tensor leaf = zeros(leaf_shape(x.shape(), layout), x.dtype());
  Tensor v = view(leaf, layout);
  v.copy_(x);
  return v;
}

inline bool is_floating_input(const Tensor& t) { return is_floating(t.dtype()); }

// The row's leaves for `layout` and its function of them, which takes the views first.
struct LaidOut {
  std::vector<Tensor> leaves;
  Fn through_views;
};
inline LaidOut lay_out(const OpCase& c, Layout layout) {
  LaidOut out;
  for (size_t i = 0; i < c.shapes.size(); ++i)
    out.leaves.push_back(make_input(leaf_shape(c.shapes[i], of_input(layout, i)), c.domain(i)));
  out.through_views = [&c, layout](const std::vector<Tensor>& in) {
    std::vector<Tensor> views;
    for (size_t i = 0; i < in.size(); ++i) views.push_back(view(in[i], of_input(layout, i)));
    return c.f(views);
  };
  return out;
}

// gradcheck of one row on its layouts, then (several floating inputs) with one input at a
// time needing grad.
inline void gradcheck_row(const OpCase& c) {
  manual_seed(seed_of(c.name));
  for (Layout layout : layouts(c)) {
    const LaidOut row = lay_out(c, layout);
    check_gradient(row.through_views, row.leaves,
                   fmt::format("{} ({})", c.name, layout_name(layout)));
  }
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < c.shapes.size(); ++i)
    inputs.push_back(make_input(c.shapes[i], c.domain(i)));
  if (std::count_if(inputs.begin(), inputs.end(), is_floating_input) < 2) return;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!is_floating_input(inputs[k])) continue;
    std::vector<Tensor> one = inputs;
    for (size_t i = 0; i < one.size(); ++i)
      if (i != k) one[i] = inputs[i].detach();
    check_gradient(c.f, one, fmt::format("{} (grad of input {} only)", c.name, k));
  }
}

// Forward mode on one row's layouts: gradcheck with check_forward_ad, each input's Jacobian
// columns by dual passes against the finite differences and against the backward.
inline void forward_row(const OpCase& c) {
  manual_seed(seed_of(c.name) + 5);
  GradcheckOptions options;
  options.check_forward_ad = true;
  for (Layout layout : layouts(c)) {
    const LaidOut row = lay_out(c, layout);
    const GradcheckResult r = gradcheck(row.through_views, row.leaves, options);
    BOOST_TEST(r.ok, fmt::format("{} ({}) forward mode: ", c.name, layout_name(layout))
                         << r.message);
  }
}

// gradgradcheck of one row on the layouts gradcheck_row uses: the backward recorded under
// create_graph differentiated again, against finite differences of the first derivatives.
inline void gradgradcheck_row(const OpCase& c) {
  manual_seed(seed_of(c.name) + 3);
  for (Layout layout : layouts(c)) {
    const LaidOut row = lay_out(c, layout);
    const GradcheckResult r = gradgradcheck(row.through_views, row.leaves);
    BOOST_TEST(r.ok, fmt::format("{} ({}): ", c.name, layout_name(layout)) << r.message);
  }
}

// The first derivatives under create_graph (the backward written in ops) against the fused
// first-order kernels', on the row's layouts: gradgradcheck alone would pass a backward in ops
// whose first derivative were wrong but consistently so.
inline void create_graph_row(const OpCase& c) {
  manual_seed(seed_of(c.name) + 5);
  for (Layout layout : layouts(c)) {
    const LaidOut row = lay_out(c, layout);
    std::vector<Tensor> wrt;
    for (const Tensor& t : row.leaves)
      if (t.requires_grad()) wrt.push_back(t);
    const Tensor up = randn(row.through_views(row.leaves).shape(), kFloat64);
    const auto grads = [&](bool create_graph) {
      return autograd::grad({row.through_views(row.leaves)}, wrt, {up}, std::nullopt, create_graph,
                            true);
    };
    const std::vector<Tensor> first = grads(false), in_ops = grads(true);
    for (size_t i = 0; i < wrt.size(); ++i) {
      BOOST_TEST(in_ops[i].defined() == first[i].defined());
      if (first[i].defined())
        expect_close(in_ops[i], first[i], 1e-10, 1e-12,
                     fmt::format("{}, input {}", layout_name(layout), i));
    }
  }
}

// One row against PyTorch: values in Float64 and Float32, gradients in Float64.
inline void golden_row(const Golden& g, const OpCase& c) {
  const std::string regenerate = "run /usr/bin/python3 tests/golden/gen_op_tables.py";
  if (!g.contains(c.name + ".row") || g.text(c.name + ".row") != signature(c)) {
    BOOST_ERROR("op_tables.json lacks this row or predates a change to it: " << regenerate);
    return;
  }
  std::vector<Tensor> in64, in32;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    Tensor x = g[fmt::format("{}.in{}", c.name, i)];
    in64.push_back(is_floating_input(x) ? x.requires_grad_(c.differentiable()) : x);
    in32.push_back(is_floating_input(x) ? x.detach().to(kFloat32) : x);
  }
  const Tensor expected = g[c.name + ".out"];
  const Tensor out64 = c.f(in64), out32 = c.f(in32);
  if (!is_floating(expected.dtype())) {  // Bool and Int64 results agree exactly
    for (const Tensor& out : {out64, out32}) {
      BOOST_TEST((out.dtype() == expected.dtype()), "dtype " << out.dtype());
      BOOST_TEST((out.shape() == expected.shape()), "shape " << fmt::format("{}", out.shape()));
      BOOST_TEST((out.to_vector<int64_t>() == expected.to_vector<int64_t>()), "values");
    }
    return;
  }
  BOOST_TEST((out64.dtype() == kFloat64));
  BOOST_TEST((out32.dtype() == kFloat32));
  expect_close(out64, expected, 1e-12, 1e-12, c.name + " (Float64)");
  expect_close(out32, expected, 1e-5, 1e-5, c.name + " (Float32)");
  if (!c.differentiable()) return;
  out64.backward(g[c.name + ".gy"]);
  for (size_t i = 0; i < in64.size(); ++i) {
    const std::string key = fmt::format("{}.g{}", c.name, i);
    if (!g.contains(key)) continue;  // Bool inputs have no gradient
    BOOST_TEST_REQUIRE(in64[i].grad().defined(), "input " << i << " got no gradient");
    expect_close(in64[i].grad(), g[key], 1e-10, 1e-12, fmt::format("{} grad {}", c.name, i));
  }
}

// f throws an ember::Error "<op>: … undefined …" for an op among the words of the row's name.
template <class F>
void expect_undefined_error(const OpCase& c, F f, size_t input) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what(), op = msg.substr(0, msg.find(':'));
    const std::string words = " " + c.name + " ";
    BOOST_TEST((words.find(" " + op + " ") != std::string::npos &&
                msg.find("undefined") != std::string::npos),
               "undefined input " << input << ": message '" << msg
                                  << "' does not start with an op of the row's name");
    return;
  }
  BOOST_ERROR("undefined input " << input << ": no ember::Error");
}

// The checks one row must pass whatever its op computes.
inline void edge_cases_row(const OpCase& c) {
  manual_seed(seed_of(c.name) + 1);
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < c.shapes.size(); ++i)
    inputs.push_back(make_input(c.shapes[i], c.domain(i)));

  // An undefined input: an ember::Error naming the op.
  const size_t required = c.flags & kOptionalInputs ? 1 : inputs.size();
  if (!(c.flags & kBugUndefined))
    for (size_t i = 0; i < required; ++i) {
      std::vector<Tensor> with_hole = inputs;
      with_hole[i] = Tensor();
      expect_undefined_error(
          c, [&] { c.f(with_hole); }, i);
    }

  // The output requires grad when (and only when) a gradient flows; never under NoGradGuard.
  std::vector<Tensor> before;
  for (const Tensor& x : inputs) before.push_back(x.detach().clone());
  const Tensor out = c.f(inputs);
  BOOST_TEST(out.requires_grad() == c.differentiable(), "output requires_grad");
  {
    NoGradGuard no_grad;
    BOOST_TEST(!c.f(inputs).requires_grad(), "output requires_grad under NoGradGuard");
  }
  // The op leaves its inputs alone.
  for (size_t i = 0; i < inputs.size(); ++i)
    expect_close(inputs[i].detach(), before[i], 0, 0, fmt::format("input {} unchanged", i));

  // The same values from non-contiguous copies of the inputs.
  for (Layout layout : layouts(c)) {
    if (layout == Layout::Contiguous) continue;
    std::vector<Tensor> strided;
    for (size_t i = 0; i < before.size(); ++i)
      strided.push_back(relayout(before[i], of_input(layout, i)));
    expect_close(c.f(strided), out.detach(), 1e-12, 1e-12,
                 fmt::format("{} inputs", layout_name(layout)));
  }
}

// Runs check(c) for every row that `wanted`, in the row's context; an exception fails that row
// only, so one broken row does not hide the others.
template <class Wanted, class Check>
void for_rows(const OpTable& table, Wanted wanted, Check check) {
  for (const OpCase& c : table) {
    if (!wanted(c)) continue;
    BOOST_TEST_CONTEXT(c.name) {
      try {
        check(c);
      } catch (const std::exception& e) {
        BOOST_ERROR("threw " << e.what());
      }
    }
  }
}

// set_detect_anomaly(on) for one scope, off again however the scope ends.
class AnomalyMode {
 public:
  AnomalyMode() { set_detect_anomaly(true); }
  ~AnomalyMode() { set_detect_anomaly(false); }
  AnomalyMode(const AnomalyMode&) = delete;
  AnomalyMode& operator=(const AnomalyMode&) = delete;
};

// Anomaly mode checks every op's forward output (graph/autograd.h, check_forward_finite): with a
// NaN in the first floating input, a row whose result holds a NaN or an Inf must throw, since at
// least its last op made a non-finite output; an op that skipped the check would let it through.
inline void anomaly_row(const OpCase& c) {
  manual_seed(seed_of(c.name) + 2);
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < c.shapes.size(); ++i)
    inputs.push_back(make_input(c.shapes[i], c.domain(i)));
  const auto first = std::find_if(inputs.begin(), inputs.end(), [](const Tensor& t) {
    return is_floating_input(t) && t.numel() > 0;
  });
  if (first == inputs.end()) return;
  Tensor poisoned = first->detach().clone();
  poisoned.data<double>()[0] = std::numeric_limits<double>::quiet_NaN();
  *first = poisoned.requires_grad_();
  const Tensor out = c.f(inputs);
  if (!is_floating(out.dtype())) return;
  const std::vector<double> values = out.to_vector<double>();
  if (std::all_of(values.begin(), values.end(), [](double v) { return std::isfinite(v); })) return;
  AnomalyMode anomaly;
  try {
    c.f(inputs);
  } catch (const Error& e) {
    const std::string msg = e.what();
    BOOST_TEST((msg.find("NaN/Inf") != std::string::npos &&
                msg.find("anomaly detection") != std::string::npos),
               "message '" << msg << "'");
    return;
  }
  BOOST_ERROR("a NaN in input " << (first - inputs.begin())
                                << " made a non-finite result, but anomaly mode did not throw");
}

// A row on the CUDA device against the CPU, on each layout gradcheck uses (the device's leaves
// hold the CPU leaves' values, its views their strides): the value in Float64 and Float32, and
// in Float64 the input gradients for one upstream gradient, every result on the device.
inline void device_row(const OpCase& c) {
  manual_seed(seed_of(c.name) + 5);
  for (Layout layout : layouts(c)) {
    const LaidOut row = lay_out(c, layout);
    BOOST_TEST_CONTEXT(layout_name(layout)) {
      for (DType dtype : {kFloat64, kFloat32}) {
        std::vector<Tensor> host, device;
        for (const Tensor& leaf : row.leaves) {
          const bool grad = leaf.requires_grad() && dtype == kFloat64;
          Tensor h = leaf.detach().to(is_floating(leaf.dtype()) ? dtype : leaf.dtype());
          Tensor d = h.to(kCUDA);
          host.push_back(grad ? h.requires_grad_() : h);
          device.push_back(grad ? d.requires_grad_() : d);
        }
        const Tensor want = row.through_views(host);
        const Tensor got = [&] {
          RowOnDevice on(kCUDA);
          return row.through_views(device);
        }();
        BOOST_TEST_REQUIRE(got.is_cuda(), "the result is on " << got.device());
        BOOST_TEST((got.dtype() == want.dtype()),
                   fmt::format("{} vs {}", got.dtype(), want.dtype()));
        const bool f64 = dtype == kFloat64, ties = c.flags & kDeviceTieOrder;
        if (!ties || is_floating(want.dtype()))
          expect_close(got.cpu(), want, f64 ? 1e-10 : 1e-5, f64 ? 1e-12 : 1e-6,
                       fmt::format("value in {}", dtype));
        if (!f64 || ties || !c.differentiable() || !want.requires_grad()) continue;
        const Tensor up = randn(want.shape(), want.dtype());
        want.backward(up);
        got.backward(up.to(kCUDA));
        for (size_t i = 0; i < host.size(); ++i) {
          if (!host[i].requires_grad()) continue;
          BOOST_TEST_REQUIRE(device[i].grad().defined(), "input " << i << " has no gradient");
          BOOST_TEST(device[i].grad().is_cuda(),
                     "input " << i << "'s gradient is on " << device[i].grad().device());
          expect_close(device[i].grad().cpu(), host[i].grad(), 1e-10, 1e-12,
                       fmt::format("gradient of input {}", i));
        }
        // and gradcheck on the device, its finite differences taken there (the contiguous layout;
        // rows gradcheck leaves out are left out here too)
        if (layout != Layout::Contiguous || (c.flags & kNoGradcheck)) continue;
        check_gradient(
            [&](const std::vector<Tensor>& in) {
              RowOnDevice on(kCUDA);
              return row.through_views(in);
            },
            device, fmt::format("{} gradcheck on the device", c.name));
      }
    }
  }
}

}  // namespace detail

// Every row of `table` on the CUDA device against the CPU (detail::device_row); one line and
// nothing else where no device is usable (Note [Host emulation of a GPU] in
// graph/device_backend.h: the emulated one runs them on any machine).
inline void check_on_device(const OpTable& table) {
  if (!cuda::is_available()) {
    BOOST_TEST_MESSAGE("skipped: no CUDA device (" << cuda::unavailable_reason() << ")");
    return;
  }
  detail::for_rows(
      table, [](const OpCase&) { return true; }, detail::device_row);
}

// The three drivers a family's test file calls on its table.
inline void check_gradients(const OpTable& table) {
  detail::for_rows(
      table, [](const OpCase& c) { return c.differentiable() && !(c.flags & kNoGradcheck); },
      detail::gradcheck_row);
}

// Second derivatives of every row gradcheck checks (detail::gradgradcheck_row).
inline void check_gradgradients(const OpTable& table) {
  detail::for_rows(
      table, [](const OpCase& c) { return c.differentiable() && !(c.flags & kNoGradcheck); },
      detail::gradgradcheck_row);
}

// Forward-mode rules of every row gradcheck checks (detail::forward_row; Note [Forward grads] in
// graph/forward_ad.h).
inline void check_forward_gradients(const OpTable& table) {
  detail::for_rows(
      table, [](const OpCase& c) { return c.differentiable() && !(c.flags & kNoGradcheck); },
      detail::forward_row);
}

// The create_graph gradients of every row gradcheck checks equal the fused kernels'
// (detail::create_graph_row).
inline void check_create_graph_gradients(const OpTable& table) {
  detail::for_rows(
      table, [](const OpCase& c) { return c.differentiable() && !(c.flags & kNoGradcheck); },
      detail::create_graph_row);
}

inline void check_golden(const OpTable& table) {
  const Golden g("op_tables.json");
  detail::for_rows(
      table, [](const OpCase&) { return true; },
      [&](const OpCase& c) { detail::golden_row(g, c); });
}

inline void check_edge_cases(const OpTable& table) {
  detail::for_rows(
      table, [](const OpCase&) { return true; }, detail::edge_cases_row);
  // Forward and backward free every Node and TensorImpl they made.
  const int64_t nodes = live_nodes(), impls = live_tensor_impls();
  detail::for_rows(
      table, [](const OpCase& c) { return c.differentiable(); },
      [](const OpCase& c) {
        std::vector<Tensor> inputs;
        for (size_t i = 0; i < c.shapes.size(); ++i)
          inputs.push_back(detail::make_input(c.shapes[i], c.domain(i)));
        const Tensor out = c.f(inputs);
        out.backward(ones_like(out));
      });
  BOOST_TEST(live_nodes() == nodes, "live Nodes after every row's forward and backward");
  BOOST_TEST(live_tensor_impls() == impls,
             "live TensorImpls after every row's forward and backward");
}

// Anomaly mode on every row (detail::anomaly_row).
inline void check_anomaly(const OpTable& table) {
  detail::for_rows(
      table, [](const OpCase&) { return true; }, detail::anomaly_row);
}

}  // namespace ember::testing
