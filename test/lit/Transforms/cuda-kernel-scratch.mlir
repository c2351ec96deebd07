// RUN: nfc import %fixtures/tiny-hybrid-bf16 -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-attention-forms --nf-cuda-scan-forms=max-tokens=600 --nf-cuda-kernel-scratch="max-tokens=600 max-sequences=32" | FileCheck %s
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-row-formats="bf16-inputs=1 max-sequences=32" --nf-cuda-attention-forms=bf16-inputs=1 --nf-cuda-scan-forms="max-tokens=600 matmul-terms=1" --nf-cuda-kernel-scratch="max-tokens=600 max-sequences=32 matmul-terms=1" | FileCheck %s --check-prefix=BF16
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-attention-forms --nf-cuda-scan-forms=max-tokens=200 --nf-cuda-kernel-scratch="max-tokens=200 max-sequences=32" | FileCheck %s --check-prefix=ONE-CHUNK
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-attention-forms --nf-cuda-scan-forms=max-tokens=600 --nf-cuda-kernel-scratch --nf-cuda-kernel-scratch="ampere-or-later=0 max-tokens=100 max-sequences=2" | FileCheck %s --check-prefix=AGAIN

// RUN: nfc compile %t.mlir --weights=fp8 --quantize=all --compile-to fuse -o %t.fp8.mlir
// RUN: nf-opt %t.fp8.mlir --nf-cuda-gemm-paths --nf-cuda-attention-forms --nf-cuda-scan-forms=max-tokens=600 --nf-cuda-kernel-scratch="max-tokens=600 max-sequences=32" | FileCheck %s --check-prefix=FP8

// RUN: nfc import %fixtures/tiny-nano-fp8-modelopt -o %t.fp8in.mlir
// RUN: nfc compile %t.fp8in.mlir --compile-to fuse -o %t.fp8in.fused.mlir
// RUN: nf-opt %t.fp8in.fused.mlir --nf-cuda-gemm-paths --nf-cuda-attention-forms --nf-cuda-scan-forms=max-tokens=600 --nf-cuda-kernel-scratch="max-tokens=600 max-sequences=32" | FileCheck %s --check-prefix=FP8IN
// RUN: nf-opt %t.fp8in.fused.mlir --nf-cuda-gemm-paths --nf-cuda-row-formats="bf16-inputs=1 max-sequences=32" --nf-cuda-attention-forms=bf16-inputs=1 --nf-cuda-scan-forms="max-tokens=600 matmul-terms=1" --nf-cuda-kernel-scratch="max-tokens=600 max-sequences=32 matmul-terms=1" | FileCheck %s --check-prefix=FP8IN-BF16
// RUN: nf-opt %S/Inputs/shared-expert-fp8in.mlir --nf-cuda-gemm-paths --nf-cuda-row-formats="bf16-inputs=1 max-sequences=32" --nf-cuda-kernel-scratch="max-tokens=600 max-sequences=32 matmul-terms=1" | FileCheck %s --check-prefix=FP8IN-DECODE
// tiny-hybrid-bf16: hidden 64, Mamba 8 heads x 16 channels, state 16, 64
// slots; attention 4 heads on 2 kv heads of 16; 16 experts of 32, top-4;
// a shared expert of 48; bf16 weights. Steps of 600 prefill tokens and 32
// decode tokens, exact products (3 bf16 terms).
// CHECK-LABEL: func.func @prefill
// The in_proj GEMM's input split into 3 bf16 planes: 3 x 600 x 64 x 2.
// CHECK: nf.linear {{.*}}nf.kernel_scratch = array<i64: 230400>
// SSD over 3 chunks of 256: the chunk states of 600 / 256 + 64 + 1 = 67
// chunks (67 x 8 x 16 x 16 x 4) and their decays (67 x 8 x 4).
// CHECK: nf_kv.ssm_scan {{.*}}nf.kernel_scratch = array<i64: 548864, 2144>
// out_proj reads 128 features: 3 x 600 x 128 x 2.
// CHECK: nf.linear {{.*}}nf.kernel_scratch = array<i64: 460800>
// The router's f64 sums (s, sb) of 16 experts: 600 x 16 x 2 x 8.
// CHECK: nf_moe.router {{.*}}nf.kernel_scratch = array<i64: 153600>
// Expert down projections read 4 rows a token: 3 x 2400 x 32 x 2.
// CHECK: nf_moe.expert_up {{.*}}nf.kernel_scratch = array<i64: 230400>
// CHECK: nf_moe.expert_down {{.*}}nf.kernel_scratch = array<i64: 460800>
// The shared expert's f32 hidden rows (600 x 48 x 4), then both GEMMs'
// planes.
// CHECK: nf_moe.shared_expert {{.*}}nf.kernel_scratch = array<i64: 115200, 230400, 172800>
// Exact attention on tensor cores reads the cache as it is.
// CHECK: nf_kv.attend {{.*}}nf.attention_positions = 32 : i64, num_heads
// The prefill LM head's planes, and no top-logits launches.
// CHECK: nf.lm_head %{{.*}} {nf.gemm_paths = ["bf16_planes"], nf.kernel_scratch = array<i64: 230400>}
// CHECK-LABEL: func.func @decode
// CHECK: nf_moe.shared_expert {{.*}}nf.kernel_scratch = array<i64: 6144>
// CHECK: nf_moe.router {{.*}}nf.kernel_scratch = array<i64: 8192>
// Each of 64 context splits' partial output, max and sum:
// 32 x 4 x 64 x (16 + 2) x 4.
// CHECK: nf_kv.attend {{.*}}nf.kernel_scratch = array<i64: 589824>
// The top-logits launches after the step rank the 512 logits of a row in
// one chunk of 512 (kernels/nf_sample.cuh): each chunk's best 64 (32 x 64 x
// 8), the rows' 64 ids and values (32 x 64 x 4 each), the noise (32 x 24),
// the totals (32 x 8) and the chunks' parts of them (32 x 16).
// CHECK: nf.lm_head {{.*}}nf.after_step_scratch = array<i64: 16384, 8192, 8192, 768, 256, 512>{{.*}}nf.top_logits_chunk = 512 : i64

