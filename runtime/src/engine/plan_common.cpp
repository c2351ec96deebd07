#include "engine/plan_common.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace nf::engine {

namespace fb = flatbuffers;
namespace pl = nf::plan;
using cpu::KvStorage;

// ---------------------------------------------------------------------------
// Model facts

Status readModelInfo(const PlanFile &pf, const BoundWeights &weights,
                     ModelInfo &info) {
  const pl::Plan &plan = *pf.plan;
  const pl::ModelConfig &cfg = *plan.config();
  info.name = cfg.name() ? cfg.name()->str() : "";
  info.vocabSize = cfg.vocab_size();
  info.hiddenSize = cfg.hidden_size();
  info.bosTokenId = cfg.bos_token_id();
  if (cfg.eos_token_ids())
    info.eosTokenIds.assign(cfg.eos_token_ids()->begin(),
                            cfg.eos_token_ids()->end());
  info.layerKinds = cfg.layer_kinds() ? cfg.layer_kinds()->str() : "";
  info.expertPolicy =
      plan.expert_policy() ? plan.expert_policy()->str() : "topk";
  info.defaultExpertBudget = plan.default_expert_budget();
  info.weightsDir = weights.dir;
  if (info.vocabSize <= 0 || info.vocabSize > (int64_t{1} << 31))
    return Status::error(pf.path + ": vocab_size " +
                         std::to_string(info.vocabSize) + " out of range");
  info.maxPrefillTokens = plan.prefill()->max_tokens();
  info.maxDecodeTokens = plan.decode()->max_tokens();
  return Status::success();
}

// ---------------------------------------------------------------------------
// Storage

void setSequenceMemory(const StorageLayout &layout, bool typedKv,
                       ModelInfo &info) {
  const int64_t ps = layout.cache.pageSize;
  info.stateBytesPerSequence = 0;
  info.kvBytesPerPage = 0;
  for (const StorageInfo &si : layout.entries)
    if (si.kind == pl::StorageKind::KVCache)
      info.kvBytesPerPage +=
          2 * (typedKv ? cpu::kvPageBytes(si.kv, ps)
                       : ps * si.kv.numKvHeads * si.kv.headDim * 4);
    else
      info.stateBytesPerSequence +=
          (si.mamba.convStateSize() + si.mamba.ssmStateSize()) * 4;
}

namespace {

std::optional<KvStorage> kvStorageOf(pl::DType d) {
  switch (d) {
  case pl::DType::F32:
    return KvStorage::F32;
  case pl::DType::BF16:
    return KvStorage::BF16;
  case pl::DType::F8E4M3:
    return KvStorage::F8E4M3;
  default:
    return std::nullopt;
  }
}

} // namespace

