// Version of the plan format (runtime/schema/plan.fbs) that this build writes
// and reads. A reader accepts plans of its major version and of a minor
// version up to its own.
#pragma once

#include <cstdint>

namespace nf {
inline constexpr uint32_t kPlanVersionMajor = 1;
// 1.1: CUDA launches; 1.2: launch token ranges, programmatic launches;
// 1.3: prefill kernels take the arena's base as a second parameter
// (nf_abi.h); 1.4: modules may declare TMA tensor maps that the runtime
// encodes at load (nf_abi.h, nf_tensor_map_desc); 1.5: decode steps may
// carry top-logits launches (Step.top_logits); 1.6: top-logits launches may
// rank rows by a temperature sampler's noisy keys (TopLogits.noise_offset;
// read by this runtime as plans without records); 1.7: per-row records with
// flags (keys, total) and the rows' totals (TopLogits.totals_offset); 1.8:
// CUDA steps' kernels write the expert statistics into the arena
// (Step.expert_stats_offset); 1.9: the kernels' expert selection reads the
// budget scope and the distinct-expert cap from nf_step_args; 1.10: ops
// carry their code from nf/plan_ops.def (Op.code); 1.11: quantised weights
// (Weight.quant, DType.F8E4M3); 1.12: weight files beside the plan
// (ModelConfig.plan_weight_files: nfc compile --weights); 1.13: tiered KV
// caches (Storage.hot_window).
inline constexpr uint32_t kPlanVersionMinor = 13;
inline constexpr char kPlanFileIdentifier[] = "NFPL";
} // namespace nf
