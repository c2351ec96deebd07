// The CPU backend's MoE ops: nf_moe.router (f64 scores), nf_moe.select
// (top-k candidates, the distinct-expert cap, the expert budget, routing
// weights), nf_moe.dispatch (assignment rows grouped by expert), expert
// up / down (grouped linears) and nf_moe.combine.
#include "backends/cpu/cpu_engine_impl.h"

#include "backends/cpu/expert_budget.h"
#include "backends/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace nf::engine::cpu_detail {
namespace {

using cpu::dotF64;
using cpu::maxThreads;
using cpu::threadId;
using cpu::worthParallel;

// Dispatch layout (i32, in the value's arena bytes):
//   offsets[E + 1]   first assignment row of each expert (grouped order)
//   rowToken[T * M]  token of each assignment row
//   slotRow[T * M]   row of assignment (t, j), j < M; -1 when unused
// M = the dispatch's max_per_token. Rows are grouped by expert, and within
// an expert ordered by token then by the token's selection order.
struct DispatchView {
  int32_t *offsets, *rowToken, *slotRow;
  int64_t E, M;
};

DispatchView dispatchView(uint8_t *base, int64_t E, int64_t M, int64_t T) {
  int32_t *p = reinterpret_cast<int32_t *>(base);
  return {p, p + E + 1, p + E + 1 + T * M, E, M};
}

} // namespace

void CpuEngine::opRouter(const Program &p, const OpInfo &o) {
  const int64_t T = run_.T;
  const int64_t H = p.values[o.in[0]].cols;
  const WeightView &gate = weight(p, o.in[1]).view;
  const WeightView &bias = weight(p, o.in[2]).view;
  const int64_t E = gate.rows();
  const float *x = f32(p, o.in[0]);
  gateF32_.resize(static_cast<size_t>(E * H));
  convertToF32(gate, 0, E * H, gateF32_.data());
  // Scores in f64 as the reference executor computes them; the f32 copies
  // in the arena are what later kernels (or another backend) see, the f64
  // ones let nf_moe.select reproduce the reference's expert choice exactly.
  std::vector<double> &s = f64Values_[o.out[0]];
  std::vector<double> &sb = f64Values_[o.out[1]];
  s.resize(static_cast<size_t>(T * E));
  sb.resize(static_cast<size_t>(T * E));
  std::vector<double> b(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    b[e] = loadF32(bias, e);
  float *sOut = f32(p, o.out[0]), *sbOut = f32(p, o.out[1]);
  const float *gw = gateF32_.data();
#pragma omp parallel for schedule(static) if (worthParallel(T * E * H))
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      const double logit = dotF64(x + t * H, gw + e * H, H);
      const double sc = 1.0 / (1.0 + std::exp(-logit));
      s[t * E + e] = sc;
      sb[t * E + e] = sc + b[e];
      sOut[t * E + e] = static_cast<float>(sc);
      sbOut[t * E + e] = static_cast<float>(sc + b[e]);
    }
  f64Gen_[o.out[0]] = runGen_;
  f64Gen_[o.out[1]] = runGen_;
}

