// RUN: nfc import %fixtures/tiny-hybrid-bf16 -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-row-formats="bf16-inputs=1 max-sequences=32" | FileCheck %s
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-row-formats="bf16-inputs=1 max-sequences=16" | FileCheck %s --check-prefix=NARROW
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-row-formats="bf16-inputs=0" | FileCheck %s --check-prefix=EXACT
// RUN: nfc compile %t.mlir --compile-to plan -o - | FileCheck %s --check-prefix=EXACT

// tiny-hybrid-bf16 (M E * M - E M * E, hidden 64, bf16 weights). Prefill:
// the activations that only bf16 GEMMs read are stored as bf16 rows by
// their producers: the norms before in_proj, the router and experts, QKV and
// the MLP; the gated norm before out_proj; the relu² before the MLP's down
// projection; the experts' up projection before their down projection.
// CHECK-LABEL: func.func @prefill
// CHECK: nf.kernel "nf_rms_norm"
// CHECK: nf.rms_norm {{.*}}nf.row_format = "bf16"
// CHECK: nf.kernel "nf_gated_rms_norm"
// CHECK: nf.gated_rms_norm {{.*}}nf.row_format = "bf16"
// CHECK: nf.kernel "add_rms_norm"
// CHECK: nf.rms_norm {{.*}}nf.row_format = "bf16"
// The router reads its input as a GEMM only with the selection fused, which
// it is (moe_route); the experts read it too.
// CHECK: nf.kernel "moe_route"
// CHECK: nf.kernel "moe_expert_up_relu2"
// CHECK: nf_moe.expert_up {{.*}}nf.row_format = "bf16"
// The expert down projection's result is combined (not a GEMM input), and
// attention's output is not a producer that writes bf16 rows: o_proj reads
// f32 (split in its own launch).
// CHECK: nf.kernel "moe_expert_down_combine"
// CHECK: nf_moe.expert_down %arg3, %arg4, %arg5 {nf.gemm_paths = ["bf16_planes"]} : (
// CHECK: nf.kernel "nf_kv_attend"
// CHECK: nf_kv.attend {{.*}} {mode = "prefill", num_heads = 4 : i64, scale = {{.*}}} :
// CHECK: nf.kernel "nf_linear"
// CHECK: nf.kernel "linear_relu2"
// CHECK: nf.activation "relu2" {{.*}}nf.row_format = "bf16"
// The final norm feeds the LM head (a GEMM), whose logits stay f32.
// CHECK: nf.kernel "add_rms_norm"
// CHECK: nf.rms_norm {{.*}}nf.row_format = "bf16"
// CHECK: nf.kernel "nf_lm_head"
// CHECK: nf.lm_head %arg3, %arg4 {nf.gemm_paths = ["bf16_planes"]} : (

// Decode steps of up to 32 tokens: f32 rows with a bf16 copy for the wide
// GEMVs, where some reader is a GEMM with K a multiple of 32 (here also the
// attention output, o_proj's input).
// CHECK-LABEL: func.func @decode
// CHECK: nf.kernel "nf_rms_norm"
// CHECK: nf.rms_norm {{.*}}nf.row_format = "f32+bf16"
// CHECK: nf.kernel "mamba_ssm_decode"
// CHECK: nf.gated_rms_norm {{.*}}nf.row_format = "f32+bf16"
// CHECK: nf.kernel "moe_layer_rms_norm"
// CHECK: nf_moe.expert_up {{.*}}nf.row_format = "f32+bf16"
// CHECK: nf.rms_norm {{.*}}nf.row_format = "f32+bf16"
// CHECK: nf.kernel "nf_kv_attend"
// CHECK: nf_kv.attend {{.*}}nf.row_format = "f32+bf16"

// Decode steps of at most 16 tokens run only the narrow GEMVs (f32 rows).
// NARROW-LABEL: func.func @decode
// NARROW-NOT: nf.row_format

// Exact inputs (and every CPU plan): nothing is marked.
// EXACT-NOT: nf.row_format
