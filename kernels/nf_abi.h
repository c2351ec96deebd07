// Launch ABI between the CUDA kernels nfc generates (kernels/*.cuh templates,
// compiled ahead of time with NVRTC) and the runtime's CUDA backend.
//
// The runtime launches every generated __global__ function with two
// arguments: a pointer to an nf_step_args in device memory, and the step
// arena's base (the address nf_step_args.arena holds). Prefill functions
// declare both; decode functions, and every function of plans before 1.3,
// only the first (nf_common.cuh, nf::arena). Shapes, dtypes,
// arena offsets, weight and storage indices are compile-time constants of the
// generated source; only what changes from step to step lives here. Because
// the token count is read from device memory, a captured CUDA graph serves
// every batch size up to the step's max tokens. Kernels cover their work with
// grid-stride loops, so the launch shape recorded in the plan is fixed.
//
// Plain C layout, shared verbatim by host (C++20) and device (NVRTC) code.
#ifndef NF_KERNELS_ABI_H
#define NF_KERNELS_ABI_H

#ifdef __CUDACC_RTC__
typedef int int32_t;
typedef long long int64_t;
typedef unsigned int uint32_t;
#else
#include <stdint.h>
#endif

/// One sequence of the step: its tokens are rows [begin, begin + count) of
/// every activation; start_pos is its length before the step.
typedef struct nf_seq_desc {
  int32_t begin;
  int32_t count;
  int32_t start_pos;
  int32_t slot; // recurrent-state slot
} nf_seq_desc;

typedef struct nf_step_args {
  char *arena; // step arena: arena_bytes + scratch_bytes
  const void *const
      *weights; // device pointer of each Plan.weights entry (packed layout)
  void *const *storage;       // per Plan.storage entry i: [2i] K or conv state,
                              // [2i+1] V or SSM state
  const int32_t *tokens;      // [num_tokens]
  const float *budget;        // [num_tokens] expert budget
  const nf_seq_desc *seqs;    // [num_seqs]
  const int32_t *token_seq;   // [num_tokens] index into seqs
  const int32_t *page_tables; // [num_seqs][max_pages_per_seq] physical KV pages
  int32_t num_tokens;
  int32_t num_seqs;
  int32_t max_pages_per_seq;
  int32_t experts_per_token; // > 0: static top-k override for every token
                             // (evaluation)
  const int32_t *logit_rows; // rows whose logits are read ([num_logit_rows]);
                             // null: every row
  int32_t num_logit_rows;
  // 1.9: the expert selection of budget plans (EngineOptions): 1 pools the
  // step's budgets over all its tokens (budget scope "step"), else each
  // sequence spends its own; > 0 caps the distinct routed experts a MoE layer
  // runs in the step (>= 1: a number; below 1: that fraction of the experts
  // the tokens' candidates name, rounded up).
  int32_t budget_pooled;
  double distinct_expert_cap;
  // 1.13: a tiered KV cache's pages that leave the hot window before this
  // step: pairs (hot page's first unit, cold page's unit), applied by every
  // layer's append before its rows (kernels/nf_kv_cache.cuh).
  const int32_t *kv_moves;
  int32_t num_kv_moves;
} nf_step_args;

/// A TMA tensor map that a module asks the runtime to encode when it loads
/// the module (sm_90+, kernels/nf_tma.cuh): a module that streams by TMA
/// defines the globals
///   extern "C" __device__ nf_tensor_map_desc nf_tensor_map_descs[n];
///   extern "C" __device__ nf_tensor_map nf_tensor_maps[n];
/// and the runtime writes map i (cuTensorMapEncodeTiled) from desc i before
/// any launch: a 2D bf16 tensor of dims[1] rows of dims[0] contiguous
/// elements, `stride` bytes apart, starting `offset` bytes into its source,
/// read in boxes of box[0] x box[1] elements with the 128-byte swizzle
/// (box[0] * 2 == 128). Plans whose kernels declare tensor maps are plan
/// format 1.4.
enum { NF_TENSOR_MAP_WEIGHT = 0, NF_TENSOR_MAP_ARENA = 1 };
typedef struct nf_tensor_map_desc {
  int32_t source; // NF_TENSOR_MAP_WEIGHT (Plan.weights[index]) or _ARENA
  int32_t index;
  int64_t offset;  // bytes
  int64_t dims[2]; // elements: inner (contiguous), outer
  int64_t stride;  // bytes between outer elements
  int32_t box[2];  // elements
} nf_tensor_map_desc;

/// An encoded tensor map (CUtensorMap: 128 opaque bytes, 64-byte aligned).
typedef struct alignas(64) nf_tensor_map {
  unsigned long long opaque[16];
} nf_tensor_map;

#endif // NF_KERNELS_ABI_H
