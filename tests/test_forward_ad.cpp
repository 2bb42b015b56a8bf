// Forward-mode autograd's dual tensors (autograd/forward_ad.h, Note [Forward grads] in
// graph/forward_ad.h): make_dual and unpack_dual and their errors, zero tangents that cost
// nothing, tangents dropped when their level ends, views sharing their base's tangent, in-place
// ops updating tangents, nested levels giving second derivatives, an op without a rule, and
// reverse mode through primals and through tangents. The per-op rules are checked by every op
// table's table_forward_ad (tests/op_table.h).
#include <functional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tests/helpers.h"

using namespace ember;
using namespace ember::testing;
namespace fa = ember::autograd::forward_ad;

namespace {

Tensor tangent_of(const Tensor& t) { return fa::unpack_dual(t).tangent; }

// A user's op y = 2x whose Node has a backward but no forward rule.
struct NoRuleBackward final : Node {
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override { return {mul(grads[0], 2.0)}; }
  bool differentiable_backward() const override { return true; }
};
Tensor twice(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard no_grad;
    fwd::VisibleLevels none(0);
    out = mul(x, 2.0);
  }
  return record<NoRuleBackward>("twice", out, {x});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_forward_ad)

BOOST_AUTO_TEST_CASE(make_dual_and_unpack_dual) {
  manual_seed(1);
  const Tensor x = randn({2, 3}, kFloat64), v = randn({2, 3}, kFloat64);
  fa::DualLevel level;
  const Tensor d = fa::make_dual(x, v);
  BOOST_TEST(d.impl()->storage == x.impl()->storage);  // a view of the primal
  const fa::UnpackedDual u = fa::unpack_dual(d);
  BOOST_TEST(u.tangent.same(v));  // the tangent as given
  expect_close(u.primal, x, 0, 0, "primal");
  BOOST_TEST(!tangent_of(u.primal).defined());
  BOOST_TEST(!tangent_of(x).defined());  // the primal itself stays plain
  // sin(x) * x: J v = (cos(x) x + sin(x)) v
  const Tensor y = sin(d) * d;
  expect_close(tangent_of(y), (cos(x) * x + sin(x)) * v, 1e-12, 1e-12, "tangent of sin(x) x");
  expect_close(fa::unpack_dual(y).primal, sin(x) * x, 0, 0, "primal of sin(x) x");
}

BOOST_AUTO_TEST_CASE(bad_make_dual) {
  const Tensor x = zeros({2, 3}, kFloat64);
  expect_error([&] { fa::make_dual(x, zeros({2, 3}, kFloat64)); }, {"make_dual", "no dual level"});
  fa::DualLevel level;
  expect_error(
      [&] {
        fa::make_dual(x, zeros({3, 2}, kFloat64));
      },
      {"make_dual", "[3, 2]", "[2, 3]"});
  expect_error([&] { fa::make_dual(x, zeros({2, 3}, kFloat32)); }, {"make_dual", "Float32"});
  expect_error([&] { fa::make_dual(zeros({2}, kInt64), zeros({2}, kInt64)); },
               {"make_dual", "Int64"});
  expect_error([&] { fa::make_dual(x, Tensor()); }, {"make_dual", "undefined"});
}

BOOST_AUTO_TEST_CASE(no_level_no_tangent) {
  const Tensor x = ones({3}, kFloat64);
  const fa::UnpackedDual u = fa::unpack_dual(x);
  BOOST_TEST(u.primal.same(x));
  BOOST_TEST(!u.tangent.defined());
}

BOOST_AUTO_TEST_CASE(plain_tensors_cost_nothing) {
  fa::DualLevel level;
  const Tensor a = ones({4}, kFloat64), b = full({4}, 2.0, kFloat64);
  const int64_t nodes = live_nodes();
  const Tensor c = exp(a * b + a);  // no input is dual: no Node, no tangent
  BOOST_TEST(live_nodes() == nodes);
  BOOST_TEST(!tangent_of(c).defined());
  // one dual input: the other counts as a zero tangent
  const Tensor v = full({4}, 3.0, kFloat64);
  const Tensor d = fa::make_dual(a, v) * b;
  expect_close(tangent_of(d), v * b, 0, 0, "d(a b) with b plain");
}

