#include "engine/engine.h"

#include "backends/cpu/cpu_engine.h"
#include "backends/cuda/cuda_engine.h"
#include "engine/plan_loader.h"

#include <cmath>
#include <cstdio>

namespace nf {

namespace {

void cudaUnavailable(const std::string &reason) {
  std::fprintf(stderr, "nf: CUDA unavailable (%s): using the CPU backend\n",
               reason.c_str());
}

StatusOr<std::unique_ptr<Engine>>
loadOnCpu(std::unique_ptr<engine::PlanFile> plan,
          const EngineOptions &options) {
  StatusOr<std::unique_ptr<engine::BoundWeights>> weights =
      options.syntheticWeights
          ? engine::syntheticWeights(*plan, options.syntheticSeed)
          : engine::bindWeights(*plan, options.weightsDir);
  if (!weights)
    return weights.status();
  // The CPU backend interprets every plan's ops whatever its target (CUDA
  // binaries, when present, are ignored here).
  return engine::createCpuEngine(std::move(plan), std::move(*weights), options);
}

} // namespace

StatusOr<std::unique_ptr<Engine>> Engine::load(const std::string &planPath,
                                               const EngineOptions &options) {
  // OpenMP crashes (SIGSEGV) when it cannot create the threads it is asked
  // for; refuse absurd counts before any parallel region runs.
  if (options.numThreads < 0 || options.numThreads > kMaxThreads)
    return Status::error(planPath + ": CPU threads must be in [0, " +
                         std::to_string(kMaxThreads) + "], got " +
                         std::to_string(options.numThreads));
  const std::string &backend = options.backend;
  if (backend != "auto" && backend != "cpu" && backend != "cuda")
    return Status::error("unknown backend '" + backend +
                         "' (expected auto, cpu or cuda)");
  if (!(options.distinctExpertCap >= 0.0) ||
      !std::isfinite(options.distinctExpertCap))
    return Status::error(planPath +
                         ": the distinct-expert cap must be 0 (none), a "
                         "fraction in (0, 1) or a number of experts");
  StatusOr<std::unique_ptr<engine::PlanFile>> plan = engine::openPlan(planPath);
  if (!plan)
    return plan.status();
  const bool tryCuda = backend == "cuda" ||
                       (backend == "auto" && engine::planTargetsCuda(**plan));
  if (!tryCuda)
    return loadOnCpu(std::move(*plan), options);
  // The probe: driver, device, a binary for every kernel.
  StatusOr<std::unique_ptr<engine::CudaProbe>> probe =
      engine::probeCuda(**plan, options);
  if (!probe) {
    if (backend == "cuda")
      return Status::error("CUDA backend: " + probe.message());
    cudaUnavailable(probe.message());
    return loadOnCpu(std::move(*plan), options);
  }
  // The kernels read quantised weights' codes (the CPU, dequantised f32).
  const auto codes = engine::QuantForm::Codes;
  StatusOr<std::unique_ptr<engine::BoundWeights>> weights =
      options.syntheticWeights
          ? engine::syntheticWeights(**plan, options.syntheticSeed, codes)
          : engine::bindWeights(**plan, options.weightsDir, codes);
  if (!weights)
    return weights.status();
  StatusOr<std::unique_ptr<Engine>> cuda = engine::createCudaEngine(
      std::move(*plan), std::move(*weights), std::move(*probe), options);
  if (cuda || backend == "cuda")
    return cuda;
  // "auto": whatever kept the device from taking the plan (a module the
  // driver cannot load, too little device memory, ...), the CPU runs it.
  cudaUnavailable(cuda.message());
  StatusOr<std::unique_ptr<engine::PlanFile>> again =
      engine::openPlan(planPath);
  if (!again)
    return again.status();
  return loadOnCpu(std::move(*again), options);
}

} // namespace nf
