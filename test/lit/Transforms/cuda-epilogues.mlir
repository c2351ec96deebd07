// RUN: nfc import %fixtures/tiny-hybrid-bf16 -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-epilogues | FileCheck %s
// RUN: nfc compile %t.mlir --compile-to fuse --kv-cache-dtype bf16 -o %t.bf16kv.mlir
// RUN: nf-opt %t.bf16kv.mlir --nf-cuda-epilogues | FileCheck %s --check-prefix=BF16-KV
// RUN: nfc compile %t.mlir --compile-to fuse --kv-cache-dtype fp8 -o %t.fp8kv.mlir
// RUN: nf-opt %t.fp8kv.mlir --nf-cuda-epilogues | FileCheck %s --check-prefix=FP8-KV

// tiny-hybrid-bf16, layers "ME*M-EM*E". Prefill: the Mamba in_proj stores
// its split pieces (the conv runs as its own kernel), the attention qkv
// projection also writes K/V into the f32 cache, the MLP up-projection
// applies its activation.
// Each residual add normalises its sum for the next layer; the shared
// expert's down projection adds the routed experts' rows.
// CHECK-LABEL: func.func @prefill
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.split"]
// CHECK: nf.add {{.*}}nf.epilogue = ["nf.rms_norm"]
// CHECK: nf_moe.shared_expert {{.*}}nf.epilogue = ["nf.add"]
// CHECK: nf.add {{.*}}nf.epilogue = ["nf.rms_norm"]
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.split", "nf_kv.append"]
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.activation"]
// Decode: the in_proj also computes the conv of each xBC channel; the shared
// expert runs beside the routing (no epilogue), and the combine of the
// routed rows adds the shared rows and the residual and normalises; those
// adds get no epilogue of their own.
// CHECK-LABEL: func.func @decode
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.split", "nf_kv.causal_conv"]
// CHECK: nf.add {{.*}}nf.epilogue = ["nf.rms_norm"]
// CHECK-NOT: nf_moe.shared_expert {{.*}}nf.epilogue
// CHECK: nf_moe.combine {{.*}}nf.epilogue = ["nf.add", "nf.add", "nf.rms_norm"]
// CHECK-NEXT: nf.add
// CHECK-NOT: nf.epilogue
// CHECK-NEXT: nf.add
// CHECK-NOT: nf.epilogue
// CHECK-NEXT: nf.rms_norm
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.split", "nf_kv.append"]
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.activation"]
// The LM head's result goes to the runtime: no epilogue.
// CHECK-NOT: nf.lm_head {{.*}}nf.epilogue

// A bf16 KV cache is written by the epilogue too (each value rounded as it
// is stored); an fp8 one is not (a row's scale needs its largest value
// first): only the split is.
// BF16-KV: nf.epilogue = ["nf.split", "nf_kv.append"]
// FP8-KV-NOT: "nf_kv.append"]
// FP8-KV: nf.epilogue = ["nf.split"]
// FP8-KV-NOT: "nf_kv.append"]

// A pass's decision is its own: marks in its input (here a stale epilogue on
// every RMSNorm, which no rule gives it) are dropped, not trusted.
// RUN: sed -e 's/ {epsilon = / {nf.epilogue = ["nf.add"], nf.gemm_paths = ["bf16_planes"], nf.row_format = "bf16", epsilon = /' %t.fused.mlir > %t.stale.mlir
// RUN: nf-opt %t.stale.mlir --nf-cuda-gemm-paths --nf-cuda-epilogues --nf-cuda-row-formats --nf-cuda-gemm-variants | FileCheck %s --check-prefix=STALE
// STALE: nf.rms_norm
// STALE-NOT: nf.rms_norm {{.*}}nf.epilogue
// STALE-NOT: nf.rms_norm {{.*}}nf.gemm_paths
// STALE-NOT: nf.rms_norm {{.*}}nf.row_format

// RUN: nfc import %examples/pydoc-moe -o %t.pydoc.mlir
// RUN: nfc compile %t.pydoc.mlir --compile-to fuse -o %t.pydoc.fused.mlir
// RUN: nf-opt %t.pydoc.fused.mlir --nf-cuda-epilogues=hopper-or-later=1 | FileCheck %s --check-prefix=SSM
// RUN: nf-opt %t.pydoc.fused.mlir --nf-cuda-epilogues="hopper-or-later=1 sm-count=4" | FileCheck %s --check-prefix=SSM-FEW-SMS
// RUN: nf-opt %t.pydoc.fused.mlir --nf-cuda-epilogues | FileCheck %s --check-prefix=SSM-PRE-HOPPER
// RUN: nf-opt %t.fused.mlir --nf-cuda-epilogues=hopper-or-later=1 | FileCheck %s --check-prefix=SSM-TILING

// pydoc-moe (8 heads of 32 channels, state 32, 2 groups) on sm_90: the
// decode SSM update computes the gated norm in its launch of clusters for
// steps of up to 132 / 8 = 16 tokens (one token on a 4-SM target).
// SSM-LABEL: func.func @decode
// SSM: nf_kv.ssm_update {{.*}}nf.epilogue = ["nf.gated_rms_norm"], nf.epilogue_max_tokens = 16 : i64
// SSM-NEXT: nf.gated_rms_norm
// SSM-FEW-SMS-LABEL: func.func @decode
// SSM-FEW-SMS: nf_kv.ssm_update {{.*}}nf.epilogue_max_tokens = 1 : i64
// Without clusters (a target before sm_90), or where the state's tiling
// does not fit the kernel (tiny-hybrid-bf16: heads of 16 channels, which
// the warp of 32 channels does not divide), the norm is its own launch.
// SSM-PRE-HOPPER-NOT: nf.epilogue_max_tokens
// SSM-PRE-HOPPER-NOT: nf.epilogue = ["nf.gated_rms_norm"]
// SSM-TILING-NOT: nf.epilogue = ["nf.gated_rms_norm"]
