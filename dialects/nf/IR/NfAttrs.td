//===- NfAttrs.td - nf dialect attributes ------------------*- tablegen -*-===//
//
// `#nf.quant`: how a quantised checkpoint stores a linear weight. It only
// describes the checkpoint (which tensors hold the codes and the scales, and
// how they combine); nothing here says how a backend computes with it.
//
//===----------------------------------------------------------------------===//

#ifndef NF_ATTRS_TD
#define NF_ATTRS_TD

include "NfDialect.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def Nf_QuantScheme : I32EnumAttr<"QuantScheme",
    "number format of quantised weight codes", [
      I32EnumAttrCase<"Fp8E4M3", 0, "fp8_e4m3">,
      I32EnumAttrCase<"Int4", 1, "int4">
    ]> {
  let cppNamespace = "::mlir::nf";
  let genSpecializedAttr = 0;
}

def Nf_QuantGranularity : I32EnumAttr<"QuantGranularity",
    "what one weight scale covers", [
      I32EnumAttrCase<"PerTensor", 0, "per_tensor">,
      I32EnumAttrCase<"PerChannel", 1, "per_channel">,
      I32EnumAttrCase<"PerGroup", 2, "per_group">
    ]> {
  let cppNamespace = "::mlir::nf";
  let genSpecializedAttr = 0;
}

def Nf_ActivationQuant : I32EnumAttr<"ActivationQuant",
    "how the input of a quantised linear is quantised", [
      I32EnumAttrCase<"None", 0, "none">,
      I32EnumAttrCase<"StaticPerTensor", 1, "static_per_tensor">,
      I32EnumAttrCase<"DynamicPerToken", 2, "dynamic_per_token">
    ]> {
  let cppNamespace = "::mlir::nf";
  let genSpecializedAttr = 0;
}

//===----------------------------------------------------------------------===//
// #nf.quant
//===----------------------------------------------------------------------===//

def Nf_QuantAttr : AttrDef<Nf_Dialect, "Quant"> {
  let mnemonic = "quant";
  let summary = "Quantisation of a checkpoint weight: codes, scales, activations";
  let description = [{
    Attached to an `nf.weight` (its `quant` attribute) whose tensors hold
    quantised codes instead of values. A weight made of several parts (one
    tensor per routed expert of a `stacked` weight, or the `concat_rows`
    parts of a packed weight) lists one scale tensor per part, in the order
    of the weight's tensors.

    - `scheme`: the number format of the codes. `fp8_e4m3`: OCP float8 E4M3
      ("FN": finite, max 448). `int4`: signed integers in [-8, 7], symmetric
      (no zero point).
    - `storage`, `pack`: the element type of the checkpoint tensors and how
      many codes one element holds. fp8: `f8E4M3FN`, 1. int4: `i32`, 8: the
      codes of 8 consecutive columns in one word, low nibble first, each
      stored offset by 8 (`code = ((word >> 4*j) & 0xF) - 8`), so a stored
      row has ceil(cols / 8) words (compressed-tensors `pack-quantized`).
    - `granularity`, `group_size`: what one scale covers. For part p with
      rows R_p and the weight's columns C (the input features):
      `per_tensor`, scale shape [] or [1], `W = code * s`;
      `per_channel`, [R_p] or [R_p, 1], `W[r, c] = code[r, c] * s[r]`;
      `per_group`, [R_p, C / group_size], `W[r, c] = code[r, c] *
      s[r, c / group_size]` (groups of consecutive input columns).
    - `symmetric`: true when codes carry no zero point, as in every scheme
      nf reads; asymmetric schemes are not representable yet.
    - `scales`, `scale_types`: the scale tensor of each part and its type as
      stored (f32, bf16 or f16).
    - `activations`: how the linear's input is quantised before the matmul,
      always to fp8 E4M3 with clamping to +-448. `none`: not at all (weight
      only). `static_per_tensor`: `x_q = e4m3(clamp(x / s_in))` with the
      calibrated scalar `s_in` of each part in `input_scales` /
      `input_scale_types`. `dynamic_per_token`: `s = max|x_row| / 448` per
      token, computed at run time.
  }];
  let parameters = (ins
    EnumParameter<Nf_QuantScheme>:$scheme,
    "::mlir::Type":$storage,
    DefaultValuedParameter<"int64_t", "1">:$pack,
    EnumParameter<Nf_QuantGranularity>:$granularity,
    DefaultValuedParameter<"int64_t", "0">:$group_size,
    "bool":$symmetric,
    "::mlir::ArrayAttr":$scales,
    "::mlir::ArrayAttr":$scale_types,
    EnumParameter<Nf_ActivationQuant>:$activations,
    OptionalParameter<"::mlir::ArrayAttr">:$input_scales,
    OptionalParameter<"::mlir::ArrayAttr">:$input_scale_types
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Number of parts (scale tensors) the attribute describes.
    size_t getNumParts() const { return getScales().size(); }
    /// The element type the codes have in a weight's result type:
    /// f8E4M3FN for fp8_e4m3, i4 for int4.
    ::mlir::Type getCodeType() const;
  }];
}

#endif // NF_ATTRS_TD
