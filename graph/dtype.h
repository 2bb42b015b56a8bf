// DType, its element types, and the dispatch helpers that pick a kernel's element type once per
// op (never per element): dispatch_float(dtype, op, [&]<class T>() { ... }).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <ostream>
#include <string_view>
#include <type_traits>
#include <vector>

#include "graph/error.h"

namespace ember {

enum class DType { Float32, Float64, Int64, Bool };
inline constexpr DType kFloat32 = DType::Float32, kFloat64 = DType::Float64, kInt64 = DType::Int64,
                       kBool = DType::Bool;

using Shape = std::vector<int64_t>;

// Everything Ember knows of a dtype, one row each: adding one (bfloat16, say) is a row here, its
// element type in dispatch_all below, and kernels. `rank` orders promotion (torch.result_type:
// the higher rank of two operands wins); `safetensors` is the dtype's name in checkpoint headers.
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
  bool is_floating;
  int rank;
  std::string_view safetensors;
};
inline constexpr DTypeInfo kDTypes[] = {
    {DType::Float32, "Float32", 4, true, 2, "F32"},
    {DType::Float64, "Float64", 8, true, 3, "F64"},
    {DType::Int64, "Int64", 8, false, 1, "I64"},
    {DType::Bool, "Bool", 1, false, 0, "BOOL"},
};

constexpr const DTypeInfo& dtype_info(DType t) { return kDTypes[static_cast<int>(t)]; }
static_assert(
    [] {
      for (int i = 0; i < static_cast<int>(std::size(kDTypes)); ++i)
        if (static_cast<int>(kDTypes[i].dtype) != i) return false;
      return true;
    }(),
    "kDTypes must list the dtypes in the enum's order");

constexpr std::string_view dtype_name(DType t) { return dtype_info(t).name; }
constexpr size_t element_size(DType t) { return dtype_info(t).size; }
constexpr bool is_floating(DType t) { return dtype_info(t).is_floating; }

// The element type of each dtype, and back.
template <class T>
struct dtype_of_t;
template <>
struct dtype_of_t<float> : std::integral_constant<DType, DType::Float32> {};
template <>
struct dtype_of_t<double> : std::integral_constant<DType, DType::Float64> {};
template <>
struct dtype_of_t<int64_t> : std::integral_constant<DType, DType::Int64> {};
template <>
struct dtype_of_t<bool> : std::integral_constant<DType, DType::Bool> {};
template <class T>
constexpr DType dtype_of() {
  return dtype_of_t<T>::value;
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

// The smallest dtype that holds both (Bool < Int64 < Float32 < Float64), as torch.result_type.
constexpr DType promote(DType a, DType b) {
  return dtype_info(a).rank >= dtype_info(b).rank ? a : b;
}

// Converts one element between element types. Floating -> Int64 is defined for every value, as
// x86's conversion (what torch does on this CPU): NaN and values outside the int64 range become
// INT64_MIN, where a plain static_cast is undefined behaviour.
template <class D, class S>
constexpr D cast_value(S v) {
  if constexpr (std::is_same_v<D, int64_t> && std::is_floating_point_v<S>)
    return v >= S(-0x1p63) && v < S(0x1p63) ? static_cast<int64_t>(v) : INT64_MIN;
  else
    return static_cast<D>(v);
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
  if (!is_floating(t))
    throw Error(fmt::format("{}: expected a Float32 or Float64 tensor, got {}", op, dtype_name(t)));
  return dispatch_all(t, [&]<class T>() -> decltype(f.template operator()<float>()) {
    if constexpr (std::is_floating_point_v<T>)
      return f.template operator()<T>();
    else
      throw Error("dispatch_float: unreachable");
  });
}

// As dispatch_all, for kernels defined on numbers (not Bool).
template <class F>
decltype(auto) dispatch_numeric(DType t, std::string_view op, F&& f) {
  if (t == DType::Bool)
    throw Error(fmt::format("{}: expected a numeric tensor, got {}", op, dtype_name(t)));
  return dispatch_all(t, [&]<class T>() -> decltype(f.template operator()<float>()) {
    if constexpr (!std::is_same_v<T, bool>)
      return f.template operator()<T>();
    else
      throw Error("dispatch_numeric: unreachable");
  });
}

}  // namespace ember

template <>
struct fmt::formatter<ember::DType> : fmt::formatter<std::string_view> {
  auto format(ember::DType t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(ember::dtype_name(t), ctx);
  }
};
