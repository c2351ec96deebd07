//===- KernelHeaders.cpp - kernels/* embedded at build time ---------------===//
//
// KernelSources.inc is generated from kernels/*.h and kernels/*.cuh by
// EmbedKernels.cmake, so nfc never reads the source tree at run time; NVRTC
// gets these texts through nvrtcCreateProgram's header list.
//
//===----------------------------------------------------------------------===//

#include "Target/Cuda/CudaCodegen.h"

namespace nf::codegen {

const std::vector<std::pair<std::string, std::string>> &kernelHeaders() {
  static const std::vector<std::pair<std::string, std::string>> headers = {
#include "KernelSources.inc"
  };
  return headers;
}

} // namespace nf::codegen