BOOST_AUTO_TEST_CASE(tangents_dropped_when_their_level_ends) {
  const Tensor x = ones({3}, kFloat64), v = full({3}, 2.0, kFloat64);
  Tensor d, y;
  {
    fa::DualLevel level;
    d = fa::make_dual(x, v);
    y = d * 3.0;
    BOOST_TEST(tangent_of(y).defined());
  }
  BOOST_TEST(y.impl()->forward_grads.empty());
  BOOST_TEST(d.impl()->forward_grads.empty());
  fa::DualLevel another;
  BOOST_TEST(!tangent_of(y).defined());
  BOOST_TEST(!tangent_of(d * 2.0).defined());
}

BOOST_AUTO_TEST_CASE(inner_level_ends_outer_kept) {
  const Tensor x = ones({3}, kFloat64);
  fa::DualLevel outer;
  const Tensor d = fa::make_dual(x, full({3}, 2.0, kFloat64));
  Tensor y;
  {
    fa::DualLevel inner;
    y = fa::make_dual(d, full({3}, 5.0, kFloat64)) * 3.0;
    expect_close(tangent_of(y), full({3}, 15.0, kFloat64), 0, 0, "inner tangent");
  }
  // the inner level's tangent is gone; the outer one's, 3 * 2, stays
  expect_close(tangent_of(y), full({3}, 6.0, kFloat64), 0, 0, "outer tangent");
  BOOST_TEST(y.impl()->forward_grads.size() == 1u);
}

BOOST_AUTO_TEST_CASE(nested_levels_give_second_derivatives) {
  manual_seed(2);
  const Tensor x = randn({5}, kFloat64), v = randn({5}, kFloat64), w = randn({5}, kFloat64);
  // f(x) = sin(x) x^2 elementwise: f' = cos x x^2 + 2 x sin x, f'' = -sin x x^2 + 4 x cos x + 2 sin
  // x
  const auto f = [](const Tensor& z) { return sin(z) * pow(z, 2.0); };
  fa::DualLevel outer;
  const Tensor x1 = fa::make_dual(x, v);
  Tensor inner_tangent;
  {
    fa::DualLevel inner;
    const Tensor x2 = fa::make_dual(x1, w);
    inner_tangent = tangent_of(f(x2));  // f'(x) w, itself dual at the outer level
    expect_close(fa::unpack_dual(inner_tangent).primal, (cos(x) * x * x + 2.0 * x * sin(x)) * w,
                 1e-12, 1e-12, "f'(x) w");
  }
  const Tensor second = tangent_of(inner_tangent);
  const Tensor expected = (-sin(x) * x * x + 4.0 * x * cos(x) + 2.0 * sin(x)) * v * w;
  expect_close(second, expected, 1e-12, 1e-12, "f''(x) v w");
}

BOOST_AUTO_TEST_CASE(views_share_their_base_tangent) {
  manual_seed(3);
  const Tensor x = randn({3, 4}, kFloat64), v = randn({3, 4}, kFloat64);
  fa::DualLevel level;
  const Tensor d = fa::make_dual(x, v);
  const Tensor views[] = {d.transpose(0, 1),  d.narrow(1, 1, 2), d.select(0, 2),
                          d.reshape({12}),    d.unsqueeze(0),    d.slice(1, 0, 4, 2),
                          d.expand({2, 3, 4})};
  for (const Tensor& view : views) {
    const Tensor t = tangent_of(view);
    BOOST_TEST_REQUIRE(t.defined());
    BOOST_TEST(t.impl()->storage == v.impl()->storage);  // a view of the base's tangent
    BOOST_TEST((t.shape() == view.shape()));
  }
  expect_close(tangent_of(d.transpose(0, 1)), v.transpose(0, 1), 0, 0, "transposed tangent");
  // chunk's pieces are views of the tangent too
  const std::vector<Tensor> pieces = d.chunk(2, 1);
  expect_close(tangent_of(pieces[1]), v.narrow(1, 2, 2), 0, 0, "chunk's tangent");
  // an op that is no view does not alias its input's tangent, even where its rule is identity
  const Tensor shifted = d + 1.0;
  BOOST_TEST(tangent_of(shifted).impl()->storage != v.impl()->storage);
  expect_close(tangent_of(shifted), v, 0, 0, "tangent of x + 1");
}

