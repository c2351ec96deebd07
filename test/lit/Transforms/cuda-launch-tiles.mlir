// RUN: nfc import %fixtures/tiny-hybrid-bf16 -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-launch-tiles | FileCheck %s
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-launch-tiles=max-tokens=4096 | FileCheck %s --check-prefix=LONG
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-launch-tiles="ampere-or-later=0 max-tokens=4096" | FileCheck %s --check-prefix=TILES
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-launch-tiles=matmul-terms=1 | FileCheck %s --check-prefix=GEMM
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-launch-tiles=matmul-terms=1 --nf-cuda-launch-tiles | FileCheck %s --check-prefix=AGAIN
// RUN: nfc import %fixtures/tiny-hybrid -o %t.f32.mlir
// RUN: nfc compile %t.f32.mlir --compile-to fuse -o %t.f32.fused.mlir
// RUN: nf-opt %t.f32.fused.mlir --nf-cuda-gemm-paths --nf-cuda-launch-tiles=matmul-terms=1 | FileCheck %s --check-prefix=F32
// RUN: nf-opt %t.f32.fused.mlir --nf-cuda-scan-forms --nf-cuda-launch-tiles | FileCheck %s --check-prefix=WALK
// RUN: nf-opt %t.f32.fused.mlir --nf-cuda-scan-forms=max-shared-bytes=20000 --nf-cuda-launch-tiles | FileCheck %s --check-prefix=CHUNKED
// RUN: nf-opt %S/Inputs/mamba-wide.mlir --nf-outline-steps --nf-lower-mixers --nf-cuda-scan-forms=ampere-or-later=0 --nf-cuda-launch-tiles | FileCheck %s --check-prefix=WIDE
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-launch-tiles=matmul-terms=1 | FileCheck %s --check-prefix=WS
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-launch-tiles | FileCheck %s --check-prefix=NO-WS
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-launch-tiles="matmul-terms=1 wgmma=0" | FileCheck %s --check-prefix=NO-WS
// RUN: nf-opt %t.fused.mlir --nf-cuda-gemm-paths --nf-cuda-launch-tiles="matmul-terms=1 max-shared-bytes=100000" | FileCheck %s --check-prefix=NO-WS

// tiny-hybrid-bf16: 16 experts. Prefill logits on f64 tensor cores: a
// block's 16 or 32 input slices and 16 experts' of 20 f64 values take
// 5,120 or 7,680 bytes of static shared memory. Steps of up to 2048 tokens
// (the default) take 16 tokens a block. Decode: a warp per (token, expert).
// CHECK-LABEL: func.func @prefill
// CHECK: nf_moe.router {{.*}}nf.router_logits = "dmma", nf.router_tiles = [array<i64: 16, 0, 0, 0>]
// CHECK-NEXT: nf_moe.select
// CHECK-LABEL: func.func @decode
// CHECK: nf_moe.router {{.*}}nf.router_logits = "warp"
// CHECK-NOT: nf.router_tiles
// CHECK-SAME: ->
// CHECK-NEXT: nf_moe.select

// Longer steps: 16 tokens a block up to 2048 tokens, 32 beyond.
// LONG: nf.router_logits = "dmma", nf.router_tiles = [array<i64: 16, 0, 0, 2048>, array<i64: 32, 0, 2049, 0>]

// Before sm_80 (no f64 mma): f64 tiles of 16 x 32, then 32 x 64
// (tokens x experts).
// TILES: nf.router_logits = "tiles", nf.router_tiles = [array<i64: 16, 32, 0, 2048>, array<i64: 32, 64, 2049, 0>]

// With bf16 inputs, bf16 gate weights take the plane path: the logits GEMM.
// GEMM-LABEL: func.func @prefill
// GEMM: nf.gemm_paths = ["bf16_planes"], nf.gemm_ws_tiles = array<i64: 128>, nf.router_logits = "gemm"}
// GEMM-LABEL: func.func @decode
// GEMM: nf.router_logits = "warp"

// A second run decides afresh: no tiles left from the first.
// AGAIN-LABEL: func.func @prefill
// AGAIN: nf.router_logits = "dmma", nf.router_tiles = [array<i64: 16, 0, 0, 0>]

// f32 gate weights are not on the plane path: f64 tensor cores even with
// bf16 inputs.
// F32-LABEL: func.func @prefill
// F32: nf.router_logits = "dmma"

// tiny-hybrid: heads of 16 channels, state size 16 (a thread per channel).
// The prefill scan on tensor cores has no walk; decode updates (16
// channels, not whole warps of them) walk: the head's 16 channels a block,
// a token a chunk.
// WALK-LABEL: func.func @prefill
// WALK: nf_kv.ssm_scan
// WALK-NOT: nf.walk_tile
// WALK-LABEL: func.func @decode
// WALK: nf_kv.ssm_update {{.*}}nf.walk_tile = array<i64: 16, 1>

// The chunked walk: a token's staged bytes ((2 * 16 + 16 + 1) * 3 + 2 +
// 16) * 4 = 660, 68 of them in 45,056 bytes, at most 32.
// CHUNKED-LABEL: func.func @prefill
// CHUNKED: nf.scan_form = "chunked", nf.walk_tile = array<i64: 16, 32>

// The Nano shape's head (64 channels, state 128: 8 threads a channel): 16
// channels a block of 128 threads; a token's bytes ((2 * 128 + 16 + 1) * 3
// + 2 + 16 * 8) * 4 = 3,796, 11 tokens a chunk. Its decode update takes
// ssm_decode's warps: no walk.
// WIDE-LABEL: func.func @prefill
// WIDE: nf.scan_form = "chunked", nf.walk_tile = array<i64: 16, 11>
// WIDE-LABEL: func.func @decode
// WIDE-NOT: nf.walk_tile

// The warp-specialised prefill GEMM (bf16 inputs, sm_90 targets): tiles
// of 256 features, or 192 or 128 where 256 rounds up by more than their
// rates (0.95x, 0.84x) make up. in_proj, 328 features: 512 / 0.95 x 384 /
// 0.84 x 384 -> 192. The LM head, 512: 256. Experts' 32 features, the
// shared expert's 48 and 64: 128. Decode GEMMs are not on the plane path.
// WS-LABEL: func.func @prefill
// WS: nf_moe.shared_expert {{.*}}nf.gemm_ws_tiles = array<i64: 128, 128>
// WS: nf.linear {{.*}}nf.gemm_ws_tiles = array<i64: 192>{{.*}}tensor<328x64xbf16>
// WS: nf_moe.expert_up {{.*}}nf.gemm_ws_tiles = array<i64: 128>
// WS: nf.lm_head {{.*}}nf.gemm_ws_tiles = array<i64: 256>
// WS-LABEL: func.func @decode
// WS-NOT: nf.gemm_ws_tiles

// Exact inputs (three bf16 terms), a target before sm_90, or stages that
// do not fit (205,824 bytes for the 192 tile): no warp-specialised GEMM.
// NO-WS-LABEL: func.func @prefill
// NO-WS: nf.linear {{.*}}nf.gemm_ws_tiles = array<i64: 0>{{.*}}tensor<328x64xbf16>
// NO-WS-NOT: nf.gemm_ws_tiles = array<i64: {{[1-9]}}
