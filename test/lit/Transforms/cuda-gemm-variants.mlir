// RUN: nfc import %fixtures/tiny-hybrid-bf16 -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-row-formats=bf16-inputs=1 --nf-cuda-gemm-variants=hopper-or-later=1 | FileCheck %s
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-gemm-variants=sm-count=1 | FileCheck %s --check-prefix=FEW-SMS
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-row-formats=bf16-inputs=1 --nf-cuda-gemm-variants=hopper-or-later=0 | FileCheck %s --check-prefix=NO-TMA
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-gemm-variants=max-sequences=16 | FileCheck %s --check-prefix=NARROW
// RUN: nfc compile %t.mlir --weights=fp8 --quantize=all --compile-to fuse -o %t.fp8.mlir
// RUN: nf-opt %t.fp8.mlir --nf-cuda-gemm-paths --nf-cuda-row-formats=bf16-inputs=1 --nf-cuda-gemm-variants=hopper-or-later=1 | FileCheck %s --check-prefix=FP8

// tiny-hybrid-bf16 (hidden 64, bf16 weights). Prefill steps have no wide
// decode variants.
// CHECK-LABEL: func.func @prefill
// CHECK-NOT: nf.gemm_wide_variants
// Decode with bf16 inputs on sm_90: the dense projections, whose inputs
// get bf16 copies, stream on TMA; the routed experts and the shared expert
// beside them keep the skinny GEMV (the shared expert's down projection,
// K 48, and the router are not on the skinny path); the LM head, whose
// result only the runtime reads, runs feature tiles.
// Wide skinny blocks: 4 warps for the experts and the shared expert, 8 for
// dense layers of fewer 32-feature columns than SMs (all of them here).
// CHECK-LABEL: func.func @decode
// CHECK: nf.linear {{.*}}nf.gemm_wide_variants = ["tma"], nf.gemm_wide_warps = array<i64: 8>
// CHECK: nf_moe.shared_expert {{.*}}nf.gemm_wide_variants = ["skinny", "none"], nf.gemm_wide_warps = array<i64: 4, 0>
// CHECK: nf_moe.router {{.*}}nf.gemm_wide_variants = ["none"], nf.gemm_wide_warps = array<i64: 0>
// CHECK: nf_moe.expert_up {{.*}}nf.gemm_wide_variants = ["skinny"], nf.gemm_wide_warps = array<i64: 4>
// CHECK: nf_moe.expert_down {{.*}}nf.gemm_wide_variants = ["skinny"], nf.gemm_wide_warps = array<i64: 4>
// CHECK: nf.lm_head {{.*}}nf.gemm_wide_variants = ["feature_tiles"], nf.gemm_wide_warps = array<i64: 8>

// Exact inputs (no bf16 copies) on one SM: every dense weight has more
// 32-feature items than two an SM, so its wide steps take items of 32 rows.
// FEW-SMS-LABEL: func.func @decode
// FEW-SMS-NOT: "tma"
// FEW-SMS-NOT: "feature_tiles"
// (One SM: every dense layer has a column an SM, so 4 warps a block.)
// FEW-SMS: nf.linear {{.*}}nf.gemm_wide_variants = ["skinny_rows32"], nf.gemm_wide_warps = array<i64: 4>
// FEW-SMS: nf_moe.expert_up {{.*}}nf.gemm_wide_variants = ["skinny"]
// FEW-SMS: nf.lm_head {{.*}}nf.gemm_wide_variants = ["skinny_rows32"]

// Copies but a target before sm_90: no TMA; the LM head keeps its tiles.
// NO-TMA-LABEL: func.func @decode
// NO-TMA-NOT: "tma"
// NO-TMA: nf.linear {{.*}}nf.gemm_wide_variants = ["skinny"]
// NO-TMA: nf.lm_head {{.*}}nf.gemm_wide_variants = ["feature_tiles"]

// Decode steps of at most nf.skinny_narrow_tokens tokens have no wide
// variants.
// NARROW-NOT: nf.gemm_wide_variants
// NARROW-NOT: nf.gemm_wide_warps

// FP8 codes (every projection quantised at compile time): the skinny items
// widen them as they load them; TMA streams bf16 weights, so the dense
// projections keep skinny items too. The LM head stays bf16: feature tiles.
// FP8-LABEL: func.func @decode
// FP8-NOT: "tma"
// FP8: nf.linear {{.*}}nf.gemm_wide_variants = ["skinny"], nf.gemm_wide_warps = array<i64: 8>
// FP8: nf_moe.expert_up {{.*}}nf.gemm_wide_variants = ["skinny"]
// FP8: nf.lm_head {{.*}}nf.gemm_wide_variants = ["feature_tiles"]
