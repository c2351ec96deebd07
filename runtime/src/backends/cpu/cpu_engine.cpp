// The CPU backend: a plan interpreter.
//
// At load every op of both step programs is decoded once into an OpInfo
// (opcode, operand/result value indices, parsed attributes) and checked
// against the plan's values, weights and storage, so that a step never meets
// a malformed op. A step then runs the prefill or decode program once per
// chunk of at most max_tokens rows: each op reads and writes f32/i32 buffers
// at their planned offsets in one arena (arena_bytes + scratch_bytes, sized
// at load), and nf_kv ops read and advance the recurrent state / paged KV
// cache of the sequences in the chunk (cpu::Caches, built from the plan's
// Storage table).
//
// Numerics follow the reference executor (test/support/reference_model.cpp) op
// for op, with the same kernels, so results agree with it and are independent
// of batch composition and thread count.
//
// This file: the op table, load (storage, program decoding, init), and the
// step / run loop. The class is in cpu_engine_impl.h; op checks in
// cpu_engine_check.cpp; op execution in cpu_ops.cpp and cpu_ops_moe.cpp.
#include "backends/cpu/cpu_engine.h"
#include "backends/cpu/cpu_engine_impl.h"

#include "engine/plan_common.h"

#include "backends/cpu/kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace nf::engine {
namespace cpu_detail {

// ---------------------------------------------------------------------------
// Load

Status CpuEngine::initStorage(const EngineOptions &options) {
  StatusOr<StorageLayout> layout =
      // Rounded on write (engine/caches.h).
      readStorage(*plan_, options, decode_.maxTokens, "CPU");
  if (!layout)
    return layout.status();
  setSequenceMemory(*layout, /*typedKv=*/false, info_);
  storage_ = std::move(layout->entries);
  hasAttention_ = layout->hasAttention;
  StatusOr<cpu::Caches> caches =
      cpu::Caches::create(layout->mamba, layout->kv, layout->cache);
  if (!caches)
    return Status::error(plan_->path + ": " + caches.message());
  caches_ = std::move(*caches);
  info_.maxSequences = layout->cache.numSlots;
  info_.maxContext = layout->maxContext;
  return Status::success();
}

Status CpuEngine::compileProgram(const pl::Step *step, const char *phase,
                                 Program &prog) {
  const std::string where = plan_->path + ": " + phase + " step";
  if (Status s = readStepValues(*plan_, step, phase,
                                static_cast<int64_t>(weights_->weights.size()),
                                info_.vocabSize, prog);
      !s)
    return s;

  bool logitsWritten = false;
  for (fb::uoffset_t k = 0; k < step->kernels()->size(); ++k) {
    const pl::Kernel &kernel = *step->kernels()->Get(k);
    const std::string kname = kernel.name() ? kernel.name()->str() : "";
    if (!kernel.ops())
      continue;
    for (fb::uoffset_t j = 0; j < kernel.ops()->size(); ++j) {
      const pl::Op &op = *kernel.ops()->Get(j);
      const std::string opName = op.name() ? op.name()->str() : "<unnamed>";
      OpInfo o;
      if (Status s = compileOp(prog, op,
                               where + " kernel " + std::to_string(k) + " '" +
                                   kname + "' op " + opName,
                               o);
          !s)
        return s;
      for (int32_t r : o.out)
        logitsWritten |= r == prog.logits;
      prog.ops.push_back(std::move(o));
    }
  }
  if (!logitsWritten)
    return Status::error(where + ": no op computes the logits");
  return Status::success();
}

Status CpuEngine::compileOp(Program &prog, const pl::Op &op,
                            const std::string &where, OpInfo &o) {
  o.where = where;
  o.code = pl::opCode(op);
  if (o.code == OpCode::Unknown)
    return Status::error(where + ": unknown op (not supported by the CPU "
                                 "backend)");
  const int32_t nv = static_cast<int32_t>(prog.values.size());
  if (op.operands())
    o.in.assign(op.operands()->begin(), op.operands()->end());
  if (op.results())
    o.out.assign(op.results()->begin(), op.results()->end());
  for (int32_t v : o.in)
    if (v < 0 || v >= nv)
      return Status::error(where + ": operand value " + std::to_string(v) +
                           " out of range");
  for (int32_t v : o.out) {
    if (v < 0 || v >= nv)
      return Status::error(where + ": result value " + std::to_string(v) +
                           " out of range");
    const pl::ValueKind k = prog.values[v].kind;
    if (k != pl::ValueKind::Tensor && k != pl::ValueKind::Dispatch)
      return Status::error(where + ": result value " + std::to_string(v) +
                           " is a " + pl::EnumNameValueKind(k));
  }
  o.storage = op.storage();
  if (o.storage >= static_cast<int32_t>(storage_.size()))
    return Status::error(where + ": storage " + std::to_string(o.storage) +
                         " out of range");
  if (o.storage >= 0)
    o.ordinal = storage_[o.storage].ordinal;
  return checkOp(prog, o, op);
}

Status CpuEngine::init(const EngineOptions &options) {
  const pl::Plan &plan = *plan_->plan;
  numThreads_ = options.numThreads;
  budgetStepScope_ = options.budgetStepScope;
  distinctExpertCap_ = options.distinctExpertCap;
  if (Status s = readModelInfo(*plan_, *weights_, info_); !s)
    return s;
  info_.backend = "cpu";
  info_.device = "cpu";
  decode_.maxTokens = info_.maxDecodeTokens; // default slot count
  if (Status s = initStorage(options); !s)
    return s;
  if (Status s = compileProgram(plan.prefill(), "prefill", prefill_); !s)
    return s;
  if (Status s = compileProgram(plan.decode(), "decode", decode_); !s)
    return s;
  // The model's k: the smallest top_k of any select (they agree in practice).
  for (const Program *p : {&prefill_, &decode_})
    for (const OpInfo &o : p->ops)
      if (o.code == OpCode::Select)
        maxExpertsOverride_ =
            maxExpertsOverride_ == 0
                ? static_cast<int32_t>(o.topK)
                : std::min(maxExpertsOverride_, static_cast<int32_t>(o.topK));
  info_.topK = maxExpertsOverride_;
  // MoE layers are numbered by their select ops in program order (the same
  // in both programs).
  for (Program *p : {&prefill_, &decode_}) {
    int32_t moe = 0;
    for (OpInfo &o : p->ops)
      if (o.code == OpCode::Select) {
        o.ordinal = moe++;
        info_.numMoeLayers = std::max(info_.numMoeLayers, moe);
        info_.numExperts = std::max<int32_t>(
            info_.numExperts, static_cast<int32_t>(p->values[o.in[0]].cols));
      }
  }
  utilization_.assign(
      static_cast<size_t>(info_.numMoeLayers),
      std::vector<int64_t>(static_cast<size_t>(info_.numExperts), 0));

  arenaSize_ = std::max(prefill_.arenaBytes + prefill_.scratchBytes,
                        decode_.arenaBytes + decode_.scratchBytes);
  const size_t alloc =
      static_cast<size_t>((std::max<int64_t>(arenaSize_, 1) + 255) / 256 * 256);
  arena_.reset(static_cast<uint8_t *>(std::aligned_alloc(256, alloc)));
  if (!arena_)
    return Status::error(plan_->path + ": out of memory for the " +
                         std::to_string(arenaSize_) + "-byte arena");
  const size_t nv = std::max(prefill_.values.size(), decode_.values.size());
  f64Values_.resize(nv);
  f64Gen_.assign(nv, 0);
  return Status::success();
}

// ---------------------------------------------------------------------------
// Steps

Status CpuEngine::runStep(std::span<const SequenceInput> inputs,
                          LogitsFor which, std::vector<float> &logits,
                          StepStats *stats, TopLogits *top) {
  cpu::ThreadCountScope threads(numThreads_);
  if (which == LogitsFor::LastTokenTop) { // the rows are in host memory
    which = LogitsFor::LastTokenPerSequence;
    if (top)
      top->k = 0;
  }
  const size_t n = inputs.size();
  const int64_t V = info_.vocabSize;
  StepRows sr;
  if (Status s = checkStep(inputs, which, info_, maxExpertsOverride_,
                           hasAttention_, sequences_, caches_, sr);
      !s)
    return s;
  const std::vector<int32_t> &slots = sr.slots;
  const std::vector<int64_t> &tokenBase = sr.tokenBase;
  const bool allOne = sr.allOne;
  const int64_t rows = sr.rows;
  logits.resize(static_cast<size_t>(rows * V));
  std::vector<int64_t> *calls = nullptr;
  if (stats) {
    resetStats(*stats, n);
    calls = &stats->expertCalls;
    run_.callsPerLayer = &stats->expertCallsPerLayer;
  } else {
    run_.callsPerLayer = nullptr;
  }

  // Chunks of at most max_tokens rows; a sequence split across chunks
  // continues from its state in the next one.
  Program &prog = allOne ? decode_ : prefill_;
  for (const std::vector<Chunk> &chunks :
       splitIntoRuns(inputs, prog.maxTokens)) {
    caches_.compress(); // a tiered cache's pages that left the hot window
    runProgram(prog, inputs, chunks, which, tokenBase, logits.data(), calls);
    for (const Chunk &c : chunks)
      (void)caches_.advance(slots[c.input], c.count);
  }
  return Status::success();
}

void CpuEngine::runProgram(Program &prog, std::span<const SequenceInput> inputs,
                           std::span<const Chunk> chunks, LogitsFor which,
                           std::span<const int64_t> tokenBase, float *logitsOut,
                           std::vector<int64_t> *expertCalls) {
  Run &r = run_;
  r.tokens.clear();
  r.budget.clear();
  r.kOverride.clear();
  r.tokenInput.clear();
  r.spans.clear();
  r.pageTables.clear();
  r.needRows.clear();
  r.outRows.clear();
  for (const Chunk &c : chunks) {
    const SequenceInput &in = inputs[c.input];
    const int32_t slot = sequences_.slot(in.sequence).value();
    SeqSpan sp;
    sp.begin = static_cast<int32_t>(c.row);
    sp.count = static_cast<int32_t>(c.count);
    sp.startPos = caches_.length(slot);
    sp.slot = slot;
    r.spans.push_back(sp);
    r.pageTables.emplace_back(caches_.pageTable(slot));
    for (int64_t j = 0; j < c.count; ++j) {
      r.tokens.push_back(in.tokens[static_cast<size_t>(c.first + j)]);
      r.budget.push_back(in.expertBudget);
      r.kOverride.push_back(in.expertsPerToken);
      r.tokenInput.push_back(c.input);
    }
    if (which == LogitsFor::AllTokens) {
      for (int64_t j = 0; j < c.count; ++j) {
        r.needRows.push_back(c.row + j);
        r.outRows.push_back(tokenBase[c.input] + c.first + j);
      }
    } else if (c.last && which == LogitsFor::LastTokenPerSequence) {
      r.needRows.push_back(c.row + c.count - 1);
      r.outRows.push_back(c.input);
    }
  }
  r.T = static_cast<int64_t>(r.tokens.size());
  r.logitsOut = logitsOut;
  r.logitsDone = false;
  r.expertCalls = expertCalls;
  ++runGen_;

  for (const OpInfo &o : prog.ops)
    execOp(prog, o);

  if (!r.logitsDone && !r.needRows.empty()) {
    // The logits were computed by an op other than nf.lm_head: copy rows.
    const int64_t V = info_.vocabSize;
    const float *src = f32(prog, prog.logits);
    for (size_t i = 0; i < r.needRows.size(); ++i)
      std::memcpy(logitsOut + r.outRows[i] * V, src + r.needRows[i] * V,
                  static_cast<size_t>(V) * sizeof(float));
  }
}

} // namespace cpu_detail

StatusOr<std::unique_ptr<Engine>>
createCpuEngine(std::unique_ptr<PlanFile> plan,
                std::unique_ptr<BoundWeights> weights,
                const EngineOptions &options) {
  return createEngine<cpu_detail::CpuEngine>(options, std::move(plan),
                                             std::move(weights));
}

} // namespace nf::engine
