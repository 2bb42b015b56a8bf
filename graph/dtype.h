// DType, its element types, and the dispatch helpers that pick a kernel's element type once per
// op (never per element): dispatch_float(dtype, op, [&]<class T>() { ... }).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <vector>

#include "graph/error.h"

namespace ember {

enum class DType { Float32, Float64, Int64, Bool };
inline constexpr DType kFloat32 = DType::Float32, kFloat64 = DType::Float64, kInt64 = DType::Int64,
                       kBool = DType::Bool;

using Shape = std::vector<int64_t>;

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Float32:
      return "Float32";
    case DType::Float64:
      return "Float64";
    case DType::Int64:
      return "Int64";
    case DType::Bool:
      return "Bool";
  }
  return "?";
}

constexpr size_t element_size(DType t) {
  switch (t) {
    case DType::Float32:
      return 4;
    case DType::Float64:
      return 8;
    case DType::Int64:
      return 8;
    case DType::Bool:
      return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) { return t == DType::Float32 || t == DType::Float64; }

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::Float32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::Float64;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::Int64;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::Bool;
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

// The smallest dtype that holds both (Bool < Int64 < Float32 < Float64), as torch.result_type.
constexpr DType promote(DType a, DType b) {
  constexpr auto rank = [](DType t) {
    return t == DType::Bool ? 0 : t == DType::Int64 ? 1 : t == DType::Float32 ? 2 : 3;
  };
  return rank(a) >= rank(b) ? a : b;
}

// Calls f.template operator()<T>() with T the element type of `t`.
template <class F>
decltype(auto) dispatch_all(DType t, F&& f) {
  switch (t) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    case DType::Int64:
      return f.template operator()<int64_t>();
    case DType::Bool:
      return f.template operator()<bool>();
  }
  throw Error("dispatch: unknown dtype");
}

// As dispatch_all, for kernels defined on Float32 and Float64 only.
template <class F>
decltype(auto) dispatch_float(DType t, std::string_view op, F&& f) {
  switch (t) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    default:
      throw Error(
          fmt::format("{}: expected a Float32 or Float64 tensor, got {}", op, dtype_name(t)));
  }
}

// As dispatch_all, for kernels defined on numbers (not Bool).
template <class F>
decltype(auto) dispatch_numeric(DType t, std::string_view op, F&& f) {
  switch (t) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    case DType::Int64:
      return f.template operator()<int64_t>();
    default:
      throw Error(fmt::format("{}: expected a numeric tensor, got {}", op, dtype_name(t)));
  }
}

}  // namespace ember

template <>
struct fmt::formatter<ember::DType> : fmt::formatter<std::string_view> {
  auto format(ember::DType t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(ember::dtype_name(t), ctx);
  }
};
