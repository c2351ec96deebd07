// The CUDA backend of nf::Engine (see cuda_engine.h).
#include "cuda/cuda_engine.h"

#include "engine/plan_common.h"
#include "nf_abi.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>

namespace nf::engine {

namespace fb = flatbuffers;
namespace pl = nf::plan;
using namespace nf::cuda;

bool planTargetsCuda(const PlanFile &pf) {
  const pl::Target *t = pf.plan->target();
  return t && t->backend() && t->backend()->string_view() == "cuda";
}

namespace {

constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }

const pl::Step *stepOf(const pl::Plan &plan, int i) {
  return i == 0 ? plan.prefill() : plan.decode();
}
const char *phaseOf(int i) { return i == 0 ? "prefill" : "decode"; }

std::string kernelWhere(const PlanFile &pf, int phase, fb::uoffset_t k,
                        const pl::Kernel &kernel) {
  return pf.path + ": " + phaseOf(phase) + " kernel " + std::to_string(k) +
         " '" + (kernel.name() ? kernel.name()->str() : "") + "'";
}

int deviceOrdinal(const EngineOptions &options) {
  if (options.cudaDevice >= 0)
    return options.cudaDevice;
  if (const char *env = std::getenv("NF_CUDA_DEVICE"); env && *env) {
    char *end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end && *end == '\0' && v >= 0 && v < 1024)
      return static_cast<int>(v);
  }
  return 0;
}

} // namespace

// ---------------------------------------------------------------------------
// Probe

StatusOr<std::unique_ptr<CudaProbe>> probeCuda(const PlanFile &pf,
                                               const EngineOptions &options) {
  if (!planTargetsCuda(pf)) {
    const pl::Target *t = pf.plan->target();
    const std::string target =
        t && t->backend() ? t->backend()->str() : std::string("none");
    return Status::error(pf.path + " has no CUDA binaries (target '" + target +
                         "'; compile it with nfc compile --target=cuda)");
  }
  StatusOr<const Driver *> d = loadDriver(options.cudaDriver);
  if (!d)
    return d.status();
  StatusOr<DeviceInfo> dev = queryDevice(**d, deviceOrdinal(options));
  if (!dev)
    return dev.status();
  auto probe = std::make_unique<CudaProbe>();
  probe->driver = *d;
  probe->device = *dev;
  const std::string arch = dev->arch();
  const pl::Plan &plan = *pf.plan;
  for (int phase = 0; phase < 2; ++phase) {
    const pl::Step *step = stepOf(plan, phase);
    if (!step->kernels())
      continue;
    auto &images = probe->images[phase];
    for (fb::uoffset_t k = 0; k < step->kernels()->size(); ++k) {
      const pl::Kernel &kernel = *step->kernels()->Get(k);
      CudaProbe::Image img;
      if (kernel.launches() && kernel.launches()->size() > 0) {
        const std::string where = kernelWhere(pf, phase, k, kernel);
        const auto *archs = kernel.cubin_archs();
        const auto *cubins = kernel.cubins();
        const size_t na = archs ? archs->size() : 0;
        const size_t nc = cubins ? cubins->size() : 0;
        if (na != nc)
          return Status::error(where + ": " + std::to_string(na) +
                               " cubin architectures for " +
                               std::to_string(nc) + " cubins");
        // The device's own architecture, else its arch-specific variant.
        for (const std::string &want : {arch, arch + "a"}) {
          for (size_t i = 0; i < na && !img.data; ++i) {
            const pl::CubinBlob *blob = cubins->Get(static_cast<uint32_t>(i));
            if (archs->Get(static_cast<uint32_t>(i))->string_view() == want &&
                blob && blob->data() && blob->data()->size() > 0) {
              img.data = blob->data()->data();
              img.size = blob->data()->size();
            }
          }
          if (img.data)
            break;
        }
        if (!img.data && kernel.ptx() && kernel.ptx()->size() > 0) {
          img.data = kernel.ptx()->c_str();
          img.size = kernel.ptx()->size() + 1;
          img.ptx = true;
        }
        if (!img.data) {
          std::string have;
          for (size_t i = 0; i < na; ++i)
            have += (have.empty() ? "" : ", ") +
                    archs->Get(static_cast<uint32_t>(i))->str();
          return Status::error(where + " has no cubin for " + arch +
                               (have.empty() ? "" : " (only " + have + ")") +
                               " and no PTX");
        }
        (img.ptx ? probe->ptx : probe->cubins) += 1;
      }
      images.push_back(img);
    }
  }
  return probe;
}

namespace {

// ---------------------------------------------------------------------------
// The engine

struct LaunchInfo {
  CUfunction fn = nullptr;
  unsigned grid = 0, block = 0, shared = 0;
  bool cooperative = false;
  bool programmatic = false; // may start while its predecessor runs (PDL)
  int64_t minTokens = 0, maxTokens = 0; // runs for steps in range (0: open)
  bool runsFor(int64_t rows) const {
    return rows >= minTokens && (maxTokens == 0 || rows <= maxTokens);
  }
  std::string where;
  std::string profileKey; // "<phase> <kernel name>: <function sans k#_op#_>"
};

/// The select results of one MoE layer, copied aside after the kernel that
/// computes them.
struct StatCopy {
  size_t afterLaunch = 0; // launches that run before the copy
  int32_t layer = 0;      // MoE layer (select ordinal)
  int32_t k = 0;          // experts per token (columns of `experts`)
  int64_t countsOffset = 0, expertsOffset = 0; // arena byte offsets
};

/// A decode step's top-logits launches (Plan Step.top_logits), run after
/// the step when the caller asks for each row's largest logits.
/// sizeof(nf::top_logit_noise): {u64 seed, u64 draw, f32 temperature, u32}.
constexpr int64_t kTopNoiseBytes = 24;

struct TopLaunches {
  int32_t k = 0; // 0: none
  int64_t idsOffset = 0, valuesOffset = 0;
  /// [rows] of nf::top_logit_noise (kernels/nf_sample.cuh); -1: plans
  /// before 1.6, whose lists rank by the logits only.
  int64_t noiseOffset = -1;
  int64_t totalsOffset = -1; // [rows] f64; -1: no totals
  std::vector<LaunchInfo> launches;
};

struct Program : StepValues {
  std::vector<LaunchInfo> launches;
  std::vector<StatCopy> copies; // by afterLaunch
  bool statsAvailable = true;
  /// Plans 1.8: the arena region the kernels write the statistics to
  /// (Step.expert_stats_offset; -1: copies after each kernel), its layout:
  /// counts [layers][rows], then experts [layers][rows * maxK].
  int64_t statsOffset = -1, statsRows = 0, statsMaxK = 0, statsLayers = 0;
  TopLaunches top;
};

/// Byte offsets of the per-run arrays in the step-argument buffers (the
/// same in pinned host staging and in device memory).
struct ArgsLayout {
  size_t tokens = 0, budget = 0, seqs = 0, tokenSeq = 0, logitRows = 0,
         pages = 0, end = 0; // pages last: a run uploads [0, pages + used)
  int64_t maxRows = 0, maxSeqs = 0, maxPages = 0;
};

struct Gpu {
  Stream stream;
  std::vector<Module> modules;
  std::vector<std::string> moduleWhere; // the first kernel of each module
  DeviceBuffer arena;
  DeviceBuffer weights;                // every weight, 256-byte aligned
  std::vector<CUdeviceptr> weightAddr; // per weight: its address and bytes
  std::vector<size_t> weightBytes;
  size_t arenaBytes = 0;
  DeviceBuffer weightPtrs;           // const void *[num weights]
  std::vector<DeviceBuffer> storage; // per Plan.storage entry: two buffers
  DeviceBuffer storagePtrs;          // void *[2 * num storage]
  DeviceBuffer args;                 // nf_step_args + per-run arrays
  PinnedBuffer staging;              // its host image
  DeviceBuffer stats;                // select results, [layer] counts, experts
  PinnedBuffer statsHost;
  PinnedBuffer topHost; // a decode step's top-logits lists
  /// Decode graphs, one per bucket of token counts (launches with token
  /// ranges differ between buckets): graph i serves steps of up to
  /// decodeBuckets[i] tokens.
  std::vector<int64_t> decodeBuckets;
  std::vector<Graph> decodeGraphs;
  std::vector<GraphExec> decodeExecs;
  Event profileStart, profileEnd; // NF_CUDA_PROFILE with CUDA events
};

class CudaEngine final : public Engine {
public:
  CudaEngine(std::unique_ptr<PlanFile> plan,
             std::unique_ptr<BoundWeights> weights,
             std::unique_ptr<CudaProbe> probe)
      : plan_(std::move(plan)), weights_(std::move(weights)),
        probe_(std::move(probe)), d_(probe_->driver) {}
  ~CudaEngine() override {
    printProfile();
    if (gpu_ && ctx_.get()) {
      ContextScope scope(*d_, ctx_.get());
      if (gpu_->stream)
        (void)d_->cuStreamSynchronize(gpu_->stream.get());
      gpu_.reset();
    }
  }

  Status init(const EngineOptions &options);

