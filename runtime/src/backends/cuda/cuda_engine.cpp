// The CUDA backend of nf::Engine (see cuda_engine.h): whether a plan targets
// CUDA, the probe (driver, device, a binary for every kernel), the engine's
// init (the load steps in order, ModelInfo), its sequences and
// createCudaEngine. The class is in cuda_engine_impl.h; the load steps in
// cuda_load.cpp; steps and runs in cuda_step.cpp.
#include "backends/cuda/cuda_engine.h"
#include "backends/cuda/cuda_engine_impl.h"

#include "engine/plan_common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace nf::engine {

using namespace cuda_detail;

bool planTargetsCuda(const PlanFile &pf) {
  const pl::Target *t = pf.plan->target();
  return t && t->backend() && t->backend()->string_view() == "cuda";
}

namespace {

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

namespace cuda_detail {

// ---------------------------------------------------------------------------
// Init

namespace {

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
        if (pl::opCode(*op) == pl::OpCode::Select &&
            pl::stringAttr(*op, pl::attr::Policy).value_or("topk") != "budget")
          return Status::error(
              file.path + ": CUDA: " + what +
              " needs a plan compiled with --expert-policy=budget");
    }
  }
  return Status::success();
}

} // namespace

Status CudaEngine::init(const EngineOptions &options) {
  if (Status s = readModelInfo(*plan_, *weights_, info_); !s)
    return s;
  if (Status s = stepWideSelection(*plan_, options); !s)
    return s;
  budgetPooled_ = options.budgetStepScope ? 1 : 0;
  distinctExpertCap_ = options.distinctExpertCap;
  gpuMemoryUtilization_ = options.gpuMemoryUtilization;
  StatusOr<StorageLayout> layout =
      readStorage(*plan_, options, info_.maxDecodeTokens, "CUDA");
  if (!layout)
    return layout.status();
  storage_ = std::move(*layout);
  setSequenceMemory(storage_, /*typedKv=*/true, info_);
  info_.maxSequences = storage_.cache.numSlots;
  if (Status s = createBookkeeping(); !s)
    return s;
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
  // The weights first: a KV cache sized to the memory left takes the rest.
  if (Status s = uploadWeights(); !s)
    return s;
  if (Status s = allocate(); !s)
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
  if (Status s = syncStream(where()); !s)
    return s;

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

StatusOr<int32_t> CudaEngine::forkSequence(int32_t sequence) {
  return sequences_.fork(sequence,
                         [this](const cpu::Caches::Fork &f, int32_t from) {
                           return copyForFork(f, from);
                         });
}

/// The sequences' bookkeeping for storage_.cache (slots, page ids): no Mamba
/// layers, and one KV layer of zero size that makes the page allocator hand
/// out page ids; the state itself is on the device.
Status CudaEngine::createBookkeeping() {
  info_.maxContext =
      storage_.hasAttention
          ? std::min<int64_t>(storage_.cache.numPages, kMaxSequencePages) *
                storage_.cache.pageSize
          : storage_.maxContext;
  std::vector<cpu::KvLayerShape> kv;
  if (storage_.hasAttention) // a tiered cache's pages need its fp8 type
    kv.push_back({0, 0,
                  storage_.cache.hotWindow > 0 ? cpu::KvStorage::F8E4M3
                                               : cpu::KvStorage::F32});
  StatusOr<cpu::Caches> book = cpu::Caches::create({}, kv, storage_.cache);
  if (!book)
    return Status::error(plan_->path + ": " + book.message());
  caches_ = std::move(*book);
  return Status::success();
}

Status CudaEngine::copyForFork(const cpu::Caches::Fork &fork, int32_t from) {
  ContextScope scope(*d_, ctx_.get());
  Status st = scope.status();
  auto copy = [&](const DeviceBuffer &buf, size_t unit, int64_t src,
                  int64_t dst) {
    if (st)
      st = d_->check(
          d_->cuMemcpyDtoDAsync(buf.ptr() + static_cast<size_t>(dst) * unit,
                                buf.ptr() + static_cast<size_t>(src) * unit,
                                unit, gpu_->stream.get()),
          "cuMemcpyDtoDAsync");
  };
  size_t buffer = 0;
  for (const StorageInfo &si : storage_.entries) {
    if (si.kind == pl::StorageKind::MambaState) {
      copy(gpu_->storage[buffer],
           static_cast<size_t>(si.mamba.convStateSize()) * sizeof(float), from,
           fork.slot);
      copy(gpu_->storage[buffer + 1],
           static_cast<size_t>(si.mamba.ssmStateSize()) * sizeof(float), from,
           fork.slot);
    } else if (fork.pageFrom >= 0) {
      // A tiered cache's hot page (the last, the one copied) spans two
      // units: copied as one block of twice a unit's bytes.
      const size_t unit =
          static_cast<size_t>(cpu::kvPageBytes(si.kv, storage_.cache.pageSize));
      const bool hot = caches_.kv().isHot(fork.pageTo);
      auto copyPage = [&](const DeviceBuffer &buf) {
        if (st)
          st = d_->check(
              d_->cuMemcpyDtoDAsync(
                  buf.ptr() + static_cast<size_t>(fork.pageTo) * unit,
                  buf.ptr() + static_cast<size_t>(fork.pageFrom) * unit,
                  hot ? 2 * unit : unit, gpu_->stream.get()),
              "cuMemcpyDtoDAsync");
      };
      copyPage(gpu_->storage[buffer]);
      copyPage(gpu_->storage[buffer + 1]);
    }
    buffer += 2;
  }
  if (!st)
    return Status::error("engine: copying the state of a forked sequence: " +
                         st.message());
  return Status::success();
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

} // namespace cuda_detail

StatusOr<std::unique_ptr<Engine>> createCudaEngine(
    std::unique_ptr<PlanFile> plan, std::unique_ptr<BoundWeights> weights,
    std::unique_ptr<CudaProbe> probe, const EngineOptions &options) {
  return createEngine<CudaEngine>(options, std::move(plan), std::move(weights),
                                  std::move(probe));
}

} // namespace nf::engine
