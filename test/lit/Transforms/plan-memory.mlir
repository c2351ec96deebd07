// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-lower-mixers --nf-lower-moe --nf-pack-weights --nf-fuse-kernels --nf-plan-memory="max-tokens=100 max-sequences=4 alignment=64" | FileCheck %s
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-fuse-kernels --nf-plan-memory="alignment=48" 2>&1 | FileCheck %s --check-prefix=ALIGN
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps --nf-fuse-kernels --nf-plan-memory="max-tokens=0" 2>&1 | FileCheck %s --check-prefix=TOKENS

// 100 tokens x 16 features x 4 bytes = 6400 bytes, already 64-aligned. The
// embedding's result lives until the first residual add, so it does not share
// bytes with anything in between; the arena is far below the no-reuse sum.
// CHECK-LABEL: func.func @prefill
// CHECK-SAME: nf.arena_bytes = [[ARENA:[0-9]+]] : i64, nf.max_tokens = 100 : i64, nf.no_reuse_bytes = [[SUM:[0-9]+]] : i64
// CHECK: nf.kernel "nf_embed"{{.*}}arena_offsets = array<i64: [[EMB:[0-9]+]]>
// CHECK: nf.kernel "nf_rms_norm"{{.*}}arena_offsets = array<i64: [[N0:[0-9]+]]>
// Expert rows are tokens x top-k assignments: 100 x 2 x 8 x 4 bytes.
// CHECK: nf.kernel "moe_expert_up_relu2"{{.*}}arena_offsets = array<i64: {{[0-9]+}}>
// CHECK-LABEL: func.func @decode
// CHECK-SAME: nf.max_tokens = 4 : i64

// ALIGN: error: nf-plan-memory: alignment must be a power of two
// TOKENS: error: 'func.func' op max tokens must be positive, got 0
