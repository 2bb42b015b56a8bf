// Burgers' equation u_t + u u_x = nu u_xx on x in [-1, 1], t in [0, 1], u(0, x) = -sin(pi x),
// u(t, ±1) = 0, nu = 0.01 / pi: the continuous-time example of Raissi, Perdikaris & Karniadakis
// (J. Comput. Phys. 378, 2019). Its exact solution, by the Cole–Hopf transformation, is
//   u(t, x) = -∫ sin(pi (x - η)) f(x - η) G(η) dη / ∫ f(x - η) G(η) dη,
//   f(y) = exp(-cos(pi y) / (2 pi nu)),  G(η) = exp(-η² / (4 nu t)),
// which with η = sqrt(4 nu t) z becomes a ratio of two Gauss–Hermite integrals over z.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <utility>
#include <vector>

namespace burgers {

inline constexpr double kNu = 0.01 / std::numbers::pi;

// ∫ e^{-z²} g(z) dz ≈ Σ weights[i] g(nodes[i]), exact for polynomials g of degree < 2n.
struct Quadrature {
  std::vector<double> nodes, weights;
};

// The n-point Gauss–Hermite rule: the nodes are, as Golub–Welsch's, the eigenvalues of the Jacobi
// matrix of the Hermite recurrence (zero diagonal, off-diagonal sqrt(k / 2)), found by the
// implicit QL method with Wilkinson shifts. Nodes in increasing order.
inline Quadrature gauss_hermite(int n) {
  std::vector<double> d(n, 0.0), e(n, 0.0);  // e[i] couples i and i + 1
  for (int i = 0; i + 1 < n; ++i) e[i] = std::sqrt((i + 1) / 2.0);
  for (int l = 0; l < n; ++l) {
    for (int iteration = 0; iteration < 60; ++iteration) {
      int m = l;
      while (m + 1 < n && std::abs(e[m]) > 1e-16 * (std::abs(d[m]) + std::abs(d[m + 1]))) ++m;
      if (m == l) break;
      double g = (d[l + 1] - d[l]) / (2 * e[l]);
      double r = std::hypot(g, 1.0);
      g = d[m] - d[l] + e[l] / (g + std::copysign(r, g));
      double s = 1, c = 1, p = 0;
      int i = m - 1;
      for (; i >= l; --i) {
        const double f = s * e[i], b = c * e[i];
        r = std::hypot(f, g);
        e[i + 1] = r;
        if (r == 0) {  // underflow: split the matrix here and start again
          d[i + 1] -= p;
          e[m] = 0;
          break;
        }
        s = f / r, c = g / r;
        g = d[i + 1] - p;
        r = (d[i] - g) * s + 2 * c * b;
        p = s * r;
        d[i + 1] = g + p;
        g = c * r - b;
      }
      if (r == 0 && i >= l) continue;
      d[l] -= p, e[l] = g, e[m] = 0;
    }
  }
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return d[a] < d[b]; });
  // Golub–Welsch's weights, sqrt(pi) times the eigenvectors' squared first components, are
  // accurate only relative to the largest (~1e-16): the far nodes' weights (down to 1e-163 at n =
  // 200), which carry the Cole–Hopf integrals near the shock, come instead from the orthonormal
  // recurrence H̃_j at the node, w = 2 / H̃_n'(z)², H̃_n' = sqrt(2n) H̃_{n-1}, after one Newton step on
  // the node.
  Quadrature q;
  const double pim4 = 1.0 / std::pow(std::numbers::pi, 0.25);
  for (int i : order) {
    double z = d[i], derivative = 0;
    for (int polish = 0; polish < 2; ++polish) {
      double p1 = pim4, p2 = 0;  // H̃_j(z), H̃_{j-1}(z)
      for (int j = 1; j <= n; ++j) {
        const double p3 = p2;
        p2 = p1;
        p1 = z * std::sqrt(2.0 / j) * p2 - std::sqrt((j - 1.0) / j) * p3;
      }
      derivative = std::sqrt(2.0 * n) * p2;
      if (polish == 0) z -= p1 / derivative;
    }
    q.nodes.push_back(z);
    q.weights.push_back(2 / (derivative * derivative));
  }
  return q;
}

// The exact u(t, x), by `q` (200 points resolve the shock to ~1e-15; tests/test_programs.cpp
// checks it against a fine trapezoid rule). The integrands are scaled by their largest
// exponent, so exp(±50) cannot overflow their ratio.
inline double exact(double t, double x, const Quadrature& q) {
  const double pi = std::numbers::pi;
  if (t <= 0) return -std::sin(pi * x);
  const double width = std::sqrt(4 * kNu * t);
  std::vector<double> exponents(q.nodes.size());
  for (size_t i = 0; i < exponents.size(); ++i)
    exponents[i] = -std::cos(pi * (x - width * q.nodes[i])) / (2 * pi * kNu);
  const double top = *std::max_element(exponents.begin(), exponents.end());
  double num = 0, den = 0;
  for (size_t i = 0; i < exponents.size(); ++i) {
    const double f = q.weights[i] * std::exp(exponents[i] - top);
    num += std::sin(pi * (x - width * q.nodes[i])) * f;
    den += f;
  }
  return -num / den;
}

// n points of a Latin hypercube in [lo, hi] per dimension (pyDOE's lhs, as Raissi's code):
// each dimension's range cut into n equal strata, one uniform point in each, the strata of each
// dimension in a random order. Returns points[i][d].
inline std::vector<std::vector<double>> latin_hypercube(
    int64_t n, const std::vector<std::pair<double, double>>& ranges, std::mt19937_64& gen) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<std::vector<double>> points(n, std::vector<double>(ranges.size()));
  std::vector<int64_t> strata(n);
  for (size_t d = 0; d < ranges.size(); ++d) {
    for (int64_t i = 0; i < n; ++i) strata[i] = i;
    std::shuffle(strata.begin(), strata.end(), gen);
    const auto [lo, hi] = ranges[d];
    for (int64_t i = 0; i < n; ++i)
      points[i][d] = lo + (hi - lo) * (static_cast<double>(strata[i]) + unit(gen)) / n;
  }
  return points;
}

}  // namespace burgers