BOOST_AUTO_TEST_CASE(in_place_ops_update_tangents) {
  manual_seed(4);
  const Tensor x = randn({2, 3}, kFloat64), v = randn({2, 3}, kFloat64);
  const Tensor o = randn({2, 3}, kFloat64), u = randn({2, 3}, kFloat64);
  fa::DualLevel level;
  Tensor d = fa::make_dual(x.clone(), v.clone());
  const Tensor t = tangent_of(d);
  const Tensor view = d.transpose(0, 1);
  const Tensor other = fa::make_dual(o, u);
  // mul_: d(s o) = ds o + s do, from the old s; written in place, so the view sees it
  d.mul_(other);
  expect_close(t, v * o + x * u, 1e-12, 1e-12, "tangent after mul_");
  BOOST_TEST(tangent_of(d).same(t));
  expect_close(tangent_of(view), (v * o + x * u).transpose(0, 1), 1e-12, 1e-12, "view's tangent");
  // add_ with alpha, add_ and mul_ of numbers
  const Tensor before = t.clone();
  d.add_(other, 2.0);
  expect_close(t, before + 2.0 * u, 1e-12, 1e-12, "after add_(alpha)");
  d.mul_(3.0);
  expect_close(t, (before + 2.0 * u) * 3.0, 1e-12, 1e-12, "after mul_(3)");
  d.add_(1.0);
  expect_close(t, (before + 2.0 * u) * 3.0, 1e-12, 1e-12, "after add_(1)");
  // masked_fill_ zeroes the filled elements' tangent; zero_ all of it
  const Tensor mask = gt(x, 0.0);
  const Tensor kept = t.clone();
  d.masked_fill_(mask, 7.0);
  expect_close(t, masked_fill(kept, mask, 0.0), 0, 0, "after masked_fill_");
  d.zero_();
  expect_close(t, zeros({2, 3}, kFloat64), 0, 0, "after zero_");
  // a plain tensor written from a dual one becomes dual; copy_ as well
  Tensor plain = zeros({2, 3}, kFloat64);
  plain.add_(other);
  expect_close(tangent_of(plain), u, 0, 0, "plain.add_(dual)");
  BOOST_TEST(tangent_of(plain).impl()->storage != u.impl()->storage);  // its own tangent
  Tensor target = zeros({2, 3}, kFloat64);
  target.copy_(other);
  expect_close(tangent_of(target), u, 0, 0, "copy_ from a dual tensor");
  // copy_ of a plain tensor into a dual one zeroes its tangent
  target.copy_(o);
  expect_close(tangent_of(target), zeros({2, 3}, kFloat64), 0, 0, "copy_ from a plain tensor");
}

BOOST_AUTO_TEST_CASE(an_op_without_a_rule_is_an_error) {
  fa::DualLevel level;
  const Tensor x = ones({2}, kFloat64);
  BOOST_TEST(!tangent_of(twice(x)).defined());  // no dual input: no rule needed
  expect_error([&] { twice(fa::make_dual(x, ones({2}, kFloat64))); },
               {"twice", "forward-mode autograd has no rule"});
}

