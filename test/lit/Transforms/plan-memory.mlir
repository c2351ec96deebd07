// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers --nf-lower-moe --nf-pack-weights --nf-fuse-kernels --nf-plan-memory="max-tokens=100 max-sequences=4 alignment=64" | FileCheck %s
// RUN: nfc import %fixtures/tiny-hybrid-bf16 -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-row-formats="bf16-inputs=1 max-sequences=32" --nf-cuda-attention-forms=bf16-inputs=1 --nf-cuda-scan-forms="matmul-terms=1 max-tokens=600" --nf-cuda-kernel-scratch="matmul-terms=1 max-tokens=600 max-sequences=32" --nf-plan-memory="max-tokens=600 max-sequences=32 expert-stats=1" | %python %S/Inputs/check_plan_regions.py | FileCheck %s --check-prefix=REGIONS
// RUN: nf-opt %t.fused.mlir --nf-plan-memory | %python %S/Inputs/check_plan_regions.py | FileCheck %s --check-prefix=CPU
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-fuse-kernels --nf-plan-memory="alignment=48" 2>&1 | FileCheck %s --check-prefix=ALIGN
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-fuse-kernels --nf-plan-memory="max-tokens=0" 2>&1 | FileCheck %s --check-prefix=TOKENS

// 100 tokens x 16 features x 4 bytes = 6400 bytes, already 64-aligned. The
// embedding's result lives until the first residual add, so it does not share
// bytes with anything in between; the arena is far below the no-reuse sum.
// CHECK-LABEL: func.func @prefill
// CHECK-SAME: nf.arena_bytes = [[ARENA:[0-9]+]] : i64, nf.kernel_scratch_end = {{[0-9]+}} : i64, nf.max_tokens = 100 : i64, nf.no_reuse_bytes = [[SUM:[0-9]+]] : i64
// CHECK: nf.kernel "nf_embed"{{.*}}arena_offsets = array<i64: [[EMB:[0-9]+]]>
// CHECK: nf.kernel "nf_rms_norm"{{.*}}arena_offsets = array<i64: [[N0:[0-9]+]]>
// A value computed inside a kernel and not yielded is the kernel's scratch,
// placed after the arena.
// CHECK: nf.kernel "linear_split"{{.*}}scratch_offsets = array<i64: [[ARENA]]>
// Expert rows are tokens x top-k assignments: 100 x 2 x 8 x 4 bytes.
// CHECK: nf.kernel "moe_expert_up_relu2"{{.*}}arena_offsets = array<i64: {{[0-9]+}}>
// CHECK-LABEL: func.func @decode
// CHECK-SAME: nf.max_tokens = 4 : i64

// After the results and the kernel-internal values: the bf16 copies of the
// rows nf-cuda-row-formats marked (decode rows of a bf16-input plan), then
// the expert statistics of a CUDA step, then each kernel's scratch regions,
// then the decode step's top-logits buffers (check_plan_regions.py checks
// the bounds Passes.td gives).
// REGIONS: prefill: {{[1-9][0-9]*}} internal, 0 copies, {{[1-9][0-9]*}} kernel scratch, 0 after the step, stats yes, ok
// REGIONS: decode: {{[1-9][0-9]*}} internal, {{[1-9][0-9]*}} copies, {{[1-9][0-9]*}} kernel scratch, 6 after the step, stats yes, ok
// CPU: prefill: {{[1-9][0-9]*}} internal, 0 copies, 0 kernel scratch, 0 after the step, stats no, ok
// CPU: decode: {{[1-9][0-9]*}} internal, 0 copies, 0 kernel scratch, 0 after the step, stats no, ok

// ALIGN: error: nf-plan-memory: alignment must be a power of two
// TOKENS: error: 'func.func' op max tokens must be positive, got 0
