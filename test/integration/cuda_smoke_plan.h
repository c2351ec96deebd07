// Synthetic CUDA plans carrying hand-written kernels (their CUDA source and
// PTX are in cuda_smoke_plan.cpp; fake_cuda_driver.cpp runs host versions
// of them): the engine's mechanics without the compiler. The "dense" plan
// embeds tokens and applies an LM head (logits: denseRow); the "state" plan
// writes what it sees of its sequence (Mamba conv window and state, KV
// pages, budget, override, token-to-sequence map) into the logits and
// selects experts. Used by the CudaBackend (cuda_driver_test.cpp) and
// CudaSmoke (cuda_smoke_test.cpp) tests.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nf::test::gpu {

/// The smoke plans' vocabulary and hidden sizes.
constexpr int64_t kV = 32, kH = 8;

/// PTX of the smoke kernels: smoke_embed, smoke_lm_head, smoke_nop,
/// smoke_state.
extern const char kSmokePtx[];

/// The dense plan's logits row of `token` (small integers and halves: exact
/// in f32 whatever the order of the sum).
std::vector<float> denseRow(int32_t token);

/// What writeSmokePlan writes: the dense or the state plan, and defects.
struct SmokeSpec {
  bool state = false; // the state plan, else the dense one
  std::string target = "cuda";
  int64_t prefillTokens = 64, decodeTokens = 8;
  int64_t slots = 8;
  int64_t pages = 64; // KV pages of 2 positions (state plan)
  bool ptx = true;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> cubins;
  bool cooperativeNop = true;
  // Defects, for error tests.
  std::string ptxText = kSmokePtx;
  std::string nopFunction = "smoke_nop";
  uint32_t nopGrid = 1;
  // State plan: the select's experts/counts as kernel outputs, or internal
  // (and then possibly overwritten by a later op of the kernel).
  bool selectOutputs = true;
  bool clobberCounts = false;
  // Dense plan: the LM head as two launch variants (up to 2 tokens, 3 and
  // more) and a launch for >= 1000 tokens that fails whenever it runs.
  bool rangedLmHead = false;
  // Weights no kernel reads, for the upload: an int4 one ("q4": 4 x 128
  // codes, eight a word, a scale per 32 columns) and an FP8 one ("q8":
  // 4 x 128 codes, a scale per row).
  bool quantisedWeights = false;
};

/// Writes <dir>/<name>.nfb (and the weights, <dir>/w.safetensors) and
/// returns its path.
std::string writeSmokePlan(const std::string &dir, const std::string &name,
                           const SmokeSpec &spec);

} // namespace nf::test::gpu
