// The CPU backend of nf::Engine: interprets a plan's step programs op by op
// with the kernels of backends/cpu/kernels.h. Internal to the runtime.
#pragma once

#include "engine/engine.h"
#include "engine/plan_loader.h"

#include <memory>

namespace nf::engine {

/// Checks every step program of `plan` against its values, weights and
/// storage (unknown ops, operand kinds, shapes, arena bounds) and builds an
/// engine that owns the plan, the weights, the caches and the arena.
StatusOr<std::unique_ptr<Engine>>
createCpuEngine(std::unique_ptr<PlanFile> plan,
                std::unique_ptr<BoundWeights> weights,
                const EngineOptions &options);

} // namespace nf::engine
