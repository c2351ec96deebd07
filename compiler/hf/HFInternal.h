// Internal to compiler/hf (used by nothing else): the parsing of
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

} // namespace nf::hf::detail