  /// NF_CUDA_PROFILE=1: graphs are not used, every launch is timed on its
  /// own (GPU time between two CUDA events; host time around a synchronize
  /// where the driver has no events) and the time per kernel is printed to
  /// stderr when the engine goes away. Launches run one at a time, so the
  /// sum is more than a step takes; for finding hot kernels, not a
  /// measurement.
  void printProfile() const {
    if (profile_.empty())
      return;
    std::vector<std::pair<double, std::string>> rows;
    double total = 0.0;
    for (const auto &[name, t] : profile_) {
      rows.push_back({t.first, name});
      total += t.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "nf: CUDA profile (%s, %.1f ms):\n",
                 profileEvents_ ? "GPU time of each launch, CUDA events"
                                : "host-timed launches",
                 total * 1e3);
    for (size_t i = 0; i < rows.size() && i < 80; ++i)
      std::fprintf(stderr, "  %8.2f ms %5.1f%%  %6lld x  %s\n",
                   rows[i].first * 1e3, 100.0 * rows[i].first / total,
                   static_cast<long long>(profile_.at(rows[i].second).second),
                   rows[i].second.c_str());
  }

  const ModelInfo &info() const override { return info_; }
  StatusOr<int32_t> addSequence() override;
  Status removeSequence(int32_t sequence) override;
  Status clearState(int32_t slot);
  int64_t sequenceLength(int32_t sequence) const override;
  CacheUsage cacheUsage() const override {
    return sequences_.usage(storage_.hasAttention);
  }
  const std::vector<std::vector<int64_t>> &expertUtilization() const override {
    return utilization_;
  }
  void resetExpertUtilization() override {
    for (auto &layer : utilization_)
      std::fill(layer.begin(), layer.end(), 0);
  }
  Status step(std::span<const SequenceInput> inputs, LogitsFor which,
              std::vector<float> &logits, StepStats *stats,
              TopLogits *top) override;
  Status lastTokenRow(size_t input, std::span<float> row) override;

private:
  Status readPrograms();
  Status loadKernels();
  StatusOr<LaunchInfo> loadLaunch(const pl::Launch &l, CUmodule module,
                                  std::string where,
                                  const std::string &profileKind);
  Status allocate();
  Status uploadWeights();
  Status bindTensorMaps();
  Status captureDecode();
  /// "graph", or "graphs for <= 16 | <= 64 tokens".
  std::string decodeGraphs() const {
    const std::vector<int64_t> &b = gpu_->decodeBuckets;
    if (b.size() <= 1)
      return "graph";
    std::string s = "graphs for";
    for (size_t i = 0; i < b.size(); ++i)
      s += (i ? " | <= " : " <= ") + std::to_string(b[i]);
    return s + " tokens";
  }
  Status enqueue(const Program &p, int64_t rows);
  Status runProgram(const Program &p, std::span<const SequenceInput> inputs,
                    std::span<const Chunk> chunks, LogitsFor which,
                    std::span<const int64_t> tokenBase, float *logitsOut,
                    StepStats *stats, int32_t expertsPerToken, TopLogits *top);
  std::string where() const { return plan_->path + ": CUDA"; }