// bf16 inputs: rows stored as bf16 by their producers need no planes; the
// shared expert's hidden rows are bf16 (600 x 48 x 2); the attention rounds
// the step's K and V rows to bf16 once (2 x 600 x 2 x 16 x 2).
// BF16-LABEL: func.func @prefill
// BF16: nf_moe.router {{.*}}nf.kernel_scratch = array<i64: 153600>
// BF16: nf_moe.shared_expert {{.*}}nf.kernel_scratch = array<i64: 57600>
// BF16: nf_kv.attend {{.*}}nf.kernel_scratch = array<i64: 76800>

// Steps of one chunk need no chunk states.
// ONE-CHUNK-LABEL: func.func @prefill
// ONE-CHUNK: nf_kv.ssm_scan
// ONE-CHUNK-NOT: nf.kernel_scratch
// ONE-CHUNK-SAME: : (

// A second run sizes afresh (decode: 2 x 4 x 64 x 18 x 4).
// AGAIN-LABEL: func.func @decode
// AGAIN: nf_kv.attend {{.*}}nf.kernel_scratch = array<i64: 36864>

// FP8 codes on the plane path: after each GEMM's planes, its weight widened
// to bf16 (2 bytes a code): in_proj 3 x 600 x 64 x 2, then its 328 x 64
// codes; the experts' 16 x 32 x 64 (up) and 16 x 64 x 32 (down); the shared
// expert's up (48 x 64) and down (64 x 48) after their planes.
// FP8-LABEL: func.func @prefill
// FP8: nf.linear {{.*}}nf.kernel_scratch = array<i64: 230400, 41984>
// FP8: nf_moe.expert_up {{.*}}nf.kernel_scratch = array<i64: 230400, 65536>
// FP8: nf_moe.expert_down {{.*}}nf.kernel_scratch = array<i64: 460800, 65536>
// FP8: nf_moe.shared_expert {{.*}}nf.kernel_scratch = array<i64: 115200, 230400, 6144, 172800, 6144>

// FP8 activations (tiny-nano-fp8-modelopt: hidden 48, in_proj 126 x 48,
// 8 experts of 24, top-2, a shared expert of 40): every GEMM's input rows
// quantised first, in f32 (4 bytes), before its planes and widened codes:
// in_proj 600 x 48 x 4, 3 x 600 x 48 x 2, 126 x 48 x 2; the experts' down
// projection reads 2 rows a token (1200 x 24 x 4); the shared expert's
// hidden rows (600 x 40 x 4), then each GEMM's three regions.
// FP8IN-LABEL: func.func @prefill
// FP8IN: nf.linear {{.*}}nf.kernel_scratch = array<i64: 115200, 172800, 12096>
// FP8IN: nf_moe.expert_up {{.*}}nf.kernel_scratch = array<i64: 115200, 172800, 18432>
// FP8IN: nf_moe.expert_down {{.*}}nf.kernel_scratch = array<i64: 115200, 172800, 18432>
// FP8IN: nf_moe.shared_expert {{.*}}nf.kernel_scratch = array<i64: 96000, 115200, 172800, 3840, 96000, 144000, 3840>
// FP8IN-LABEL: func.func @decode
// FP8IN: nf.linear {{.*}}nf.kernel_scratch = array<i64: 6144>

// With bf16 inputs the rows stay f32 where a GEMM quantises them (a bf16
// rounding first would change their codes): no producer stores bf16 rows,
// and the shared expert's hidden rows are f32 (600 x 40 x 4).
// FP8IN-BF16-NOT: nf.row_format
// FP8IN-BF16: nf.linear {{.*}}nf.kernel_scratch = array<i64: 115200, 57600, 12096>
// FP8IN-BF16: nf_moe.shared_expert {{.*}}nf.kernel_scratch = array<i64: 96000, 115200, 57600, 3840, 96000, 48000, 3840>
// FP8IN-BF16-NOT: nf.row_format

// A decode step's shared expert whose down projection quantises its input
// reads its hidden rows as f32 (32 x 64 x 4): no bf16 copy of them for the
// wide skinny variants; then each GEMM's quantised input rows (32 x 64 x 4).
// FP8IN-DECODE: nf_moe.shared_expert {{.*}}nf.gemm_paths = ["bf16_skinny", "bf16_skinny"], nf.kernel_scratch = array<i64: 8192, 8192, 8192>
