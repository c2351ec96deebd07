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
  char *arena;                 // step arena: arena_bytes + scratch_bytes
  const void *const *weights;  // device pointer of each Plan.weights entry (packed layout)
  void *const *storage;        // per Plan.storage entry i: [2i] K or conv state, [2i+1] V or SSM state
  const int32_t *tokens;       // [num_tokens]
  const float *budget;         // [num_tokens] expert budget
  const nf_seq_desc *seqs;     // [num_seqs]
  const int32_t *token_seq;    // [num_tokens] index into seqs
  const int32_t *page_tables;  // [num_seqs][max_pages_per_seq] physical KV pages
  int32_t num_tokens;
  int32_t num_seqs;
  int32_t max_pages_per_seq;
  int32_t experts_per_token;   // > 0: static top-k override for every token (evaluation)
  const int32_t *logit_rows;   // rows whose logits are read ([num_logit_rows]); null: every row
  int32_t num_logit_rows;
} nf_step_args;

#endif // NF_KERNELS_ABI_H
