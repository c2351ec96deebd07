#include "reference_model.h"

#include <algorithm>
#include <exception>
#include <new>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace nf::cpu {

const char *layerKindName(LayerKind k) {
  switch (k) {
  case LayerKind::Mamba:
    return "mamba";
  case LayerKind::Attention:
    return "attention";
  case LayerKind::Mlp:
    return "mlp";
  case LayerKind::Moe:
    return "moe";
  }
  return "?";
}

namespace {

std::string shapeString(const std::vector<int64_t> &s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// A present view of a supported dtype and exactly `shape`.
Status checkView(const WeightView &v, const std::vector<int64_t> &shape,
                 const std::string &what) {
  if (!v.valid())
    return Status::error(what + ": missing weight");
  if (!isSupportedWeightDType(v.dtype))
    return Status::error(what + ": unsupported dtype " + dtypeName(v.dtype));
  if (v.shape != shape)
    return Status::error(what + ": shape " + shapeString(v.shape) +
                         ", expected " + shapeString(shape));
  return Status::success();
}

Status checkMamba(const MambaLayer &l, int64_t H, const std::string &ctx) {
  const MambaShape &s = l.shape;
  if (s.numHeads <= 0 || s.headDim <= 0 || s.stateSize <= 0 || s.nGroups <= 0 ||
      s.convKernel <= 0)
    return Status::error(ctx + ": mamba sizes must be positive");
  if (s.numHeads % s.nGroups != 0)
    return Status::error(ctx + ": mamba heads " + std::to_string(s.numHeads) +
                         " not divisible by n_groups " +
                         std::to_string(s.nGroups));
  if (!(l.dtMin <= l.dtMax))
    return Status::error(ctx + ": dt limits out of order");
  const int64_t I = s.inner(), CD = s.convDim(), nh = s.numHeads;
  if (Status st = checkView(l.inProj, {s.inProjDim(), H}, ctx + " in_proj");
      !st)
    return st;
  if (l.convWeight.shape.size() == 2) {
    if (Status st = checkView(l.convWeight, {CD, s.convKernel}, ctx + " conv");
        !st)
      return st;
  } else if (Status st =
                 checkView(l.convWeight, {CD, 1, s.convKernel}, ctx + " conv");
             !st) {
    return st;
  }
  if (l.convBias.valid())
    if (Status st = checkView(l.convBias, {CD}, ctx + " conv bias"); !st)
      return st;
  if (Status st = checkView(l.dtBias, {nh}, ctx + " dt_bias"); !st)
    return st;
  if (Status st = checkView(l.aLog, {nh}, ctx + " A_log"); !st)
    return st;
  if (Status st = checkView(l.d, {nh}, ctx + " D"); !st)
    return st;
  if (Status st = checkView(l.norm, {I}, ctx + " gated norm"); !st)
    return st;
  return checkView(l.outProj, {H, I}, ctx + " out_proj");
}

Status checkAttention(const AttentionLayer &l, int64_t H,
                      const std::string &ctx) {
  if (l.numHeads <= 0 || l.numKvHeads <= 0 || l.headDim <= 0)
    return Status::error(ctx + ": attention sizes must be positive");
  if (l.numHeads % l.numKvHeads != 0)
    return Status::error(ctx + ": heads " + std::to_string(l.numHeads) +
                         " not divisible by kv heads " +
                         std::to_string(l.numKvHeads));
  const int64_t q = l.numHeads * l.headDim, kv = l.numKvHeads * l.headDim;
  if (Status st = checkView(l.q, {q, H}, ctx + " q_proj"); !st)
    return st;
  if (Status st = checkView(l.k, {kv, H}, ctx + " k_proj"); !st)
    return st;
  if (Status st = checkView(l.v, {kv, H}, ctx + " v_proj"); !st)
    return st;
  return checkView(l.o, {H, q}, ctx + " o_proj");
}

Status checkMlp(const WeightView &up, const WeightView &down, int64_t H,
                const std::string &ctx) {
  if (!up.valid() || up.shape.size() != 2)
    return Status::error(ctx + " up: missing or not a matrix");
  const int64_t I = up.rows();
  if (Status st = checkView(up, {I, H}, ctx + " up"); !st)
    return st;
  return checkView(down, {H, I}, ctx + " down");
}

Status checkMoe(const MoeLayer &l, int64_t H, const std::string &ctx) {
  const RouterConfig &r = l.router;
  const int64_t E = r.numExperts;
  if (E <= 0 || r.nGroup <= 0 || r.topkGroup <= 0 || r.topkGroup > r.nGroup ||
      E % r.nGroup != 0)
    return Status::error(ctx + ": bad router config (experts " +
                         std::to_string(E) + ", n_group " +
                         std::to_string(r.nGroup) + ", topk_group " +
                         std::to_string(r.topkGroup) + ")");
  if (l.topK < 0 || l.topK > maxExpertsPerToken(r))
    return Status::error(
        ctx + ": top-k " + std::to_string(l.topK) + " exceeds the " +
        std::to_string(maxExpertsPerToken(r)) + " experts selectable");
  if (Status st = checkView(l.gate, {E, H}, ctx + " gate"); !st)
    return st;
  if (l.correctionBias.valid())
    if (Status st = checkView(l.correctionBias, {E}, ctx + " correction bias");
        !st)
      return st;
  if (l.latentDown.valid() != l.latentUp.valid())
    return Status::error(ctx + ": latent projections come in pairs");
  int64_t He = H;
  if (l.latentDown.valid()) {
    He = l.latentDown.rows();
    if (Status st = checkView(l.latentDown, {He, H}, ctx + " fc1_latent"); !st)
      return st;
    if (Status st = checkView(l.latentUp, {H, He}, ctx + " fc2_latent"); !st)
      return st;
  }
  if (static_cast<int64_t>(l.expertsUp.size()) != E ||
      static_cast<int64_t>(l.expertsDown.size()) != E)
    return Status::error(ctx + ": " + std::to_string(l.expertsUp.size()) + "/" +
                         std::to_string(l.expertsDown.size()) +
                         " expert up/down views for " + std::to_string(E) +
                         " experts");
  for (int64_t e = 0; e < E; ++e)
    if (Status st = checkMlp(l.expertsUp[e], l.expertsDown[e], He,
                             ctx + " expert " + std::to_string(e));
        !st)
      return st;
  if (l.sharedUp.valid() || l.sharedDown.valid())
    return checkMlp(l.sharedUp, l.sharedDown, H, ctx + " shared expert");
  return Status::success();
}

} // namespace

Status ModelDesc::validate() const {
  if (vocabSize <= 0 || hiddenSize <= 0)
    return Status::error("model: vocab and hidden sizes must be positive");
  if (!(eps >= 0))
    return Status::error("model: eps must be >= 0");
  const int64_t H = hiddenSize;
  if (Status st = checkView(embedding, {vocabSize, H}, "embedding"); !st)
    return st;
  if (Status st = checkView(finalNorm, {H}, "final norm"); !st)
    return st;
  if (Status st = checkView(lmHead, {vocabSize, H}, "lm_head"); !st)
    return st;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerDesc &l = layers[i];
    const std::string ctx =
        "layer " + std::to_string(i) + " (" + layerKindName(l.kind) + ")";
    if (Status st = checkView(l.norm, {H}, ctx + " norm"); !st)
      return st;
    Status st = Status::success();
    switch (l.kind) {
    case LayerKind::Mamba:
      st = checkMamba(l.mamba, H, ctx);
      break;
    case LayerKind::Attention:
      st = checkAttention(l.attention, H, ctx);
      break;
    case LayerKind::Mlp:
      st = checkMlp(l.mlp.up, l.mlp.down, H, ctx + " mlp");
      break;
    case LayerKind::Moe:
      st = checkMoe(l.moe, H, ctx);
      break;
    }
    if (!st)
      return st;
  }
  return Status::success();
}

