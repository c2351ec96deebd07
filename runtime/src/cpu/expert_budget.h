// Budget-driven expert scheduling: how many of its ranked experts each token
// runs, given a compute budget for a group of tokens.
//
// A group (one request's tokens in a step) gets budget * k * tokens expert
// calls, k being the model's experts per token. Every token first gets
// `minK` experts; the remaining calls go, one at a time, to the token whose
// kept experts cover the smallest share of its routed weight (weights over the
// sum of its k candidates). Confident tokens (one dominant expert) are covered
// early and stop; uncertain tokens (flat weights) get more. Why coverage:
// after renormalisation, dropping experts of routed share 1 - P moves a
// token's MoE output by (1 - P) times the distance between the dropped and
// the kept mixtures, so evening out 1 - P evens out the error. A budget of
// 1.0 gives every token all k experts: exactly static top-k.
#pragma once

#include <cstdint>
#include <span>

namespace nf::cpu {

struct BudgetGroup {
  int32_t begin = 0; // first token of the group
  int32_t count = 0; // tokens in the group
  float budget = 1.0f;
};

/// `weights` is [T, k]: each token's candidate routing weights (sigmoid scores,
/// before renormalisation) in rank order. Writes counts[t] in [minK, k] for
/// every token of every group. Deterministic: ties go to the earlier token.
void allocateExpertBudget(std::span<const float> weights, int32_t k,
                          int32_t minK, std::span<const BudgetGroup> groups,
                          std::span<int32_t> counts);

/// The calls a group of `tokens` tokens may spend at `budget`.
int64_t expertCallsForBudget(float budget, int32_t k, int32_t minK,
                             int64_t tokens);

} // namespace nf::cpu