void CpuEngine::opSelect(const Program &p, const OpInfo &o) {
  const int64_t T = run_.T;
  const int64_t E = p.values[o.in[0]].cols;
  const int64_t K = o.topK;
  const bool exact = f64Gen_[o.in[0]] == runGen_ && f64Gen_[o.in[1]] == runGen_;
  const float *sF = f32(p, o.in[0]), *sbF = f32(p, o.in[1]);
  int32_t *experts = i32(p, o.out[0]);
  float *weights = f32(p, o.out[1]);
  int32_t *counts = i32(p, o.out[2]);
  std::vector<double> s(static_cast<size_t>(E)), sb(static_cast<size_t>(E));
  std::vector<int64_t> order(static_cast<size_t>(E));
  // Pass 1: every token's K best candidates, in rank order, with their
  // routing weights (sigmoid scores).
  std::vector<int32_t> &ranked = run_.rankedExperts;
  std::vector<double> &rankedScore = run_.rankedScores;
  ranked.assign(static_cast<size_t>(T * K), -1);
  rankedScore.assign(static_cast<size_t>(T * K), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      if (exact) {
        s[e] = f64Values_[o.in[0]][t * E + e];
        sb[e] = f64Values_[o.in[1]][t * E + e];
      } else {
        s[e] = sF[t * E + e];
        sb[e] = sbF[t * E + e];
      }
    }
    cpu::maskExpertGroups(sb, o.nGroup, o.topkGroup);
    std::iota(order.begin(), order.begin() + E, 0);
    std::partial_sort(order.begin(), order.begin() + K, order.begin() + E,
                      [&](int64_t a, int64_t b) {
                        return sb[a] > sb[b] || (sb[a] == sb[b] && a < b);
                      });
    for (int64_t j = 0; j < K; ++j) {
      ranked[t * K + j] = static_cast<int32_t>(order[j]);
      rankedScore[t * K + j] = s[order[j]];
    }
  }

  // Pass 2: how many of its candidates each token runs. "topk": the model's
  // k, or the evaluation override (expertsPerToken). "budget": the scheduler
  // spreads each sequence's budget over its tokens in this run
  // (backends/cpu/expert_budget.h); a budget of 1.0 is exactly top-k.
  // The distinct-expert cap first: the candidates it leaves each token
  // bound what the policy may give it.
  std::vector<int32_t> limits(static_cast<size_t>(T), static_cast<int32_t>(K));
  if (distinctExpertCap_ > 0.0) {
    int32_t cap = static_cast<int32_t>(distinctExpertCap_);
    if (distinctExpertCap_ < 1.0) {
      const int32_t named = cpu::capDistinctExperts(
          ranked, rankedScore, static_cast<int32_t>(K), T, 0, limits);
      cap = std::max(
          1, static_cast<int32_t>(std::ceil(distinctExpertCap_ * named)));
    }
    cpu::capDistinctExperts(ranked, rankedScore, static_cast<int32_t>(K), T,
                            cap, limits);
  }
  for (int64_t t = 0; t < T; ++t)
    counts[t] = std::min(
        limits[t],
        static_cast<int32_t>(run_.kOverride[t] > 0
                                 ? std::min<int64_t>(run_.kOverride[t], K)
                                 : K));
  if (o.budgetPolicy) {
    std::vector<float> candidate(rankedScore.begin(), rankedScore.end());
    std::vector<cpu::BudgetGroup> groups;
    for (const SeqSpan &sp : run_.spans)
      if (sp.count > 0 && run_.kOverride[sp.begin] <= 0)
        groups.push_back({sp.begin, sp.count, run_.budget[sp.begin]});
    cpu::allocateExpertBudget(
        candidate, static_cast<int32_t>(K), static_cast<int32_t>(o.minK),
        groups, {counts, static_cast<size_t>(T)}, budgetStepScope_, limits);
  }

  // Pass 3: the kept experts' weights, renormalised over the kept ones as the
  // model does for its own k.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t kt = counts[t];
    double sum = 0.0;
    for (int64_t j = 0; j < kt; ++j)
      sum += rankedScore[t * K + j];
    const double norm = o.normTopkProb ? 1.0 / (sum + 1e-20) : 1.0;
    for (int64_t j = 0; j < K; ++j) {
      if (j < kt) {
        experts[t * K + j] = ranked[t * K + j];
        weights[t * K + j] = static_cast<float>(rankedScore[t * K + j] * norm *
                                                o.routedScalingFactor);
      } else {
        experts[t * K + j] = -1;
        weights[t * K + j] = 0.0f;
      }
    }
    if (run_.expertCalls)
      (*run_.expertCalls)[run_.tokenInput[t]] += kt;
    if (run_.callsPerLayer)
      (*run_.callsPerLayer)[run_.tokenInput[t]][o.ordinal] += kt;
    std::vector<int64_t> &used = utilization_[o.ordinal];
    for (int64_t j = 0; j < kt; ++j)
      ++used[ranked[t * K + j]];
  }
}

void CpuEngine::opDispatch(const Program &p, const OpInfo &o) {
  const int64_t T = run_.T;
  const ValueInfo &dv = p.values[o.out[0]];
  const int64_t K = p.values[o.in[0]].cols;
  DispatchView d =
      dispatchView(arena_.get() + dv.offset, dv.numExperts, dv.maxPerToken, T);
  const int32_t *experts = i32(p, o.in[0]);
  const int32_t *counts = i32(p, o.in[1]);
  auto used = [&](int64_t t, int64_t j) {
    const int32_t e = experts[t * K + j];
    return j < counts[t] && e >= 0 && e < d.E;
  };
  std::fill(d.offsets, d.offsets + d.E + 1, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j)
      if (used(t, j))
        ++d.offsets[experts[t * K + j] + 1];
  for (int64_t e = 0; e < d.E; ++e)
    d.offsets[e + 1] += d.offsets[e];
  std::vector<int32_t> fill(d.offsets, d.offsets + d.E);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < d.M; ++j) {
      if (j < K && used(t, j)) {
        const int32_t row = fill[experts[t * K + j]]++;
        d.slotRow[t * d.M + j] = row;
        d.rowToken[row] = static_cast<int32_t>(t);
      } else {
        d.slotRow[t * d.M + j] = -1;
      }
    }
}

