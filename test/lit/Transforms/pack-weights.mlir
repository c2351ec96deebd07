// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers --nf-pack-weights | FileCheck %s
// RUN: nf-opt %s --nf-pack-weights | FileCheck %s --check-prefix=MIXED

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
  %0 = nf.linear %x, %a : (tensor<?x4xf32>, tensor<4x4xf32>) -> tensor<?x4xf32>
  %1 = nf.linear %x, %b : (tensor<?x4xf32>, tensor<2x4xbf16>) -> tensor<?x2xf32>
  return %0, %1 : tensor<?x4xf32>, tensor<?x2xf32>
}
