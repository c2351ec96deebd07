// The CUDA backend of nf::Engine: runs the kernels that `nfc compile
// --target=cuda` put in a plan (per Kernel: cubins per architecture, PTX,
// and the launches to run in order; runtime/schema/plan.fbs) through the
// CUDA driver API, loaded at run time (backends/cuda/driver.h).
//
// Host-side bookkeeping is the CPU backend's (engine/plan_common.h):
// sequences, state slots, KV pages, step validation, the split of steps
// larger than a program's max_tokens into runs, the decode/prefill choice.
// Device side, every generated __global__ takes one `const nf_step_args *`
// (kernels/nf_abi.h) in device memory, which the engine fills before every
// run from pinned host staging:
//   arena       one allocation of max over programs of arena_bytes +
//               scratch_bytes; the step's logits value [tokens, vocab] f32
//               is read back from it at its offset (the rows asked for);
//   weights     a device pointer per Plan.weights entry, in its packed
//               layout (stacked experts contiguous [E, ...], concat_rows
//               weights concatenated along dim 0), uploaded once at load;
//   storage     per Plan.storage entry i, [2i] and [2i+1]: KV cache K and V
//               [num_pages, page_size, kv_heads, head_dim] f32, or Mamba
//               conv window [slots, conv_dim, conv_window] f32 (oldest
//               first) and SSM state [slots, heads, head_dim, state] f32;
//               a slot's state is zeroed when a sequence gets it;
//   tokens, budget, seqs, token_seq, page_tables [num_seqs][max_pages_per_seq]
//               and the counts: per run.
// The decode program is captured once, at load, as a CUDA graph and
// replayed every decode run (the arguments live in device memory, so one
// graph serves every batch size); prefill runs launch their kernels.
//
// Expert statistics (StepStats, expertUtilization): plans of format 1.8 and
// later have the rankings write each nf_moe.select's experts [T, k] and
// counts [T] into a region of the arena of their own
// (Step.expert_stats_offset), read back once after the run and summed on
// the host. Older plans: after the kernel that computes an nf_moe.select,
// its results are copied aside (device to device, in stream order,
// captured into the decode graph too: graph nodes between two kernels,
// which break the chain of programmatic launches there). That needs them in
// the arena when the kernel ends: outputs of the kernel, or kernel-internal
// values that no later op of the kernel overwrites (checked on the values'
// byte ranges). When a plan breaks that, its statistics stay 0 and
// ModelInfo::expertStats is false.
//
// Restrictions: one expertsPerToken override per step (a step mixing
// different overrides is rejected); the KV cache is f32.
#pragma once

#include "backends/cuda/driver.h"
#include "engine/engine.h"
#include "engine/plan_loader.h"

#include <memory>
#include <string>
#include <vector>

namespace nf::engine {

/// Whether the plan was compiled for CUDA (Target.backend == "cuda").
bool planTargetsCuda(const PlanFile &plan);

/// What the CUDA backend settled on before committing to a plan.
struct CudaProbe {
  const cuda::Driver *driver = nullptr;
  cuda::DeviceInfo device;
  /// The module image of each kernel, per step program (prefill, decode);
  /// size 0 for kernels without launches.
  struct Image {
    const void *data = nullptr;
    size_t size = 0;
    bool ptx = false;
  };
  std::vector<Image> images[2];
  int cubins = 0, ptx = 0; // kernels loaded from each
};

/// Checks that the CUDA backend can run `plan` here: the driver loads and
/// initialises, the device exists, and every kernel with launches has a
/// cubin for the device's architecture (sm_XX, or sm_XXa) or PTX to JIT.
/// The error is the reason it cannot, in one line.
StatusOr<std::unique_ptr<CudaProbe>> probeCuda(const PlanFile &plan,
                                               const EngineOptions &options);

/// Loads the modules, uploads the weights, allocates the arena, the state
/// and the step arguments, and captures the decode graph.
StatusOr<std::unique_ptr<Engine>> createCudaEngine(
    std::unique_ptr<PlanFile> plan, std::unique_ptr<BoundWeights> weights,
    std::unique_ptr<CudaProbe> probe, const EngineOptions &options);

} // namespace nf::engine
