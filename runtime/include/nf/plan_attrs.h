// Reading a plan op's attributes (nf/plan_generated.h): the one reader the
// runtime's engines and the compiler's CUDA code generator share. Attributes
// are few per op: linear search.
#pragma once

#include "nf/plan_generated.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nf::plan {

namespace detail {
template <typename Vec>
auto findAttr(const Vec *v, std::string_view name) -> decltype(v->Get(0)) {
  if (!v)
    return nullptr;
  for (auto a : *v)
    if (a->name() && a->name()->string_view() == name)
      return a;
  return nullptr;
}
} // namespace detail

inline std::optional<int64_t> intAttr(const Op &op, std::string_view name) {
  if (auto a = detail::findAttr(op.ints(), name))
    return a->value();
  return std::nullopt;
}

/// A float attribute, or an integer one read as a float.
inline std::optional<double> floatAttr(const Op &op, std::string_view name) {
  if (auto a = detail::findAttr(op.floats(), name))
    return a->value();
  if (auto a = detail::findAttr(op.ints(), name))
    return static_cast<double>(a->value());
  return std::nullopt;
}

inline std::optional<std::string> stringAttr(const Op &op,
                                             std::string_view name) {
  if (auto a = detail::findAttr(op.strings(), name))
    return a->value() ? a->value()->str() : std::string();
  return std::nullopt;
}

inline std::optional<std::vector<int64_t>> listAttr(const Op &op,
                                                    std::string_view name) {
  if (auto a = detail::findAttr(op.int_lists(), name)) {
    std::vector<int64_t> out;
    if (a->values())
      out.assign(a->values()->begin(), a->values()->end());
    return out;
  }
  return std::nullopt;
}

} // namespace nf::plan
