//===- NfAttrs.cpp - nf dialect attributes --------------------------------===//
//
// `#nf.quant` checks what it can check alone: that scheme, storage, packing,
// granularity and activation scheme fit together, and that every scale is a
// named tensor of a float type. Shapes against the weight are checked by
// `nf.weight`'s verifier, which knows the weight.
//
//===----------------------------------------------------------------------===//

#include "nf/IR/NfAttrs.h"
#include "nf/IR/NfDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::nf;

#include "nf/IR/NfEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "nf/IR/NfAttrs.cpp.inc"

void NfDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "nf/IR/NfAttrs.cpp.inc"
      >();
}

namespace {

using EmitError = llvm::function_ref<InFlightDiagnostic()>;

bool isScaleElementType(Type t) { return t.isF32() || t.isBF16() || t.isF16(); }

/// `names` and `types` describe one tensor per part: non-empty names, static
/// float tensors of at most `maxRank` dimensions.
LogicalResult checkTensorList(EmitError emitError, StringRef what,
                              ArrayAttr names, ArrayAttr types,
                              int64_t maxRank) {
  if (names.empty())
    return emitError() << "quant " << what << " lists no tensors";
  if (names.size() != types.size())
    return emitError() << "quant lists " << names.size() << " " << what
                       << " but " << types.size() << " types in "
                       << (what == "scales" ? "scale_types"
                                            : "input_scale_types");
  for (auto [name, type] : llvm::zip(names, types)) {
    auto str = dyn_cast<StringAttr>(name);
    if (!str || str.getValue().empty())
      return emitError() << "quant " << what
                         << " must be non-empty tensor names, got " << name;
    auto typeAttr = dyn_cast<TypeAttr>(type);
    auto tensor =
        typeAttr ? dyn_cast<RankedTensorType>(typeAttr.getValue()) : nullptr;
    if (!tensor || !tensor.hasStaticShape() || tensor.getRank() > maxRank)
      return emitError() << "quant " << what << " '" << str.getValue()
                         << "' must have a static tensor type of rank <= "
                         << maxRank << ", got " << type;
    if (!isScaleElementType(tensor.getElementType()))
      return emitError() << "quant " << what << " '" << str.getValue()
                         << "' has element type " << tensor.getElementType()
                         << " (expected f32, bf16 or f16)";
  }
  return success();
}

} // namespace

Type QuantAttr::getCodeType() const {
  switch (getScheme()) {
  case QuantScheme::Fp8E4M3:
    return Float8E4M3FNType::get(getContext());
  case QuantScheme::Int4:
    return IntegerType::get(getContext(), 4);
  }
  llvm_unreachable("unknown quantisation scheme");
}

LogicalResult
QuantAttr::verify(EmitError emitError, QuantScheme scheme, Type storage,
                  int64_t pack, QuantGranularity granularity, int64_t groupSize,
                  bool symmetric, ArrayAttr scales, ArrayAttr scaleTypes,
                  ActivationQuant activations, ArrayAttr inputScales,
                  ArrayAttr inputScaleTypes) {
  StringRef name = stringifyQuantScheme(scheme);
  switch (scheme) {
  case QuantScheme::Fp8E4M3:
    if (!isa<Float8E4M3FNType>(storage) || pack != 1)
      return emitError() << "quant scheme " << name
                         << " is stored as f8E4M3FN with pack = 1, got "
                         << storage << " with pack = " << pack;
    break;
  case QuantScheme::Int4:
    if (!storage.isSignlessInteger(32) || pack != 8)
      return emitError() << "quant scheme " << name
                         << " is stored as i32 with pack = 8, got " << storage
                         << " with pack = " << pack;
    if (activations != ActivationQuant::None)
      return emitError() << "quant scheme " << name
                         << " takes unquantised activations (activations = "
                            "none), got "
                         << stringifyActivationQuant(activations);
    break;
  }
  if (granularity == QuantGranularity::PerGroup) {
    if (groupSize <= 0)
      return emitError() << "quant granularity per_group needs a positive "
                            "group_size, got "
                         << groupSize;
  } else if (groupSize != 0) {
    return emitError() << "quant group_size applies to per_group only, got "
                       << groupSize << " with "
                       << stringifyQuantGranularity(granularity);
  }
  if (!symmetric)
    return emitError() << "quant symmetric = false: asymmetric quantisation "
                          "(zero points) is not supported";
  if (failed(checkTensorList(emitError, "scales", scales, scaleTypes, 2)))
    return failure();
  if (activations == ActivationQuant::StaticPerTensor) {
    if (!inputScales || !inputScaleTypes)
      return emitError() << "quant activations = static_per_tensor needs "
                            "input_scales and input_scale_types";
    if (failed(checkTensorList(emitError, "input_scales", inputScales,
                               inputScaleTypes, 1)))
      return failure();
    if (inputScales.size() != scales.size())
      return emitError() << "quant lists " << inputScales.size()
                         << " input_scales for " << scales.size()
                         << " scales (one per part)";
    for (auto [n, t] : llvm::zip(inputScales, inputScaleTypes))
      if (cast<RankedTensorType>(cast<TypeAttr>(t).getValue())
              .getNumElements() != 1)
        return emitError() << "quant input scale '"
                           << cast<StringAttr>(n).getValue()
                           << "' must be a scalar ([] or [1]), got "
                           << cast<TypeAttr>(t).getValue();
  } else if (inputScales || inputScaleTypes) {
    return emitError() << "quant input_scales belong to activations = "
                          "static_per_tensor, got "
                       << stringifyActivationQuant(activations);
  }
  return success();
}
