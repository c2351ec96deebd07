//===- CudaCodegen.h - plan kernels -> CUDA C++ ----------------*- C++ -*-===//
//
// Turns every kernel of a plan (runtime/schema/plan.fbs) into one CUDA C++
// module: the device templates of kernels/*.cuh, instantiated with the
// kernel's compile-time shapes, dtypes, arena offsets, weight and storage
// indices, behind thin `extern "C" __global__` functions that follow the
// launch ABI of kernels/nf_abi.h. The generator reads the module's
// PlanModel (Plan/PlanModel.h): the ops and attributes of the IR, numbered
// and placed exactly as the plan the runtime interprets stores them. It
// needs no GPU.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "nf/status.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nf::compiler {
struct PlanModel;
}

namespace nf::codegen {

/// One __global__ function of a module and its fixed launch shape.
struct CudaLaunchInfo {
  std::string function;
  uint32_t grid = 1;
  uint32_t block = 256;
  uint32_t sharedBytes = 0; // dynamic shared memory (the kernels use static)
  bool cooperative = false; // no generated kernel needs a grid barrier
  uint32_t minTokens = 0, maxTokens = 0; // run only for steps in this range
  bool programmatic = false; // waits on its predecessor (griddepcontrol)
};

/// The generated module of one plan kernel.
struct CudaKernelSource {
  std::string step;     // "prefill" or "decode"
  int index = 0;        // kernel index in the step
  std::string name;     // the plan kernel's name, e.g. "add_rms_norm"
  std::string fileName; // e.g. "prefill_k12_add_rms_norm.cu"
  std::string source;   // CUDA C++; #includes kernels/*.cuh by name
  std::vector<CudaLaunchInfo> launches; // in execution order
  /// Uses sm_90a features (wgmma) where compiled for them: its sm_90 cubin
  /// is compiled for sm_90a, its PTX for compute_90 (without them).
  bool hopperFeatures = false;
};

/// Launches the runtime may run after a decode step to rank each logit
/// row's largest values (kernels/nf_sample.cuh), so that a greedy or top-k
/// sampler reads K ids and values per sequence instead of a vocabulary row
/// (a temperature sampler too: rows may be ranked by its noisy keys). The
/// functions live in the module of the kernel that computes the logits.
struct CudaTopLogits {
  int kernel = -1;                         // index of that kernel; -1: none
  int k = 0;                               // values per row
  int64_t idsOffset = 0, valuesOffset = 0; // arena: [rows][k] i32 / f32
  int64_t noiseOffset = 0;  // arena: [rows] nf::top_logit_noise (24 bytes)
  int64_t totalsOffset = 0; // arena: [rows] f64, the rows' totals
  std::vector<CudaLaunchInfo> launches; // in execution order
};

struct CudaStepSources {
  std::vector<CudaKernelSource> kernels;
  CudaTopLogits topLogits; // decode only
  /// Step.scratch_bytes with the scratch the generated kernels add (the
  /// shared expert's hidden rows), >= the plan's value.
  int64_t scratchBytes = 0;
  /// Arena offset of the expert statistics region (ExpertStatsLayout in
  /// KernelEmitter.h; Step.expert_stats_offset), -1: none.
  int64_t expertStatsOffset = -1;
};

struct CudaCodegenOptions {
  /// Streaming multiprocessors the launch grids are sized for (H100/H200).
  int smCount = 132;
  /// Testing: functions whose name contains this get a syntax error.
  std::string injectError;
  /// bf16 terms an f32 activation is split into before tensor-core GEMMs
  /// with bf16 weights: 3 (exact products) or 1 (rounded to bf16).
  int matmulTerms = 3;
  /// Decode steps of one token run row_linear (nf_linear.cuh) for linears
  /// with bf16 weights; false: the skinny kernel's narrow variant, as for
  /// steps of up to 16 tokens (benchmarks compare the two).
  bool rowLinear = true;
  /// Prefill GEMM tiles on wgmma (nf_wgmma.cuh), with its shared memory:
  /// when every target is an sm_90 architecture.
  bool wgmma = false;
  /// Every target is sm_80 or later: kernels that need mma.sync's bf16 and
  /// f64 shapes (the SSD scan, the f64 router) are generated.
  bool ampereOrLater = false;
  /// Every target is sm_90 or later: thread block clusters and distributed
  /// shared memory (the decode Mamba state update with its gated norm).
  bool hopperOrLater = false;
  /// Dynamic shared memory a block may have on every target, bytes.
  int64_t maxSharedBytes = 99 * 1024;
};

struct CudaPlanSources {
  CudaStepSources prefill, decode;
};

StatusOr<CudaPlanSources> generateCudaSources(const compiler::PlanModel &plan,
                                              const CudaCodegenOptions &opts);

/// The device headers embedded at build time (kernels/*.h, kernels/*.cuh):
/// (file name, text), sorted by name.
const std::vector<std::pair<std::string, std::string>> &kernelHeaders();

} // namespace nf::codegen
