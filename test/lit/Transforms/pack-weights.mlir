// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers --nf-pack-weights | FileCheck %s
// RUN: nf-opt %s --nf-pack-weights | FileCheck %s --check-prefix=MIXED
// RUN: nf-opt %s --nf-pack-weights | FileCheck %s --check-prefix=QUANT

// q/k/v read the same input: one GEMM over a concatenated weight, then a split.
// CHECK-LABEL: func.func @prefill
// CHECK: %[[QKV:.*]] = nf.weight ["q", "k", "v"] {concat_rows = array<i64: 16, 8, 8>} : tensor<32x16xf32>
// CHECK: %[[P:.*]] = nf.linear %{{.*}}, %[[QKV]] : {{.*}} -> tensor<?x32xf32>
// CHECK: %[[S:.*]]:3 = nf.split %[[P]] [16, 8, 8]
// CHECK: nf_kv.append @kv_cache_1, %arg1, %[[S]]#1, %[[S]]#2
// CHECK: nf_kv.attend @kv_cache_1, %arg1, %[[S]]#0
// The unfused weights are gone.
// CHECK-NOT: nf.weight ["k"]

// Weights of different dtypes are not concatenated.
func.func @mixed(%x: tensor<?x4xf32>) -> (tensor<?x4xf32>, tensor<?x2xf32>) {
  %a = nf.weight ["a"] : tensor<4x4xf32>
  %b = nf.weight ["b"] : tensor<2x4xbf16>
  // MIXED: nf.linear %{{.*}}, %{{.*}} : (tensor<?x4xf32>, tensor<4x4xf32>)
  // MIXED: nf.linear %{{.*}}, %{{.*}} : (tensor<?x4xf32>, tensor<2x4xbf16>)
  // MIXED-NOT: nf.split
  // MIXED: return
  %0 = nf.linear %x, %a : (tensor<?x4xf32>, tensor<4x4xf32>) -> tensor<?x4xf32>
  %1 = nf.linear %x, %b : (tensor<?x4xf32>, tensor<2x4xbf16>) -> tensor<?x2xf32>
  return %0, %1 : tensor<?x4xf32>, tensor<?x2xf32>
}

// Quantised weights concatenate when they are quantised the same way, and the
// packed weight lists each part's scales (and input scales) in order.
// QUANT-LABEL: func.func @quantised_qkv
// QUANT: %[[W:.*]] = nf.weight ["q", "k", "v"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["q.s", "k.s", "v.s"], scale_types = [tensor<f32>, tensor<f32>, tensor<f32>], activations = static_per_tensor, input_scales = ["q.in", "k.in", "v.in"], input_scale_types = [tensor<f32>, tensor<f32>, tensor<f32>]> {concat_rows = array<i64: 8, 4, 4>} : tensor<16x16xf8E4M3FN>
// QUANT: nf.linear %{{.*}}, %[[W]] : (tensor<?x16xf32>, tensor<16x16xf8E4M3FN>) -> tensor<?x16xf32>
// QUANT: nf.split
func.func @quantised_qkv(%x: tensor<?x16xf32>) -> (tensor<?x8xf32>, tensor<?x4xf32>, tensor<?x4xf32>) {
  %q = nf.weight ["q"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["q.s"], scale_types = [tensor<f32>], activations = static_per_tensor, input_scales = ["q.in"], input_scale_types = [tensor<f32>]> : tensor<8x16xf8E4M3FN>
  %k = nf.weight ["k"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["k.s"], scale_types = [tensor<f32>], activations = static_per_tensor, input_scales = ["k.in"], input_scale_types = [tensor<f32>]> : tensor<4x16xf8E4M3FN>
  %v = nf.weight ["v"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["v.s"], scale_types = [tensor<f32>], activations = static_per_tensor, input_scales = ["v.in"], input_scale_types = [tensor<f32>]> : tensor<4x16xf8E4M3FN>
  %0 = nf.linear %x, %q : (tensor<?x16xf32>, tensor<8x16xf8E4M3FN>) -> tensor<?x8xf32>
  %1 = nf.linear %x, %k : (tensor<?x16xf32>, tensor<4x16xf8E4M3FN>) -> tensor<?x4xf32>
  %2 = nf.linear %x, %v : (tensor<?x16xf32>, tensor<4x16xf8E4M3FN>) -> tensor<?x4xf32>
  return %0, %1, %2 : tensor<?x8xf32>, tensor<?x4xf32>, tensor<?x4xf32>
}

// Weights quantised differently (here per-tensor and per-channel scales) are
// not concatenated.
// QUANT-LABEL: func.func @different_granularity
// QUANT-NOT: concat_rows
// QUANT: return
func.func @different_granularity(%x: tensor<?x16xf32>) -> (tensor<?x8xf32>, tensor<?x4xf32>) {
  %a = nf.weight ["a"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["a.s"], scale_types = [tensor<f32>], activations = dynamic_per_token> : tensor<8x16xf8E4M3FN>
  %b = nf.weight ["b"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_channel, symmetric = true, scales = ["b.s"], scale_types = [tensor<4x1xf32>], activations = dynamic_per_token> : tensor<4x16xf8E4M3FN>
  %0 = nf.linear %x, %a : (tensor<?x16xf32>, tensor<8x16xf8E4M3FN>) -> tensor<?x8xf32>
  %1 = nf.linear %x, %b : (tensor<?x16xf32>, tensor<4x16xf8E4M3FN>) -> tensor<?x4xf32>
  return %0, %1 : tensor<?x8xf32>, tensor<?x4xf32>
}

// Nor are quantised and unquantised weights.
// QUANT-LABEL: func.func @quantised_and_plain
// QUANT-NOT: concat_rows
// QUANT: return
func.func @quantised_and_plain(%x: tensor<?x16xf32>) -> (tensor<?x8xf32>, tensor<?x4xf32>) {
  %a = nf.weight ["a"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_group, group_size = 8, symmetric = true, scales = ["a.s"], scale_types = [tensor<8x2xf32>], activations = none> : tensor<8x16xi4>
  %b = nf.weight ["b"] : tensor<4x16xf32>
  %0 = nf.linear %x, %a : (tensor<?x16xf32>, tensor<8x16xi4>) -> tensor<?x8xf32>
  %1 = nf.linear %x, %b : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
  return %0, %1 : tensor<?x8xf32>, tensor<?x4xf32>
}