// ---------------------------------------------------------------------------
// Caches of a ModelDesc

StatusOr<Caches> createCaches(const ModelDesc &m, const CacheConfig &cfg) {
  std::vector<MambaShape> mamba;
  std::vector<KvLayerShape> attention;
  for (const LayerDesc &l : m.layers) {
    if (l.kind == LayerKind::Mamba)
      mamba.push_back(l.mamba.shape);
    else if (l.kind == LayerKind::Attention)
      attention.push_back({l.attention.numKvHeads, l.attention.headDim});
  }
  return Caches::create(mamba, attention, cfg);
}

// ---------------------------------------------------------------------------
// Executor

StatusOr<Executor> Executor::create(ModelDesc desc, ExecutorOptions opts) {
  try {
    if (Status s = desc.validate(); !s)
      return s;
    Executor ex;
    ex.desc_ = std::move(desc);
    ex.opts_ = opts;
    int32_t counts[4] = {0, 0, 0, 0};
    for (const LayerDesc &l : ex.desc_.layers)
      ex.ordinal_.push_back(counts[static_cast<int>(l.kind)]++);
    return ex;
  } catch (const std::bad_alloc &) {
    return Status::error("executor: out of memory");
  }
}

Status Executor::checkStep(Caches &caches, std::span<const SeqSpan> spans,
                           std::span<const int32_t> tokens,
                           const StepOptions &opts) const {
  const int64_t T = static_cast<int64_t>(tokens.size());
  int32_t mambaLayers = 0, attnLayers = 0;
  for (const LayerDesc &l : desc_.layers) {
    mambaLayers += l.kind == LayerKind::Mamba;
    attnLayers += l.kind == LayerKind::Attention;
  }
  if (caches.state_.numMambaLayers() != mambaLayers ||
      caches.kv_.numAttentionLayers() != attnLayers)
    return Status::error("step: caches were built for another model");
  std::vector<char> covered(static_cast<size_t>(T), 0);
  std::vector<char> slotSeen(static_cast<size_t>(caches.state_.numSlots()), 0);
  for (size_t i = 0; i < spans.size(); ++i) {
    const SeqSpan &s = spans[i];
    const std::string ctx = "step: span " + std::to_string(i);
    if (s.count < 1 || s.begin < 0 || s.begin + int64_t{s.count} > T)
      return Status::error(ctx + " [" + std::to_string(s.begin) + ", +" +
                           std::to_string(s.count) + ") is outside the " +
                           std::to_string(T) + " tokens");
    if (!caches.isLive(s.slot))
      return Status::error(ctx + ": slot " + std::to_string(s.slot) +
                           " holds no sequence");
    if (slotSeen[s.slot]++)
      return Status::error(ctx + ": slot " + std::to_string(s.slot) +
                           " appears twice");
    if (s.startPos != caches.length(s.slot))
      return Status::error(ctx + ": startPos " + std::to_string(s.startPos) +
                           " but the sequence in slot " +
                           std::to_string(s.slot) + " has " +
                           std::to_string(caches.length(s.slot)) + " tokens");
    for (int32_t j = 0; j < s.count; ++j)
      if (covered[s.begin + j]++)
        return Status::error(ctx + ": token " + std::to_string(s.begin + j) +
                             " belongs to two spans");
  }
  for (int64_t t = 0; t < T; ++t) {
    if (!covered[t])
      return Status::error("step: token " + std::to_string(t) +
                           " belongs to no span");
    if (tokens[t] < 0 || tokens[t] >= desc_.vocabSize)
      return Status::error("step: token id " + std::to_string(tokens[t]) +
                           " outside the vocabulary of " +
                           std::to_string(desc_.vocabSize));
  }
  const size_t nk = opts.expertsPerToken.size();
  if (nk != 0 && nk != 1 && nk != static_cast<size_t>(T))
    return Status::error("step: expertsPerToken has " + std::to_string(nk) +
                         " entries; expected 0, 1 or " + std::to_string(T));
  for (const LayerDesc &l : desc_.layers) {
    if (l.kind != LayerKind::Moe)
      continue;
    const int64_t mx = maxExpertsPerToken(l.moe.router);
    for (int32_t k : opts.expertsPerToken)
      if (k < 0 || k > mx)
        return Status::error("step: " + std::to_string(k) +
                             " experts per token; a MoE layer allows 0.." +
                             std::to_string(mx));
  }
  return Status::success();
}