StatusOr<StorageLayout> readStorage(const PlanFile &pf,
                                    const EngineOptions &options,
                                    int64_t defaultSlots,
                                    const char *backendName) {
  const pl::Plan &plan = *pf.plan;
  StorageLayout out;
  int64_t slots = 0, pageSize = 0, numPages = 0, hotWindow = 0;
  if (plan.storage()) {
    for (fb::uoffset_t i = 0; i < plan.storage()->size(); ++i) {
      const pl::Storage &s = *plan.storage()->Get(i);
      const std::string ctx = pf.path + ": storage " + std::to_string(i) +
                              (s.name() ? " (" + s.name()->str() + ")" : "");
      StorageInfo si;
      si.kind = s.kind();
      if (s.kind() == pl::StorageKind::MambaState) {
        const int64_t nh = s.num_heads(), P = s.head_dim(), N = s.state_size(),
                      CD = s.conv_dim(), K1 = s.conv_window();
        if (nh <= 0 || P <= 0 || N <= 0 || CD <= 0 || K1 <= 0 || s.slots() <= 0)
          return Status::error(ctx + ": mamba state sizes must be positive");
        if (CD <= nh * P || (CD - nh * P) % (2 * N) != 0)
          return Status::error(ctx + ": conv_dim " + std::to_string(CD) +
                               " is not heads*head_dim + 2*groups*state");
        si.mamba = {nh, P, N, (CD - nh * P) / (2 * N), K1 + 1};
        if (nh % si.mamba.nGroups != 0)
          return Status::error(ctx + ": " + std::to_string(nh) + " heads in " +
                               std::to_string(si.mamba.nGroups) + " groups");
        si.ordinal = static_cast<int32_t>(out.mamba.size());
        si.slots = s.slots();
        out.mamba.push_back(si.mamba);
        slots = slots == 0 ? s.slots() : std::min(slots, s.slots());
      } else if (s.kind() == pl::StorageKind::KVCache) {
        if (s.page_size() <= 0 || s.num_pages() <= 0 || s.kv_heads() <= 0 ||
            s.head_dim() <= 0)
          return Status::error(ctx + ": kv cache sizes must be positive");
        const std::optional<KvStorage> storage = kvStorageOf(s.dtype());
        if (!storage)
          return Status::error(ctx + ": kv cache dtype " +
                               pl::EnumNameDType(s.dtype()) +
                               " is not supported by the " + backendName +
                               " backend (f32, bf16, f8e4m3)");
        if (pageSize != 0 &&
            (s.page_size() != pageSize || s.num_pages() != numPages ||
             s.hot_window() != hotWindow))
          return Status::error(ctx + ": every kv cache must have the same "
                                     "page size, page count and hot window");
        if (s.hot_window() < 0 ||
            s.hot_window() > s.num_pages() * s.page_size() ||
            (s.hot_window() > 0 && *storage != KvStorage::F8E4M3))
          return Status::error(ctx + ": a hot window needs an fp8 kv cache "
                                     "and at most its positions");
        pageSize = s.page_size();
        numPages = s.num_pages();
        hotWindow = s.hot_window();
        si.kv = {s.kv_heads(), s.head_dim(), *storage};
        si.pageSize = pageSize;
        si.numPages = numPages;
        si.ordinal = static_cast<int32_t>(out.kv.size());
        out.kv.push_back(si.kv);
      } else {
        return Status::error(ctx + ": unknown storage kind");
      }
      out.entries.push_back(si);
    }
  }
  out.hasAttention = !out.kv.empty();
  if (options.maxSequences < 0 || options.kvPages < 0)
    return Status::error(pf.path + ": maxSequences and kvPages must be >= 0");
  int64_t numSlots = options.maxSequences;
  if (numSlots == 0)
    numSlots = slots > 0 ? slots : defaultSlots;
  if (options.kvPages > 0)
    numPages = options.kvPages;
  if (numSlots <= 0 || numSlots > std::numeric_limits<int32_t>::max() ||
      numPages > std::numeric_limits<int32_t>::max())
    return Status::error(pf.path + ": bad sequence or page count");
  out.cache.numSlots = static_cast<int32_t>(numSlots);
  out.cache.numPages = out.hasAttention ? static_cast<int32_t>(numPages) : 1;
  out.cache.pageSize = out.hasAttention ? static_cast<int32_t>(pageSize) : 1;
  out.cache.hotWindow = static_cast<int32_t>(hotWindow);
  out.maxContext = out.hasAttention ? numPages * pageSize : -1;
  return out;
}

// ---------------------------------------------------------------------------
// Step programs

