// Quantised weights (#nf.quant on nf.weight): every scheme nf reads, a
// concatenated weight with one scale per part, stacked experts with one scale
// per expert, and the attribute on its own. Custom and generic forms round-trip.
// RUN: nf-opt %s | FileCheck %s
// RUN: nf-opt %s | nf-opt | FileCheck %s
// RUN: nf-opt %s --mlir-print-op-generic | nf-opt | FileCheck %s

// CHECK-LABEL: func.func @fp8_static_per_tensor
// CHECK: nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<f32>], activations = static_per_tensor, input_scales = ["l.input_scale"], input_scale_types = [tensor<1xf32>]> : tensor<8x16xf8E4M3FN>
// CHECK: nf.linear {{.*}} : (tensor<?x16xf32>, tensor<8x16xf8E4M3FN>) -> tensor<?x8xf32>
func.func @fp8_static_per_tensor(%x: tensor<?x16xf32>) -> tensor<?x8xf32> {
  %w = nf.weight ["l.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<f32>], activations = static_per_tensor, input_scales = ["l.input_scale"], input_scale_types = [tensor<1xf32>]> : tensor<8x16xf8E4M3FN>
  %y = nf.linear %x, %w : (tensor<?x16xf32>, tensor<8x16xf8E4M3FN>) -> tensor<?x8xf32>
  return %y : tensor<?x8xf32>
}

// Per-channel scales as [rows] or [rows, 1]; bf16 scales.
// CHECK-LABEL: func.func @fp8_dynamic_per_channel
// CHECK: scale_types = [tensor<8xbf16>], activations = dynamic_per_token> : tensor<8x16xf8E4M3FN>
// CHECK: scale_types = [tensor<8x1xf32>], activations = dynamic_per_token> : tensor<8x16xf8E4M3FN>
func.func @fp8_dynamic_per_channel(%x: tensor<?x16xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>) {
  %a = nf.weight ["a.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_channel, symmetric = true, scales = ["a.weight_scale"], scale_types = [tensor<8xbf16>], activations = dynamic_per_token> : tensor<8x16xf8E4M3FN>
  %b = nf.weight ["b.weight"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_channel, symmetric = true, scales = ["b.weight_scale"], scale_types = [tensor<8x1xf32>], activations = dynamic_per_token> : tensor<8x16xf8E4M3FN>
  %ya = nf.linear %x, %a : (tensor<?x16xf32>, tensor<8x16xf8E4M3FN>) -> tensor<?x8xf32>
  %yb = nf.linear %x, %b : (tensor<?x16xf32>, tensor<8x16xf8E4M3FN>) -> tensor<?x8xf32>
  return %ya, %yb : tensor<?x8xf32>, tensor<?x8xf32>
}

// int4 codes, 8 per i32, one scale per 4 input columns; weight only.
// CHECK-LABEL: func.func @int4_per_group
// CHECK: nf.weight ["l.weight_packed"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_group, group_size = 4, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<8x4xf16>], activations = none> : tensor<8x16xi4>
func.func @int4_per_group(%x: tensor<?x16xf32>) -> tensor<?x8xf32> {
  %w = nf.weight ["l.weight_packed"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_group, group_size = 4, symmetric = true, scales = ["l.weight_scale"], scale_types = [tensor<8x4xf16>], activations = none> : tensor<8x16xi4>
  %y = nf.linear %x, %w : (tensor<?x16xf32>, tensor<8x16xi4>) -> tensor<?x8xf32>
  return %y : tensor<?x8xf32>
}

// A concatenated (fused QKV) weight keeps each part's scales, checked
// against each part's rows.
// CHECK-LABEL: func.func @concat_parts
// CHECK: nf.weight ["q", "k", "v"] quant <{{.*}}granularity = per_channel{{.*}}scales = ["q.s", "k.s", "v.s"], scale_types = [tensor<8x1xf32>, tensor<4x1xf32>, tensor<4x1xf32>]{{.*}}> {concat_rows = array<i64: 8, 4, 4>} : tensor<16x16xf8E4M3FN>
func.func @concat_parts(%x: tensor<?x16xf32>) -> tensor<?x16xf32> {
  %w = nf.weight ["q", "k", "v"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_channel, symmetric = true, scales = ["q.s", "k.s", "v.s"], scale_types = [tensor<8x1xf32>, tensor<4x1xf32>, tensor<4x1xf32>], activations = dynamic_per_token> {concat_rows = array<i64: 8, 4, 4>} : tensor<16x16xf8E4M3FN>
  %y = nf.linear %x, %w : (tensor<?x16xf32>, tensor<16x16xf8E4M3FN>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// Stacked experts list one scale (and input scale) per expert; the router and
// its bias stay unquantised.
// CHECK-LABEL: func.func @moe_experts
// CHECK: nf.weight stacked ["e0.up", "e1.up"] quant <{{.*}}scales = ["e0.up.s", "e1.up.s"]{{.*}}input_scales = ["e0.up.in", "e1.up.in"]{{.*}}> : tensor<2x8x16xf8E4M3FN>
// CHECK: nf.moe {{.*}} : (tensor<?x16xf32>, tensor<2x16xf32>, tensor<2xf32>, tensor<2x8x16xf8E4M3FN>, tensor<2x16x8xf8E4M3FN>, tensor<8x16xi4>, tensor<16x8xf32>) -> tensor<?x16xf32>
func.func @moe_experts(%x: tensor<?x16xf32>) -> tensor<?x16xf32> {
  %r = nf.weight ["gate"] : tensor<2x16xf32>
  %rb = nf.weight ["bias"] : tensor<2xf32>
  %eu = nf.weight stacked ["e0.up", "e1.up"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["e0.up.s", "e1.up.s"], scale_types = [tensor<f32>, tensor<f32>], activations = static_per_tensor, input_scales = ["e0.up.in", "e1.up.in"], input_scale_types = [tensor<f32>, tensor<f32>]> : tensor<2x8x16xf8E4M3FN>
  %ed = nf.weight stacked ["e0.down", "e1.down"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_channel, symmetric = true, scales = ["e0.down.s", "e1.down.s"], scale_types = [tensor<16xf32>, tensor<16xf32>], activations = dynamic_per_token> : tensor<2x16x8xf8E4M3FN>
  %su = nf.weight ["su"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_channel, symmetric = true, scales = ["su.s"], scale_types = [tensor<8x1xf32>], activations = none> : tensor<8x16xi4>
  %sd = nf.weight ["sd"] : tensor<16x8xf32>
  %m = nf.moe %x, %r, %rb, %eu, %ed, %su, %sd {num_experts = 2 : i64, top_k = 1 : i64, n_group = 1 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 1.0 : f64} : (tensor<?x16xf32>, tensor<2x16xf32>, tensor<2xf32>, tensor<2x8x16xf8E4M3FN>, tensor<2x16x8xf8E4M3FN>, tensor<8x16xi4>, tensor<16x8xf32>) -> tensor<?x16xf32>
  return %m : tensor<?x16xf32>
}

// The attribute alone, in its full dialect form.
// CHECK-LABEL: func.func @attribute
// CHECK-SAME: nf.q = #nf.quant<scheme = int4, storage = i32, pack = 8, granularity = per_group, group_size = 32, symmetric = true, scales = ["w.s"], scale_types = [tensor<4x2xf32>], activations = none>
func.func @attribute() attributes {nf.q = #nf.quant<scheme = int4, storage = i32, pack = 8, granularity = per_group, group_size = 32, symmetric = true, scales = ["w.s"], scale_types = [tensor<4x2xf32>], activations = none>} {
  return
}
