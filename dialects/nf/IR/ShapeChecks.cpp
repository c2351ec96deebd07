//===- ShapeChecks.cpp - verifier helpers shared by nf dialects -----------===//

#include "nf/IR/ShapeChecks.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::nf {

std::string shapeString(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape)) {
    if (i)
      s += ", ";
    s += ShapedType::isDynamic(d) ? "?" : std::to_string(d);
  }
  return s + "]";
}

bool isWeightElementType(Type t) {
  return t.isF32() || t.isBF16() || t.isF16();
}

bool isQuantCodeType(Type t) {
  return isa<Float8E4M3FNType>(t) || t.isSignlessInteger(4);
}

static LogicalResult checkWeightOf(Operation *op, StringRef role, Value v,
                                   ArrayRef<int64_t> expected, bool linear) {
  auto type = cast<RankedTensorType>(v.getType());
  Type element = type.getElementType();
  if (!isWeightElementType(element) && !(linear && isQuantCodeType(element))) {
    auto diag = op->emitOpError()
                << role << " weight has unsupported element type " << element;
    if (linear)
      diag << " (expected f32, bf16, f16, or quantised codes f8E4M3FN or i4)";
    else if (isQuantCodeType(element))
      diag << " (expected f32, bf16 or f16; only linear projections may be "
              "quantised)";
    else
      diag << " (expected f32, bf16 or f16)";
    return diag;
  }
  if (type.getShape() != expected)
    return op->emitOpError()
           << role << " weight has shape " << shapeString(type.getShape())
           << ", expected " << shapeString(expected);
  return success();
}

/// A weight operand: static shape `expected`, element type f32/bf16/f16.
LogicalResult checkWeight(Operation *op, StringRef role, Value v,
                          ArrayRef<int64_t> expected) {
  return checkWeightOf(op, role, v, expected, /*linear=*/false);
}

LogicalResult checkLinearWeight(Operation *op, StringRef role, Value v,
                                ArrayRef<int64_t> expected) {
  return checkWeightOf(op, role, v, expected, /*linear=*/true);
}

/// An activation: [tokens, features] with a static feature dimension and a
/// float element type. Returns the feature count through `features`.
LogicalResult checkActivation(Operation *op, StringRef role, Type t,
                              int64_t &features) {
  auto type = dyn_cast<RankedTensorType>(t);
  if (!type || type.getRank() != 2 || type.isDynamicDim(1) ||
      !isa<FloatType>(type.getElementType()))
    return op->emitOpError()
           << role << " must be a [tokens, features] float tensor with static "
           << "features, got " << t;
  features = type.getDimSize(1);
  return success();
}

LogicalResult checkSameTokens(Operation *op, Type in, Type out) {
  auto a = cast<RankedTensorType>(in), b = cast<RankedTensorType>(out);
  if (a.getDimSize(0) != b.getDimSize(0))
    return op->emitOpError() << "result has " << shapeString(b.getShape())
                             << " tokens-by-features but the input has "
                             << shapeString(a.getShape());
  return success();
}

LogicalResult checkPositive(Operation *op, StringRef name, int64_t value) {
  if (value <= 0)
    return op->emitOpError() << name << " must be positive, got " << value;
  return success();
}

LogicalResult checkMode(Operation *op, StringRef mode) {
  if (mode != "prefill" && mode != "decode")
    return op->emitOpError()
           << "mode must be 'prefill' or 'decode', got '" << mode << "'";
  return success();
}

} // namespace mlir::nf