Status readStepValues(const PlanFile &pf, const pl::Step *step,
                      const char *phase, int64_t numWeights, int64_t vocabSize,
                      StepValues &prog) {
  const std::string where = pf.path + ": " + phase + " step";
  prog.phase = phase;
  if (!step->values() || !step->kernels())
    return Status::error(where + " has no values or kernels");
  prog.maxTokens = step->max_tokens();
  prog.arenaBytes = step->arena_bytes();
  prog.scratchBytes = step->scratch_bytes();
  if (prog.maxTokens <= 0 || prog.maxTokens > (int64_t{1} << 31))
    return Status::error(where + ": max_tokens " +
                         std::to_string(prog.maxTokens) + " out of range");
  if (prog.arenaBytes < 0 || prog.scratchBytes < 0 ||
      prog.arenaBytes > (int64_t{1} << 46) ||
      prog.scratchBytes > (int64_t{1} << 46))
    return Status::error(where + ": arena or scratch size out of range");
  const int64_t total = prog.arenaBytes + prog.scratchBytes;

  for (fb::uoffset_t i = 0; i < step->values()->size(); ++i) {
    const pl::Value &v = *step->values()->Get(i);
    const std::string ctx = where + " value " + std::to_string(i);
    ValueInfo vi;
    vi.kind = v.kind();
    vi.dtype = v.dtype();
    vi.rows = v.rows();
    if (v.shape())
      vi.shape.assign(v.shape()->begin(), v.shape()->end());
    vi.offset = v.offset();
    vi.bytes = v.bytes();
    vi.weight = v.weight();
    vi.numExperts = v.num_experts();
    vi.maxPerToken = v.max_per_token();
    // offset + bytes may overflow: compare with what is left of the arena.
    auto inArena = [&]() {
      return vi.offset >= 0 && vi.bytes >= 0 && vi.offset % 4 == 0 &&
             vi.offset <= total && vi.bytes <= total - vi.offset;
    };
    switch (vi.kind) {
    case pl::ValueKind::Tensor: {
      if (vi.dtype != pl::DType::F32 && vi.dtype != pl::DType::I32)
        return Status::error(ctx + ": tensors must be f32 or i32, not " +
                             pl::EnumNameDType(vi.dtype));
      if (vi.shape.empty())
        return Status::error(ctx + ": tensor without dimensions");
      const bool dynamic = vi.rows != pl::Rows::None;
      if (dynamic != (vi.shape[0] == -1))
        return Status::error(
            ctx + ": leading dimension " + std::to_string(vi.shape[0]) +
            " does not match its row kind " + pl::EnumNameRows(vi.rows));
      vi.cols = 1;
      // Each row must fit in the arena (at most 2^46 bytes), which also
      // keeps the products below from overflowing.
      for (size_t d = dynamic ? 1 : 0; d < vi.shape.size(); ++d) {
        if (vi.shape[d] <= 0 || vi.shape[d] > (int64_t{1} << 32) ||
            vi.cols > (int64_t{1} << 46) / vi.shape[d])
          return Status::error(ctx + ": bad shape " + shapeString(vi.shape));
        vi.cols *= vi.shape[d];
      }
      if (!inArena())
        return Status::error(ctx + ": bytes [" + std::to_string(vi.offset) +
                             ", +" + std::to_string(vi.bytes) +
                             ") outside the arena of " + std::to_string(total));
      // maxTokens <= 2^31 and cols <= 2^46: a product beyond the arena
      // (2^46) is refused before it could overflow.
      const int64_t rowsNeeded = vi.rows == pl::Rows::Tokens ? prog.maxTokens
                                 : vi.rows == pl::Rows::None ? 1
                                                             : 0;
      if (rowsNeeded > 0 && vi.cols > total / 4 / rowsNeeded)
        return Status::error(ctx + ": " + std::to_string(rowsNeeded) +
                             " rows of " + std::to_string(vi.cols) +
                             " elements do not fit in the arena of " +
                             std::to_string(total));
      const int64_t need = rowsNeeded * vi.cols * 4;
      if (vi.bytes < need)
        return Status::error(ctx + ": " + std::to_string(vi.bytes) +
                             " bytes reserved, " + std::to_string(need) +
                             " needed at " + std::to_string(prog.maxTokens) +
                             " tokens");
      break;
    }
    case pl::ValueKind::Weight:
      if (vi.weight < 0 || vi.weight >= numWeights)
        return Status::error(ctx + ": weight index " +
                             std::to_string(vi.weight) + " out of range");
      break;
    case pl::ValueKind::Dispatch: {
      if (vi.numExperts <= 0 || vi.maxPerToken <= 0)
        return Status::error(ctx + ": dispatch without experts");
      // Two ids per (token, choice): refused beyond the arena before the
      // product could overflow.
      const int64_t perToken = 2 * static_cast<int64_t>(vi.maxPerToken);
      if (perToken > total / 4 / prog.maxTokens)
        return Status::error(ctx + ": dispatch of " +
                             std::to_string(vi.maxPerToken) +
                             " experts per token does not fit in the arena");
      const int64_t need = 4 * (vi.numExperts + 1 + prog.maxTokens * perToken);
      if (!inArena() || vi.bytes < need)
        return Status::error(ctx + ": dispatch needs " + std::to_string(need) +
                             " bytes in the arena");
      break;
    }
    case pl::ValueKind::Batch:
    case pl::ValueKind::Tokens:
    case pl::ValueKind::Budget:
      break;
    default:
      return Status::error(ctx + ": unknown value kind");
    }
    prog.values.push_back(std::move(vi));
  }

  const int32_t nv = static_cast<int32_t>(prog.values.size());
  auto role = [&](int32_t idx, pl::ValueKind kind, const char *name,
                  int32_t &outIdx) -> Status {
    if (idx < 0 || idx >= nv || prog.values[idx].kind != kind)
      return Status::error(where + ": the " + name + " value " +
                           std::to_string(idx) + " is missing or not a " +
                           pl::EnumNameValueKind(kind));
    outIdx = idx;
    return Status::success();
  };
  if (Status s =
          role(step->tokens(), pl::ValueKind::Tokens, "tokens", prog.tokens);
      !s)
    return s;
  if (Status s = role(step->batch(), pl::ValueKind::Batch, "batch", prog.batch);
      !s)
    return s;
  if (Status s = role(step->expert_budget(), pl::ValueKind::Budget,
                      "expert budget", prog.budget);
      !s)
    return s;
  if (Status s =
          role(step->logits(), pl::ValueKind::Tensor, "logits", prog.logits);
      !s)
    return s;
  const ValueInfo &lv = prog.values[prog.logits];
  if (lv.dtype != pl::DType::F32 || lv.rows != pl::Rows::Tokens ||
      lv.cols != vocabSize)
    return Status::error(where + ": logits must be f32 [tokens, " +
                         std::to_string(vocabSize) + "], not " +
                         shapeString(lv.shape));
  return Status::success();
}

