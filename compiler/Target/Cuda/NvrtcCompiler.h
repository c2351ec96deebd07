//===- NvrtcCompiler.h - CUDA C++ -> cubin / PTX with NVRTC ----*- C++ -*-===//
//
// Ahead-of-time compilation of generated modules: no GPU or driver needed,
// only libnvrtc. Compiling for a real architecture (-arch=sm_90) yields the
// cubin and, from the same compile, the PTX of that architecture (the same
// text a compute_90 compile produces).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "nf/status.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nf::codegen {

/// (file name, text) of the headers a module may #include.
using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct NvrtcOutput {
  std::vector<uint8_t> cubin;
  std::string ptx; // when asked for
};

/// Whether this nfc was built with NVRTC.
bool nvrtcAvailable();
/// "13.0" (the library's version), or "" without NVRTC.
std::string nvrtcVersionString();
/// The NVRTC options of a compile for `arch` ("sm_90", "sm_100a", ...).
std::vector<std::string> nvrtcOptions(const std::string &arch);
/// Whether `arch` names a real architecture NVRTC accepts ("sm_<digits>"
/// with an optional "a"/"f" suffix).
bool isCudaArch(const std::string &arch);

/// Compiles `source` (as `fileName`) for `arch`: a real architecture
/// ("sm_90": the cubin, and the PTX when asked for) or a virtual one
/// ("compute_90": the PTX only). On failure the status is
/// one message: "`what` does not compile for <arch>:" followed by each error
/// (at most a few) with the offending source lines.
StatusOr<NvrtcOutput> nvrtcCompile(const std::string &source,
                                   const std::string &fileName,
                                   const HeaderList &headers,
                                   const std::string &arch, bool wantPtx,
                                   const std::string &what);

/// The error report for an NVRTC log: error lines with source context
/// (exposed for tests).
std::string formatCompileLog(const std::string &log, const std::string &fileName,
                             const std::string &source,
                             const HeaderList &headers);

} // namespace nf::codegen
