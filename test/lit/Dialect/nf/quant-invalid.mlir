// Verifier diagnostics of quantised weights: #nf.quant on its own, then its
// scales against the weight they belong to, then quantised codes where an op
// does not accept them.
// RUN: nf-opt %s -split-input-file -verify-diagnostics

// expected-error @below {{expected ::mlir::nf::QuantScheme to be one of: fp8_e4m3, int4}}
// expected-error @below {{failed to parse Nf_QuantAttr parameter 'scheme'}}
%w = nf.weight ["l.weight"] quant <scheme = nvfp4, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<f32>], activations = none> : tensor<8x16xf8E4M3FN>

// -----

// expected-error @below {{expected ::mlir::nf::QuantGranularity to be one of: per_tensor, per_channel, per_group}}
// expected-error @below {{failed to parse Nf_QuantAttr parameter 'granularity'}}
%w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_block, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<f32>], activations = none> : tensor<8x16xf8E4M3FN>

// -----

// expected-error @below {{quant scheme fp8_e4m3 is stored as f8E4M3FN with pack = 1, got 'i32' with pack = 1}}
%w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = i32, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<f32>], activations = none> : tensor<8x16xf8E4M3FN>

// -----

// expected-error @below {{quant scheme int4 is stored as i32 with pack = 8, got 'i32' with pack = 1}}
%w = nf.weight ["l.weight"] quant <scheme = int4, storage = i32, granularity = per_channel, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<8xf32>], activations = none> : tensor<8x16xi4>

// -----

// expected-error @below {{quant scheme int4 takes unquantised activations (activations = none), got dynamic_per_token}}
%w = nf.weight ["l.weight"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_channel, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<8xf32>], activations = dynamic_per_token> : tensor<8x16xi4>

// -----

// expected-error @below {{quant granularity per_group needs a positive group_size, got 0}}
%w = nf.weight ["l.weight"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_group, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<8x2xf32>], activations = none> : tensor<8x16xi4>

// -----

// expected-error @below {{quant group_size applies to per_group only, got 8 with per_channel}}
%w = nf.weight ["l.weight"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_channel, group_size = 8, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<8xf32>], activations = none> : tensor<8x16xi4>

// -----

// expected-error @below {{quant symmetric = false: asymmetric quantisation (zero points) is not supported}}
%w = nf.weight ["l.weight"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_channel, symmetric = false, scales = ["l.weight_scale"], scale_types = [tensor<8xf32>], activations = none> : tensor<8x16xi4>

// -----

// expected-error @below {{quant lists 1 scales but 2 types in scale_types}}
%w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<f32>, tensor<f32>], activations = none> : tensor<8x16xf8E4M3FN>

// -----

// expected-error @below {{quant scales 'l.weight_scale' has element type 'i32' (expected f32, bf16 or f16)}}
%w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<i32>], activations = none> : tensor<8x16xf8E4M3FN>

// -----

// expected-error @below {{quant activations = static_per_tensor needs input_scales and input_scale_types}}
%w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<f32>], activations = static_per_tensor> : tensor<8x16xf8E4M3FN>

// -----

// expected-error @below {{quant input scale 'l.input_scale' must be a scalar ([] or [1]), got 'tensor<8xf32>'}}
%w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<f32>], activations = static_per_tensor, input_scales = ["l.input_scale"], input_scale_types = [tensor<8xf32>]> : tensor<8x16xf8E4M3FN>

// -----

// expected-error @below {{quant input_scales belong to activations = static_per_tensor, got dynamic_per_token}}
%w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<f32>], activations = dynamic_per_token, input_scales = ["l.input_scale"], input_scale_types = [tensor<f32>]> : tensor<8x16xf8E4M3FN>

// -----

//===----------------------------------------------------------------------===//
// Scales against the weight.
//===----------------------------------------------------------------------===//

// expected-error @below {{scale 'l.weight_scale' of 'l.weight' has shape [2], expected [] or [1] (per_tensor)}}
%w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<2xf32>], activations = none> : tensor<8x16xf8E4M3FN>

// -----

// expected-error @below {{scale 'l.weight_scale' of 'l.weight' has shape [7, 1], expected [8] or [8, 1] (per_channel)}}
%w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_channel, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<7x1xf32>], activations = dynamic_per_token> : tensor<8x16xf8E4M3FN>

// -----

