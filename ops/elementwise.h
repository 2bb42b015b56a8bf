// Elementwise ops with broadcasting (by strides): arithmetic, math functions, comparisons,
// logic, where and masked_fill. Differentiable in every floating input.
#pragma once

#include "graph/tensor.h"

namespace ember {

Tensor add(const Tensor& a, const Tensor& b);  // a + b
Tensor sub(const Tensor& a, const Tensor& b);  // a - b
Tensor mul(const Tensor& a, const Tensor& b);  // a * b
Tensor div(const Tensor& a, const Tensor& b);  // a / b (true division)
Tensor add(const Tensor& a, double b);         // a + b
Tensor sub(const Tensor& a, double b);         // a - b
Tensor rsub(const Tensor& a, double b);        // b - a
Tensor mul(const Tensor& a, double b);         // a * b
Tensor div(const Tensor& a, double b);         // a / b
Tensor rdiv(const Tensor& a, double b);        // b / a
Tensor neg(const Tensor& x);                   // -x
Tensor pow(const Tensor& x, double exponent);  // x^exponent
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);  // natural log
Tensor sqrt(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);  // 1 / (1 + exp(-x))
Tensor relu(const Tensor& x);     // max(x, 0)
Tensor abs(const Tensor& x);

// comparisons -> Bool, never differentiable
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);

// logic on Bool tensors
Tensor logical_not(const Tensor& mask);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);     // cond ? a : b
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);  // mask broadcasts to x

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, double b);
Tensor operator<=(const Tensor& a, double b);
Tensor operator>(const Tensor& a, double b);
Tensor operator>=(const Tensor& a, double b);
// Only against a double: == between two Tensors would read as handle identity.
Tensor operator==(const Tensor& a, double b);
Tensor operator!=(const Tensor& a, double b);
Tensor operator!(const Tensor& mask);
Tensor operator&(const Tensor& a, const Tensor& b);
Tensor operator|(const Tensor& a, const Tensor& b);

}  // namespace ember
