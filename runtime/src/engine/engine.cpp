#include "engine/engine.h"

#include "engine/cpu_engine.h"
#include "engine/plan_loader.h"

namespace nf {

StatusOr<std::unique_ptr<Engine>> Engine::load(const std::string &planPath,
                                               const EngineOptions &options) {
  StatusOr<std::unique_ptr<engine::PlanFile>> plan = engine::openPlan(planPath);
  if (!plan)
    return plan.status();
  StatusOr<std::unique_ptr<engine::BoundWeights>> weights =
      engine::bindWeights(**plan, options.weightsDir);
  if (!weights)
    return weights.status();
  // Every plan carries the ops; the CPU backend interprets them whatever
  // the plan's target (CUDA binaries, when present, are ignored here).
  return engine::createCpuEngine(std::move(*plan), std::move(*weights),
                                 options);
}

} // namespace nf