// expected-error @below {{scale 'l.weight_scale' of 'l.weight' has shape [8, 4], expected [8, 2] (per_group, 8 columns per scale)}}
%w = nf.weight ["l.weight"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_group, group_size = 8, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<8x4xf32>], activations = none> : tensor<8x16xi4>

// -----

// expected-error @below {{quant group_size 5 does not divide the 16 input columns of 'l.weight'}}
%w = nf.weight ["l.weight"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_group, group_size = 5, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<8x3xf32>], activations = none> : tensor<8x16xi4>

// -----

// Each concatenated part is checked against its own rows.
// expected-error @below {{scale 'k.s' of 'k' has shape [8, 1], expected [4] or [4, 1] (per_channel)}}
%w = nf.weight ["q", "k"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_channel, symmetric = true, scales = ["q.s", "k.s"], scale_types = [tensor<8x1xf32>, tensor<8x1xf32>], activations = dynamic_per_token> {concat_rows = array<i64: 8, 4>} : tensor<12x16xf8E4M3FN>

// -----

// expected-error @below {{quant of 'q' lists 1 scales for 2 weight tensors (one per part)}}
%w = nf.weight ["q", "k"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["q.s"], scale_types = [tensor<f32>], activations = none> {concat_rows = array<i64: 8, 4>} : tensor<12x16xf8E4M3FN>

// -----

// expected-error @below {{quantised stacked weight 'experts.up_proj' must list one tensor per expert (4), got 1}}
%w = nf.weight stacked ["experts.up_proj"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["experts.up_proj.s"], scale_types = [tensor<4xf32>], activations = none> : tensor<4x8x16xf8E4M3FN>

// -----

// expected-error @below {{quantised weight 'l.weight' (int4) must have element type 'i4', got 'f8E4M3FN'}}
%w = nf.weight ["l.weight"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_channel, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<8xf32>], activations = none> : tensor<8x16xf8E4M3FN>

// -----

// expected-error @below {{quantised weight 'l.weight' (fp8_e4m3) must have element type 'f8E4M3FN', got 'f32'}}
%w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<f32>], activations = none> : tensor<8x16xf32>

// -----

// expected-error @below {{quantised weight 'norm' must be a matrix [rows, cols], got 'tensor<16xf8E4M3FN>'}}
%w = nf.weight ["norm"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["norm.s"], scale_types = [tensor<f32>], activations = none> : tensor<16xf8E4M3FN>

// -----

// expected-error @below {{weight 'l.weight' has element type 'f8E4M3FN' (quantised codes) but no quant attribute}}
%w = nf.weight ["l.weight"] : tensor<8x16xf8E4M3FN>

// -----

//===----------------------------------------------------------------------===//
// Quantised codes are accepted for linear projections only.
//===----------------------------------------------------------------------===//

func.func @quantised_router(%x: tensor<?x16xf32>) -> tensor<?x16xf32> {
  %r = nf.weight ["gate"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["gate.s"], scale_types = [tensor<f32>], activations = none> : tensor<2x16xf8E4M3FN>
  %rb = nf.weight ["bias"] : tensor<2xf32>
  %eu = nf.weight stacked ["e.up"] : tensor<2x8x16xf32>
  %ed = nf.weight stacked ["e.down"] : tensor<2x16x8xf32>
  %su = nf.weight ["su"] : tensor<8x16xf32>
  %sd = nf.weight ["sd"] : tensor<16x8xf32>
  // expected-error @below {{router weight has unsupported element type 'f8E4M3FN' (expected f32, bf16 or f16; only linear projections may be quantised)}}
  %m = nf.moe %x, %r, %rb, %eu, %ed, %su, %sd {num_experts = 2 : i64, top_k = 1 : i64, n_group = 1 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 1.0 : f64} : (tensor<?x16xf32>, tensor<2x16xf8E4M3FN>, tensor<2xf32>, tensor<2x8x16xf32>, tensor<2x16x8xf32>, tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  return %m : tensor<?x16xf32>
}

// -----

func.func @i8_linear(%x: tensor<?x16xf32>, %w: tensor<8x16xi8>) -> tensor<?x8xf32> {
  // expected-error @below {{linear weight has unsupported element type 'i8' (expected f32, bf16, f16, or quantised codes f8E4M3FN or i4)}}
  %y = nf.linear %x, %w : (tensor<?x16xf32>, tensor<8x16xi8>) -> tensor<?x8xf32>
  return %y : tensor<?x8xf32>
}