// ---------------------------------------------------------------------------
// Sequences

StatusOr<int32_t>
SequenceTable::add(int64_t maxSequences,
                   const std::function<Status(int32_t slot)> &prepare) {
  if (nextId_ == std::numeric_limits<int32_t>::max())
    return Status::error("engine: sequence ids exhausted");
  StatusOr<int32_t> slot = caches_.addSequence();
  if (!slot)
    return Status::error("engine: all " + std::to_string(maxSequences) +
                         " sequence slots are in use");
  if (prepare)
    if (Status st = prepare(*slot); !st) {
      (void)caches_.removeSequence(*slot);
      return st;
    }
  const int32_t id = nextId_++;
  slotOf_[id] = *slot;
  return id;
}

StatusOr<int32_t> SequenceTable::fork(
    int32_t id,
    const std::function<Status(const cpu::Caches::Fork &, int32_t)> &copy) {
  auto it = slotOf_.find(id);
  if (it == slotOf_.end())
    return Status::error("engine: no sequence " + std::to_string(id));
  if (nextId_ == std::numeric_limits<int32_t>::max())
    return Status::error("engine: sequence ids exhausted");
  const int32_t from = it->second;
  StatusOr<cpu::Caches::Fork> f = caches_.fork(from);
  if (!f)
    return Status::error("engine: cannot fork sequence " + std::to_string(id) +
                         ": " + f.message());
  if (copy)
    if (Status st = copy(*f, from); !st) {
      (void)caches_.removeSequence(f->slot);
      return st;
    }
  const int32_t fresh = nextId_++;
  slotOf_[fresh] = f->slot;
  return fresh;
}

Status SequenceTable::remove(int32_t id) {
  auto it = slotOf_.find(id);
  if (it == slotOf_.end())
    return Status::error("engine: no sequence " + std::to_string(id));
  Status s = caches_.removeSequence(it->second);
  slotOf_.erase(it);
  return s;
}

int64_t SequenceTable::length(int32_t id) const {
  auto it = slotOf_.find(id);
  return it == slotOf_.end() ? -1 : caches_.length(it->second);
}

CacheUsage SequenceTable::usage(bool hasAttention) const {
  CacheUsage u;
  u.sequences = static_cast<int32_t>(slotOf_.size());
  u.maxSequences = caches_.state().numSlots();
  if (hasAttention) {
    u.kvPages = caches_.kv().numPages();
    u.kvFreePages = caches_.kv().numFreePages();
    u.kvPageSize = caches_.kv().pageSize();
  }
  return u;
}

int64_t SequenceTable::exclusivePages(std::span<const int32_t> ids) const {
  std::vector<int32_t> slots;
  for (int32_t id : ids)
    if (auto it = slotOf_.find(id); it != slotOf_.end())
      slots.push_back(it->second);
  return caches_.exclusivePages(slots);
}

