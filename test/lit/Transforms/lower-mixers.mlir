// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers="max-sequences=8 page-size=32 kv-pages=100" | FileCheck %s
// RUN: nf-opt %s --nf-outline-steps --nf-lower-mixers -split-input-file -verify-diagnostics
// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers="kv-dtype=bf16" | FileCheck %s --check-prefix=BF16
// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers="kv-dtype=fp8" | FileCheck %s --check-prefix=FP8
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers="kv-dtype=f16" 2>&1 | FileCheck %s --check-prefix=BADDTYPE
// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers="kv-dtype=fp8 kv-hot-window=64" | FileCheck %s --check-prefix=TIERED
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers="kv-dtype=bf16 kv-hot-window=64" 2>&1 | FileCheck %s --check-prefix=BADWINDOW

// kv-dtype: what the cache stores (the K/V rows stay f32 activations).
// BF16: nf_kv.kv_cache @kv_cache_1 layer 1 : !nf_kv.kv_cache<{{.*}}elementType = bf16>
// FP8: nf_kv.kv_cache @kv_cache_1 layer 1 : !nf_kv.kv_cache<{{.*}}elementType = f8E4M3FN>
// TIERED: nf_kv.kv_cache @kv_cache_1 layer 1 {hot_window = 64 : i64} : !nf_kv.kv_cache<{{.*}}elementType = f8E4M3FN>
// BADWINDOW: error: nf-lower-mixers: kv-hot-window needs kv-dtype fp8 and a positive window
// BADDTYPE: error: nf-lower-mixers: kv-dtype must be f32, bf16 or fp8, got 'f16'

// Storage is declared once per layer, before the steps, and shared by them.
// CHECK: nf_kv.mamba_state @mamba_state_0 layer 0 : !nf_kv.mamba_state<slots = 8, convDim = 32, convWindow = 3, numHeads = 4, headDim = 4, stateSize = 4>
// CHECK-NEXT: nf_kv.kv_cache @kv_cache_1 layer 1 : !nf_kv.kv_cache<pageSize = 32, numPages = 100, kvHeads = 2, headDim = 4, elementType = f32>
// CHECK-NEXT: func.func @prefill

// Prefill: conv over the window, chunked scan.
// CHECK: %[[ZXBCDT:.*]] = nf.linear %{{.*}} -> tensor<?x52xf32>
// CHECK: %[[S:.*]]:3 = nf.split %[[ZXBCDT]] [16, 32, 4]
// CHECK: %[[C:.*]] = nf_kv.causal_conv @mamba_state_0, %arg1, %[[S]]#1, {{.*}} {mode = "prefill"}
// CHECK: %[[Y:.*]] = nf_kv.ssm_scan @mamba_state_0, %arg1, %[[C]], %[[S]]#2, {{.*}} {chunk_size = 8 : i64, n_groups = 2 : i64
// CHECK: nf.gated_rms_norm %[[Y]], %[[S]]#0, {{.*}} {epsilon = 1.000000e-05 : f64, groups = 2 : i64}
// CHECK-NEXT: nf.linear {{.*}} -> tensor<?x16xf32>
// Attention: projections, append, attend, o_proj.
// CHECK: %[[Q:[0-9]+]] = nf.linear {{.*}} -> tensor<?x16xf32>
// CHECK: %[[K:[0-9]+]] = nf.linear {{.*}} -> tensor<?x8xf32>
// CHECK: %[[V:[0-9]+]] = nf.linear {{.*}} -> tensor<?x8xf32>
// CHECK: nf_kv.append @kv_cache_1, %arg1, %[[K]], %[[V]]
// CHECK: nf_kv.attend @kv_cache_1, %arg1, %[[Q]] {mode = "prefill", num_heads = 4 : i64, scale = 5.000000e-01 : f64}
// MLP.
// CHECK: nf.activation "relu2"
// MoE is left to nf-lower-moe.
// CHECK: nf.moe

// Decode: one state update per sequence.
// CHECK: func.func @decode
// CHECK: nf_kv.causal_conv @mamba_state_0, {{.*}} {mode = "decode"}
// CHECK: nf_kv.ssm_update @mamba_state_0
// CHECK-NOT: nf_kv.ssm_scan
// CHECK: nf_kv.attend @kv_cache_1, {{.*}} {mode = "decode"

// -----

nf.model @rope attributes {vocab_size = 4 : i64, hidden_size = 8 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %w = nf.weight ["w"] : tensor<4x8xf32>
  %p = nf.weight ["p"] : tensor<8x8xf32>
  %h = nf.embed %tokens, %w : (tensor<?xi32>, tensor<4x8xf32>) -> tensor<?x8xf32>
  // expected-error @below {{rotary position embeddings are not supported yet}}
  %a = nf.attention %h, %p, %p, %p, %p {num_heads = 2 : i64, num_kv_heads = 2 : i64, head_dim = 4 : i64, rope_theta = 10000.0 : f64} : (tensor<?x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<?x8xf32>
  %l = nf.lm_head %a, %w : (tensor<?x8xf32>, tensor<4x8xf32>) -> tensor<?x4xf32>
  nf.output %l : tensor<?x4xf32>
}
