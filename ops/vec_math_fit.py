"""Coefficients of the polynomial approximations in ops/vec_math.h: near-minimax (Lawson's
iteratively reweighted least squares, in 50-digit arithmetic with mpmath) fits of relative
error. Run with /usr/bin/python3 ops/vec_math_fit.py (a few seconds); prints the C++ arrays."""
import sys

import mpmath as mp

mp.mp.dps = 50


def fit(g, var, a, b, deg, iters=30):
    """c[0..deg] minimising max |sum c_k var(x)^k - g(x)| / |g(x)| over [a, b] (Lawson)."""
    n = 4 * (deg + 1)
    xs = [(a + b) / 2 + (b - a) / 2 * mp.cos(mp.pi * (2 * k + 1) / (2 * n)) for k in range(n)]
    vs, gs = [var(x) for x in xs], [g(x) for x in xs]
    w, best = [mp.mpf(1) / n] * n, None
    for _ in range(iters):
        m = deg + 1
        A, r = mp.matrix(m, m), mp.matrix(m, 1)
        for i in range(n):
            row = [vs[i] ** k / abs(gs[i]) for k in range(m)]
            for p in range(m):
                r[p] += w[i] * row[p] * gs[i] / abs(gs[i])
                for q in range(m):
                    A[p, q] += w[i] * row[p] * row[q]
        c = mp.lu_solve(A, r)
        errs = [(sum(c[k] * vs[i] ** k for k in range(m)) - gs[i]) / abs(gs[i]) for i in range(n)]
        worst = max(abs(e) for e in errs)
        if best is None or worst < best[0]:
            best = (worst, [c[k] for k in range(m)])
        total = sum(w[i] * abs(errs[i]) for i in range(n))
        w = [w[i] * abs(errs[i]) / total for i in range(n)]
    return best


def show(name, ctype, worst, c):
    digits = 9 if ctype == "float" else 17
    suffix = "f" if ctype == "float" else ""
    body = ", ".join(mp.nstr(v, digits, min_fixed=1, max_fixed=0) .replace("e", "e") + suffix
                     for v in c)
    print(f"// {name}: max relative error {mp.nstr(worst, 3)}")
    print(f"inline constexpr std::array<{ctype}, {len(c)}> {name} = {{{body}}};")


tiny = mp.mpf("1e-30")
tanh_p = lambda x: (mp.tanh(x) / x - 1) / (x * x)   # tanh x = x + x z P(z), z = x^2
erf_p = lambda z: mp.erf(z) / z                      # erf z = z P(z^2) (Float64 only)
erfc_q = lambda z: mp.erfc(z) * mp.exp(z * z)         # erfc z = exp(-z^2) Q(1 / (1 + p z))
sq = lambda x: x * x
if __name__ == "__main__":
    # Float32's erfc runs from 0 (no erf branch), Float64's from 0.5 (erf below).
    for ctype, tanh_deg, erf_deg, q_p, q_lo, q_hi, q_deg in (
            ("float", 4, None, "0.5", "0", 10, 9), ("double", 10, 12, "0.3", "0.5", 27, 20)):
        show(f"kTanh{ctype.capitalize()}", ctype, *fit(tanh_p, sq, tiny, mp.mpf("0.625"), tanh_deg))
        if erf_deg:
            show(f"kErf{ctype.capitalize()}", ctype, *fit(erf_p, sq, tiny, 1, erf_deg))
        p = mp.mpf(q_p)
        show(f"kErfc{ctype.capitalize()}", ctype,
             *fit(erfc_q, lambda z: 1 / (1 + p * z), mp.mpf(q_lo), q_hi, q_deg))
        sys.stdout.flush()
