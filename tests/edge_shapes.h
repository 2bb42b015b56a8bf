// Edge shapes for the op tables (tests/op_table.h): every row re-run on its input shapes with one
// dim made 0 (each dim of each input in turn, then every dim of one size across all inputs at
// once, so that shared dims such as matmul's k or linear's in_features vanish together) and with
// every dim 1; each on contiguous, transposed and narrowed inputs. The result must be the one
// PyTorch gives (shape, dtype, values, and the gradients for an upstream gradient of ones), or an
// ember::Error where PyTorch raises. Another exception, a result where PyTorch raises, an error
// where PyTorch returns, or a signal fails the row.
//
// Note [Edge variants]
// gen_op_tables.py enumerates the same variants (edge_variants there) and records, under
// "<row>.edge <variant>.out" and ".g<i>", PyTorch's result as text: "error", or
// "<shape> <dtype> v0 v1 …" (repr of each value: nan, inf and -0.0 survive). Inputs are
// deterministic in the flat index k (edge_input), so both sides compute on the same values:
//   Real (k·7 + 3) mod 11 − 5, / 4;  Positive 0.5 + ((k·5 + 1) mod 9) / 8;
//   Integer (k·3 + 1) mod 7 − 3;      Bool (k·5 + 2) mod 3 == 0.
#pragma once

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tests/op_table.h"