std::optional<int32_t> SequenceTable::slot(int32_t id) const {
  auto it = slotOf_.find(id);
  if (it == slotOf_.end())
    return std::nullopt;
  return it->second;
}

// ---------------------------------------------------------------------------
// Steps

Status checkStep(std::span<const SequenceInput> inputs, LogitsFor which,
                 const ModelInfo &info, int32_t maxExpertsOverride,
                 bool hasAttention, const SequenceTable &sequences,
                 cpu::Caches &caches, StepRows &out) {
  const size_t n = inputs.size();
  const int64_t V = info.vocabSize;
  out.slots.assign(n, 0);
  out.tokenBase.assign(n + 1, 0);
  out.allOne = true;
  int64_t pagesNeeded = 0;
  for (size_t i = 0; i < n; ++i) {
    const SequenceInput &in = inputs[i];
    const std::string ctx = "step: input " + std::to_string(i) + " (sequence " +
                            std::to_string(in.sequence) + ")";
    std::optional<int32_t> slot = sequences.slot(in.sequence);
    if (!slot)
      return Status::error(ctx + ": no such sequence");
    out.slots[i] = *slot;
    for (size_t j = 0; j < i; ++j)
      if (inputs[j].sequence == in.sequence)
        return Status::error(ctx + ": the sequence appears twice");
    const int64_t count = static_cast<int64_t>(in.tokens.size());
    if (count == 0)
      return Status::error(ctx + ": no tokens");
    for (int32_t t : in.tokens)
      if (t < 0 || t >= V)
        return Status::error(ctx + ": token id " + std::to_string(t) +
                             " outside the vocabulary of " + std::to_string(V));
    if (in.expertsPerToken < 0 || in.expertsPerToken > maxExpertsOverride)
      return Status::error(
          ctx + ": " + std::to_string(in.expertsPerToken) +
          " experts per token; this model allows 0 (default) to " +
          std::to_string(maxExpertsOverride));
    if (!(in.expertBudget >= 0.0f) || std::isinf(in.expertBudget))
      return Status::error(ctx + ": expert budget must be finite and >= 0");
    const int64_t len = caches.length(out.slots[i]);
    if (hasAttention && len + count > info.maxContext)
      return Status::error(ctx + ": " + std::to_string(len + count) +
                           " tokens exceed the context of " +
                           std::to_string(info.maxContext));
    pagesNeeded += caches.pagesNeeded(out.slots[i], len + count);
    out.allOne &= count == 1;
    out.tokenBase[i + 1] = out.tokenBase[i] + count;
  }
  if (hasAttention && pagesNeeded > caches.kv().numFreePages())
    return Status::error("step: needs " + std::to_string(pagesNeeded) +
                         " more KV pages, " +
                         std::to_string(caches.kv().numFreePages()) + " of " +
                         std::to_string(caches.kv().numPages()) + " are free");
  for (size_t i = 0; i < n; ++i)
    if (Status s = caches.reserve(
            out.slots[i], caches.length(out.slots[i]) +
                              static_cast<int64_t>(inputs[i].tokens.size()));
        !s)
      return Status::error("step: " + s.message());
  out.rows = which == LogitsFor::AllTokens ? out.tokenBase[n]
             : which == LogitsFor::None    ? 0
                                           : static_cast<int64_t>(n);
  return Status::success();
}

std::vector<std::vector<Chunk>>
splitIntoRuns(std::span<const SequenceInput> inputs, int64_t R) {
  const size_t n = inputs.size();
  std::vector<std::vector<Chunk>> runs;
  std::vector<int64_t> done(n, 0);
  size_t next = 0;
  while (next < n) {
    std::vector<Chunk> &chunks = runs.emplace_back();
    int64_t used = 0;
    while (next < n && used < R) {
      const int64_t size = static_cast<int64_t>(inputs[next].tokens.size());
      const int64_t take = std::min(size - done[next], R - used);
      Chunk c;
      c.input = static_cast<int32_t>(next);
      c.first = done[next];
      c.count = take;
      c.row = used;
      c.last = done[next] + take == size;
      chunks.push_back(c);
      used += take;
      done[next] += take;
      if (!c.last)
        break; // the run is full
      ++next;
    }
  }
  return runs;
}

} // namespace nf::engine