Status Executor::step(Caches &caches, std::span<const SeqSpan> spans,
                      std::span<const int32_t> tokens,
                      std::vector<float> &logits, const StepOptions &opts) {
  ThreadCountScope threads(opts_.numThreads);
  try {
    if (Status s = checkStep(caches, spans, tokens, opts); !s)
      return s;
    for (const SeqSpan &s : spans)
      if (Status st = caches.reserve(s.slot, s.startPos + s.count); !st)
        return Status::error("step: slot " + std::to_string(s.slot) + ": " +
                             st.message());
    runStep(caches, spans, tokens, logits, opts);
    for (const SeqSpan &s : spans)
      caches.lengths_[s.slot] += s.count;
    return Status::success();
  } catch (const std::bad_alloc &) {
    return Status::error("step: out of memory");
  } catch (const std::exception &e) {
    return Status::error(std::string("step: ") + e.what());
  }
}

void Executor::runStep(Caches &caches, std::span<const SeqSpan> spans,
                       std::span<const int32_t> tokens,
                       std::vector<float> &logits, const StepOptions &opts) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t H = desc_.hiddenSize, V = desc_.vocabSize;
  const Accum acc = opts_.accum;
  h_.resize(static_cast<size_t>(T * H));
  x_.resize(static_cast<size_t>(T * H));
  mix_.resize(static_cast<size_t>(T * H));
  embedding(desc_.embedding, tokens, h_.data());
  if (opts.hiddenStates)
    opts.hiddenStates->clear();
  if (opts.routes)
    opts.routes->clear();

  std::span<const int32_t> kPerToken = opts.expertsPerToken;
  for (size_t li = 0; li < desc_.layers.size(); ++li) {
    const LayerDesc &l = desc_.layers[li];
    if (opts.hiddenStates)
      opts.hiddenStates->push_back(h_);
    rmsNorm(h_.data(), T, H, l.norm, desc_.eps, x_.data());
    switch (l.kind) {
    case LayerKind::Mamba:
      mamba(l.mamba, ordinal_[li], caches, spans, x_.data(), mix_.data());
      break;
    case LayerKind::Attention:
      attention(l.attention, ordinal_[li], caches, spans, x_.data(),
                mix_.data());
      break;
    case LayerKind::Mlp:
      mlpRelu2(x_.data(), T, l.mlp.up, l.mlp.down, mix_.data(), acc);
      break;
    case LayerKind::Moe:
      moe(l.moe, static_cast<int32_t>(li), kPerToken, x_.data(), T, mix_.data(),
          opts);
      break;
    }
    addInPlace(h_.data(), mix_.data(), T * H);
  }

  if (opts.logits == LogitsMode::AllTokens || opts.hiddenStates) {
    rmsNorm(h_.data(), T, H, desc_.finalNorm, desc_.eps, x_.data());
    if (opts.hiddenStates)
      opts.hiddenStates->push_back(x_);
  }
  if (opts.logits == LogitsMode::AllTokens) {
    logits.resize(static_cast<size_t>(T * V));
    linear(x_.data(), T, H, desc_.lmHead, logits.data(), V, acc);
    return;
  }
  // Only the last token of each sequence goes through the final norm/head.
  const int64_t S = static_cast<int64_t>(spans.size());
  a_.resize(static_cast<size_t>(S * H));
  for (int64_t i = 0; i < S; ++i) {
    const int64_t t = spans[i].begin + spans[i].count - 1;
    std::copy(h_.begin() + t * H, h_.begin() + (t + 1) * H, a_.begin() + i * H);
  }
  rmsNorm(a_.data(), S, H, desc_.finalNorm, desc_.eps, a_.data());
  logits.resize(static_cast<size_t>(S * V));
  linear(a_.data(), S, H, desc_.lmHead, logits.data(), V, acc);
}

