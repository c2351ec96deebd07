// RUN: nf-opt %s | FileCheck %s
// RUN: nf-opt %s --mlir-print-op-generic | nf-opt | FileCheck %s

// CHECK-LABEL: func.func @moe
func.func @moe(%x: tensor<?x16xf32>, %budget: tensor<?xf32>, %r: tensor<4x16xbf16>, %rb: tensor<4xf32>, %up: tensor<4x8x16xbf16>, %down: tensor<4x16x8xbf16>, %su: tensor<12x16xbf16>, %sd: tensor<16x12xbf16>) -> tensor<?x16xf32> {
  // CHECK: nf_moe.router
  %s, %sel = nf_moe.router %x, %r, %rb : (tensor<?x16xf32>, tensor<4x16xbf16>, tensor<4xf32>) -> (tensor<?x4xf32>, tensor<?x4xf32>)
  // CHECK: nf_moe.select {{.*}}policy = "budget"
  %e, %w, %n = nf_moe.select %s, %sel, %budget {top_k = 2 : i64, min_k = 1 : i64, n_group = 1 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 2.5 : f64, policy = "budget"} : (tensor<?x4xf32>, tensor<?x4xf32>, tensor<?xf32>) -> (tensor<?x2xi32>, tensor<?x2xf32>, tensor<?xi32>)
  // CHECK: nf_moe.dispatch {{.*}} -> !nf_moe.dispatch<numExperts = 4, maxPerToken = 2>
  %d = nf_moe.dispatch %e, %n : (tensor<?x2xi32>, tensor<?xi32>) -> !nf_moe.dispatch<numExperts = 4, maxPerToken = 2>
  %h = nf_moe.expert_up %x, %d, %up : (tensor<?x16xf32>, !nf_moe.dispatch<numExperts = 4, maxPerToken = 2>, tensor<4x8x16xbf16>) -> tensor<?x8xf32>
  %y = nf_moe.expert_down %h, %d, %down : (tensor<?x8xf32>, !nf_moe.dispatch<numExperts = 4, maxPerToken = 2>, tensor<4x16x8xbf16>) -> tensor<?x16xf32>
  // CHECK: nf_moe.combine
  %c = nf_moe.combine %y, %d, %w : (tensor<?x16xf32>, !nf_moe.dispatch<numExperts = 4, maxPerToken = 2>, tensor<?x2xf32>) -> tensor<?x16xf32>
  // CHECK: nf_moe.shared_expert
  %sh = nf_moe.shared_expert %x, %su, %sd : (tensor<?x16xf32>, tensor<12x16xbf16>, tensor<16x12xbf16>) -> tensor<?x16xf32>
  %out = nf.add %c, %sh : tensor<?x16xf32>
  return %out : tensor<?x16xf32>
}