BOOST_AUTO_TEST_CASE(reverse_mode_through_primals_and_tangents) {
  manual_seed(5);
  const Tensor x = randn({4}, kFloat64).requires_grad_();
  const Tensor v = randn({4}, kFloat64);
  fa::DualLevel level;
  const Tensor y = tanh(fa::make_dual(x, v)) * 2.0;
  // backward through the primal: d(2 tanh x)/dx = 2 (1 - tanh² x)
  const fa::UnpackedDual u = fa::unpack_dual(y);
  u.primal.backward(ones({4}, kFloat64), true);
  const Tensor th = tanh(x.detach());
  expect_close(x.grad(), 2.0 * (1.0 - th * th), 1e-12, 1e-12, "grad through the primal");
  // reverse over forward: the tangent 2 (1 - tanh² x) v, differentiated in x:
  // -4 tanh x (1 - tanh² x) v
  x.set_grad({});
  BOOST_TEST_REQUIRE(u.tangent.requires_grad());
  u.tangent.backward(ones({4}, kFloat64));
  expect_close(x.grad(), -4.0 * th * (1.0 - th * th) * v, 1e-12, 1e-12, "grad of the tangent");
}

BOOST_AUTO_TEST_CASE(forward_over_reverse) {
  manual_seed(6);
  // g = d/dx of sum(x³) = 3x², recorded with create_graph; its tangent is H v = 6 x v
  const Tensor x = randn({4}, kFloat64), v = randn({4}, kFloat64);
  fa::DualLevel level;
  const Tensor d = fa::make_dual(x, v).detach().requires_grad_();
  BOOST_TEST(!tangent_of(d).defined());  // detach drops the tangent
  const Tensor xv = fa::make_dual(x.clone().requires_grad_(), v);
  const Tensor y = pow(xv, 3.0);
  const std::vector<Tensor> g = autograd::grad({y}, {xv}, {ones({4}, kFloat64)}, true, true, false);
  expect_close(fa::unpack_dual(g[0]).primal, 3.0 * x * x, 1e-12, 1e-12, "gradient");
  expect_close(tangent_of(g[0]), 6.0 * x * v, 1e-12, 1e-12, "H v");
  // through a leaf: the gradient of sin(x) in the leaf under the dual view carries -sin(x) v
  const Tensor leaf_x = x.clone().requires_grad_();
  const Tensor s = sin(fa::make_dual(leaf_x, v));
  const Tensor gs = autograd::grad({s}, {leaf_x}, {ones({4}, kFloat64)}, true, true, false)[0];
  expect_close(tangent_of(gs), -sin(x) * v, 1e-12, 1e-12, "d cos(x) through the leaf");
}

// gradgradcheck with check_forward_ad: the first derivatives' Jacobian columns by dual passes
// (forward over reverse, the upstream gradient dual too) against their finite differences.
BOOST_AUTO_TEST_CASE(gradgradcheck_checks_forward_over_reverse) {
  manual_seed(7);
  GradcheckOptions options;
  options.check_forward_ad = true;
  const std::vector<Tensor> inputs = {leaf({3, 2}),
                                      (rand({3, 2}, kFloat64) + 0.5).requires_grad_()};
  const std::vector<std::pair<std::string, Fn>> fs = {
      {"tanh", [](const std::vector<Tensor>& in) { return tanh(in[0]) * 1.0; }},
      {"mul", [](const std::vector<Tensor>& in) { return in[0] * in[1]; }},
      {"div", [](const std::vector<Tensor>& in) { return in[0] / in[1]; }},
      {"sin", [](const std::vector<Tensor>& in) { return sin(in[0]) * 1.0; }},
      {"all", [](const std::vector<Tensor>& in) { return tanh(in[0] * in[1]) / in[1]; }}};
  for (const auto& [name, f] : fs) {
    const GradcheckResult r = gradgradcheck(f, inputs, {}, options);
    BOOST_TEST(r.ok, name << ": " << r.message);
  }
}

