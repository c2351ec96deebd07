//===- Pipeline.h - the nfc compile phases ----------------------*- C++ -*-===//
#pragma once

#include "mlir/Pass/PassManager.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nf::compiler {

/// Phases in pipeline order; `nfc compile --compile-to=<phase>` stops after
/// one of them.
enum class Phase { Import, Outline, Lower, Pack, Fuse, Plan };

const std::vector<std::string> &phaseNames();
std::optional<Phase> parsePhase(const std::string &name);

struct PipelineOptions {
  int64_t maxTokens = 2048;  // prefill step
  int64_t maxSequences = 64; // decode step, and recurrent-state slots
  int64_t pageSize = 16;
  int64_t kvPages = 4096;
  /// What the KV cache stores: "f32", "bf16" or "fp8"; "auto" is bf16 for
  /// CUDA targets whose GEMM inputs are bf16 and f32 for exact plans (the
  /// CPU backend's and exact CUDA plans' tests compare f32 references).
  std::string kvCacheDtype = "auto";
  /// fp8 caches: a sequence's last positions whose pages stay bf16 (tiered).
  int64_t kvHotWindow = 0;
  // "budget" by default: every plan then honours per-request budgets, and
  // at the default budget (1.0) it computes exactly static top-k.
  std::string expertPolicy = "budget";
  float defaultExpertBudget = 1.0f;
  int64_t minExperts = 1;
  /// CUDA target whose GEMM inputs are rounded to bf16 (nf-cuda-row-formats
  /// marks the activations stored rounded by their producers).
  bool cudaBf16Inputs = false;
  /// A CUDA target: nf-plan-memory reserves the expert statistics region
  /// its steps write.
  bool cudaTarget = false;
  /// The CUDA target's SMs, whether every architecture is sm_80 / sm_90 or
  /// later, and the shared memory a block may have on every one (the CUDA
  /// decision passes).
  int64_t cudaSmCount = 132;
  bool cudaAmpereOrLater = false;
  bool cudaHopperOrLater = false;
  /// Every architecture is sm_90 (its cubins use wgmma).
  bool cudaWgmma = false;
  int64_t cudaMaxSharedBytes = 99 * 1024;
  /// bf16 terms of each tensor-core product (1: bf16 inputs; exact: 3).
  int64_t cudaMatmulTerms = 3;
  /// Decode steps of one token run row_linear (nf-cuda-co-launches' one-token
  /// experts need it).
  bool cudaRowLinear = true;
  /// Compile-time quantisation (nf-quantize-weights): "" (none), "fp8" or
  /// "int4"; which weights ("experts" or "all"); int4 columns per scale.
  std::string quantizeWeights;
  std::string quantizeScope = "experts";
  int64_t quantGroupSize = 128;
};

/// The KV cache's element type `options` asks for, "auto" resolved.
std::string resolvedKvCacheDtype(const PipelineOptions &options);

/// Adds the passes of every phase up to and including `last`.
void buildPipeline(mlir::PassManager &pm, Phase last,
                   const PipelineOptions &options);

/// Registers the dialects every phase produces.
void registerDialects(mlir::DialectRegistry &registry);

} // namespace nf::compiler
