// RUN: nf-opt %s -split-input-file -verify-diagnostics

func.func @topk(%s: tensor<?x4xf32>, %budget: tensor<?xf32>) {
  // expected-error @below {{top_k (5) exceeds the number of experts (4)}}
  %e, %w, %n = nf_moe.select %s, %s, %budget {top_k = 5 : i64, min_k = 1 : i64, n_group = 1 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 1.0 : f64, policy = "topk"} : (tensor<?x4xf32>, tensor<?x4xf32>, tensor<?xf32>) -> (tensor<?x5xi32>, tensor<?x5xf32>, tensor<?xi32>)
  return
}

// -----

func.func @min_k(%s: tensor<?x4xf32>, %budget: tensor<?xf32>) {
  // expected-error @below {{min_k (3) exceeds top_k (2)}}
  %e, %w, %n = nf_moe.select %s, %s, %budget {top_k = 2 : i64, min_k = 3 : i64, n_group = 1 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 1.0 : f64, policy = "topk"} : (tensor<?x4xf32>, tensor<?x4xf32>, tensor<?xf32>) -> (tensor<?x2xi32>, tensor<?x2xf32>, tensor<?xi32>)
  return
}

// -----

func.func @policy(%s: tensor<?x4xf32>, %budget: tensor<?xf32>) {
  // expected-error @below {{unknown selection policy 'random' (expected topk or budget)}}
  %e, %w, %n = nf_moe.select %s, %s, %budget {top_k = 2 : i64, min_k = 1 : i64, n_group = 1 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 1.0 : f64, policy = "random"} : (tensor<?x4xf32>, tensor<?x4xf32>, tensor<?xf32>) -> (tensor<?x2xi32>, tensor<?x2xf32>, tensor<?xi32>)
  return
}

// -----

func.func @router(%x: tensor<?x16xf32>, %r: tensor<4x15xf32>, %rb: tensor<4xf32>) {
  // expected-error @below {{router weight has shape [4, 15], expected [4, 16]}}
  %s, %sel = nf_moe.router %x, %r, %rb : (tensor<?x16xf32>, tensor<4x15xf32>, tensor<4xf32>) -> (tensor<?x4xf32>, tensor<?x4xf32>)
  return
}

// -----

func.func @expert(%h: tensor<?x8xf32>, %d: !nf_moe.dispatch<numExperts = 4, maxPerToken = 2>, %down: tensor<3x16x8xf32>) {
  // expected-error @below {{expert weight has shape [3, 16, 8], expected [4, 16, 8]}}
  %y = nf_moe.expert_down %h, %d, %down : (tensor<?x8xf32>, !nf_moe.dispatch<numExperts = 4, maxPerToken = 2>, tensor<3x16x8xf32>) -> tensor<?x16xf32>
  return
}
