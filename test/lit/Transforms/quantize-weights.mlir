// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-quantize-weights | FileCheck %s --check-prefix=EXPERTS
// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-quantize-weights="scheme=int4 scope=all group-size=16" | FileCheck %s --check-prefix=INT4
// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-quantize-weights="scheme=int4 scope=all" --nf-outline-steps --nf-lower-mixers --nf-lower-moe --nf-pack-weights | FileCheck %s --check-prefix=PACKED
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-quantize-weights="scheme=int8" 2>&1 | FileCheck %s --check-prefix=SCHEME
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-quantize-weights="scope=some" 2>&1 | FileCheck %s --check-prefix=SCOPE
// RUN: not nf-opt %S/Inputs/hybrid.mlir --nf-quantize-weights="group-size=12" 2>&1 | FileCheck %s --check-prefix=GROUP

// Default (fp8, routed experts only): one E4M3 code tensor and one f32
// scale per output row for each expert; a stacked checkpoint tensor becomes
// one tensor per expert. Every other weight is untouched.
// EXPERTS-NOT: quant <
// EXPERTS: nf.weight stacked ["e0.up.nfc_fp8", "e1.up.nfc_fp8", "e2.up.nfc_fp8", "e3.up.nfc_fp8"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_channel, symmetric = true, scales = ["e0.up.nfc_fp8_scale", "e1.up.nfc_fp8_scale", "e2.up.nfc_fp8_scale", "e3.up.nfc_fp8_scale"], scale_types = [tensor<8x1xf32>, tensor<8x1xf32>, tensor<8x1xf32>, tensor<8x1xf32>], activations = none> {nf.quantize_from = ["e0.up", "e1.up", "e2.up", "e3.up"]} : tensor<4x8x8xf8E4M3FN>
// EXPERTS: nf.weight stacked ["experts.down_proj.0.nfc_fp8", "experts.down_proj.1.nfc_fp8", "experts.down_proj.2.nfc_fp8", "experts.down_proj.3.nfc_fp8"] quant <{{.*}}> {nf.quantize_from = ["experts.down_proj"]} : tensor<4x8x8xf8E4M3FN>
// EXPERTS-NOT: quant <

// int4, every projection: groups of 16 input columns, or 8 where 16 does
// not divide them (down: 24 columns). The shared expert's down projection
// (12 columns) has no power-of-two group of at least 8 and stays as it is;
// embeddings, norms, convolution, router and LM head are never quantised.
// INT4: nf.weight ["emb"] : tensor<32x16xf32>
// INT4: nf.weight ["in_proj.nfc_int4"] quant <scheme = int4, storage = i32, pack = 8, granularity = per_group, group_size = 16, symmetric = true, scales = ["in_proj.nfc_int4_scale"], scale_types = [tensor<52x1xf32>], activations = none> {nf.quantize_from = ["in_proj"]} : tensor<52x16xi4>
// INT4: nf.weight ["conv_w"] : tensor<32x1x4xf32>
// INT4: nf.weight ["out_proj.nfc_int4"] quant <{{.*}}group_size = 16{{.*}}> {{.*}}: tensor<16x16xi4>
// INT4: nf.weight ["q.nfc_int4"]
// INT4: nf.weight ["k.nfc_int4"]
// INT4: nf.weight ["v.nfc_int4"]
// INT4: nf.weight ["o.nfc_int4"]
// INT4: nf.weight ["up.nfc_int4"]
// INT4: nf.weight ["down.nfc_int4"] quant <{{.*}}group_size = 8, {{.*}}scale_types = [tensor<16x3xf32>]{{.*}}> {{.*}}: tensor<16x24xi4>
// INT4: nf.weight ["gate"] : tensor<4x16xf32>
// INT4: nf.weight stacked ["e0.up.nfc_int4"
// INT4: nf.weight stacked ["experts.down_proj.0.nfc_int4"
// INT4: nf.weight ["su.nfc_int4"]
// INT4: nf.weight ["sd"] : tensor<16x12xf32>
// INT4: nf.weight ["fc1.nfc_int4"]
// INT4: nf.weight ["fc2.nfc_int4"] quant <{{.*}}group_size = 8,
// INT4: nf.weight ["lm_head"] : tensor<32x16xf32>

// Packing concatenates quantised q/k/v with each part's scales and sources.
// PACKED: nf.weight ["q.nfc_int4", "k.nfc_int4", "v.nfc_int4"] quant <{{.*}}scales = ["q.nfc_int4_scale", "k.nfc_int4_scale", "v.nfc_int4_scale"]{{.*}}> {concat_rows = array<i64: 16, 8, 8>, nf.quantize_from = ["q", "k", "v"]} : tensor<32x16xi4>

// SCHEME: error: nf-quantize-weights: unknown scheme 'int8' (expected fp8 or int4)
// SCOPE: error: nf-quantize-weights: unknown scope 'some' (expected experts or all)
// GROUP: error: nf-quantize-weights: group size 12 is not a power of two of at least 8
