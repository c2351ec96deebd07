// RUN: nfc import %fixtures/tiny-hybrid-bf16 -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-epilogues | FileCheck %s
// RUN: nfc compile %t.mlir --compile-to fuse --kv-cache-dtype bf16 -o %t.bf16kv.mlir
// RUN: nf-opt %t.bf16kv.mlir --nf-cuda-epilogues | FileCheck %s --check-prefix=BF16-KV

// tiny-hybrid-bf16, layers "ME*M-EM*E". Prefill: the Mamba in_proj stores
// its split pieces (the conv runs as its own kernel), the attention qkv
// projection also writes K/V into the f32 cache, the MLP up-projection
// applies its activation.
// CHECK-LABEL: func.func @prefill
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.split"]
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.split", "nf_kv.append"]
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.activation"]
// Decode: the in_proj also computes the conv of each xBC channel.
// CHECK-LABEL: func.func @decode
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.split", "nf_kv.causal_conv"]
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.split", "nf_kv.append"]
// CHECK: nf.linear {{.*}}nf.epilogue = ["nf.activation"]
// The LM head's result goes to the runtime: no epilogue.
// CHECK-NOT: nf.lm_head {{.*}}nf.epilogue

// A bf16 KV cache is not written by the epilogue (only the split is).
// BF16-KV-NOT: "nf_kv.append"]
// BF16-KV: nf.epilogue = ["nf.split"]
// BF16-KV-NOT: "nf_kv.append"]