void CpuEngine::opExperts(const Program &p, const OpInfo &o, bool up) {
  const int64_t T = run_.T;
  const ValueInfo &dv = p.values[o.in[1]];
  const DispatchView d =
      dispatchView(arena_.get() + dv.offset, dv.numExperts, dv.maxPerToken, T);
  const BoundWeight &w = weight(p, o.in[2]);
  const int64_t In = p.values[o.in[0]].cols, Out = p.values[o.out[0]].cols;
  const float *x = f32(p, o.in[0]);
  float *y = f32(p, o.out[0]);
  const int64_t A = d.offsets[d.E];
  // Expert up gathers its rows (token rows -> assignment rows) in blocks.
  constexpr int64_t kBlock = 64;
  const bool parallel = worthParallel(A * In * Out) && d.E > 1;
  const int nt = parallel ? maxThreads() : 1;
  // Quantised experts quantise their input rows (a copy) per expert.
  const pl::ActivationQuant quant = w.input.kind;
  const bool copyRows = up || quant != pl::ActivationQuant::None;
  const size_t per = copyRows ? static_cast<size_t>(kBlock * In) : 0;
  float *gather = scratchF(2, per * static_cast<size_t>(nt) + 1);
#pragma omp parallel num_threads(nt) if (parallel)
  {
    float *g = gather + per * static_cast<size_t>(threadId());
#pragma omp for schedule(dynamic, 1)
    for (int64_t e = 0; e < d.E; ++e) {
      const int64_t begin = d.offsets[e], end = d.offsets[e + 1];
      const WeightView &we = w.experts[e];
      for (int64_t a0 = begin; a0 < end; a0 += kBlock) {
        const int64_t rows = std::min(kBlock, end - a0);
        const float *xs;
        if (up) {
          for (int64_t i = 0; i < rows; ++i)
            std::memcpy(g + i * In, x + d.rowToken[a0 + i] * In,
                        static_cast<size_t>(In) * sizeof(float));
          xs = g;
        } else {
          xs = x + a0 * In;
        }
        if (quant != pl::ActivationQuant::None) {
          const float s = quant == pl::ActivationQuant::StaticPerTensor
                              ? w.input.scales[static_cast<size_t>(e)]
                              : 0.0f;
          cpu::fakeQuantE4M3(xs, rows, In, In, s, g);
          xs = g;
        }
        cpu::linear(xs, rows, In, we, y + a0 * Out, Out);
        if (up)
          activate(o.act, y + a0 * Out, rows * Out);
      }
    }
  }
}

void CpuEngine::opCombine(const Program &p, const OpInfo &o) {
  const int64_t T = run_.T;
  const ValueInfo &dv = p.values[o.in[1]];
  const DispatchView d =
      dispatchView(arena_.get() + dv.offset, dv.numExperts, dv.maxPerToken, T);
  const int64_t He = p.values[o.out[0]].cols;
  const int64_t K = p.values[o.in[2]].cols;
  const float *rows = f32(p, o.in[0]);
  const float *w = f32(p, o.in[2]);
  float *out = f32(p, o.out[0]);
  // Each token's experts in its selection order, f32: the sum does not
  // depend on which tokens share the step.
#pragma omp parallel for schedule(static) if (worthParallel(T * K * He))
  for (int64_t t = 0; t < T; ++t) {
    float *ot = out + t * He;
    std::fill(ot, ot + He, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const int32_t row = d.slotRow[t * d.M + j];
      if (row < 0)
        continue;
      const float wj = w[t * K + j];
      const float *r = rows + static_cast<int64_t>(row) * He;
      for (int64_t i = 0; i < He; ++i)
        ot[i] += wj * r[i];
    }
  }
}

} // namespace nf::engine::cpu_detail
