// RUN: nfc import %examples/pydoc-moe -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-epilogues --nf-cuda-co-launches | FileCheck %s
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-epilogues --nf-cuda-co-launches=max-sequences=16 | FileCheck %s --check-prefix=NARROW
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-epilogues --nf-cuda-co-launches --nf-cuda-co-launches=row-linear=0 | FileCheck %s --check-prefix=NO-ROW
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-co-launches | FileCheck %s --check-prefix=NO-EPILOGUE
// RUN: nfc import %fixtures/tiny-hybrid-bf16 -o %t.hybrid.mlir
// RUN: nfc compile %t.hybrid.mlir --compile-to fuse -o %t.hybrid.fused.mlir
// RUN: nf-opt %t.hybrid.fused.mlir --nf-cuda-gemm-paths --nf-cuda-epilogues --nf-cuda-co-launches | FileCheck %s --check-prefix=HYBRID

// pydoc-moe (bf16 weights, 16 experts, top 4, a shared expert hoisted
// before each MoE layer's router). Prefill launches nothing side by side.
// CHECK-LABEL: func.func @prefill
// CHECK-NOT: nf.co_launch
// CHECK-NOT: nf.one_token_experts
// Decode steps of up to 64 tokens (more than the 16 narrow tokens): the
// shared expert's narrow variants run beside the routing chain, its wide
// ones beside the routed experts'; steps of one token run the experts on
// the ranking's slots.
// CHECK-LABEL: func.func @decode
// CHECK: nf_moe.shared_expert {{.*}}nf.co_launch = "routing_and_experts"
// CHECK-NEXT: nf_moe.router
// CHECK-NEXT: nf_moe.select
// CHECK-NEXT: nf_moe.dispatch {{.*}}{nf.one_token_experts}
// CHECK: nf_moe.combine {{.*}}nf.epilogue = ["nf.add", "nf.add", "nf.rms_norm"]

// Decode steps no longer than the narrow tokens: every variant beside the
// routing chain.
// NARROW-LABEL: func.func @decode
// NARROW: nf_moe.shared_expert {{.*}}nf.co_launch = "routing"
// NARROW: nf_moe.dispatch {{.*}}{nf.one_token_experts}

// One-token steps without row_linear have no one-token experts, whatever
// an earlier run of the pass marked (the pass starts from no decision).
// NO-ROW-LABEL: func.func @decode
// NO-ROW-NOT: nf.one_token_experts
// NO-ROW: nf.co_launch = "routing_and_experts"
// NO-ROW-NOT: nf.one_token_experts

// Without the combine's epilogue the layer's end is its own launch, which
// the one-token experts replace: none.
// NO-EPILOGUE-LABEL: func.func @decode
// NO-EPILOGUE-NOT: nf.one_token_experts
// NO-EPILOGUE: nf.co_launch = "routing_and_experts"
// NO-EPILOGUE-NOT: nf.one_token_experts

// tiny-hybrid-bf16: the shared expert's down projection (K 48) is not on
// the skinny path, so it runs after the routing chain; the routed experts
// still take the one-token form.
// HYBRID-LABEL: func.func @decode
// HYBRID-NOT: nf.co_launch
// HYBRID: nf_moe.dispatch {{.*}}{nf.one_token_experts}
// HYBRID-NOT: nf.co_launch