// The rules that compute a tangent by kernels where it needs no graph (records_graph false:
// layer_norm's and head_attention's) against the same rules in ops (their inputs requiring grad)
// and against central differences, in Float64: tangents on every subset of the inputs, a
// non-contiguous input and tangent, two normalized dims, no affine parameters, a mask with an
// empty row, an empty batch.
BOOST_AUTO_TEST_CASE(rules_by_kernels_match_rules_in_ops) {
  using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
  const auto check = [](const std::string& name, const Fn& f, const std::vector<Tensor>& xs,
                        const std::vector<Tensor>& vs) {
    const auto tangent = [&](bool in_ops) {
      GradModeScope grad_mode(in_ops);
      fa::DualLevel level;
      std::vector<Tensor> duals;
      for (size_t i = 0; i < xs.size(); ++i) {
        const Tensor x = in_ops ? xs[i].detach().requires_grad_() : xs[i].detach();
        duals.push_back(vs[i].defined() ? fa::make_dual(x, vs[i]) : x);
      }
      const Tensor t = tangent_of(f(duals));
      return t.defined() ? t.detach() : t;
    };
    const Tensor by_kernels = tangent(false), in_ops = tangent(true);
    BOOST_TEST_REQUIRE(by_kernels.defined(), name);
    expect_close(by_kernels, in_ops, 1e-10, 1e-12, name + ": kernels against ops");
    NoGradGuard no_grad;
    const double h = 1e-6;
    std::vector<Tensor> plus, minus;
    for (size_t i = 0; i < xs.size(); ++i) {
      plus.push_back(vs[i].defined() ? add(xs[i], mul(vs[i], h)) : xs[i]);
      minus.push_back(vs[i].defined() ? sub(xs[i], mul(vs[i], h)) : xs[i]);
    }
    expect_close(by_kernels, div(sub(f(plus), f(minus)), 2 * h), 1e-6, 1e-7,
                 name + ": kernels against central differences");
  };
  const auto r = [](Shape s) { return randn(std::move(s), kFloat64); };
  const Tensor x = r({3, 4, 5}), w = r({5}), b = r({5});
  const Tensor tx = r({3, 4, 5}), tw = r({5}), tb = r({5});
  const Fn ln = [](const std::vector<Tensor>& in) { return layer_norm(in[0], {5}, in[1], in[2]); };
  check("layer_norm, tX", ln, {x, w, b}, {tx, {}, {}});
  check("layer_norm, tX tW tB", ln, {x, w, b}, {tx, tw, tb});
  check("layer_norm, tW", ln, {x, w, b}, {{}, tw, {}});
  check("layer_norm, tB", ln, {x, w, b}, {{}, {}, tb});
  check("layer_norm, non-contiguous", ln, {r({5, 4, 3}).permute({2, 1, 0}), w, b},
        {r({5, 4, 3}).permute({2, 1, 0}), tw, {}});
  check("layer_norm, two dims",
        [](const std::vector<Tensor>& in) {
          return layer_norm(in[0], {4, 5}, in[1], {});
        },
        {x, r({4, 5})}, {tx, r({4, 5})});
  check("layer_norm, no weight",
        [](const std::vector<Tensor>& in) { return layer_norm(in[0], {5}); }, {x}, {tx});
  check("layer_norm, empty", ln, {r({0, 5}), w, b}, {r({0, 5}), tw, tb});

  const Tensor q = r({2, 3, 8}), k = r({2, 4, 8}), v = r({2, 4, 8});
  const Tensor keep = from_vector(std::vector<double>{1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 1, 1}, {3, 4},
                                  kFloat64);  // the second query sees no key
  const Fn attention = [&](const std::vector<Tensor>& in) {
    return head_attention(in[0], in[1], in[2], 2, keep).values;
  };
  check("head_attention, tQ tK tV", attention, {q, k, v},
        {r({2, 3, 8}), r({2, 4, 8}), r({2, 4, 8})});
  check("head_attention, tK", attention, {q, k, v}, {{}, r({2, 4, 8}), {}});
  check("head_attention, tV", attention, {q, k, v}, {{}, {}, r({2, 4, 8})});
  check("head_attention, non-contiguous", attention, {q, r({8, 4, 2}).permute({2, 1, 0}), v},
        {r({2, 3, 8}), r({8, 4, 2}).permute({2, 1, 0}), {}});
}

BOOST_AUTO_TEST_SUITE_END()
