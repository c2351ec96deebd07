//===- ShapeChecks.h - verifier helpers shared by nf dialects ---*- C++ -*-===//
//
// Every nf dialect verifies weights and activations the same way, with the
// same wording, so that a broken model reads the same whichever op catches it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "mlir/IR/Operation.h"

#include <string>

namespace mlir::nf {

/// "[4, ?, 8]".
std::string shapeString(ArrayRef<int64_t> shape);
/// f32, bf16 or f16.
bool isWeightElementType(Type t);
/// The element type of quantised codes (see `#nf.quant`): f8E4M3FN or i4.
bool isQuantCodeType(Type t);
/// A weight operand: static shape `expected`, element type f32/bf16/f16.
LogicalResult checkWeight(Operation *op, StringRef role, Value v,
                          ArrayRef<int64_t> expected);
/// The weight of a linear projection: as checkWeight, and quantised codes
/// (f8E4M3FN, i4) are accepted too; `nf.weight` checks their scales.
LogicalResult checkLinearWeight(Operation *op, StringRef role, Value v,
                                ArrayRef<int64_t> expected);
/// An activation [tokens, features] with static features and a float element
/// type; returns the feature count through `features`.
LogicalResult checkActivation(Operation *op, StringRef role, Type t,
                              int64_t &features);
/// `in` and `out` have the same token dimension.
LogicalResult checkSameTokens(Operation *op, Type in, Type out);
LogicalResult checkPositive(Operation *op, StringRef name, int64_t value);
/// `mode` is "prefill" or "decode".
LogicalResult checkMode(Operation *op, StringRef mode);

} // namespace mlir::nf
