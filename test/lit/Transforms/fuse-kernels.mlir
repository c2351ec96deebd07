// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers --nf-lower-moe --nf-pack-weights --nf-fuse-kernels | FileCheck %s
// RUN: nf-opt %s --nf-fuse-kernels | FileCheck %s --check-prefix=PLAIN
// RUN: nfc import %fixtures/tiny-hybrid-bf16 -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o - | FileCheck %s --check-prefix=SHARED

// Every compute op of a step ends up in exactly one kernel; weights stay
// outside as operands.
// CHECK-LABEL: func.func @prefill
// CHECK-COUNT-27: nf.weight
// CHECK: nf.kernel "nf_embed"
// CHECK: nf.kernel "nf_rms_norm"
// CHECK: nf.kernel "linear_split"
// CHECK: nf.kernel "nf_kv_causal_conv"
// CHECK: nf.kernel "mamba_ssd_scan"
// CHECK: nf.kernel "nf_gated_rms_norm"
// CHECK: nf.kernel "nf_linear"
// CHECK: %[[AN:.*]]:2 = nf.kernel "add_rms_norm"
// CHECK-NEXT: ^bb0(%[[A0:.*]]: tensor<?x16xf32>, %[[A1:.*]]: tensor<?x16xf32>, %[[A2:.*]]: tensor<16xf32>):
// CHECK-NEXT: %[[SUM:.*]] = nf.add %[[A0]], %[[A1]]
// CHECK-NEXT: %[[NORM:.*]] = nf.rms_norm %[[SUM]], %[[A2]]
// CHECK-NEXT: nf.yield %[[SUM]], %[[NORM]]
// CHECK: nf.kernel "qkv_proj_append"(%[[AN]]#1,
// CHECK: nf.linear
// CHECK-NEXT: nf.split
// CHECK-NEXT: nf_kv.append
// CHECK: nf.kernel "nf_kv_attend"
// CHECK: nf.kernel "linear_relu2"
// CHECK: nf.kernel "moe_route"
// CHECK-NEXT: ^bb0
// CHECK-NEXT: nf_moe.router
// CHECK-NEXT: nf_moe.select
// CHECK-NEXT: nf_moe.dispatch
// CHECK: nf.kernel "moe_expert_up_relu2"
// CHECK: nf.kernel "moe_expert_down_combine"
// CHECK-NEXT: ^bb0
// CHECK-NEXT: nf_moe.expert_down
// CHECK-NEXT: nf_moe.combine
// CHECK: nf.kernel "moe_shared_expert_add"
// CHECK-NEXT: ^bb0({{.*}}, %[[R:.*]]: tensor<?x16xf32>):
// CHECK-NEXT: %[[SH:.*]] = nf_moe.shared_expert
// CHECK-NEXT: nf.add %[[R]], %[[SH]]
// CHECK: nf.kernel "nf_lm_head"
// CHECK: return

// Decode (one token per sequence) fuses the conv with in_proj (per channel,
// in the GEMM's epilogue), and the state update with the gated norm.
// CHECK-LABEL: func.func @decode
// CHECK: nf.kernel "linear_split_conv"
// CHECK-NEXT: ^bb0
// CHECK-NEXT: nf.linear
// CHECK-NEXT: nf.split
// CHECK-NEXT: nf_kv.causal_conv {{.*}}mode = "decode"
// CHECK-NEXT: nf.yield
// CHECK: nf.kernel "mamba_ssm_decode"
// CHECK-NEXT: ^bb0
// CHECK-NEXT: nf_kv.ssm_update
// CHECK-NEXT: nf.gated_rms_norm
// CHECK-NEXT: nf.yield

// With a shared expert (and no latent projection after the combine), decode
// moves the shared expert next to its layer's router and fuses the whole
// layer into one kernel: the shared expert, the routing chain, the routed
// experts' projections and the layer's end (combine, the add of the shared
// rows, the residual add) with the next RMSNorm (the code generator runs the
// shared expert's GEMVs beside launches of that kernel, and ends steps of one
// token in the down projection's launch); prefill keeps the combine with the
// routed down projection.
// SHARED-LABEL: func.func @prefill
// SHARED: nf.kernel "moe_expert_down_combine"
// SHARED: nf.kernel "moe_shared_expert_add"
// SHARED-LABEL: func.func @decode
// SHARED: nf.kernel "moe_layer_rms_norm"
// SHARED-NEXT: ^bb0
// SHARED-NEXT: %[[S:.*]] = nf_moe.shared_expert
// SHARED-NEXT: nf_moe.router
// SHARED-NEXT: nf_moe.select
// SHARED-NEXT: %[[D:.*]] = nf_moe.dispatch
// SHARED-NEXT: %[[U:.*]] = nf_moe.expert_up %{{.*}}, %[[D]]
// SHARED-NEXT: %[[E:.*]] = nf_moe.expert_down %[[U]], %[[D]]
// SHARED-NEXT: %[[C:.*]] = nf_moe.combine %[[E]], %[[D]]
// SHARED-NEXT: %[[SUM:.*]] = nf.add %[[C]], %[[S]]
// SHARED-NEXT: %[[R:.*]] = nf.add %{{.*}}, %[[SUM]]
// SHARED-NEXT: %[[N:.*]] = nf.rms_norm %[[R]]
// SHARED-NEXT: nf.yield %[[R]], %[[N]]
// SHARED-NOT: nf.kernel "nf_moe_expert_down"
// SHARED-NOT: nf.kernel "moe_combine_add_rms_norm"
// SHARED-NOT: moe_shared_expert_combine_add

// Functions that are not steps are left alone.
// PLAIN-LABEL: func.func @not_a_step
// PLAIN-NOT: nf.kernel
func.func @not_a_step(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  %0 = nf.add %x, %x : tensor<?x4xf32>
  return %0 : tensor<?x4xf32>
}
