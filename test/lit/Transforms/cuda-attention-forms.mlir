// RUN: nfc import %fixtures/tiny-hybrid -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-attention-forms | FileCheck %s
// RUN: nf-opt %t.fused.mlir --nf-cuda-attention-forms=bf16-inputs=1 | FileCheck %s --check-prefix=BF16
// RUN: nf-opt %t.fused.mlir --nf-cuda-attention-forms=ampere-or-later=0 | FileCheck %s --check-prefix=PRE-AMPERE
// RUN: nf-opt %t.fused.mlir --nf-cuda-attention-forms="ampere-or-later=0 max-sequences=2" | FileCheck %s --check-prefix=ONE-HEAD
// RUN: nf-opt %t.fused.mlir --nf-cuda-attention-forms=max-shared-bytes=20000 | FileCheck %s --check-prefix=SMALL-SMEM
// RUN: nf-opt %t.fused.mlir --nf-cuda-attention-forms=bf16-inputs=1 --nf-cuda-attention-forms=ampere-or-later=0 | FileCheck %s --check-prefix=RERUN

// tiny-hybrid: 4 query heads on 2 kv heads of 16 channels. On sm_80+ with
// the default shared memory (227 KB), both steps run on tensor cores;
// exact products keep K/V tiles of 32 positions.
// CHECK-LABEL: func.func @prefill
// CHECK: nf_kv.attend {{.*}}nf.attention_form = "mma", nf.attention_positions = 32 : i64
// CHECK-LABEL: func.func @decode
// CHECK: nf_kv.attend {{.*}}nf.attention_form = "split_mma"
// CHECK-NOT: nf.attention_positions

// bf16 inputs: tiles of 64 positions.
// BF16-LABEL: func.func @prefill
// BF16: nf.attention_form = "mma", nf.attention_positions = 64 : i64

// Before sm_80: shared-memory tiles in prefill; in decode a warp per
// (token, kv head) for its two query heads from 4 tokens.
// PRE-AMPERE-LABEL: func.func @prefill
// PRE-AMPERE: nf.attention_form = "tiles"
// PRE-AMPERE-LABEL: func.func @decode
// PRE-AMPERE: nf.attention_form = "split_gqa"
// PRE-AMPERE-NOT: nf.attention_positions

// Decode steps of fewer than 4 tokens: a warp per head only.
// ONE-HEAD-LABEL: func.func @decode
// ONE-HEAD: nf.attention_form = "split"

// Tensor-core tiles that do not fit the target's shared memory (24 KB for
// the decode tiles, 2 KB kept for static variables).
// SMALL-SMEM-LABEL: func.func @prefill
// SMALL-SMEM: nf.attention_form = "tiles"
// SMALL-SMEM-LABEL: func.func @decode
// SMALL-SMEM: nf.attention_form = "split_gqa"

// A second run decides afresh: no positions left from the first.
// RERUN-NOT: nf.attention_positions
