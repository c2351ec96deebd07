// Linear layers: y[r, n] = sum_k x[r, k] * W[n, k] for one weight or one
// weight per group of rows (routed experts). The generated modules include
// this header; it includes one header per strategy. The spec S every
// strategy takes, its groups of rows and the work items over them:
// nf_linear_groups.cuh. The code generator (EmitLinear.cpp) picks
//   - nf_linear_gemm.cuh, linear: prefill, and decode linears with weights
//     other than bf16 or K not a multiple of 32. GEMV items for groups of
//     up to 8 rows, output tiles for larger ones (CUDA cores, or tensor
//     cores for bf16 weights: in prefill the rows are first split into bf16
//     planes, split_rows_bf16, for mma.sync or wgmma tiles);
//   - nf_linear_row.cuh, row_linear: decode steps of one token (bf16
//     weights, K a multiple of 32), a warp per output feature on CUDA cores;
//     row_experts_combine: a one-token step's routed expert down projections
//     with the MoE combine, residual add and next RMSNorm;
//   - nf_linear_skinny.cuh, skinny_linear: the other decode steps (bf16
//     weights, K a multiple of 32) on tensor cores with the operands
//     swapped, a narrow variant for up to 16 tokens and a wide one above;
//   - nf_linear_feature.cuh, feature_tile_linear: the LM head's wide decode
//     steps (more than 16 tokens) from the rows' bf16 copy;
//   - nf_linear_int4.cuh, int4_linear: every step of int4 weights with group
//     scales, on CUDA cores.
// (Dense layers' wide decode steps with bf16 inputs on sm_90 stream by TMA
// instead: nf_tma.cuh.)
#ifndef NF_KERNELS_LINEAR_CUH
#define NF_KERNELS_LINEAR_CUH

// What the strategies build on comes first, in this order: a module's PTX
// lists namespace-scope constants in declaration order, so another order
// would change the cubins (not the code).
#include "nf_common.cuh"
#include "nf_mma.cuh"
#include "nf_rows.cuh"
#include "nf_wgmma.cuh"

#include "nf_linear_groups.cuh"

#include "nf_linear_feature.cuh"
#include "nf_linear_gemm.cuh"
#include "nf_linear_int4.cuh"
#include "nf_linear_row.cuh"
#include "nf_linear_skinny.cuh"

#endif // NF_KERNELS_LINEAR_CUH
