// Internal to compiler/hf (used by nothing else): helpers shared by
// HFConfig.cpp, HFBinding.cpp and HFQuant.cpp, and the parsing of
// config.json's `quantization_config` (HFConfig.cpp reads config.json,
// HFQuant.cpp knows the formats).
#pragma once

#include "hf/HFQuant.h"

#include <nlohmann/json_fwd.hpp>

namespace nf::hf::detail {

/// `config.json`'s `quantization_config` object (ModelOpt or
/// compressed-tensors); `source` is config.json's path, for messages.
StatusOr<QuantConfig> parseQuantizationConfig(const nlohmann::json &qc,
                                              const std::string &source);

/// One-line form of a string read from a checkpoint (control characters
/// escaped), for messages.
std::string printable(const std::string &s);
/// "[4, 8]".
std::string shapeString(const std::vector<int64_t> &shape);

} // namespace nf::hf::detail
