// Typed plan ops: the op codes and attribute keys of nf/plan_ops.def, and the
// one way to learn a plan op's code. Plans since format 1.10 store the code
// (Op.code); older plans are read by name.
#pragma once

#include "nf/plan_generated.h"

#include <cstdint>
#include <optional>
#include <string_view>

namespace nf::plan {

enum class OpCode : uint16_t {
  Unknown = 0,
#define NF_PLAN_OP(E, C, N) E = C,
#include "nf/plan_ops.def"
};

/// The attribute keys, e.g. attr::Epsilon == "epsilon".
namespace attr {
#define NF_PLAN_ATTR(E, K) inline constexpr std::string_view E = K;
#include "nf/plan_ops.def"
} // namespace attr

struct OpCodeName {
  OpCode code;
  std::string_view name;
};

inline constexpr OpCodeName kOpCodeNames[] = {
#define NF_PLAN_OP(E, C, N) {OpCode::E, N},
#include "nf/plan_ops.def"
};

inline constexpr std::string_view kAttrKeys[] = {
#define NF_PLAN_ATTR(E, K) K,
#include "nf/plan_ops.def"
};

/// "nf.linear" for OpCode::Linear; "" for Unknown or a code not in the list.
constexpr std::string_view opCodeName(OpCode code) {
  for (const OpCodeName &e : kOpCodeNames)
    if (e.code == code)
      return e.name;
  return {};
}

/// The code of an op name; Unknown if the name is not a plan op.
constexpr OpCode opCodeOf(std::string_view name) {
  for (const OpCodeName &e : kOpCodeNames)
    if (e.name == name)
      return e.code;
  return OpCode::Unknown;
}

/// A plan op's code: the stored one (format 1.10) when it names the same op
/// as the op's name, else the name's. The plan loader rejects plans whose
/// stored code and name disagree, so past loading the two are one.
inline OpCode opCode(const Op &op) {
  const std::string_view name =
      op.name() ? op.name()->string_view() : std::string_view();
  const auto stored = static_cast<OpCode>(op.code());
  if (stored != OpCode::Unknown && opCodeName(stored) == name)
    return stored;
  return opCodeOf(name);
}

/// Why a plan op's stored code is inconsistent with its name, or nullopt
/// when it is not (a code of 0 means "not stored": plans before 1.10).
inline std::optional<std::string_view> opCodeMismatch(const Op &op) {
  if (op.code() == 0)
    return std::nullopt;
  const std::string_view stored = opCodeName(static_cast<OpCode>(op.code()));
  if (stored.empty())
    return "unknown op code";
  const std::string_view name =
      op.name() ? op.name()->string_view() : std::string_view();
  if (stored != name)
    return "op code names another op";
  return std::nullopt;
}

} // namespace nf::plan