void Executor::mamba(const MambaLayer &l, int32_t ordinal, Caches &caches,
                     std::span<const SeqSpan> spans, const float *x,
                     float *out) {
  const MambaShape &s = l.shape;
  int64_t T = 0;
  for (const SeqSpan &sp : spans)
    T += sp.count;
  const int64_t H = desc_.hiddenSize, I = s.inner(), CD = s.convDim(),
                nh = s.numHeads, DIN = s.inProjDim();
  // a_: in_proj output [T, DIN] = z | xBC | dt_raw
  a_.resize(static_cast<size_t>(T * DIN));
  linear(x, T, H, l.inProj, a_.data(), DIN, opts_.accum);

  std::vector<float *> conv, ssm;
  for (const SeqSpan &sp : spans) {
    conv.push_back(caches.state_.conv(ordinal, sp.slot));
    ssm.push_back(caches.state_.ssm(ordinal, sp.slot));
  }
  // b_: conv output [T, CD] = x | B | C
  b_.resize(static_cast<size_t>(T * CD));
  causalConvSilu(a_.data() + I, DIN, spans, conv, s, l.convWeight, l.convBias,
                 b_.data(), CD);
  // c_: dt [T, nh] | y [T, I] | gated-normed u [T, I]
  c_.resize(static_cast<size_t>(T * (nh + 2 * I)));
  float *dt = c_.data(), *y = dt + T * nh, *u = y + T * I;
  mambaDt(a_.data() + I + CD, DIN, T, nh, l.dtBias, l.dtMin, l.dtMax, dt);
  ssmScan(b_.data(), CD, dt, spans, ssm, s, l.aLog, l.d, y, I);
  gatedRmsNorm(y, I, a_.data(), DIN, T, I, s.nGroups, l.norm, desc_.eps, u);
  linear(u, T, I, l.outProj, out, H, opts_.accum);
}

