//===- CudaBackend.h - plan -> CUDA binaries ---------------------*- C++
//-*-===//
//
// The CUDA target of `nfc compile --target=cuda[:sm_90,...]`: generates a
// module per plan kernel (CudaCodegen.h), compiles each with NVRTC for every
// requested architecture (cubin; PTX from the lowest one), in parallel and
// through the kernel cache (KernelCache.h), and returns what the plan writer
// embeds in Kernel.cubin_archs / cubins / ptx / launches / source_hash.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "Target/Cuda/CudaCodegen.h"
#include "nf/status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace nf::compiler {
struct PlanModel;
}

namespace nf::codegen {

struct CudaOptions {
  std::vector<std::string> archs{"sm_90"}; // real architectures, for cubins
  std::string sourceDir;   // non-empty: write the generated .cu files here
  std::string cacheDir;    // "" = no cache (see KernelCache::defaultDirectory)
  std::string injectError; // testing: see CudaCodegenOptions::injectError
  int jobs = 0;            // parallel NVRTC compiles; 0 = hardware threads
  int matmulTerms = 3;     // see CudaCodegenOptions::matmulTerms
  bool rowLinear = true;   // see CudaCodegenOptions::rowLinear
  /// SMs the launch grids are sized for (CudaCodegenOptions::smCount).
  /// Testing: a small count makes small models take the code paths of
  /// large ones (NF_CUDA_SM_COUNT).
  int smCount = 132;
};

/// "cuda" or "cuda:sm_90,sm_100" -> archs (sorted, deduplicated). The
/// default architecture is sm_90.
Status parseCudaTarget(const std::string &spec, CudaOptions &opts);

struct CudaKernelBinary {
  std::vector<std::string> archs;           // = CudaOptions::archs
  std::vector<std::vector<uint8_t>> cubins; // one per arch
  std::string ptx;                          // of the lowest arch
  std::vector<CudaLaunchInfo> launches;
  std::string sourceHash; // SHA-256 of the source and the embedded headers
};

struct CudaPlanBinaries {
  std::vector<std::string> archs;
  std::vector<CudaKernelBinary> prefill, decode;
  int64_t prefillScratchBytes = 0, decodeScratchBytes = 0;
  /// Step.expert_stats_offset of each step (-1: none).
  int64_t prefillExpertStatsOffset = -1, decodeExpertStatsOffset = -1;
  CudaTopLogits decodeTopLogits; // launches in decode[kernel]'s module
  // Statistics
  int compiles = 0, cacheHits = 0, cacheMisses = 0;
  std::string cacheDir;
  double seconds = 0.0;
};

/// GEMM inputs are rounded once to bf16 (`--matmul-inputs=bf16`) and every
/// target has mma.sync's bf16 shapes (sm_80 or later): their producers may
/// then store them rounded (nf-cuda-row-formats).
bool roundsGemmInputsToBf16(const CudaOptions &opts);
/// Every target is sm_90 or later (thread block clusters, TMA).
bool targetsHopperOrLater(const CudaOptions &opts);
/// Whether every architecture is sm_90 (prefill GEMMs on wgmma).
bool targetsWgmma(const CudaOptions &opts);
/// Every target is sm_80 or later (mma.sync's bf16 and f64 shapes).
bool targetsAmpereOrLater(const CudaOptions &opts);
/// The dynamic shared memory a block may opt into on every target, bytes
/// (CUDA C++ Programming Guide, "Technical Specifications per Compute
/// Capability").
int64_t maxSharedBytesOf(const CudaOptions &opts);

StatusOr<CudaPlanBinaries> compileCudaPlan(const compiler::PlanModel &plan,
                                           const CudaOptions &opts);

} // namespace nf::codegen
