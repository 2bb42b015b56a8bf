// Elementwise kernel templates shared by the op families: a contiguous fast path (a plain loop
// the compiler vectorises, OpenMP above parallel_grain()) and a general strided path that
// broadcasts by strides. They allocate the output; callers pick the element types.
#pragma once

#include "graph/strided.h"

namespace ember {

// out[i] = f(x[i]) for out contiguous of x's shape.
template <class X, class O, class F>
void unary_into(const Tensor& x, const Tensor& out, F f) {
  const X* px = x.data<X>();
  O* po = out.data<O>();
  const int64_t n = out.numel();
  if (x.is_contiguous()) {
    parallel_for(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = f(px[i]);
    });
    return;
  }
  StridedLoop<2> loop(out.shape(), {out.strides(), x.strides()});
  loop.run([&](const auto& off, int64_t len, const auto& st) {
    O* o = po + off[0];
    const X* x = px + off[1];
    const int64_t so = st[0], sx = st[1];
    for (int64_t i = 0; i < len; ++i) o[i * so] = f(x[i * sx]);
  });
}

// out = f(a, b) with a and b broadcast to out's shape. `out` may alias `a` (in-place ops).
template <class A, class B, class O, class F>
void binary_into(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  O* po = out.data<O>();
  const int64_t n = out.numel();
  const bool flat = out.is_contiguous() && a.is_contiguous() && a.shape() == out.shape();
  if (flat && b.is_contiguous() && b.shape() == out.shape()) {
    parallel_for(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = f(pa[i], pb[i]);
    });
    return;
  }
  if (flat && b.numel() == 1) {
    const B vb = *pb;
    parallel_for(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = f(pa[i], vb);
    });
    return;
  }
  StridedLoop<3> loop(out.shape(), {out.strides(), broadcast_strides(a, out.shape()),
                                    broadcast_strides(b, out.shape())});
  loop.run([&](const auto& off, int64_t len, const auto& st) {
    O* o = po + off[0];
    const A* x = pa + off[1];
    const B* y = pb + off[2];
    // Strides and broadcast scalars as locals: GCC 12 vectorises no loop that reads them
    // through a reference, and a store to `o` could alias a scalar read through a pointer.
    const int64_t so = st[0], sx = st[1], sy = st[2];
    if (so == 1 && sx == 1 && sy == 1) {
      for (int64_t i = 0; i < len; ++i) o[i] = f(x[i], y[i]);
    } else if (so == 1 && sx == 1 && sy == 0) {
      const B yv = *y;
      for (int64_t i = 0; i < len; ++i) o[i] = f(x[i], yv);
    } else if (so == 1 && sx == 0 && sy == 1) {
      const A xv = *x;
      for (int64_t i = 0; i < len; ++i) o[i] = f(xv, y[i]);
    } else {
      for (int64_t i = 0; i < len; ++i) o[i * so] = f(x[i * sx], y[i * sy]);
    }
  });
}

// out = f(a, b, c) with all three broadcast to out's shape (where, fused backwards).
template <class A, class B, class C, class O, class F>
void ternary_into(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& out, F f) {
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  const C* pc = c.data<C>();
  O* po = out.data<O>();
  StridedLoop<4> loop(out.shape(),
                      {out.strides(), broadcast_strides(a, out.shape()),
                       broadcast_strides(b, out.shape()), broadcast_strides(c, out.shape())});
  loop.run([&](const auto& off, int64_t len, const auto& st) {
    O* o = po + off[0];
    const A* x = pa + off[1];
    const B* y = pb + off[2];
    const C* z = pc + off[3];
    const int64_t so = st[0], sx = st[1], sy = st[2], sz = st[3];
    if (so == 1 && sx == 1 && sy == 1 && sz == 1) {
      for (int64_t i = 0; i < len; ++i) o[i] = f(x[i], y[i], z[i]);
    } else {
      for (int64_t i = 0; i < len; ++i) o[i * so] = f(x[i * sx], y[i * sy], z[i * sz]);
    }
  });
}

// A new tensor f(x) of dtype `out_dtype`, element types X (x's) and O (out's) given.
template <class X, class O, class F>
Tensor map(const Tensor& x, F f) {
  Tensor out = empty(x.shape(), dtype_of<O>());
  unary_into<X, O>(x, out, f);
  return out;
}

// A new tensor f(a, b) of the broadcast shape of a and b.
template <class A, class B, class O, class F>
Tensor zip(const Tensor& a, const Tensor& b, std::string_view op, F f) {
  Tensor out =
      empty(a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape(), op),
            dtype_of<O>());
  binary_into<A, B, O>(a, b, out, f);
  return out;
}

}  // namespace ember
