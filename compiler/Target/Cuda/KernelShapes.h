//===- KernelShapes.h - CUDA kernel facts the passes and emitter share -*-===//
//
// Sizes of kernels/*.cuh templates that decide which form of a kernel a
// target can run: the CUDA decision passes (compiler/Transforms/Cuda*.cpp)
// choose by them and the emitter (Emit*.cpp) sizes its launches by them.
// Header-only, no dependencies: each function matches the kernel's own
// constexpr size (the emitter static_asserts the two are equal).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>

namespace nf::codegen::shapes {

/// Bytes left beside a kernel's dynamic shared memory for its static
/// shared variables when checking a target's limit (the limit is for both).
inline constexpr int64_t kStaticSharedAllowance = 2048;

// Attention (kernels/nf_attention.cuh).

/// Decode (flash decoding): most splits of a (token, head)'s context; each
/// keeps its partial output, max and sum in generated scratch.
inline constexpr int64_t kDecodeSplits = 64;
/// Decode on tensor cores (kv_attend_split_mma): warps a block, and their
/// K/V tiles (nf::kv_attend_split_mma_smem) of values of the cache's
/// `kvBytes` (4: f32, 2: bf16).
inline constexpr int64_t kSplitMmaWarps = 4;
constexpr int64_t splitMmaSmem(int64_t headDim, int64_t kvBytes = 4) {
  return kSplitMmaWarps * 2 * 32 * (headDim + 8) * kvBytes;
}
/// Decode, grouped queries (kv_attend_split_gqa): warps a block, and the
/// step size from which it takes over from a warp per head.
inline constexpr int64_t kGqaWarps = 4, kGqaTokens = 4;
/// Its queries and exponentials in static shared memory (48 KB at most).
constexpr bool gqaFits(int64_t rep, int64_t headDim) {
  return rep >= 2 && rep <= 16 && headDim % 4 == 0 &&
         kGqaWarps * rep * (headDim + 32) * 4 <= 48 * 1024;
}
/// Prefill on tensor cores (kv_attend_mma): 8 warps of 16 rows a block;
/// the query tile and double-buffered K/V tiles of `positions` positions,
/// in the plan's bf16 terms, or with bf16 K/V rows (kv16: one term)
/// (nf::kv_attend_mma_smem).
inline constexpr int64_t kMmaWarps = 8, kMmaRows = 16 * kMmaWarps;
constexpr int64_t mmaSmem(int64_t headDim, int64_t terms, bool kv16,
                          int64_t positions) {
  return 2 * terms *
         (kMmaRows * (headDim + 8) +
          (kv16 ? 4 : 2) * positions * (headDim + 8));
}
/// Prefill without tensor cores (kv_attend): warps a block (a warp per
/// query head of a kv head, at most 16), the heads each warp takes, and the
/// shared memory of a block of `tokens` tokens.
constexpr int64_t attendWarps(int64_t rep) { return rep < 16 ? rep : 16; }
constexpr int64_t attendHeadsPerWarp(int64_t rep) {
  return (rep + attendWarps(rep) - 1) / attendWarps(rep);
}
constexpr int64_t attendTileSmem(int64_t rep, int64_t headDim, int64_t tokens) {
  return (32 * (headDim + 1) + 32 * headDim +
          tokens * attendWarps(rep) * attendHeadsPerWarp(rep) * headDim) *
         4;
}
/// A one-token block's static and dynamic shared memory: the tiled form
/// runs where it is at most 48 KB.
constexpr int64_t attendBlockSmem(int64_t rep, int64_t headDim) {
  return 32 * (2 * headDim + 1) * 4 +
         attendWarps(rep) * attendHeadsPerWarp(rep) * headDim * 4 + 256;
}

/// The decode step's attention forms (nf-cuda-attention-forms): tensor
/// cores for a kv head's query heads (at most 16, mma's rows) whose tiles
/// fit `maxSharedBytes` (every target sm_80 or later besides).
constexpr bool splitMmaFits(int64_t rep, int64_t headDim,
                            int64_t maxSharedBytes) {
  return rep <= 16 && headDim % 16 == 0 &&
         splitMmaSmem(headDim) + kStaticSharedAllowance <= maxSharedBytes;
}
/// Prefill on tensor cores with K/V tiles of `positions` positions (every
/// target sm_80 or later besides).
constexpr bool mmaFits(int64_t headDim, int64_t terms, int64_t positions,
                       int64_t maxSharedBytes) {
  return headDim % 16 == 0 && headDim <= 128 &&
         mmaSmem(headDim, terms, terms == 1, positions) +
                 kStaticSharedAllowance <=
             maxSharedBytes;
}

// Mamba2 (kernels/nf_mamba.cuh).

/// Threads per head channel of the SSM kernels (NS): each holds N / NS state
/// values, at most 16 where N allows.
constexpr int64_t ssmThreadsPerChannel(int64_t stateSize) {
  int64_t ns = 1;
  while (ns < 32 && stateSize / ns > 16 && stateSize % (ns * 2) == 0)
    ns *= 2;
  return ns;
}
/// The decode update's warp layout (ssm_decode): a warp per (sequence, head,
/// 32 / NS channels), state and channel rows read 4 at a time.
constexpr bool ssmDecodeFits(int64_t heads, int64_t headDim, int64_t stateSize,
                             int64_t convDim) {
  const int64_t ns = ssmThreadsPerChannel(stateSize);
  return 32 % ns == 0 && stateSize % (4 * ns) == 0 &&
         headDim % (32 / ns) == 0 && (heads * headDim) % 4 == 0 &&
         convDim % 4 == 0;
}
/// The decode update with its gated norm in one launch of clusters
/// (ssm_gated_decode): a cluster of a group's heads (at most 8), a block of
/// headDim / (32 / NS) warps per head, the group's channels a multiple of
/// 128 and at most 1024.
constexpr bool ssmGatedDecodeFits(int64_t headDim, int64_t stateSize,
                                  int64_t headsPerGroup) {
  const int64_t ns = ssmThreadsPerChannel(stateSize);
  return headsPerGroup <= 8 && headDim % 4 == 0 &&
         headDim / (32 / ns) * 32 <= 1024 &&
         (headsPerGroup * headDim) % 128 == 0 &&
         headsPerGroup * headDim <= 1024;
}

/// The walk over tokens (ssm_scan): a block of `channels` head channels of
/// NS threads each stages chunks of tokens in static shared memory (three
/// chunks of B, C, x and dt, and the chunk's partial y sums), at most
/// kSsmWalkSharedBytes; these are a token's bytes.
inline constexpr int64_t kSsmWalkSharedBytes = 45056;
constexpr int64_t ssmWalkBytesPerToken(int64_t channels, int64_t stateSize) {
  return ((2 * stateSize + channels + 1) * 3 + 2 +
          channels * ssmThreadsPerChannel(stateSize)) *
         4;
}

/// The prefill scan's chunks (ssd_chunk, ssm_chunk_states): tokens a chunk.
inline constexpr int64_t kSsmChunk = 256;
/// The scan on tensor cores (ssd_chunk, SSD's matrix form): shared memory of
/// a block with sub-chunks of `subChunk` tokens, in the plan's bf16 terms;
/// `states`: the chunk-states launch, which stages no C, y or state tile
/// (nf::ssd_chunk_smem).
constexpr int64_t ssdChunkSmem(int64_t headDim, int64_t stateSize,
                               int64_t subChunk, int64_t terms, bool states) {
  const int64_t q = subChunk, P = headDim, N = stateSize;
  return 2 * terms *
         (q * (N + 8) + q * (P + 8) +
          (states ? 0 : q * (N + 8) + q * (P + 8) + P * (N + 8)));
}
/// Whether the tensor-core scan takes the shapes (mma's tiles over head
/// channels and state, up to 128 channels) and its tiles fit
/// `maxSharedBytes` (every target sm_80 or later besides).
constexpr bool ssdFits(int64_t headDim, int64_t stateSize, int64_t subChunk,
                       int64_t terms, int64_t maxSharedBytes) {
  return headDim % 16 == 0 && stateSize % 16 == 0 && headDim <= 128 &&
         ssdChunkSmem(headDim, stateSize, subChunk, terms, false) +
                 kStaticSharedAllowance <=
             maxSharedBytes;
}
/// Whether the sequential walk can take a long step's chunks in parallel
/// (ssm_chunk_states: state rows read 4 channels and 8 state values at a
/// time).
constexpr bool ssmChunkedWalkFits(int64_t headDim, int64_t stateSize) {
  return headDim % 4 == 0 && stateSize % 8 == 0;
}
/// Chunk states a step of `maxTokens` tokens over `stateSlots` sequence
/// slots may have (each sequence's chunks, plus a partial one each).
constexpr int64_t ssmChunkStates(int64_t maxTokens, int64_t stateSlots) {
  return maxTokens / kSsmChunk + stateSlots + 1;
}

// Prefill GEMMs (kernels/nf_wgmma.cuh).

/// The warp-specialised wgmma GEMM (wgmma_ws_gemm) with 128 x tileN tiles:
/// as many 64-deep K stages as fit 210 KB, and 1 KB of barriers
/// (nf::wgmma_ws_smem).
constexpr int64_t wsGemmSmem(int64_t tileN) {
  const int64_t stage = (128 + tileN) * 64 * 2;
  return (210 * 1024) / stage * stage + 1024;
}

// MoE router (kernels/nf_moe.cuh).

/// Prefill router logits: steps of up to this many tokens take the small
/// tiles (every SM gets work), longer ones large tiles (each staged value
/// reused more).
inline constexpr int64_t kRouterSmallTileTokens = 2048;
/// moe_router_logits_dmma: a block's `tokens` input slices and the experts'
/// (rounded up to 8) of 20 f64 values each fit static shared memory.
constexpr bool routerDmmaFits(int64_t tokens, int64_t experts) {
  return (tokens + (experts + 7) / 8 * 8) * 20 * 8 <= 48 * 1024;
}

// Sampling (kernels/nf_sample.cuh).

/// Values per row the top-logits launches keep: a sampler whose top-k is
/// below this reads no vocabulary row (the runtime checks the rest).
inline constexpr int64_t kTopLogits = 64;
/// sizeof(nf::top_logit_noise): how a row is ranked.
inline constexpr int64_t kTopLogitNoiseBytes = 24;
/// The logits a top_logits_chunks block ranks: at most 64 chunks of a row,
/// at least kTopLogits logits and at most 2048 where that allows; 0 for
/// vocabularies beyond 64 chunks of 4096 (a 32 KB shared-memory sort),
/// which get no top-logits launches.
constexpr int64_t topLogitsChunk(int64_t vocab) {
  auto pow2AtLeast = [](int64_t n) {
    int64_t p = 1;
    while (p < n)
      p <<= 1;
    return p;
  };
  const int64_t least = pow2AtLeast((vocab + 63) / 64);
  const int64_t most = pow2AtLeast(vocab > kTopLogits ? vocab : kTopLogits);
  const int64_t chunk =
      least > (most < 2048 ? most : 2048) ? least : (most < 2048 ? most : 2048);
  return chunk <= 4096 ? chunk : 0;
}

} // namespace nf::codegen::shapes