namespace ember::testing {

namespace detail {

struct EdgeVariant {
  std::string name;
  std::vector<Shape> shapes;
};

// As edge_variants in gen_op_tables.py.
inline std::vector<EdgeVariant> edge_variants(const std::vector<Shape>& shapes) {
  std::vector<EdgeVariant> out;
  for (size_t i = 0; i < shapes.size(); ++i)
    for (size_t d = 0; d < shapes[i].size(); ++d) {
      if (shapes[i][d] == 0) continue;
      std::vector<Shape> v = shapes;
      v[i][d] = 0;
      out.push_back({fmt::format("in{} dim{} 0", i, d), v});
    }
  std::vector<int64_t> sizes;  // distinct sizes, in order of first appearance
  for (const Shape& s : shapes)
    for (int64_t n : s)
      if (n > 0 && std::find(sizes.begin(), sizes.end(), n) == sizes.end()) sizes.push_back(n);
  for (int64_t n : sizes) {
    std::vector<Shape> v = shapes;
    int64_t count = 0;
    for (Shape& s : v)
      for (int64_t& m : s)
        if (m == n) m = 0, ++count;
    if (count >= 2) out.push_back({fmt::format("size {} 0", n), v});
  }
  std::vector<Shape> ones = shapes;
  for (Shape& s : ones) std::fill(s.begin(), s.end(), 1);
  if (ones != shapes) out.push_back({"ones", ones});
  return out;
}

// A Float64 input (Bool for masks) with values fixed by the flat index (Note [Edge variants]).
inline Tensor edge_input(const Shape& shape, Domain domain) {
  std::vector<double> data(static_cast<size_t>(shape_numel(shape)));
  for (size_t k = 0; k < data.size(); ++k) switch (domain) {
      case Real:
        data[k] = static_cast<double>(static_cast<int64_t>((k * 7 + 3) % 11) - 5) / 4.0;
        break;
      case Positive:
        data[k] = 0.5 + static_cast<double>((k * 5 + 1) % 9) / 8.0;
        break;
      case Integer:
        data[k] = static_cast<double>(static_cast<int64_t>((k * 3 + 1) % 7) - 3);
        break;
      case Bool:
        data[k] = (k * 5 + 2) % 3 == 0 ? 1.0 : 0.0;
        break;
    }
  return from_vector(data, shape, domain == Bool ? kBool : kFloat64);
}

// t in the text form gen_op_tables.py writes, for comparison and messages.
inline std::string edge_text(const Tensor& t) {
  std::string s = fmt::format("{} {}", t.shape(), t.dtype());
  for (double v : t.to_vector<double>()) s += fmt::format(" {}", v);
  return s;
}

// `got` agrees with PyTorch's text: shape and dtype exactly, values to 1e-12 (NaN matches NaN,
// an infinity the same infinity).
inline void expect_edge(const Tensor& got, const std::string& expected, const std::string& what) {
  const std::string head = fmt::format("{} {}", got.shape(), got.dtype());
  if (expected.compare(0, head.size(), head) != 0 ||
      (expected.size() > head.size() && expected[head.size()] != ' ')) {
    BOOST_ERROR(what << ": got " << edge_text(got) << ", torch " << expected);
    return;
  }
  std::istringstream rest(expected.substr(head.size()));
  const std::vector<double> values = got.to_vector<double>();
  std::string word;
  for (double v : values) {
    rest >> word;
    const double e = std::strtod(word.c_str(), nullptr);
    const bool same = std::isnan(e)   ? std::isnan(v)
                      : std::isinf(e) ? v == e
                                      : std::abs(v - e) <= 1e-12 * (1 + std::abs(e));
    if (!same) {
      BOOST_ERROR(what << ": got " << edge_text(got) << ", torch " << expected);
      return;
    }
  }
}

// One variant of one row on one layout, against PyTorch's text.
inline void edge_variant_row(const Golden& g, const OpCase& c, const EdgeVariant& v,
                             Layout layout) {
  const std::string key = fmt::format("{}.edge {}", c.name, v.name);
  const std::string what = fmt::format("{} ({} inputs)", v.name, layout_name(layout));
  std::vector<Tensor> leaves, inputs;  // inputs are views of the leaves in `layout`
  for (size_t i = 0; i < v.shapes.size(); ++i) {
    const Layout l = of_input(layout, i);
    Tensor leaf = zeros(leaf_shape(v.shapes[i], l), c.domain(i) == Bool ? kBool : kFloat64);
    view(leaf, l).copy_(edge_input(v.shapes[i], c.domain(i)));
    leaves.push_back(c.domain(i) == Bool ? leaf : leaf.requires_grad_());
    inputs.push_back(view(leaves[i], l));
  }
  const std::string expected = g.text(key + ".out");
  Tensor out;
  try {
    out = c.f(inputs);
  } catch (const Error& e) {
    BOOST_TEST(expected == "error",
               what << ": ember::Error '" << e.what() << "', torch " << expected);
    return;
  }
  if (expected == "error") {
    BOOST_ERROR(what << ": torch raises, Ember gives " << edge_text(out.detach()));
    return;
  }
  expect_edge(out.detach(), expected, what);
  if (!c.differentiable() || !out.requires_grad()) return;
  out.backward(ones_like(out));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!g.contains(fmt::format("{}.g{}", key, i))) continue;
    BOOST_TEST_REQUIRE(leaves[i].grad().defined(), what << ": input " << i << " got no gradient");
    expect_edge(view(leaves[i].grad(), of_input(layout, i)), g.text(fmt::format("{}.g{}", key, i)),
                fmt::format("{}: gradient of input {}", what, i));
  }
}

// The variants of one row; the golden file must hold them (regenerate it otherwise).
inline void edge_shapes_row(const Golden& g, const OpCase& c) {
  for (const EdgeVariant& v : edge_variants(c.shapes)) {
    if (!g.contains(fmt::format("{}.edge {}.out", c.name, v.name))) {
      BOOST_ERROR("op_tables.json lacks edge variant '"
                  << v.name << "': run /usr/bin/python3 tests/golden/gen_op_tables.py");
      continue;
    }
    for (Layout layout : layouts(c)) edge_variant_row(g, c, v, layout);
  }
}

}  // namespace detail

// Every row on empty, one-element and non-contiguous inputs (the file comment). Rows flagged
// kEdgeDiffers are skipped: each says why in a comment.
inline void check_edge_shapes(const OpTable& table) {
  const Golden g("op_tables.json");
  detail::for_rows(
      table, [](const OpCase& c) { return !(c.flags & kEdgeDiffers); },
      [&](const OpCase& c) { detail::edge_shapes_row(g, c); });
}

}  // namespace ember::testing
