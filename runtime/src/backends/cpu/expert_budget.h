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
///
/// `pooled` (step scope): the groups' calls form one pool, handed out by
/// coverage across all their tokens alike; a group's tokens then get what
/// the pool gives them, not exactly its own calls (the caller's accounts
/// even that out over steps). Otherwise (request scope) each group spends its
/// own calls on its own tokens. `limits` (empty, or [T]): the most
/// candidates a token may run (after capDistinctExperts).
void allocateExpertBudget(std::span<const float> weights, int32_t k,
                          int32_t minK, std::span<const BudgetGroup> groups,
                          std::span<int32_t> counts, bool pooled = false,
                          std::span<const int32_t> limits = {});

/// The distinct-expert cap of one MoE layer in one step: of the experts the
/// tokens' candidates name (`ranked` [T, k], -1: none; `scores` their
/// routing weights), keeps the `cap` that cover the most routed weight over
/// the step (each token's candidates weighted by their share of its
/// candidate weight), and leaves each token its candidates among them, in
/// rank order, compacted to the front (a token with none keeps its best
/// candidate); `limits[t]` becomes at most the number kept. Returns the
/// distinct experts the candidates name, or `cap` when it cuts (cap <= 0:
/// no cap).
int32_t capDistinctExperts(std::span<int32_t> ranked, std::span<double> scores,
                           int32_t k, int64_t tokens, int32_t cap,
                           std::span<int32_t> limits);

/// The calls a group of `tokens` tokens may spend at `budget`.
int64_t expertCallsForBudget(float budget, int32_t k, int32_t minK,
                             int64_t tokens);

} // namespace nf::cpu