void Executor::attention(const AttentionLayer &l, int32_t ordinal,
                         Caches &caches, std::span<const SeqSpan> spans,
                         const float *x, float *out) {
  int64_t T = 0;
  for (const SeqSpan &sp : spans)
    T += sp.count;
  const int64_t H = desc_.hiddenSize;
  const int64_t qd = l.numHeads * l.headDim, kvd = l.numKvHeads * l.headDim;
  a_.resize(static_cast<size_t>(T * (qd + 2 * kvd)));
  float *q = a_.data(), *k = q + T * qd, *v = k + T * kvd;
  linear(x, T, H, l.q, q, qd, opts_.accum);
  linear(x, T, H, l.k, k, kvd, opts_.accum);
  linear(x, T, H, l.v, v, kvd, opts_.accum);

  std::vector<std::span<const int32_t>> tables;
  for (const SeqSpan &sp : spans)
    tables.emplace_back(caches.pageTables_[sp.slot]);
  const PagedKvLayer cache = caches.kv_.layer(ordinal);
  // All new K/V first: tokens of a span attend to earlier tokens of the same
  // step.
  kvAppend(k, kvd, v, kvd, spans, tables, cache);
  b_.resize(static_cast<size_t>(T * qd));
  pagedAttention(q, qd, l.numHeads, spans, tables, cache, b_.data(), qd);
  linear(b_.data(), T, qd, l.o, out, H, opts_.accum);
}

void Executor::moe(const MoeLayer &l, int32_t layerIndex,
                   std::span<const int32_t> kPerToken, const float *x,
                   int64_t T, float *out, const StepOptions &opts) {
  const int64_t H = desc_.hiddenSize;
  RouterOutput routes;
  int32_t k = l.topK;
  std::span<const int32_t> perToken;
  if (kPerToken.size() == 1)
    k = kPerToken[0];
  else if (!kPerToken.empty())
    perToken = kPerToken;
  moeRoute(x, T, H, l.gate, l.correctionBias, l.router, k, perToken, routes);

  // Latent MoE: experts run on fc1(x); fc2 maps their weighted sum back.
  const float *xe = x;
  int64_t He = H;
  if (l.latentDown.valid()) {
    He = l.latentDown.rows();
    a_.resize(static_cast<size_t>(T * He));
    linear(x, T, H, l.latentDown, a_.data(), He, opts_.accum);
    xe = a_.data();
  }
  b_.resize(static_cast<size_t>(T * He));
  moeExperts(xe, T, He, routes, l.expertsUp, l.expertsDown, b_.data(),
             opts_.accum);
  if (l.latentUp.valid())
    linear(b_.data(), T, He, l.latentUp, out, H, opts_.accum);
  else
    std::copy(b_.begin(), b_.begin() + T * H, out);
  if (l.sharedUp.valid()) {
    // The shared expert sees the un-projected x.
    c_.resize(static_cast<size_t>(T * H));
    mlpRelu2(x, T, l.sharedUp, l.sharedDown, c_.data(), opts_.accum);
    addInPlace(out, c_.data(), T * H);
  }
  if (opts.routes)
    opts.routes->push_back({layerIndex, std::move(routes)});
}

} // namespace nf::cpu