  std::unique_ptr<PlanFile> plan_;
  std::unique_ptr<BoundWeights> weights_; // released after the upload
  const bool profiling_ = [] {
    const char *e = std::getenv("NF_CUDA_PROFILE");
    return e && *e && *e != '0';
  }();
  std::map<std::string, std::pair<double, int64_t>> profile_; // where -> (s, n)
  bool profileEvents_ = false;
  bool usePdl_ = false;
  std::unique_ptr<CudaProbe> probe_;
  const Driver *d_;
  ModelInfo info_;
  StorageLayout storage_;
  /// The arena row of each input's last token in the last step, when that
  /// step returned top lists (lastTokenRow); empty otherwise.
  std::vector<int64_t> lastTopRows_;
  Program programs_[2]; // prefill, decode
  Program &prefill_ = programs_[0];
  Program &decode_ = programs_[1];
  ArgsLayout layout_;
  int32_t maxExpertsOverride_ = 0;
  // nf_step_args' expert selection (EngineOptions: budget scope "step",
  // distinct-expert cap); checked against the plan by stepWideSelection.
  int32_t budgetPooled_ = 0;
  double distinctExpertCap_ = 0.0;
  int32_t maxK_ = 0; // largest k of any select (stats buffer columns)
  std::vector<std::vector<int64_t>> utilization_;
  // Sequence bookkeeping as the CPU backend's: slots, lengths, page tables
  // (cpu::Caches without state memory: the state lives on the device).
  cpu::Caches book_;
  SequenceTable sequences_{book_}; // sequence id -> slot of book_
  // Device objects: the context first, so that it is released last.
  Context ctx_;
  std::unique_ptr<Gpu> gpu_;
  std::vector<int32_t> tokenInput_; // per row of the run in progress
};

// ---------------------------------------------------------------------------
// Load

Status CudaEngine::readPrograms() {
  const pl::Plan &plan = *plan_->plan;
  const int64_t numWeights = static_cast<int64_t>(weights_->weights.size());
  for (int phase = 0; phase < 2; ++phase)
    if (Status s =
            readStepValues(*plan_, stepOf(plan, phase), phaseOf(phase),
                           numWeights, info_.vocabSize, programs_[phase]);
        !s)
      return s;

  // MoE layers: the select ops, numbered in program order as on the CPU;
  // the model's k is the smallest top_k.
  for (int phase = 0; phase < 2; ++phase) {
    Program &p = programs_[phase];
    const pl::Step &step = *stepOf(plan, phase);
    const int32_t nv = static_cast<int32_t>(p.values.size());
    int32_t moe = 0;
    size_t launchesSoFar = 0;
    const bool inArena = step.expert_stats_offset() >= 0;
    int32_t stepMaxK = 0;
    for (fb::uoffset_t k = 0; k < step.kernels()->size(); ++k) {
      const pl::Kernel &kernel = *step.kernels()->Get(k);
      launchesSoFar += kernel.launches() ? kernel.launches()->size() : 0;
      if (!kernel.ops())
        continue;
      auto isOutput = [&](int32_t v) {
        if (!kernel.outputs())
          return false;
        for (int32_t o : *kernel.outputs())
          if (o == v)
            return true;
        return false;
      };
      const auto &ops = *kernel.ops();
      // Whether `v` is intact when the kernel ends: one of its outputs, or
      // a value no later op of the kernel (after op `j`) writes over.
      auto intactAtEnd = [&](int32_t v, fb::uoffset_t j) {
        if (isOutput(v))
          return true;
        const ValueInfo &vi = p.values[v];
        for (fb::uoffset_t later = j + 1; later < ops.size(); ++later) {
          const auto *res = ops.Get(later)->results();
          if (!res)
            continue;
          for (int32_t r : *res) {
            if (r < 0 || r >= nv)
              return false;
            const ValueInfo &ri = p.values[r];
            if (ri.kind != pl::ValueKind::Tensor &&
                ri.kind != pl::ValueKind::Dispatch)
              continue;
            if (ri.offset < vi.offset + vi.bytes &&
                vi.offset < ri.offset + ri.bytes)
              return false;
          }
        }
        return true;
      };
      for (fb::uoffset_t j = 0; j < ops.size(); ++j) {
        const pl::Op *op = ops.Get(j);
        if (!op->name() || op->name()->string_view() != "nf_moe.select")
          continue;
        const std::string ctx =
            kernelWhere(*plan_, phase, k, kernel) + " op nf_moe.select";
        std::optional<int64_t> topK = intAttr(*op, "top_k");
        if (!topK || *topK <= 0 || *topK > 4096)
          return Status::error(ctx + ": missing or bad attribute 'top_k'");
        const int32_t K = static_cast<int32_t>(*topK);
        const auto *in = op->operands();
        const auto *out = op->results();
        if (!in || in->size() < 1 || in->Get(0) < 0 || in->Get(0) >= nv ||
            p.values[in->Get(0)].kind != pl::ValueKind::Tensor)
          return Status::error(ctx + ": expects scores as its first operand");
        info_.numExperts = std::max<int32_t>(
            info_.numExperts, static_cast<int32_t>(p.values[in->Get(0)].cols));
        maxExpertsOverride_ =
            maxExpertsOverride_ == 0 ? K : std::min(maxExpertsOverride_, K);
        maxK_ = std::max(maxK_, K);
        const int32_t layer = moe++;
        // Statistics: experts [T, k] and counts [T], i32, in the arena when
        // the kernel ends.
        auto isI32Rows = [&](int32_t v, int64_t cols) {
          return v >= 0 && v < nv &&
                 p.values[v].kind == pl::ValueKind::Tensor &&
                 p.values[v].dtype == pl::DType::I32 &&
                 p.values[v].rows == pl::Rows::Tokens &&
                 p.values[v].cols == cols;
        };
        if (out && out->size() == 3 && isI32Rows(out->Get(0), K) &&
            isI32Rows(out->Get(2), 1) &&
            (inArena ||
             (intactAtEnd(out->Get(0), j) && intactAtEnd(out->Get(2), j))) &&
            kernel.launches() && kernel.launches()->size() > 0) {
          StatCopy c;
          // In the arena's statistics region: read after the step.
          c.afterLaunch =
              inArena ? std::numeric_limits<size_t>::max() : launchesSoFar;
          c.layer = layer;
          c.k = K;
          c.countsOffset = p.values[out->Get(2)].offset;
          c.expertsOffset = p.values[out->Get(0)].offset;
          p.copies.push_back(c);
          stepMaxK = std::max(stepMaxK, K);
        } else {
          p.statsAvailable = false;
        }
      }
    }
    info_.numMoeLayers = std::max(info_.numMoeLayers, moe);
    if (inArena && moe > 0) {
      p.statsOffset = step.expert_stats_offset();
      p.statsRows = step.max_tokens();
      p.statsMaxK = stepMaxK;
      p.statsLayers = moe;
      const int64_t end =
          p.statsOffset + 4 * p.statsLayers * p.statsRows * (1 + p.statsMaxK);
      if (!p.statsAvailable || p.statsRows <= 0 ||
          end > step.arena_bytes() + step.scratch_bytes())
        return Status::error(plan_->path + ": " + phaseOf(phase) +
                             " step: expert statistics region [" +
                             std::to_string(p.statsOffset) + ", " +
                             std::to_string(end) +
                             ") does not fit the arena or its selects");
    }
  }
  info_.topK = maxExpertsOverride_;
  info_.expertStats = prefill_.statsAvailable && decode_.statsAvailable;
  utilization_.assign(
      static_cast<size_t>(info_.numMoeLayers),
      std::vector<int64_t>(static_cast<size_t>(info_.numExperts), 0));
  return Status::success();
}

Status CudaEngine::loadKernels() {
  const pl::Plan &plan = *plan_->plan;
  const DeviceInfo &dev = probe_->device;
  Gpu &g = *gpu_;
  // Programmatic dependent launches (sm_90+, through cuLaunchKernelEx);
  // NF_CUDA_PDL=0 turns them off.
  {
    const char *e = std::getenv("NF_CUDA_PDL");
    usePdl_ = dev.major >= 9 && d_->cuLaunchKernelEx != nullptr &&
              !(e && std::string_view(e) == "0");
  }
  // Kernels with identical images share a module.
  std::unordered_map<std::string_view, size_t> moduleOf;
  for (int phase = 0; phase < 2; ++phase) {
    const pl::Step &step = *stepOf(plan, phase);
    Program &p = programs_[phase];
    const auto &images = probe_->images[phase];
    std::vector<CUmodule> kernelModule(step.kernels()->size(), nullptr);
    for (fb::uoffset_t k = 0; k < step.kernels()->size(); ++k) {
      const pl::Kernel &kernel = *step.kernels()->Get(k);
      if (!kernel.launches() || kernel.launches()->size() == 0)
        continue;
      const std::string kwhere = kernelWhere(*plan_, phase, k, kernel);
      const CudaProbe::Image &img = images[k];
      const std::string_view key(static_cast<const char *>(img.data), img.size);
      auto it = moduleOf.find(key);
      if (it == moduleOf.end()) {
        StatusOr<Module> m = loadModule(*d_, img.data, img.size, img.ptx);
        if (!m)
          return Status::error(kwhere + ": " + m.message());
        g.modules.push_back(std::move(*m));
        g.moduleWhere.push_back(kwhere);
        it = moduleOf.emplace(key, g.modules.size() - 1).first;
      }
      const CUmodule module = g.modules[it->second].get();
      kernelModule[k] = module;
      for (fb::uoffset_t j = 0; j < kernel.launches()->size(); ++j) {
        StatusOr<LaunchInfo> li =
            loadLaunch(*kernel.launches()->Get(j), module,
                       kwhere + " launch " + std::to_string(j),
                       std::string(phase == 0 ? "prefill " : "decode ") +
                           (kernel.name() ? kernel.name()->str() : "?"));
        if (!li)
          return li.status();
        p.launches.push_back(std::move(*li));
      }
    }
    // NF_CUDA_TOP_LOGITS=0: steps return rows only (to compare).
    const char *topEnv = std::getenv("NF_CUDA_TOP_LOGITS");
    const pl::TopLogits *t = step.top_logits();
    if (t && phase == 1 && !(topEnv && std::string_view(topEnv) == "0")) {
      // Checked like the kernels' own launches, and against the arena.
      const std::string twhere = plan_->path + ": decode top logits";
      const int64_t rows = step.max_tokens(), k = t->k();
      const int64_t end = step.arena_bytes() + step.scratch_bytes();
      if (t->kernel() < 0 ||
          t->kernel() >= static_cast<int32_t>(kernelModule.size()) ||
          !kernelModule[static_cast<size_t>(t->kernel())] || k <= 0 ||
          k > 4096 || !t->launches() || t->launches()->size() == 0)
        return Status::error(twhere + ": kernel " +
                             std::to_string(t->kernel()) + ", k " +
                             std::to_string(k) + " or launches invalid");
      for (int64_t off : {t->ids_offset(), t->values_offset()})
        if (off < 0 || off % 4 != 0 || off + rows * k * 4 > end)
          return Status::error(twhere + ": list at " + std::to_string(off) +
                               " does not fit the arena (" +
                               std::to_string(end) + " bytes)");
      if (const int64_t off = t->noise_offset();
          off != -1 &&
          (off < 0 || off % 8 != 0 || off + rows * kTopNoiseBytes > end))
        return Status::error(twhere + ": noise rows at " + std::to_string(off) +
                             " do not fit the arena (" + std::to_string(end) +
                             " bytes)");
      p.top.k = static_cast<int32_t>(k);
      p.top.idsOffset = t->ids_offset();
      p.top.valuesOffset = t->values_offset();
      // The records' flags (keys, total) are 1.7's: a 1.6 plan's
      // functions ranked by keys wherever the temperature was set, which
      // this runtime's records would misread; its lists rank by logit.
      const bool records = plan.version_minor() >= 7;
      p.top.noiseOffset = records ? t->noise_offset() : -1;
      if (const int64_t off = records ? t->totals_offset() : -1;
          off != -1 && (off < 0 || off % 8 != 0 || off + rows * 8 > end ||
                        p.top.noiseOffset < 0))
        return Status::error(twhere + ": totals at " + std::to_string(off) +
                             " do not fit the arena (" + std::to_string(end) +
                             " bytes) or come without noise rows");
      p.top.totalsOffset = records ? t->totals_offset() : -1;
      for (fb::uoffset_t j = 0; j < t->launches()->size(); ++j) {
        StatusOr<LaunchInfo> li = loadLaunch(
            *t->launches()->Get(j),
            kernelModule[static_cast<size_t>(t->kernel())],
            twhere + " launch " + std::to_string(j), "decode top logits");
        if (!li)
          return li.status();
        li->programmatic = false; // after a graph, not inside one
        p.top.launches.push_back(std::move(*li));
      }
    }
  }
  return Status::success();
}

/// One launch of a module, checked against the device.
StatusOr<LaunchInfo> CudaEngine::loadLaunch(const pl::Launch &l,
                                            CUmodule module, std::string where,
                                            const std::string &profileKind) {
  const DeviceInfo &dev = probe_->device;
  LaunchInfo li;
  li.where = std::move(where);
  if (!l.function() || l.function()->size() == 0)
    return Status::error(li.where + ": no function name");
  li.where += " (" + l.function()->str() + ")";
  {
    std::string fn = l.function()->str();
    // k12_op3_linear -> linear: one profile row per kind of launch.
    size_t cut = 0;
    for (int part = 0; part < 2; ++part) {
      size_t u = fn.find('_', cut);
      if (u == std::string::npos)
        break;
      cut = u + 1;
    }
    li.profileKey = profileKind + ": " + fn.substr(cut);
  }
  li.grid = l.grid();
  li.block = l.block();
  li.shared = l.shared_bytes();
  li.cooperative = l.cooperative();
  li.programmatic = l.programmatic() && usePdl_ && !li.cooperative;
  li.minTokens = l.min_tokens();
  li.maxTokens = l.max_tokens();
  if (li.grid == 0 || li.grid > 0x7fffffffu || li.block == 0 ||
      static_cast<int64_t>(li.block) > dev.maxThreadsPerBlock)
    return Status::error(
        li.where + ": launch shape " + std::to_string(li.grid) + " x " +
        std::to_string(li.block) + " is not valid on this device (at most " +
        std::to_string(dev.maxThreadsPerBlock) + " threads per block)");
  if (static_cast<int64_t>(li.shared) > dev.maxSharedPerBlockOptin)
    return Status::error(li.where + ": " + std::to_string(li.shared) +
                         " bytes of shared memory; the device allows " +
                         std::to_string(dev.maxSharedPerBlockOptin));
  if (Status s = d_->check(
          d_->cuModuleGetFunction(&li.fn, module, l.function()->c_str()),
          "cuModuleGetFunction");
      !s)
    return Status::error(li.where + ": " + s.message());
  // Every launch with dynamic shared memory raises the function's
  // limit to it: the default 48 KiB covers static plus dynamic bytes,
  // so 48 KiB of dynamic memory beside any static bytes needs it too.
  if (li.shared > 0)
    if (Status s = d_->check(
            d_->cuFuncSetAttribute(
                li.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                static_cast<int>(li.shared)),
            "cuFuncSetAttribute");
        !s)
      return Status::error(li.where + ": " + s.message());
  if (li.cooperative) {
    if (!dev.cooperativeLaunch)
      return Status::error(li.where + ": needs cooperative launches, "
                                      "which the device does not "
                                      "support");
    int perSm = 0;
    if (Status s =
            d_->check(d_->cuOccupancyMaxActiveBlocksPerMultiprocessor(
                          &perSm, li.fn, static_cast<int>(li.block), li.shared),
                      "cuOccupancyMaxActiveBlocksPerMultiprocessor");
        !s)
      return Status::error(li.where + ": " + s.message());
    const int64_t resident = static_cast<int64_t>(perSm) * dev.multiprocessors;
    if (static_cast<int64_t>(li.grid) > resident)
      return Status::error(li.where + ": cooperative grid of " +
                           std::to_string(li.grid) + " blocks exceeds the " +
                           std::to_string(resident) +
                           " that can be resident at once on this device");
  }
  return li;
}

/// Every weight to the device, in stream order (all uploads go through
/// `stream`: copies on the legacy stream would not be ordered with it).
Status CudaEngine::uploadWeights() {
  Gpu &g = *gpu_;
  CUstream stream = g.stream.get();
  const auto &ws = weights_->weights;
  std::vector<size_t> offsets(ws.size());
  std::vector<size_t> sizes(ws.size());
  size_t total = 0;
  const pl::Plan &plan = *plan_->plan;
  for (size_t i = 0; i < ws.size(); ++i) {
    size_t n = 1;
    for (int64_t d : ws[i].shape)
      n *= static_cast<size_t>(d);
    sizes[i] =
        n * dtypeSize(toDType(
                plan.weights()->Get(static_cast<fb::uoffset_t>(i))->dtype()));
    offsets[i] = total;
    total += align256(sizes[i]);
  }
  StatusOr<DeviceBuffer> buf = allocDevice(*d_, total);
  if (!buf)
    return Status::error(where() + ": weights: " + buf.message());
  g.weights = std::move(*buf);
  std::vector<CUdeviceptr> ptrs(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) {
    const BoundWeight &w = ws[i];
    const CUdeviceptr dst = g.weights.ptr() + offsets[i];
    ptrs[i] = dst;
    const std::string ctx = where() + ": uploading weight " + std::to_string(i);
    if (w.view.valid()) {
      if (Status s = d_->check(
              d_->cuMemcpyHtoDAsync(dst, w.view.data, sizes[i], stream),
              "cuMemcpyHtoDAsync");
          !s)
        return Status::error(ctx + ": " + s.message());
      continue;
    }
    // Stacked from one tensor per expert: contiguous [E, ...].
    if (w.experts.empty() || sizes[i] % w.experts.size() != 0)
      return Status::error(ctx + ": no data");
    const size_t each = sizes[i] / w.experts.size();
    for (size_t e = 0; e < w.experts.size(); ++e) {
      const WeightView &v = w.experts[e];
      if (static_cast<size_t>(v.numElements()) * v.elementSize() != each)
        return Status::error(ctx + ": expert " + std::to_string(e) +
                             " has the wrong size");
      if (Status s = d_->check(
              d_->cuMemcpyHtoDAsync(dst + e * each, v.data, each, stream),
              "cuMemcpyHtoDAsync");
          !s)
        return Status::error(ctx + ": " + s.message());
    }
  }
  StatusOr<DeviceBuffer> table =
      allocDevice(*d_, std::max<size_t>(ptrs.size(), 1) * sizeof(CUdeviceptr));
  if (!table)
    return Status::error(where() + ": weight table: " + table.message());
  g.weightPtrs = std::move(*table);
  g.weightAddr = ptrs;
  g.weightBytes = sizes;
  if (!ptrs.empty())
    if (Status s = d_->check(
            d_->cuMemcpyHtoDAsync(g.weightPtrs.ptr(), ptrs.data(),
                                  ptrs.size() * sizeof(CUdeviceptr), stream),
            "cuMemcpyHtoDAsync");
        !s)
      return Status::error(where() + ": weight table: " + s.message());
  // The sources (the table, the mapped checkpoint) must outlive the copies.
  if (Status s =
          d_->check(d_->cuStreamSynchronize(stream), "cuStreamSynchronize");
      !s)
    return Status::error(where() + ": uploading the weights: " + s.message());
  return Status::success();
}

/// Encodes the TMA tensor maps that modules declare (nf_abi.h:
/// nf_tensor_map_descs, nf_tensor_maps) now that the weights and the arena
/// have their addresses; every map is checked to lie inside its source.
Status CudaEngine::bindTensorMaps() {
  Gpu &g = *gpu_;
  CUstream stream = g.stream.get();
  for (size_t m = 0; m < g.modules.size(); ++m) {
    const std::string &mw = g.moduleWhere[m];
    CUdeviceptr descAddr = 0, mapAddr = 0;
    size_t descBytes = 0, mapBytes = 0;
    const CUresult found = d_->cuModuleGetGlobal(
        &descAddr, &descBytes, g.modules[m].get(), "nf_tensor_map_descs");
    if (found == CUDA_ERROR_NOT_FOUND)
      continue;
    if (Status s = d_->check(found, "cuModuleGetGlobal"); !s)
      return Status::error(mw + ": " + s.message());
    if (Status s = d_->check(d_->cuModuleGetGlobal(&mapAddr, &mapBytes,
                                                   g.modules[m].get(),
                                                   "nf_tensor_maps"),
                             "cuModuleGetGlobal");
        !s)
      return Status::error(mw + ": nf_tensor_maps: " + s.message());
    const size_t n = descBytes / sizeof(nf_tensor_map_desc);
    if (n == 0 || descBytes % sizeof(nf_tensor_map_desc) != 0 ||
        mapBytes != n * sizeof(CUtensorMap) || mapAddr % 64 != 0)
      return Status::error(mw + ": malformed tensor map declarations (" +
                           std::to_string(descBytes) + " and " +
                           std::to_string(mapBytes) + " bytes)");
    if (!d_->cuTensorMapEncodeTiled)
      return Status::error(mw + ": needs TMA tensor maps, but the driver has "
                                "no cuTensorMapEncodeTiled (CUDA 12 or later)");
    std::vector<nf_tensor_map_desc> descs(n);
    if (Status s = d_->check(
            d_->cuMemcpyDtoHAsync(descs.data(), descAddr, descBytes, stream),
            "cuMemcpyDtoHAsync");
        !s)
      return Status::error(mw + ": " + s.message());
    if (Status s =
            d_->check(d_->cuStreamSynchronize(stream), "cuStreamSynchronize");
        !s)
      return Status::error(mw + ": " + s.message());
    std::vector<CUtensorMap> maps(n);
    for (size_t i = 0; i < n; ++i) {
      const nf_tensor_map_desc &t = descs[i];
      const std::string what = mw + ": tensor map " + std::to_string(i);
      CUdeviceptr base = 0;
      size_t size = 0;
      if (t.source == NF_TENSOR_MAP_WEIGHT && t.index >= 0 &&
          static_cast<size_t>(t.index) < g.weightAddr.size()) {
        base = g.weightAddr[static_cast<size_t>(t.index)];
        size = g.weightBytes[static_cast<size_t>(t.index)];
      } else if (t.source == NF_TENSOR_MAP_ARENA) {
        base = g.arena.ptr();
        size = g.arenaBytes;
      } else {
        return Status::error(what + ": unknown source " +
                             std::to_string(t.source) + " / " +
                             std::to_string(t.index));
      }
      // Inside its source, strides and addresses as TMA needs them.
      const bool valid =
          t.offset >= 0 && t.dims[0] > 0 && t.dims[1] > 0 &&
          t.stride >= 2 * t.dims[0] && t.stride % 16 == 0 &&
          (base + static_cast<CUdeviceptr>(t.offset)) % 16 == 0 &&
          t.box[0] * 2 == 128 && t.box[1] > 0 && t.box[1] <= 256 &&
          static_cast<size_t>(t.offset + (t.dims[1] - 1) * t.stride +
                              2 * t.dims[0]) <= size;
      if (!valid)
        return Status::error(what + " does not fit its source (" +
                             std::to_string(size) + " bytes)");
      const unsigned long long dims[2] = {
          static_cast<unsigned long long>(t.dims[0]),
          static_cast<unsigned long long>(t.dims[1])};
      const unsigned long long strides[1] = {
          static_cast<unsigned long long>(t.stride)};
      const unsigned box[2] = {static_cast<unsigned>(t.box[0]),
                               static_cast<unsigned>(t.box[1])};
      const unsigned elementStrides[2] = {1, 1};
      if (Status s = d_->check(
              d_->cuTensorMapEncodeTiled(
                  &maps[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                  reinterpret_cast<void *>(
                      static_cast<uintptr_t>(base + t.offset)),
                  dims, strides, box, elementStrides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
              "cuTensorMapEncodeTiled");
          !s)
        return Status::error(what + ": " + s.message());
    }
    if (Status s = d_->check(
            d_->cuMemcpyHtoDAsync(mapAddr, maps.data(), mapBytes, stream),
            "cuMemcpyHtoDAsync");
        !s)
      return Status::error(mw + ": " + s.message());
    // `maps` must outlive the copy.
    if (Status s =
            d_->check(d_->cuStreamSynchronize(stream), "cuStreamSynchronize");
        !s)
      return Status::error(mw + ": " + s.message());
  }
  return Status::success();
}

Status CudaEngine::allocate() {
  Gpu &g = *gpu_;
  CUstream stream = g.stream.get();
  auto alloc = [&](DeviceBuffer &out, size_t bytes, const char *what,
                   bool zero) -> Status {
    StatusOr<DeviceBuffer> b = allocDevice(*d_, bytes);
    if (!b)
      return Status::error(where() + ": " + what + ": " + b.message());
    out = std::move(*b);
    if (zero)
      if (Status s =
              d_->check(d_->cuMemsetD8Async(out.ptr(), 0,
                                            std::max<size_t>(bytes, 1), stream),
                        "cuMemsetD8Async");
          !s)
        return Status::error(where() + ": " + what + ": " + s.message());
    return Status::success();
  };

  // The arena.
  const int64_t arena = std::max(prefill_.arenaBytes + prefill_.scratchBytes,
                                 decode_.arenaBytes + decode_.scratchBytes);
  if (Status s =
          alloc(g.arena, static_cast<size_t>(std::max<int64_t>(arena, 1)),
                "arena", true);
      !s)
    return s;
  g.arenaBytes = static_cast<size_t>(std::max<int64_t>(arena, 0));

  // State: two buffers per storage entry.
  const int64_t slots = storage_.cache.numSlots;
  std::vector<CUdeviceptr> sptrs;
  for (const StorageInfo &si : storage_.entries) {
    size_t a = 0, b = 0;
    if (si.kind == pl::StorageKind::KVCache) {
      a = b = static_cast<size_t>(storage_.cache.numPages) *
              static_cast<size_t>(storage_.cache.pageSize) *
              static_cast<size_t>(si.kv.numKvHeads * si.kv.headDim) *
              sizeof(float);
    } else {
      a = static_cast<size_t>(slots * si.mamba.convStateSize()) * sizeof(float);
      b = static_cast<size_t>(slots * si.mamba.ssmStateSize()) * sizeof(float);
    }
    for (size_t bytes : {a, b}) {
      DeviceBuffer buf;
      if (Status s = alloc(buf, bytes, "state", true); !s)
        return s;
      sptrs.push_back(buf.ptr());
      g.storage.push_back(std::move(buf));
    }
  }
  if (Status s = alloc(g.storagePtrs,
                       std::max<size_t>(sptrs.size(), 1) * sizeof(CUdeviceptr),
                       "state table", false);
      !s)
    return s;
  if (!sptrs.empty())
    if (Status s = d_->check(
            d_->cuMemcpyHtoDAsync(g.storagePtrs.ptr(), sptrs.data(),
                                  sptrs.size() * sizeof(CUdeviceptr), stream),
            "cuMemcpyHtoDAsync");
        !s)
      return Status::error(where() + ": state table: " + s.message());
  // `sptrs` must outlive its copy.
  if (Status s =
          d_->check(d_->cuStreamSynchronize(stream), "cuStreamSynchronize");
      !s)
    return Status::error(where() + ": state table: " + s.message());

  // Step arguments: the struct, then the per-run arrays. A run has at most
  // max_tokens rows and at most one sequence per row or per slot; a page
  // table row holds at most every page.
  ArgsLayout &L = layout_;
  L.maxRows = std::max(prefill_.maxTokens, decode_.maxTokens);
  L.maxSeqs = std::min<int64_t>(L.maxRows, slots);
  L.maxPages = storage_.hasAttention ? storage_.cache.numPages : 1;
  size_t at = align256(sizeof(nf_step_args));
  auto take = [&](size_t &off, size_t bytes) {
    off = at;
    at += align256(bytes);
  };
  const size_t R = static_cast<size_t>(L.maxRows);
  const size_t S = static_cast<size_t>(L.maxSeqs);
  take(L.tokens, R * sizeof(int32_t));
  take(L.budget, R * sizeof(float));
  take(L.seqs, S * sizeof(nf_seq_desc));
  take(L.tokenSeq, R * sizeof(int32_t));
  take(L.logitRows, R * sizeof(int32_t));
  take(L.pages, S * static_cast<size_t>(L.maxPages) * sizeof(int32_t));
  L.end = at;
  if (Status s = alloc(g.args, L.end, "step arguments", true); !s)
    return s;
  StatusOr<PinnedBuffer> staging = allocPinned(*d_, L.end);
  if (!staging)
    return Status::error(where() + ": step arguments: " + staging.message());
  g.staging = std::move(*staging);
  std::memset(g.staging.data(), 0, L.end);

  // Expert statistics: per MoE layer, counts [R] then experts [R, max k].
  if (info_.numMoeLayers > 0 && info_.expertStats) {
    const size_t bytes = static_cast<size_t>(info_.numMoeLayers) * R *
                         (1 + static_cast<size_t>(maxK_)) * sizeof(int32_t);
    if (Status s = alloc(g.stats, bytes, "expert statistics", true); !s)
      return s;
    StatusOr<PinnedBuffer> host = allocPinned(*d_, bytes);
    if (!host)
      return Status::error(where() + ": expert statistics: " + host.message());
    g.statsHost = std::move(*host);
  }
  // Top-logits lists of a decode step: ids then values, [rows][k] each,
  // then the rows' noise to upload, then their totals.
  if (decode_.top.k > 0) {
    StatusOr<PinnedBuffer> host = allocPinned(
        *d_, static_cast<size_t>(decode_.maxTokens) *
                 (static_cast<size_t>(decode_.top.k) * 8 + kTopNoiseBytes + 8));
    if (!host)
      return Status::error(where() + ": top logits: " + host.message());
    g.topHost = std::move(*host);
  }
  return Status::success();
}

/// The program's kernels (and statistics copies) into the stream; `rows`:
/// rows of the select results to copy.
Status CudaEngine::enqueue(const Program &p, int64_t rows) {
  Gpu &g = *gpu_;
  CUstream stream = g.stream.get();
  const size_t R = static_cast<size_t>(layout_.maxRows);
  const size_t L = static_cast<size_t>(info_.numMoeLayers);
  size_t c = 0;
  for (size_t i = 0; i <= p.launches.size(); ++i) {
    for (; c < p.copies.size() && p.copies[c].afterLaunch == i; ++c) {
      if (g.stats.ptr() == 0)
        continue;
      const StatCopy &sc = p.copies[c];
      const CUdeviceptr counts =
          g.stats.ptr() + static_cast<size_t>(sc.layer) * R * sizeof(int32_t);
      const CUdeviceptr experts =
          g.stats.ptr() + (L * R + static_cast<size_t>(sc.layer) * R *
                                       static_cast<size_t>(maxK_)) *
                              sizeof(int32_t);
      const size_t n = static_cast<size_t>(rows);
      if (Status s = d_->check(
              d_->cuMemcpyDtoDAsync(counts, g.arena.ptr() + sc.countsOffset,
                                    n * sizeof(int32_t), stream),
              "cuMemcpyDtoDAsync");
          !s)
        return Status::error(where() + ": expert statistics: " + s.message());
      if (Status s = d_->check(
              d_->cuMemcpyDtoDAsync(
                  experts, g.arena.ptr() + sc.expertsOffset,
                  n * static_cast<size_t>(sc.k) * sizeof(int32_t), stream),
              "cuMemcpyDtoDAsync");
          !s)
        return Status::error(where() + ": expert statistics: " + s.message());
    }
    if (i == p.launches.size())
      break;
    const LaunchInfo &l = p.launches[i];
    if (!l.runsFor(rows))
      continue;
    const auto t0 = std::chrono::steady_clock::now();
    const bool timed = profiling_ && g.profileStart && g.profileEnd;
    if (timed)
      (void)d_->cuEventRecord(g.profileStart.get(), stream);
    if (Status s = launch(*d_, l.fn, l.grid, l.block, l.shared, l.cooperative,
                          l.programmatic && !profiling_, stream, g.args.ptr(),
                          g.arena.ptr());
        !s)
      return Status::error(l.where + ": " + s.message());
    if (profiling_) {
      double seconds = 0.0;
      float ms = 0.0f;
      if (timed &&
          d_->cuEventRecord(g.profileEnd.get(), stream) == CUDA_SUCCESS &&
          d_->cuEventSynchronize(g.profileEnd.get()) == CUDA_SUCCESS &&
          d_->cuEventElapsedTime(&ms, g.profileStart.get(),
                                 g.profileEnd.get()) == CUDA_SUCCESS) {
        seconds = ms * 1e-3;
      } else {
        if (Status s = d_->check(d_->cuStreamSynchronize(stream),
                                 "cuStreamSynchronize");
            !s)
          return Status::error(l.where + ": " + s.message());
        seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
      }
      auto &entry = profile_[l.profileKey];
      entry.first += seconds;
      ++entry.second;
    }
  }
  return Status::success();
}

Status CudaEngine::captureDecode() {
  Gpu &g = *gpu_;
  CUstream stream = g.stream.get();
  // Bucket bounds: where the set of launches that run changes, and the most.
  std::set<int64_t> bounds{decode_.maxTokens};
  for (const LaunchInfo &l : decode_.launches) {
    if (l.maxTokens > 0 && l.maxTokens < decode_.maxTokens)
      bounds.insert(l.maxTokens);
    if (l.minTokens > 1 && l.minTokens - 1 < decode_.maxTokens)
      bounds.insert(l.minTokens - 1);
  }
  for (int64_t bound : bounds) {
    const std::string what = ": capturing the decode graph for " +
                             std::to_string(bound) + " tokens: ";
    if (Status s = d_->check(d_->cuStreamBeginCapture(
                                 stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                             "cuStreamBeginCapture");
        !s)
      return Status::error(where() + what + s.message());
    Status enq = enqueue(decode_, bound);
    CUgraph graph = nullptr;
    Status end =
        d_->check(d_->cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
    Graph owned;
    if (graph)
      owned = Graph(*d_, graph);
    if (!enq)
      return Status::error(where() + what + enq.message());
    if (!end)
      return Status::error(where() + what + end.message());
    CUgraphExec exec = nullptr;
    if (Status s = d_->check(d_->cuGraphInstantiateWithFlags(&exec, graph, 0),
                             "cuGraphInstantiateWithFlags");
        !s)
      return Status::error(where() + ": instantiating the decode graph for " +
                           std::to_string(bound) + " tokens: " + s.message());
    g.decodeBuckets.push_back(bound);
    g.decodeGraphs.push_back(std::move(owned));
    g.decodeExecs.push_back(GraphExec(*d_, exec));
  }
  return Status::success();
}

/// The step budget scope and the distinct-expert cap on the device: the
/// kernels of plans since 1.9 read them from nf_step_args, and only the
/// budget policy's selection (moe_budget, moe_route's deferred ranking)
/// applies them.
Status stepWideSelection(const PlanFile &file, const EngineOptions &options) {
  if (!options.budgetStepScope && options.distinctExpertCap <= 0.0)
    return Status::success();
  const pl::Plan &plan = *file.plan;
  const std::string what = options.budgetStepScope ? "the step budget scope"
                                                   : "the distinct-expert "
                                                     "cap";
  if (plan.version_minor() < 9)
    return Status::error(file.path + ": CUDA: " + what +
                         " needs a plan of format 1.9 or later (this one is " +
                         std::to_string(plan.version_major()) + "." +
                         std::to_string(plan.version_minor()) +
                         "); recompile it with this nfc");
  for (int phase = 0; phase < 2; ++phase) {
    const pl::Step *step = stepOf(plan, phase);
    if (!step || !step->kernels())
      continue;
    for (const pl::Kernel *kernel : *step->kernels()) {
      if (!kernel->ops())
        continue;
      for (const pl::Op *op : *kernel->ops())
        if (op->name() && op->name()->string_view() == "nf_moe.select" &&
            pl::stringAttr(*op, "policy").value_or("topk") != "budget")
          return Status::error(
              file.path + ": CUDA: " + what +
              " needs a plan compiled with --expert-policy=budget");
    }
  }
  return Status::success();
}

Status CudaEngine::init(const EngineOptions &options) {
  if (Status s = readModelInfo(*plan_, *weights_, info_); !s)
    return s;
  if (Status s = stepWideSelection(*plan_, options); !s)
    return s;
  budgetPooled_ = options.budgetStepScope ? 1 : 0;
  distinctExpertCap_ = options.distinctExpertCap;
  StatusOr<StorageLayout> layout =
      readStorage(*plan_, options, info_.maxDecodeTokens, "CUDA");
  if (!layout)
    return layout.status();
  storage_ = std::move(*layout);
  info_.maxSequences = storage_.cache.numSlots;
  info_.maxContext = storage_.maxContext;
  {
    // Bookkeeping only: no Mamba layers, and one KV layer of zero size that
    // makes the page allocator hand out page ids.
    std::vector<cpu::KvLayerShape> kv;
    if (storage_.hasAttention)
      kv.push_back({0, 0});
    StatusOr<cpu::Caches> book = cpu::Caches::create({}, kv, storage_.cache);
    if (!book)
      return Status::error(plan_->path + ": " + book.message());
    book_ = std::move(*book);
  }
  if (Status s = readPrograms(); !s)
    return s;

  const DeviceInfo &dev = probe_->device;
  StatusOr<Context> ctx = Context::retain(*d_, dev.device);
  if (!ctx)
    return Status::error(where() + ": " + ctx.message());
  ctx_ = std::move(*ctx);
  ContextScope scope(*d_, ctx_.get());
  if (!scope.status())
    return Status::error(where() + ": " + scope.status().message());
  gpu_ = std::make_unique<Gpu>();
  StatusOr<Stream> stream = createStream(*d_);
  if (!stream)
    return Status::error(where() + ": " + stream.message());
  gpu_->stream = std::move(*stream);
  if (profiling_ && d_->cuEventCreate && d_->cuEventDestroy &&
      d_->cuEventRecord && d_->cuEventSynchronize && d_->cuEventElapsedTime) {
    CUevent e0 = nullptr, e1 = nullptr;
    if (d_->cuEventCreate(&e0, 0) == CUDA_SUCCESS)
      gpu_->profileStart = Event(*d_, e0);
    if (d_->cuEventCreate(&e1, 0) == CUDA_SUCCESS)
      gpu_->profileEnd = Event(*d_, e1);
    profileEvents_ = gpu_->profileStart && gpu_->profileEnd;
  }
  if (Status s = loadKernels(); !s)
    return s;
  info_.topLogits = decode_.top.k;
  info_.topLogitsNoise = decode_.top.k > 0 && decode_.top.noiseOffset >= 0;
  info_.topLogitsTotals = info_.topLogitsNoise && decode_.top.totalsOffset >= 0;
  if (Status s = allocate(); !s)
    return s;
  if (Status s = uploadWeights(); !s)
    return s;
  if (Status s = bindTensorMaps(); !s)
    return s;
  // A decode program that cannot be captured (a driver without capturable
  // cooperative launches, say) still runs, launch by launch: the reason is
  // kept in ModelInfo::device.
  std::string graphNote;
  if (options.cudaGraphs && !profiling_)
    if (Status s = captureDecode(); !s) {
      gpu_->decodeExecs.clear();
      gpu_->decodeGraphs.clear();
      gpu_->decodeBuckets.clear();
      graphNote = " (graph capture failed: " + s.message() + ")";
    }
  if (Status s = d_->check(d_->cuStreamSynchronize(gpu_->stream.get()),
                           "cuStreamSynchronize");
      !s)
    return Status::error(where() + ": " + s.message());

  info_.backend = "cuda";
  const double gib = static_cast<double>(dev.totalMemory) / (1u << 30);
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.0f GiB", gib);
  info_.device =
      dev.name + " (" + dev.arch() + ", " +
      std::to_string(dev.multiprocessors) + " SMs, " + mem + "; driver " +
      std::to_string(d_->version / 1000) + "." +
      std::to_string(d_->version % 1000 / 10) +
      "); kernels: " + std::to_string(probe_->cubins) + " cubin, " +
      std::to_string(probe_->ptx) + " PTX JIT; decode " +
      (gpu_->decodeExecs.empty() ? std::string("launches") : decodeGraphs()) +
      (usePdl_ ? ", programmatic launches" : "") + graphNote +
      (decode_.top.k > 0
           ? "; top " + std::to_string(decode_.top.k) + " logits on the device"
           : "") +
      (info_.numMoeLayers > 0 && !info_.expertStats ? "; no expert statistics"
                                                    : "");
  // The device holds the weights now: unmap the checkpoint.
  weights_.reset();
  return Status::success();
}

// ---------------------------------------------------------------------------
// Sequences

StatusOr<int32_t> CudaEngine::addSequence() {
  return sequences_.add(info_.maxSequences,
                        [this](int32_t slot) { return clearState(slot); });
}

/// A fresh recurrent state: zeroes the slot of every Mamba layer (in stream
/// order, before the sequence's first step).
Status CudaEngine::clearState(int32_t slot) {
  ContextScope scope(*d_, ctx_.get());
  Status st = scope.status();
  size_t buffer = 0;
  for (const StorageInfo &si : storage_.entries) {
    if (si.kind == pl::StorageKind::MambaState && st) {
      const size_t conv =
          static_cast<size_t>(si.mamba.convStateSize()) * sizeof(float);
      const size_t ssm =
          static_cast<size_t>(si.mamba.ssmStateSize()) * sizeof(float);
      const size_t s = static_cast<size_t>(slot);
      st = d_->check(d_->cuMemsetD8Async(gpu_->storage[buffer].ptr() + s * conv,
                                         0, conv, gpu_->stream.get()),
                     "cuMemsetD8Async");
      if (st)
        st = d_->check(
            d_->cuMemsetD8Async(gpu_->storage[buffer + 1].ptr() + s * ssm, 0,
                                ssm, gpu_->stream.get()),
            "cuMemsetD8Async");
    }
    buffer += 2;
  }
  if (!st)
    return Status::error("engine: clearing the state of a new sequence: " +
                         st.message());
  return Status::success();
}

Status CudaEngine::removeSequence(int32_t sequence) {
  return sequences_.remove(sequence);
}

int64_t CudaEngine::sequenceLength(int32_t sequence) const {
  return sequences_.length(sequence);
}

// ---------------------------------------------------------------------------
// Steps

Status CudaEngine::step(std::span<const SequenceInput> inputs, LogitsFor which,
                        std::vector<float> &logits, StepStats *stats,
                        TopLogits *top) {
  lastTopRows_.clear();
  const bool wantTop = which == LogitsFor::LastTokenTop;
  if (top)
    top->k = 0;
  if (wantTop)
    which = LogitsFor::LastTokenPerSequence;
  try {
    const size_t n = inputs.size();
    const int64_t V = info_.vocabSize;
    // One static top-k override per step: nf_step_args has one.
    for (size_t i = 1; i < n; ++i)
      if (inputs[i].expertsPerToken != inputs[0].expertsPerToken)
        return Status::error("step: input " + std::to_string(i) +
                             " (sequence " +
                             std::to_string(inputs[i].sequence) +
                             "): " + std::to_string(inputs[i].expertsPerToken) +
                             " experts per token, input 0 asks for " +
                             std::to_string(inputs[0].expertsPerToken) +
                             "; the CUDA backend runs one override per step");
    StepRows sr;
    if (Status s = checkStep(inputs, which, info_, maxExpertsOverride_,
                             storage_.hasAttention, sequences_, book_, sr);
        !s)
      return s;
    // Top lists where the decode program ranks them, in one run (a later
    // run would overwrite an earlier one's rows, which lastTokenRow reads).
    const Program &prog = sr.allOne ? decode_ : prefill_;
    const std::vector<std::vector<Chunk>> runs =
        splitIntoRuns(inputs, prog.maxTokens);
    if (wantTop && top && !top->noise.empty() && top->noise.size() != n)
      return Status::error("step: top-list noise for " +
                           std::to_string(top->noise.size()) + " of " +
                           std::to_string(n) + " inputs");
    bool keys = false, totals = false;
    if (wantTop && top)
      for (const TopNoise &z : top->noise) {
        keys = keys || z.keys;
        totals = totals || z.total;
      }
    const bool served = wantTop && top && sr.allOne && decode_.top.k > 0 &&
                        runs.size() == 1 && (!keys || info_.topLogitsNoise) &&
                        (!totals || info_.topLogitsTotals);
    if (served)
      which = LogitsFor::LastTokenTop;
    else
      logits.resize(static_cast<size_t>(sr.rows * V));
    if (stats) {
      stats->expertCalls.assign(n, 0);
      stats->expertCallsPerLayer.assign(
          n, std::vector<int64_t>(static_cast<size_t>(info_.numMoeLayers), 0));
      stats->budgetSpent.assign(n, 0.0);
    }
    if (n == 0)
      return Status::success();

    ContextScope scope(*d_, ctx_.get());
    if (!scope.status())
      return Status::error("step: " + scope.status().message());
    for (const std::vector<Chunk> &chunks : runs) {
      if (Status s =
              runProgram(prog, inputs, chunks, which, sr.tokenBase,
                         logits.data(), stats, inputs[0].expertsPerToken, top);
          !s)
        return Status::error("step: " + s.message());
      for (const Chunk &c : chunks)
        (void)book_.advance(sr.slots[c.input], c.count);
    }
    if (stats && info_.numMoeLayers > 0 && info_.topK > 0)
      for (size_t i = 0; i < n; ++i)
        stats->budgetSpent[i] =
            static_cast<double>(stats->expertCalls[i]) /
            (static_cast<double>(info_.topK) * info_.numMoeLayers *
             static_cast<double>(inputs[i].tokens.size()));
    return Status::success();
  } catch (const std::bad_alloc &) {
    return Status::error("step: out of memory");
  } catch (const std::exception &e) {
    return Status::error(std::string("step: ") + e.what());
  }
}

Status CudaEngine::lastTokenRow(size_t input, std::span<float> row) {
  const int64_t V = info_.vocabSize;
  if (input >= lastTopRows_.size() || lastTopRows_[input] < 0)
    return Status::error("the last step returned no top logits for input " +
                         std::to_string(input));
  if (row.size() < static_cast<size_t>(V))
    return Status::error("logits row: room for " + std::to_string(row.size()) +
                         " of " + std::to_string(V) + " values");
  ContextScope scope(*d_, ctx_.get());
  if (!scope.status())
    return Status::error("logits row: " + scope.status().message());
  Gpu &g = *gpu_;
  const size_t rowBytes = static_cast<size_t>(V) * sizeof(float);
  const CUdeviceptr src =
      g.arena.ptr() +
      static_cast<size_t>(decode_.values[decode_.logits].offset) +
      static_cast<size_t>(lastTopRows_[input]) * rowBytes;
  CUstream stream = g.stream.get();
  if (Status s =
          d_->check(d_->cuMemcpyDtoHAsync(row.data(), src, rowBytes, stream),
                    "cuMemcpyDtoHAsync");
      !s)
    return Status::error(where() + ": logits row: " + s.message());
  if (Status s =
          d_->check(d_->cuStreamSynchronize(stream), "cuStreamSynchronize");
      !s)
    return Status::error(where() + ": logits row: " + s.message());
  return Status::success();
}

Status CudaEngine::runProgram(const Program &p,
                              std::span<const SequenceInput> inputs,
                              std::span<const Chunk> chunks, LogitsFor which,
                              std::span<const int64_t> tokenBase,
                              float *logitsOut, StepStats *stats,
                              int32_t expertsPerToken, TopLogits *top) {
  Gpu &g = *gpu_;
  const ArgsLayout &L = layout_;
  CUstream stream = g.stream.get();
  uint8_t *h = g.staging.data();
  auto *tokens = reinterpret_cast<int32_t *>(h + L.tokens);
  auto *budget = reinterpret_cast<float *>(h + L.budget);
  auto *seqs = reinterpret_cast<nf_seq_desc *>(h + L.seqs);
  auto *tokenSeq = reinterpret_cast<int32_t *>(h + L.tokenSeq);
  auto *logitRows = reinterpret_cast<int32_t *>(h + L.logitRows);
  auto *pages = reinterpret_cast<int32_t *>(h + L.pages);

  const int64_t numSeqs = static_cast<int64_t>(chunks.size());
  int64_t maxPages = 1;
  for (const Chunk &c : chunks)
    maxPages = std::max<int64_t>(
        maxPages,
        static_cast<int64_t>(
            book_.pageTable(sequences_.slot(inputs[c.input].sequence).value())
                .size()));
  if (numSeqs > L.maxSeqs || maxPages > L.maxPages)
    return Status::error("internal: run of " + std::to_string(numSeqs) +
                         " sequences / " + std::to_string(maxPages) +
                         " pages exceeds the argument buffers");
  tokenInput_.clear();
  int64_t T = 0;
  int32_t numLogitRows = 0; // the rows copied back below
  for (int64_t ci = 0; ci < numSeqs; ++ci) {
    const Chunk &c = chunks[static_cast<size_t>(ci)];
    const SequenceInput &in = inputs[c.input];
    const int32_t slot = sequences_.slot(in.sequence).value();
    nf_seq_desc &sd = seqs[ci];
    sd.begin = static_cast<int32_t>(c.row);
    sd.count = static_cast<int32_t>(c.count);
    sd.start_pos = static_cast<int32_t>(book_.length(slot));
    sd.slot = slot;
    for (int64_t j = 0; j < c.count; ++j) {
      tokens[T] = in.tokens[static_cast<size_t>(c.first + j)];
      budget[T] = in.expertBudget;
      tokenSeq[T] = static_cast<int32_t>(ci);
      tokenInput_.push_back(c.input);
      ++T;
    }
    if (which != LogitsFor::AllTokens && c.last)
      logitRows[numLogitRows++] = static_cast<int32_t>(c.row + c.count - 1);
    const std::vector<int32_t> &pt = book_.pageTable(slot);
    int32_t *row = pages + ci * maxPages;
    std::copy(pt.begin(), pt.end(), row);
    std::fill(row + pt.size(), row + maxPages, 0);
  }
  if (T > L.maxRows)
    return Status::error("internal: run of " + std::to_string(T) +
                         " rows exceeds the argument buffers");
  const CUdeviceptr dev = g.args.ptr();
  auto devPtr = [&](size_t off) {
    return reinterpret_cast<void *>(static_cast<uintptr_t>(dev + off));
  };
  nf_step_args args;
  std::memset(&args, 0, sizeof args);
  args.arena = reinterpret_cast<char *>(static_cast<uintptr_t>(g.arena.ptr()));
  args.weights = reinterpret_cast<const void *const *>(
      static_cast<uintptr_t>(g.weightPtrs.ptr()));
  args.storage = reinterpret_cast<void *const *>(
      static_cast<uintptr_t>(g.storagePtrs.ptr()));
  args.tokens = static_cast<const int32_t *>(devPtr(L.tokens));
  args.budget = static_cast<const float *>(devPtr(L.budget));
  args.seqs = static_cast<const nf_seq_desc *>(devPtr(L.seqs));
  args.token_seq = static_cast<const int32_t *>(devPtr(L.tokenSeq));
  args.page_tables = static_cast<const int32_t *>(devPtr(L.pages));
  args.num_tokens = static_cast<int32_t>(T);
  args.num_seqs = static_cast<int32_t>(numSeqs);
  args.max_pages_per_seq = static_cast<int32_t>(maxPages);
  args.experts_per_token = expertsPerToken;
  args.budget_pooled = budgetPooled_;
  args.distinct_expert_cap = distinctExpertCap_;
  // The LM head computes the rows whose logits are read (all: null).
  args.logit_rows = which == LogitsFor::AllTokens
                        ? nullptr
                        : static_cast<const int32_t *>(devPtr(L.logitRows));
  args.num_logit_rows = numLogitRows;
  std::memcpy(h, &args, sizeof args);
  const size_t used =
      L.pages + static_cast<size_t>(numSeqs * maxPages) * sizeof(int32_t);
  if (Status s = d_->check(d_->cuMemcpyHtoDAsync(dev, h, used, stream),
                           "cuMemcpyHtoDAsync");
      !s)
    return s;

  size_t bucket = 0;
  while (bucket < g.decodeBuckets.size() && g.decodeBuckets[bucket] < T)
    ++bucket;
  if (&p == &decode_ && bucket < g.decodeExecs.size() && !profiling_) {
    if (Status s =
            d_->check(d_->cuGraphLaunch(g.decodeExecs[bucket].get(), stream),
                      "cuGraphLaunch");
        !s)
      return Status::error(where() + ": decode graph: " + s.message());
  } else if (Status s = enqueue(p, T); !s) {
    return s;
  }

  // The logits rows asked for, straight into the caller's buffer.
  const int64_t V = info_.vocabSize;
  const size_t rowBytes = static_cast<size_t>(V) * sizeof(float);
  const CUdeviceptr src =
      g.arena.ptr() + static_cast<size_t>(p.values[p.logits].offset);
  for (const Chunk &c : chunks) {
    CUresult r = CUDA_SUCCESS;
    if (which == LogitsFor::AllTokens)
      r = d_->cuMemcpyDtoHAsync(logitsOut + (tokenBase[c.input] + c.first) * V,
                                src + static_cast<size_t>(c.row) * rowBytes,
                                static_cast<size_t>(c.count) * rowBytes,
                                stream);
    else if (c.last && which == LogitsFor::LastTokenPerSequence)
      r = d_->cuMemcpyDtoHAsync(logitsOut + static_cast<int64_t>(c.input) * V,
                                src + static_cast<size_t>(c.row + c.count - 1) *
                                          rowBytes,
                                rowBytes, stream);
    if (Status s = d_->check(r, "cuMemcpyDtoHAsync"); !s)
      return Status::error(where() + ": logits: " + s.message());
  }
  // The rows' largest logits, ranked on the device after the step.
  const bool ranked = which == LogitsFor::LastTokenTop;
  const size_t topBytes =
      static_cast<size_t>(numLogitRows) * static_cast<size_t>(p.top.k) * 4;
  // The rows' totals land after the noise records in the pinned buffer.
  const size_t totalsAt = static_cast<size_t>(p.maxTokens) *
                          (static_cast<size_t>(p.top.k) * 8 + kTopNoiseBytes);
  bool anyTotal = false;
  if (ranked)
    for (const TopNoise &z : top->noise)
      anyTotal = anyTotal || z.total;
  if (ranked) {
    if (p.top.noiseOffset >= 0) {
      // How each row is ranked: row j is the j-th sequence's last token.
      auto *noise = g.topHost.data() + static_cast<size_t>(p.maxTokens) *
                                           static_cast<size_t>(p.top.k) * 8;
      size_t j = 0;
      for (const Chunk &c : chunks) {
        if (!c.last)
          continue;
        const TopNoise z =
            top->noise.empty() ? TopNoise{} : top->noise[c.input];
        const uint32_t flags = (z.keys ? 1u : 0u) | (z.total ? 2u : 0u);
        std::memcpy(noise + j * kTopNoiseBytes, &z.seed, 8);
        std::memcpy(noise + j * kTopNoiseBytes + 8, &z.draw, 8);
        std::memcpy(noise + j * kTopNoiseBytes + 16, &z.temperature, 4);
        std::memcpy(noise + j * kTopNoiseBytes + 20, &flags, 4);
        ++j;
      }
      if (Status s = d_->check(
              d_->cuMemcpyHtoDAsync(g.arena.ptr() +
                                        static_cast<size_t>(p.top.noiseOffset),
                                    noise, j * kTopNoiseBytes, stream),
              "cuMemcpyHtoDAsync");
          !s)
        return Status::error(where() + ": top-list noise: " + s.message());
    }
    for (const LaunchInfo &l : p.top.launches)
      if (Status s = launch(*d_, l.fn, l.grid, l.block, l.shared, false, false,
                            stream, g.args.ptr(), g.arena.ptr());
          !s)
        return Status::error(l.where + ": " + s.message());
    for (int part = 0; part < 2; ++part)
      if (Status s = d_->check(
              d_->cuMemcpyDtoHAsync(
                  g.topHost.data() + part * topBytes,
                  g.arena.ptr() + static_cast<size_t>(part ? p.top.valuesOffset
                                                           : p.top.idsOffset),
                  topBytes, stream),
              "cuMemcpyDtoHAsync");
          !s)
        return Status::error(where() + ": top logits: " + s.message());
    if (anyTotal)
      if (Status s = d_->check(
              d_->cuMemcpyDtoHAsync(
                  g.topHost.data() + totalsAt,
                  g.arena.ptr() + static_cast<size_t>(p.top.totalsOffset),
                  static_cast<size_t>(numLogitRows) * 8, stream),
              "cuMemcpyDtoHAsync");
          !s)
        return Status::error(where() + ": top-list totals: " + s.message());
  }
  const bool haveStats = g.stats.ptr() != 0 && !p.copies.empty();
  // Plans 1.8: the kernels' own region of the arena (its layout fits in
  // statsHost: no more layers, rows or columns than the engine's).
  const bool statsInArena = p.statsOffset >= 0;
  if (haveStats)
    if (Status s = d_->check(
            statsInArena
                ? d_->cuMemcpyDtoHAsync(
                      g.statsHost.data(),
                      g.arena.ptr() + static_cast<size_t>(p.statsOffset),
                      static_cast<size_t>(4 * p.statsLayers * p.statsRows *
                                          (1 + p.statsMaxK)),
                      stream)
                : d_->cuMemcpyDtoHAsync(g.statsHost.data(), g.stats.ptr(),
                                        g.stats.bytes, stream),
            "cuMemcpyDtoHAsync");
        !s)
      return Status::error(where() + ": expert statistics: " + s.message());
  if (Status s =
          d_->check(d_->cuStreamSynchronize(stream), "cuStreamSynchronize");
      !s)
    return Status::error(where() + ": " + p.phase + " run: " + s.message());

  if (ranked) {
    // List j is that of the j-th sequence's last token (the logit rows'
    // order).
    const size_t k = static_cast<size_t>(p.top.k);
    top->k = p.top.k;
    top->ids.resize(inputs.size() * k);
    top->values.resize(inputs.size() * k);
    top->totals.assign(inputs.size(), std::numeric_limits<double>::quiet_NaN());
    lastTopRows_.assign(inputs.size(), -1);
    const auto *ids = reinterpret_cast<const int32_t *>(g.topHost.data());
    const auto *vals =
        reinterpret_cast<const float *>(g.topHost.data() + topBytes);
    size_t j = 0;
    for (const Chunk &c : chunks) {
      if (!c.last)
        continue;
      std::copy_n(ids + j * k, k, top->ids.data() + c.input * k);
      std::copy_n(vals + j * k, k, top->values.data() + c.input * k);
      if (anyTotal && top->noise[c.input].total)
        std::memcpy(&top->totals[c.input], g.topHost.data() + totalsAt + j * 8,
                    8);
      lastTopRows_[c.input] = c.row + c.count - 1;
      ++j;
    }
  }
  if (haveStats) {
    const size_t R =
        static_cast<size_t>(statsInArena ? p.statsRows : L.maxRows);
    const size_t layers = static_cast<size_t>(
        statsInArena ? p.statsLayers : int64_t(info_.numMoeLayers));
    const size_t maxK =
        static_cast<size_t>(statsInArena ? p.statsMaxK : int64_t(maxK_));
    const auto *all = reinterpret_cast<const int32_t *>(g.statsHost.data());
    for (const StatCopy &sc : p.copies) {
      const int32_t *counts = all + static_cast<size_t>(sc.layer) * R;
      const int32_t *experts =
          all + layers * R + static_cast<size_t>(sc.layer) * R * maxK;
      std::vector<int64_t> &used = utilization_[static_cast<size_t>(sc.layer)];
      for (int64_t t = 0; t < T; ++t) {
        const int32_t kt = std::clamp(counts[t], 0, sc.k);
        const int32_t input = tokenInput_[static_cast<size_t>(t)];
        if (stats) {
          stats->expertCalls[static_cast<size_t>(input)] += kt;
          stats->expertCallsPerLayer[static_cast<size_t>(input)]
                                    [static_cast<size_t>(sc.layer)] += kt;
        }
        for (int32_t j = 0; j < kt; ++j) {
          const int32_t e = experts[t * sc.k + j];
          if (e >= 0 && e < info_.numExperts)
            ++used[static_cast<size_t>(e)];
        }
      }
    }
  }
  return Status::success();
}

} // namespace

StatusOr<std::unique_ptr<Engine>> createCudaEngine(
    std::unique_ptr<PlanFile> plan, std::unique_ptr<BoundWeights> weights,
    std::unique_ptr<CudaProbe> probe, const EngineOptions &options) {
  try {
    auto engine = std::make_unique<CudaEngine>(
        std::move(plan), std::move(weights), std::move(probe));
    if (Status s = engine->init(options); !s)
      return s;
    return std::unique_ptr<Engine>(std::move(engine));
  } catch (const std::bad_alloc &) {
    return Status::error("engine: out of memory loading the plan");
  }
}

} // namespace nf::engine
