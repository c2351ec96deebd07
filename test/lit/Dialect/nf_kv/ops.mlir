// RUN: nf-opt %s | FileCheck %s
// RUN: nf-opt %s | nf-opt | FileCheck %s
// RUN: nf-opt %s --mlir-print-op-generic | nf-opt | FileCheck %s

// CHECK: nf_kv.kv_cache @kv layer 1 : !nf_kv.kv_cache<pageSize = 16, numPages = 8, kvHeads = 2, headDim = 4, elementType = f32>
nf_kv.kv_cache @kv layer 1 : !nf_kv.kv_cache<pageSize = 16, numPages = 8, kvHeads = 2, headDim = 4, elementType = f32>
// CHECK: nf_kv.kv_cache @tiered layer 3 {hot_window = 128 : i64} : !nf_kv.kv_cache<pageSize = 16, numPages = 8, kvHeads = 2, headDim = 4, elementType = f8E4M3FN>
nf_kv.kv_cache @tiered layer 3 {hot_window = 128 : i64} : !nf_kv.kv_cache<pageSize = 16, numPages = 8, kvHeads = 2, headDim = 4, elementType = f8E4M3FN>
// CHECK: nf_kv.mamba_state @ssm layer 0 : !nf_kv.mamba_state<slots = 4, convDim = 32, convWindow = 3, numHeads = 4, headDim = 4, stateSize = 4>
nf_kv.mamba_state @ssm layer 0 : !nf_kv.mamba_state<slots = 4, convDim = 32, convWindow = 3, numHeads = 4, headDim = 4, stateSize = 4>

// CHECK-LABEL: func.func @attention
func.func @attention(%b: !nf_kv.batch, %q: tensor<?x16xf32>, %k: tensor<?x8xf32>, %v: tensor<?x8xf32>) -> tensor<?x16xf32> {
  // CHECK: nf_kv.append @kv, %{{.*}}, %{{.*}}, %{{.*}} : tensor<?x8xf32>, tensor<?x8xf32>
  nf_kv.append @kv, %b, %k, %v : tensor<?x8xf32>, tensor<?x8xf32>
  // CHECK: nf_kv.attend @kv, {{.*}} {mode = "decode", num_heads = 4 : i64, scale = 5.000000e-01 : f64}
  %o = nf_kv.attend @kv, %b, %q {mode = "decode", num_heads = 4 : i64, scale = 0.5 : f64} : tensor<?x16xf32> -> tensor<?x16xf32>
  return %o : tensor<?x16xf32>
}

// CHECK-LABEL: func.func @mamba
func.func @mamba(%b: !nf_kv.batch, %xbc: tensor<?x32xf32>, %dt: tensor<?x4xf32>, %w: tensor<32x1x4xbf16>, %bias: tensor<32xbf16>, %v: tensor<4xf32>) -> (tensor<?x16xf32>, tensor<?x16xf32>) {
  // CHECK: nf_kv.causal_conv @ssm
  %c = nf_kv.causal_conv @ssm, %b, %xbc, %w, %bias {mode = "prefill"} : (!nf_kv.batch, tensor<?x32xf32>, tensor<32x1x4xbf16>, tensor<32xbf16>) -> tensor<?x32xf32>
  // CHECK: nf_kv.causal_conv @ssm, {{.*}} {mode = "decode"} : (!nf_kv.batch, tensor<?x32xf32>, tensor<32x1x4xbf16>) -> tensor<?x32xf32>
  %c2 = nf_kv.causal_conv @ssm, %b, %xbc, %w {mode = "decode"} : (!nf_kv.batch, tensor<?x32xf32>, tensor<32x1x4xbf16>) -> tensor<?x32xf32>
  // CHECK: nf_kv.ssm_scan @ssm
  %y = nf_kv.ssm_scan @ssm, %b, %c, %dt, %v, %v, %v {chunk_size = 8 : i64, n_groups = 2 : i64, time_step_min = 0.0 : f64, time_step_max = 0x7FF0000000000000 : f64} : (!nf_kv.batch, tensor<?x32xf32>, tensor<?x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<?x16xf32>
  // CHECK: nf_kv.ssm_update @ssm
  %y2 = nf_kv.ssm_update @ssm, %b, %c2, %dt, %v, %v, %v {n_groups = 2 : i64, time_step_min = 0.0 : f64, time_step_max = 0x7FF0000000000000 : f64} : (!nf_kv.batch, tensor<?x32xf32>, tensor<?x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<?x16xf32>
  return %y, %y2 : tensor<?x16xf32>, tensor<?x16xf32>
}
