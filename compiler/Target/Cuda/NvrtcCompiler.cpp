//===- NvrtcCompiler.cpp - CUDA C++ -> cubin / PTX with NVRTC -------------===//

#include "Target/Cuda/NvrtcCompiler.h"

#if NF_HAVE_NVRTC
#include <nvrtc.h>
#endif

#include <algorithm>
#include <cctype>
#include <regex>
#include <sstream>

namespace nf::codegen {

bool isCudaArch(const std::string &arch) {
  static const std::regex re("sm_[0-9]{2,3}[af]?");
  return std::regex_match(arch, re);
}

std::vector<std::string> nvrtcOptions(const std::string &arch) {
  // No fast math: expf / log1pf / division keep their IEEE accuracy, as in
  // the CPU backend (FMA contraction stays on, NVRTC's default).
  return {"--std=c++17", "-arch=" + arch};
}

namespace {

std::vector<std::string> splitLines(const std::string &text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

/// The __global__ function whose definition starts before `line` (1-based).
std::string enclosingFunction(const std::vector<std::string> &lines, int line) {
  static const std::regex fn(
      R"(__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\()");
  for (int i = std::min<int>(line, static_cast<int>(lines.size())) - 1; i >= 0;
       --i) {
    std::smatch m;
    if (std::regex_search(lines[static_cast<size_t>(i)], m, fn))
      return m[1].str();
  }
  return {};
}

} // namespace

std::string formatCompileLog(const std::string &log,
                             const std::string &fileName,
                             const std::string &source,
                             const HeaderList &headers) {
  static const std::regex where(
      R"(^(.*)\((\d+)\): (catastrophic error|error|warning)(.*)$)");
  std::ostringstream out;
  int shown = 0, errors = 0;
  std::string lastPlace; // context once per source line
  for (const std::string &entry : splitLines(log)) {
    std::smatch m;
    if (!std::regex_match(entry, m, where))
      continue;
    if (m[3].str() == "warning")
      continue;
    ++errors;
    if (shown == 3)
      continue;
    ++shown;
    const std::string file = m[1].str();
    const int line = std::stoi(m[2].str());
    const std::string *text = nullptr;
    if (file == fileName || file.ends_with("/" + fileName))
      text = &source;
    for (const auto &[name, body] : headers)
      if (!text && (file == name || file.ends_with("/" + name)))
        text = &body;
    out << "\n" << file << ":" << line << ": " << m[3].str() << m[4].str();
    const std::string place = file + ":" + std::to_string(line);
    if (!text || place == lastPlace)
      continue;
    lastPlace = place;
    const auto lines = splitLines(*text);
    if (text == &source) {
      const std::string fn = enclosingFunction(lines, line);
      if (!fn.empty())
        out << " (in " << fn << ")";
    }
    const int first = std::max(1, line - 2);
    const int last = std::min(static_cast<int>(lines.size()), line + 2);
    for (int l = first; l <= last; ++l) {
      char num[16];
      std::snprintf(num, sizeof num, "%5d", l);
      out << "\n  " << (l == line ? ">" : " ") << num << " | "
          << lines[static_cast<size_t>(l - 1)];
    }
  }
  if (errors > shown)
    out << "\n(" << errors - shown << " more error"
        << (errors - shown > 1 ? "s" : "") << ")";
  if (errors == 0) // no recognisable error line: the raw log
    out << "\n" << log;
  return out.str();
}

#if NF_HAVE_NVRTC

bool nvrtcAvailable() { return true; }

std::string nvrtcVersionString() {
  int major = 0, minor = 0;
  if (::nvrtcVersion(&major, &minor) != NVRTC_SUCCESS)
    return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

StatusOr<NvrtcOutput> nvrtcCompile(const std::string &source,
                                   const std::string &fileName,
                                   const HeaderList &headers,
                                   const std::string &arch, bool wantPtx,
                                   const std::string &what) {
  std::vector<const char *> names, bodies;
  for (const auto &[name, body] : headers) {
    names.push_back(name.c_str());
    bodies.push_back(body.c_str());
  }
  nvrtcProgram prog = nullptr;
  nvrtcResult r = nvrtcCreateProgram(&prog, source.c_str(), fileName.c_str(),
                                     static_cast<int>(headers.size()),
                                     bodies.data(), names.data());
  if (r != NVRTC_SUCCESS)
    return Status::error(what +
                         ": nvrtcCreateProgram: " + nvrtcGetErrorString(r));
  struct Destroy {
    nvrtcProgram *p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&prog};
  const std::vector<std::string> opts = nvrtcOptions(arch);
  std::vector<const char *> copts;
  for (const std::string &o : opts)
    copts.push_back(o.c_str());
  r = nvrtcCompileProgram(prog, static_cast<int>(copts.size()), copts.data());
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    std::string log;
    if (nvrtcGetProgramLogSize(prog, &n) == NVRTC_SUCCESS && n > 0) {
      log.resize(n);
      nvrtcGetProgramLog(prog, log.data());
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n'))
        log.pop_back();
    }
    return Status::error(what + " does not compile for " + arch + ":" +
                         formatCompileLog(log, fileName, source, headers));
  }
  NvrtcOutput out;
  size_t n = 0;
  if (arch.rfind("compute_", 0) == 0) // a virtual architecture: PTX only
    wantPtx = true;
  else {
    if ((r = nvrtcGetCUBINSize(prog, &n)) != NVRTC_SUCCESS || n == 0)
      return Status::error(what + ": no cubin for " + arch + " (" +
                           nvrtcGetErrorString(r) + ")");
    out.cubin.resize(n);
    if ((r = nvrtcGetCUBIN(prog, reinterpret_cast<char *>(out.cubin.data()))) !=
        NVRTC_SUCCESS)
      return Status::error(what + ": nvrtcGetCUBIN: " + nvrtcGetErrorString(r));
  }
  if (wantPtx) {
    if ((r = nvrtcGetPTXSize(prog, &n)) != NVRTC_SUCCESS || n == 0)
      return Status::error(what + ": no PTX for " + arch + " (" +
                           nvrtcGetErrorString(r) + ")");
    out.ptx.resize(n);
    if ((r = nvrtcGetPTX(prog, out.ptx.data())) != NVRTC_SUCCESS)
      return Status::error(what + ": nvrtcGetPTX: " + nvrtcGetErrorString(r));
    while (!out.ptx.empty() && out.ptx.back() == '\0')
      out.ptx.pop_back();
  }
  return out;
}

#else

bool nvrtcAvailable() { return false; }
std::string nvrtcVersionString() { return ""; }
StatusOr<NvrtcOutput> nvrtcCompile(const std::string &, const std::string &,
                                   const HeaderList &, const std::string &,
                                   bool, const std::string &what) {
  return Status::error(what + ": this nfc was built without NVRTC (CUDA "
                              "toolkit not found at configure time)");
}

#endif

} // namespace nf::codegen
