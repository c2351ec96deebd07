// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers --nf-lower-moe | FileCheck %s
// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers --nf-lower-moe="policy=budget min-k=1" | FileCheck %s --check-prefix=BUDGET
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-moe="policy=budget min-k=3" 2>&1 | FileCheck %s --check-prefix=MINK
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-moe="policy=random" 2>&1 | FileCheck %s --check-prefix=POLICY
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-lower-moe 2>&1 | FileCheck %s --check-prefix=NOSTEP

// CHECK-LABEL: func.func @prefill
// CHECK-SAME: %[[BGT:[^:]*]]: tensor<?xf32> {nf.arg = "expert_budget"}
// CHECK: %[[SC:.*]], %[[SEL:.*]] = nf_moe.router %[[X:[0-9]+]], {{.*}} -> (tensor<?x4xf32>, tensor<?x4xf32>)
// CHECK: %[[E:.*]], %[[W:.*]], %[[N:.*]] = nf_moe.select %[[SC]], %[[SEL]], %[[BGT]] {min_k = 2 : i64, n_group = 2 : i64, norm_topk_prob = true, policy = "topk", routed_scaling_factor = 2.500000e+00 : f64, top_k = 2 : i64, topk_group = 1 : i64} {{.*}} -> (tensor<?x2xi32>, tensor<?x2xf32>, tensor<?xi32>)
// CHECK: %[[D:.*]] = nf_moe.dispatch %[[E]], %[[N]] {{.*}} -> !nf_moe.dispatch<numExperts = 4, maxPerToken = 2>
// CHECK: %[[XE:.*]] = nf_moe.latent_proj %[[X]], {{.*}} {direction = "down"} {{.*}} -> tensor<?x8xf32>
// CHECK: %[[H:.*]] = nf_moe.expert_up %[[XE]], %[[D]]
// CHECK: %[[Y:.*]] = nf_moe.expert_down %[[H]], %[[D]]
// CHECK: %[[R:.*]] = nf_moe.combine %[[Y]], %[[D]], %[[W]]
// CHECK: %[[RU:.*]] = nf_moe.latent_proj %[[R]], {{.*}} {direction = "up"} {{.*}} -> tensor<?x16xf32>
// Shared expert on the un-projected input.
// CHECK: %[[SH:.*]] = nf_moe.shared_expert %[[X]]
// CHECK: nf.add %[[RU]], %[[SH]]
// CHECK-NOT: nf.moe

// BUDGET: nf_moe.select {{.*}} {min_k = 1 : i64, {{.*}} policy = "budget"
// MINK: error: 'nf.moe' op min-k (3) exceeds top_k (2)
// POLICY: error: nf-lower-moe: unknown policy 'random' (expected topk or budget)
// NOSTEP: error: 'nf.moe' op must be inside a step function with an 'expert_budget' argument (run nf-outline-steps)
