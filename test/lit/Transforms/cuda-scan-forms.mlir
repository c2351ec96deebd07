// RUN: nfc import %fixtures/tiny-hybrid -o %t.mlir
// RUN: nfc compile %t.mlir --compile-to fuse -o %t.fused.mlir
// RUN: nf-opt %t.fused.mlir --nf-cuda-scan-forms | FileCheck %s
// RUN: nf-opt %t.fused.mlir --nf-cuda-scan-forms=max-shared-bytes=30000 | FileCheck %s --check-prefix=SUB32
// RUN: nf-opt %t.fused.mlir --nf-cuda-scan-forms=max-shared-bytes=20000 | FileCheck %s --check-prefix=NO-SSD
// RUN: nf-opt %t.fused.mlir --nf-cuda-scan-forms="ampere-or-later=0 max-tokens=256" | FileCheck %s --check-prefix=SHORT
// RUN: nf-opt %t.fused.mlir --nf-cuda-scan-forms --nf-cuda-scan-forms="ampere-or-later=0 max-tokens=256" | FileCheck %s --check-prefix=AGAIN
// RUN: nfc import %fixtures/tiny-nano -o %t.nano.mlir
// RUN: nfc compile %t.nano.mlir --compile-to fuse -o %t.nano.fused.mlir
// RUN: nf-opt %t.nano.fused.mlir --nf-cuda-scan-forms | FileCheck %s --check-prefix=NANO

// tiny-hybrid: 8 heads of 16 channels, state size 16. On sm_80+ the
// prefill scan runs on tensor cores; exact products (three bf16 terms) with
// sub-chunks of 64 tokens take 39,168 bytes of shared memory. Decode
// updates get no form.
// CHECK-LABEL: func.func @prefill
// CHECK: nf_kv.ssm_scan {{.*}}nf.scan_form = "ssd", nf.scan_sub_chunk = 64 : i64
// CHECK-LABEL: func.func @decode
// CHECK-NOT: nf.scan_form

// Sub-chunks of 32 tokens (20,736 bytes) where 64 do not fit (2 KB kept for
// static variables).
// SUB32: nf_kv.ssm_scan {{.*}}nf.scan_form = "ssd", nf.scan_sub_chunk = 32 : i64

// Neither fits: the walk, its chunks in parallel in steps of up to 2048
// tokens (longer than a chunk of 256).
// NO-SSD: nf_kv.ssm_scan {{.*}}nf.scan_form = "chunked"
// NO-SSD-NOT: nf.scan_sub_chunk

// Before sm_80, steps of at most one chunk: the walk over each sequence.
// SHORT: nf_kv.ssm_scan {{.*}}nf.scan_form = "sequential"

// A second run decides afresh: no sub-chunk left from the first.
// AGAIN: nf.scan_form = "sequential"
// AGAIN-NOT: nf.scan_sub_chunk

// tiny-nano: 8 channels a head (not mma's 16) and state size 12 (not a
// multiple of 8): the walk over each sequence.
// NANO: nf_kv.ssm_scan {{.*}}nf.scan_form = "sequential"
