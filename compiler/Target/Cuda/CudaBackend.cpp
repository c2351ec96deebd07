//===- CudaBackend.cpp - plan -> CUDA binaries ----------------------------===//

#include "Target/Cuda/CudaBackend.h"

#include "Target/Cuda/KernelCache.h"
#include "Target/Cuda/NvrtcCompiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

namespace nf::codegen {

namespace fs = std::filesystem;

Status parseCudaTarget(const std::string &spec, CudaOptions &opts) {
  if (spec == "cuda") {
    opts.archs = {"sm_90"};
    return Status::success();
  }
  if (spec.rfind("cuda:", 0) != 0)
    return Status::error("--target: expected cpu, cuda or cuda:sm_XX[,sm_YY], "
                         "not '" +
                         spec + "'");
  std::vector<std::string> archs;
  std::stringstream in(spec.substr(5));
  for (std::string a; std::getline(in, a, ',');) {
    if (!isCudaArch(a))
      return Status::error("--target: '" + a +
                           "' is not a CUDA architecture like sm_90");
    archs.push_back(a);
  }
  if (archs.empty())
    return Status::error("--target: no architecture after 'cuda:'");
  auto number = [](const std::string &a) { return std::stoi(a.substr(3)); };
  std::sort(archs.begin(), archs.end(), [&](const auto &x, const auto &y) {
    return number(x) != number(y) ? number(x) < number(y) : x < y;
  });
  archs.erase(std::unique(archs.begin(), archs.end()), archs.end());
  opts.archs = archs;
  return Status::success();
}

namespace {

/// "sm_90a" -> 90.
int capability(const std::string &arch) {
  return arch.size() >= 5 ? std::atoi(arch.c_str() + 3) : 0;
}

} // namespace

bool targetsAmpereOrLater(const CudaOptions &opts) {
  return !opts.archs.empty() &&
         std::all_of(opts.archs.begin(), opts.archs.end(),
                     [](const std::string &a) { return capability(a) >= 80; });
}

bool roundsGemmInputsToBf16(const CudaOptions &opts) {
  return opts.matmulTerms == 1 && targetsAmpereOrLater(opts);
}

int64_t maxSharedBytesOf(const CudaOptions &opts) {
  int64_t bytes = 227 * 1024;
  for (const std::string &a : opts.archs) {
    const int cc = capability(a);
    const int64_t kb = cc == 80 || cc == 87    ? 163
                       : cc == 90 || cc == 100 ? 227
                                               : 99;
    bytes = std::min<int64_t>(bytes, kb * 1024);
  }
  return bytes;
}

bool targetsHopperOrLater(const CudaOptions &opts) {
  return !opts.archs.empty() &&
         std::all_of(opts.archs.begin(), opts.archs.end(),
                     [](const std::string &a) { return capability(a) >= 90; });
}

bool targetsWgmma(const CudaOptions &opts) {
  return !opts.archs.empty() &&
         std::all_of(opts.archs.begin(), opts.archs.end(),
                     [](const std::string &a) {
                       return a == "sm_90" || a == "sm_90a";
                     });
}

namespace {

struct Job {
  const CudaKernelSource *src;
  std::string hash;
  size_t arch;
  bool ptx;
  std::string cubin, ptxText; // results
  Status status = Status::success();
};

/// The hash of the device headers a kernel's source includes, directly or
/// through other headers (`#include "name"` or `<name>` of an embedded
/// header, any spacing): a change to one kernel template recompiles only
/// the kernels that use it.
std::string includedHeadersHash(const std::string &source) {
  std::map<std::string, const std::string *> byName;
  for (const auto &[name, text] : kernelHeaders())
    byName[name] = &text;
  static const std::regex kInclude(R"(#\s*include\s*[<"]([^>"]+)[>"])");
  std::set<std::string> seen;
  std::vector<const std::string *> pending{&source};
  while (!pending.empty()) {
    const std::string &text = *pending.back();
    pending.pop_back();
    for (auto it = std::sregex_iterator(text.begin(), text.end(), kInclude);
         it != std::sregex_iterator(); ++it) {
      auto h = byName.find((*it)[1].str());
      if (h != byName.end() && seen.insert(h->first).second)
        pending.push_back(h->second);
    }
  }
  std::string all;
  for (const std::string &name : seen)
    all += name + '\0' + *byName[name] + '\0';
  return sha256Hex(all);
}

} // namespace

StatusOr<CudaPlanBinaries> compileCudaPlan(const compiler::PlanModel &plan,
                                           const CudaOptions &opts) {
  const auto start = std::chrono::steady_clock::now();
  if (opts.archs.empty())
    return Status::error("cuda: no target architecture");
  if (!nvrtcAvailable())
    return Status::error("cuda: this nfc was built without NVRTC (the CUDA "
                         "toolkit was not found at configure time)");
  CudaCodegenOptions cg;
  cg.injectError = opts.injectError;
  cg.matmulTerms = opts.matmulTerms;
  cg.rowLinear = opts.rowLinear;
  cg.smCount = opts.smCount;
  cg.wgmma = targetsWgmma(opts);
  cg.ampereOrLater = targetsAmpereOrLater(opts);
  cg.hopperOrLater = targetsHopperOrLater(opts);
  cg.maxSharedBytes = maxSharedBytesOf(opts);
  auto sources = generateCudaSources(plan, cg);
  if (!sources)
    return sources.status();

  if (!opts.sourceDir.empty()) {
    std::error_code ec;
    fs::create_directories(opts.sourceDir, ec);
    auto write = [&](const std::string &name, const std::string &text) {
      std::ofstream out(fs::path(opts.sourceDir) / name, std::ios::trunc);
      out << text;
      return static_cast<bool>(out);
    };
    bool ok = !ec;
    for (const auto &[name, text] : kernelHeaders())
      ok = ok && write(name, text);
    for (const CudaStepSources *s : {&sources->prefill, &sources->decode})
      for (const CudaKernelSource &k : s->kernels)
        ok = ok && write(k.fileName, k.source);
    if (!ok)
      return Status::error("--cuda-source-dir: cannot write to " +
                           opts.sourceDir);
  }

  const std::string version = nvrtcVersionString();
  KernelCache cache(opts.cacheDir);
  std::vector<Job> jobs;
  for (const CudaStepSources *s : {&sources->prefill, &sources->decode})
    for (const CudaKernelSource &k : s->kernels) {
      const std::string hash =
          sha256Hex(k.source + '\0' + includedHeadersHash(k.source));
      for (size_t a = 0; a < opts.archs.size(); ++a)
        jobs.push_back({&k, hash, a, a == 0, {}, {}});
    }

  // A kernel with sm_90a features (wgmma) targeting sm_90 gets an sm_90a
  // cubin (it runs on the same GPUs) and the PTX of a compute_90 compile,
  // which leaves the features out and so stays loadable on later GPUs.
  auto runJob = [&](Job &job) {
    const std::string &arch = opts.archs[job.arch];
    const CudaKernelSource &k = *job.src;
    const bool featureCubin = k.hopperFeatures && arch == "sm_90";
    const std::string cubinArch = featureCubin ? "sm_90a" : arch;
    const bool separatePtx = featureCubin && job.ptx;
    std::string key = "nf-kernel-cache-3\n" + job.hash + "\n" + cubinArch +
                      (separatePtx ? " + compute_90" : "") + "\nnvrtc " +
                      version + "\n";
    for (const std::string &o : nvrtcOptions(cubinArch))
      key += o + "\n";
    key = sha256Hex(key);
    auto cubin = cache.load(key, ".cubin");
    std::optional<std::string> ptx;
    if (cubin && job.ptx)
      ptx = cache.load(key, ".ptx");
    if (cubin && (!job.ptx || ptx)) {
      ++cache.hits;
      job.cubin = std::move(*cubin);
      if (ptx)
        job.ptxText = std::move(*ptx);
      return;
    }
    ++cache.misses;
    std::string what = "CUDA module of " + k.step + " kernel " +
                       std::to_string(k.index) + " '" + k.name + "' (";
    for (size_t i = 0; i < k.launches.size(); ++i)
      what += (i ? ", " : "") + k.launches[i].function;
    what += ")";
    auto out = nvrtcCompile(k.source, k.fileName, kernelHeaders(), cubinArch,
                            job.ptx && !separatePtx, what);
    if (!out) {
      job.status = out.status();
      return;
    }
    job.cubin.assign(out->cubin.begin(), out->cubin.end());
    job.ptxText = std::move(out->ptx);
    if (separatePtx) {
      auto virt = nvrtcCompile(k.source, k.fileName, kernelHeaders(),
                               "compute_90", true, what);
      if (!virt) {
        job.status = virt.status();
        return;
      }
      job.ptxText = std::move(virt->ptx);
    }
    cache.store(key, ".cubin", job.cubin);
    if (job.ptx)
      cache.store(key, ".ptx", job.ptxText);
  };

  int threads = opts.jobs > 0
                    ? opts.jobs
                    : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, static_cast<int>(jobs.size()));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&]() {
    for (size_t j; !failed && (j = next.fetch_add(1)) < jobs.size();) {
      runJob(jobs[j]);
      if (!jobs[j].status)
        failed = true;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back(worker);
  worker();
  for (std::thread &t : pool)
    t.join();
  for (const Job &j : jobs) // the first failure in plan order
    if (!j.status)
      return j.status;

  CudaPlanBinaries out;
  out.archs = opts.archs;
  size_t j = 0;
  for (auto [src, dst] : {std::pair{&sources->prefill, &out.prefill},
                          std::pair{&sources->decode, &out.decode}}) {
    for (const CudaKernelSource &k : src->kernels) {
      CudaKernelBinary bin;
      bin.archs = opts.archs;
      bin.launches = k.launches;
      for (size_t a = 0; a < opts.archs.size(); ++a, ++j) {
        bin.sourceHash = jobs[j].hash;
        bin.cubins.emplace_back(jobs[j].cubin.begin(), jobs[j].cubin.end());
        if (a == 0)
          bin.ptx = std::move(jobs[j].ptxText);
      }
      dst->push_back(std::move(bin));
    }
  }
  out.prefillScratchBytes = sources->prefill.scratchBytes;
  out.decodeScratchBytes = sources->decode.scratchBytes;
  out.prefillExpertStatsOffset = sources->prefill.expertStatsOffset;
  out.decodeExpertStatsOffset = sources->decode.expertStatsOffset;
  out.decodeTopLogits = sources->decode.topLogits;
  out.compiles = static_cast<int>(jobs.size());
  out.cacheHits = cache.hits;
  out.cacheMisses = cache.misses;
  out.cacheDir = cache.directory();
  out.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return out;
}

} // namespace nf::codegen
