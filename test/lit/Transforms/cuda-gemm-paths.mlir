// RUN: nfc import %fixtures/tiny-hybrid-bf16 -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths | FileCheck %s
// RUN: nfc import %fixtures/tiny-hybrid -o %t.f32.mlir
// RUN: nfc compile %t.f32.mlir --compile-to fuse -o %t.f32.fused.mlir
// RUN: nf-opt %t.f32.fused.mlir --nf-cuda-gemm-paths | FileCheck %s --check-prefix=F32
// RUN: nfc compile %t.mlir --compile-to plan -o - | FileCheck %s --check-prefix=CPU
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths=ampere-or-later=0 | FileCheck %s --check-prefix=PRE-AMPERE
// RUN: nfc compile %t.f32.mlir --weights=fp8 --quantize=all --compile-to fuse -o %t.fp8.mlir
// RUN: nf-opt %t.fp8.mlir --nf-cuda-gemm-paths | FileCheck %s --check-prefix=FP8
// RUN: nf-opt %t.fp8.mlir --nf-cuda-gemm-paths=ampere-or-later=0 | FileCheck %s --check-prefix=FP8-PRE-AMPERE
// RUN: nfc compile %t.f32.mlir --weights=int4 --quantize=all --compile-to fuse -o %t.int4.mlir
// RUN: nf-opt %t.int4.mlir --nf-cuda-gemm-paths | FileCheck %s --check-prefix=INT4
// RUN: nf-opt %t.int4.mlir --nf-cuda-gemm-paths=ampere-or-later=0 | FileCheck %s --check-prefix=INT4

// tiny-hybrid-bf16 (hidden 64, bf16 weights; the shared expert's
// intermediate 48). Prefill: every GEMM over bf16 weights with K a multiple
// of 8 takes the bf16-plane tiles, the router's logits and both GEMMs of the
// shared expert included.
// CHECK-LABEL: func.func @prefill
// CHECK: nf.linear {{.*}}nf.gemm_paths = ["bf16_planes"]
// CHECK: nf_moe.router {{.*}}nf.gemm_paths = ["bf16_planes"]
// CHECK: nf_moe.expert_up {{.*}}nf.gemm_paths = ["bf16_planes"]
// CHECK: nf_moe.expert_down {{.*}}nf.gemm_paths = ["bf16_planes"]
// CHECK: nf_moe.shared_expert {{.*}}nf.gemm_paths = ["bf16_planes", "bf16_planes"]
// CHECK: nf.lm_head {{.*}}nf.gemm_paths = ["bf16_planes"]
// Decode: the skinny tensor-core GEMVs where K is a multiple of 32 (not the
// shared expert's down projection, K 48), never for the router.
// Decode steps record how many tokens their narrow skinny variants take.
// CHECK-LABEL: func.func @decode
// CHECK-SAME: nf.skinny_narrow_tokens = 16
// CHECK: nf.linear {{.*}}nf.gemm_paths = ["bf16_skinny"]
// CHECK: nf_moe.shared_expert {{.*}}nf.gemm_paths = ["bf16_skinny", "other"]
// CHECK: nf_moe.router {{.*}}nf.gemm_paths = ["other"]
// CHECK: nf_moe.expert_up {{.*}}nf.gemm_paths = ["bf16_skinny"]
// CHECK: nf_moe.expert_down {{.*}}nf.gemm_paths = ["bf16_skinny"]

// tiny-hybrid has f32 weights: no bf16 path anywhere.
// F32-NOT: bf16_planes
// F32-NOT: bf16_skinny
// F32: nf.gemm_paths = ["other"]

// The pass runs for CUDA targets only: a CPU plan has no paths.
// CPU-NOT: nf.gemm_paths
// CPU-NOT: nf.skinny_narrow_tokens

// A target before sm_80 has neither tensor-core path (mma.sync's bf16
// shapes): bf16 weights take the other path too.
// PRE-AMPERE-NOT: bf16_planes
// PRE-AMPERE-NOT: bf16_skinny
// PRE-AMPERE: nf.gemm_paths = ["other"]

// tiny-hybrid's projections quantised to FP8 codes at compile time (its LM
// head and routers stay f32): the codes widen to bf16 exactly, so prefill
// takes the plane tiles (after a launch that widens them) and decode the
// skinny GEMVs where K is a multiple of 32 (not the shared expert's down
// projection, K 48); routers and the f32 LM head take the other path.
// FP8-LABEL: func.func @prefill
// FP8: nf.linear {{.*}}nf.gemm_paths = ["bf16_planes"]
// FP8: nf_moe.router {{.*}}nf.gemm_paths = ["other"]
// FP8: nf_moe.expert_up {{.*}}nf.gemm_paths = ["bf16_planes"]
// FP8: nf_moe.shared_expert {{.*}}nf.gemm_paths = ["bf16_planes", "bf16_planes"]
// FP8: nf.lm_head {{.*}}nf.gemm_paths = ["other"]
// FP8-LABEL: func.func @decode
// FP8: nf.linear {{.*}}nf.gemm_paths = ["bf16_skinny"]
// FP8: nf_moe.shared_expert {{.*}}nf.gemm_paths = ["bf16_skinny", "other"]
// FP8: nf_moe.expert_down {{.*}}nf.gemm_paths = ["bf16_skinny"]
// Before sm_80 the codes take the other path (f32 tiles and GEMVs).
// FP8-PRE-AMPERE-NOT: bf16_planes
// FP8-PRE-AMPERE-NOT: bf16_skinny

// tiny-hybrid's projections quantised to int4 codes with group scales: every
// step, on every target, runs them on the int4 path (dequantised in
// registers on CUDA cores); routers and the f32 LM head take the other path.
// INT4-LABEL: func.func @prefill
// INT4: nf.linear {{.*}}nf.gemm_paths = ["int4_rows"]
// INT4: nf_moe.router {{.*}}nf.gemm_paths = ["other"]
// INT4: nf_moe.expert_up {{.*}}nf.gemm_paths = ["int4_rows"]
// INT4: nf_moe.shared_expert {{.*}}nf.gemm_paths = ["int4_rows", "int4_rows"]
// INT4: nf.lm_head {{.*}}nf.gemm_paths = ["other"]
// INT4-LABEL: func.func @decode
// INT4: nf.linear {{.*}}nf.gemm_paths = ["int4_rows"]
// INT4: nf_moe.shared_expert {{.*}}nf.gemm_paths = ["int4_rows", "int4_rows"]
// INT4: nf_moe.expert_down {{.*}}nf.gemm_paths = ["int4_rows"]
