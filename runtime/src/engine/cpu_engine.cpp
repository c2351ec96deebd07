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
// Numerics follow the reference executor (cpu/reference_model.cpp) op for
// op, with the same kernels, so results agree with it and are independent of
// batch composition and thread count.
#include "engine/cpu_engine.h"

#include "engine/plan_common.h"

#include "cpu/expert_budget.h"
#include "cpu/kernels.h"
#include "cpu/reference_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <string_view>
#include <unordered_map>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace nf::engine {
namespace {

namespace fb = flatbuffers;
namespace pl = nf::plan;
using cpu::KvLayerShape;
using cpu::MambaShape;
using cpu::PagedKvLayer;
using cpu::SeqSpan;

// ---------------------------------------------------------------------------
// Decoded programs

enum class Code {
  Embed,
  RmsNorm,
  Add,
  Linear,
  Split,
  Activation,
  GatedRmsNorm,
  LmHead,
  CausalConv,
  SsmScan,
  SsmUpdate,
  KvAppend,
  KvAttend,
  Router,
  Select,
  Dispatch,
  ExpertUp,
  ExpertDown,
  Combine,
  SharedExpert,
  LatentProj,
};

constexpr std::pair<std::string_view, Code> kOpNames[] = {
    {"nf.embed", Code::Embed},
    {"nf.rms_norm", Code::RmsNorm},
    {"nf.add", Code::Add},
    {"nf.linear", Code::Linear},
    {"nf.split", Code::Split},
    {"nf.activation", Code::Activation},
    {"nf.gated_rms_norm", Code::GatedRmsNorm},
    {"nf.lm_head", Code::LmHead},
    {"nf_kv.causal_conv", Code::CausalConv},
    {"nf_kv.ssm_scan", Code::SsmScan},
    {"nf_kv.ssm_update", Code::SsmUpdate},
    {"nf_kv.append", Code::KvAppend},
    {"nf_kv.attend", Code::KvAttend},
    {"nf_moe.router", Code::Router},
    {"nf_moe.select", Code::Select},
    {"nf_moe.dispatch", Code::Dispatch},
    {"nf_moe.expert_up", Code::ExpertUp},
    {"nf_moe.expert_down", Code::ExpertDown},
    {"nf_moe.combine", Code::Combine},
    {"nf_moe.shared_expert", Code::SharedExpert},
    {"nf_moe.latent_proj", Code::LatentProj},
};

enum class Act { Relu2, Silu };

struct OpInfo {
  Code code = Code::Add;
  std::string where; // "<plan>: prefill kernel 3 'name' op nf.linear"
  std::vector<int32_t> in, out;
  int32_t storage = -1; // Plan.storage index
  int32_t ordinal = -1; // index among the storages of its kind
  // Attributes (those the op uses).
  double eps = 0.0;
  int64_t groups = 1;
  std::vector<int64_t> sizes;
  Act act = Act::Relu2;
  float dtMin = 0.0f, dtMax = std::numeric_limits<float>::infinity();
  int64_t numHeads = 0;
  float scale = 1.0f;
  int64_t topK = 0, minK = 0, nGroup = 1, topkGroup = 1;
  bool normTopkProb = true;
  float routedScalingFactor = 1.0f;
  bool budgetPolicy = false;
  bool hasBias = false;
};

/// A step program: its values (plan_common.h) and its decoded ops.
struct Program : StepValues {
  std::vector<OpInfo> ops;
};

// ---------------------------------------------------------------------------
// Numerical helpers (the same arithmetic as cpu/kernels.cpp)

inline double dotF64(const float *a, const float *b, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j)
      acc[j] += static_cast<double>(a[i + j]) * static_cast<double>(b[i + j]);
  double tail = 0.0;
  for (; i < n; ++i)
    tail += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return ((acc[0] + acc[2]) + (acc[1] + acc[3])) + tail;
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

inline bool worthParallel(int64_t work) {
  return work > cpu::parallelThreshold();
}

int maxThreads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int threadId() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

void activate(Act act, float *x, int64_t n) {
  if (act == Act::Relu2) {
    cpu::relu2InPlace(x, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    x[i] = silu(x[i]);
}

struct FreeDeleter {
  void operator()(uint8_t *p) const { std::free(p); }
};

// ---------------------------------------------------------------------------
// The engine

class CpuEngine final : public Engine {
public:
  CpuEngine(std::unique_ptr<PlanFile> plan,
            std::unique_ptr<BoundWeights> weights)
      : plan_(std::move(plan)), weights_(std::move(weights)) {}

  Status init(const EngineOptions &options);

  const ModelInfo &info() const override { return info_; }
  StatusOr<int32_t> addSequence() override;
  Status removeSequence(int32_t sequence) override;
  int64_t sequenceLength(int32_t sequence) const override;
  CacheUsage cacheUsage() const override {
    return sequences_.usage(hasAttention_);
  }
  const std::vector<std::vector<int64_t>> &expertUtilization() const override {
    return utilization_;
  }
  void resetExpertUtilization() override {
    for (auto &layer : utilization_)
      std::fill(layer.begin(), layer.end(), 0);
  }
  Status step(std::span<const SequenceInput> inputs, LogitsFor which,
              std::vector<float> &logits, StepStats *stats,
              TopLogits *top) override;

private:
  // Load
  Status initStorage(const EngineOptions &options);
  Status compileProgram(const pl::Step *step, const char *phase, Program &prog);
  Status compileOp(Program &prog, const pl::Op &op, const std::string &where,
                   OpInfo &o);
  Status checkOp(const Program &prog, OpInfo &o, const pl::Op &op);

  // Step
  void runProgram(Program &prog, std::span<const SequenceInput> inputs,
                  std::span<const Chunk> chunks, LogitsFor which,
                  std::span<const int64_t> tokenBase, float *logitsOut,
                  std::vector<int64_t> *expertCalls);
  void execOp(Program &prog, const OpInfo &o);

  // Value access during a run.
  float *f32(const Program &p, int32_t v) {
    return reinterpret_cast<float *>(arena_.get() + p.values[v].offset);
  }
  int32_t *i32(const Program &p, int32_t v) {
    return reinterpret_cast<int32_t *>(arena_.get() + p.values[v].offset);
  }
  const BoundWeight &weight(const Program &p, int32_t v) const {
    return weights_->weights[p.values[v].weight];
  }
  float *scratchF(size_t i, size_t n) {
    if (scratch_[i].size() < n)
      scratch_[i].resize(n);
    return scratch_[i].data();
  }

  // Ops with more than a kernel call.
  void opRouter(const Program &p, const OpInfo &o);
  void opSelect(const Program &p, const OpInfo &o);
  void opDispatch(const Program &p, const OpInfo &o);
  void opExperts(const Program &p, const OpInfo &o, bool up);
  void opCombine(const Program &p, const OpInfo &o);
  void opLmHead(const Program &p, const OpInfo &o);

  std::unique_ptr<PlanFile> plan_;
  std::unique_ptr<BoundWeights> weights_;
  ModelInfo info_;
  int numThreads_ = 0;
  Program prefill_, decode_;
  std::vector<StorageInfo> storage_;
  cpu::Caches caches_;
  bool hasAttention_ = false;
  int32_t maxExpertsOverride_ = 0; // largest expertsPerToken accepted
  bool budgetStepScope_ = false;   // EngineOptions::budgetStepScope
  double distinctExpertCap_ = 0.0; // EngineOptions::distinctExpertCap
  std::vector<std::vector<int64_t>> utilization_; // [moe layer][expert]
  SequenceTable sequences_{caches_}; // sequence id -> slot of caches_
  std::unique_ptr<uint8_t, FreeDeleter> arena_;
  int64_t arenaSize_ = 0;

  // State of the run in progress.
  struct Run {
    int64_t T = 0;
    std::vector<int32_t> tokens;
    std::vector<float> budget;
    std::vector<std::vector<int64_t>> *callsPerLayer = nullptr;
    std::vector<int32_t> rankedExperts; // select: [T, K] candidates by rank
    std::vector<double> rankedScores;
    std::vector<int32_t> kOverride; // per token, 0: the op's top_k
    std::vector<int32_t> tokenInput;
    std::vector<SeqSpan> spans;
    std::vector<std::span<const int32_t>> pageTables;
    std::vector<int64_t> needRows, outRows; // logits rows to produce
    float *logitsOut = nullptr;
    bool logitsDone = false;
    std::vector<int64_t> *expertCalls = nullptr;
  } run_;
  // f64 router scores of the run, by value index (generation-tagged).
  std::vector<std::vector<double>> f64Values_;
  std::vector<uint64_t> f64Gen_;
  uint64_t runGen_ = 0;
  std::vector<float> scratch_[4];
  std::vector<float> gateF32_;
};

// ---------------------------------------------------------------------------
// Load

Status CpuEngine::initStorage(const EngineOptions &options) {
  StatusOr<StorageLayout> layout =
      readStorage(*plan_, options, decode_.maxTokens, "CPU");
  if (!layout)
    return layout.status();
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
  const std::string_view name =
      op.name() ? op.name()->string_view() : std::string_view();
  auto it = std::find_if(std::begin(kOpNames), std::end(kOpNames),
                         [&](const auto &p) { return p.first == name; });
  if (it == std::end(kOpNames))
    return Status::error(where + ": unknown op (not supported by the CPU "
                                 "backend)");
  o.code = it->second;
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

/// Operand kinds, shapes and attributes of one op.
Status CpuEngine::checkOp(const Program &prog, OpInfo &o, const pl::Op &op) {
  auto fail = [&](const std::string &m) {
    return Status::error(o.where + ": " + m);
  };
  auto arity = [&](size_t minIn, size_t maxIn, size_t nOut) {
    return o.in.size() >= minIn && o.in.size() <= maxIn && o.out.size() == nOut;
  };
  auto V = [&](int32_t v) -> const ValueInfo & { return prog.values[v]; };
  auto isRows = [&](int32_t v, pl::Rows rows, pl::DType dt) {
    return V(v).kind == pl::ValueKind::Tensor && V(v).rows == rows &&
           V(v).dtype == dt;
  };
  auto isAct = [&](int32_t v) {
    return isRows(v, pl::Rows::Tokens, pl::DType::F32);
  };
  auto W = [&](int32_t v) -> const BoundWeight * {
    return V(v).kind == pl::ValueKind::Weight ? &weights_->weights[V(v).weight]
                                              : nullptr;
  };
  auto numel = [](const BoundWeight *w) {
    int64_t n = 1;
    for (int64_t d : w->shape)
      n *= d;
    return n;
  };
  auto matrix = [&](int32_t v) -> const BoundWeight * {
    const BoundWeight *w = W(v);
    return w && w->view.valid() && w->shape.size() == 2 ? w : nullptr;
  };
  auto vector = [&](int32_t v, int64_t n) {
    const BoundWeight *w = W(v);
    return w && w->view.valid() && numel(w) == n;
  };
  auto stacked = [&](int32_t v) -> const BoundWeight * {
    const BoundWeight *w = W(v);
    return w && w->shape.size() == 3 &&
                   static_cast<int64_t>(w->experts.size()) == w->shape[0]
               ? w
               : nullptr;
  };
  auto needF = [&](const char *n, double &out) -> Status {
    std::optional<double> v = floatAttr(op, n);
    if (!v)
      return fail(std::string("missing attribute '") + n + "'");
    out = *v;
    return Status::success();
  };
  auto needI = [&](const char *n, int64_t &out) -> Status {
    std::optional<int64_t> v = intAttr(op, n);
    if (!v)
      return fail(std::string("missing attribute '") + n + "'");
    out = *v;
    return Status::success();
  };
  auto activation = [&](const char *attr, bool required) -> Status {
    std::optional<std::string> k = stringAttr(op, attr);
    if (!k && !required) {
      o.act = Act::Relu2; // the dialect's default
      return Status::success();
    }
    if (!k)
      return fail(std::string("missing attribute '") + attr + "'");
    if (*k == "relu2")
      o.act = Act::Relu2;
    else if (*k == "silu")
      o.act = Act::Silu;
    else
      return fail("unsupported activation '" + *k + "'");
    return Status::success();
  };
  auto mambaStorage = [&]() -> const StorageInfo * {
    return o.storage >= 0 &&
                   storage_[o.storage].kind == pl::StorageKind::MambaState
               ? &storage_[o.storage]
               : nullptr;
  };
  auto kvStorage = [&]() -> const StorageInfo * {
    return o.storage >= 0 &&
                   storage_[o.storage].kind == pl::StorageKind::KVCache
               ? &storage_[o.storage]
               : nullptr;
  };
  auto isBatch = [&](int32_t v) { return V(v).kind == pl::ValueKind::Batch; };
  auto dims = [&](int32_t v) { return shapeString(V(v).shape); };

  switch (o.code) {
  case Code::Embed: {
    if (!arity(2, 2, 1))
      return fail("expects (tokens, table) -> 1 result");
    const ValueInfo &t = V(o.in[0]);
    const bool tokens =
        t.kind == pl::ValueKind::Tokens ||
        (isRows(o.in[0], pl::Rows::Tokens, pl::DType::I32) && t.cols == 1);
    const BoundWeight *w = matrix(o.in[1]);
    if (!tokens || !w)
      return fail("expects token ids and a [vocab, hidden] table");
    if (w->shape[0] < info_.vocabSize)
      return fail("table has " + std::to_string(w->shape[0]) +
                  " rows for a vocabulary of " +
                  std::to_string(info_.vocabSize));
    if (!isAct(o.out[0]) || V(o.out[0]).cols != w->shape[1])
      return fail("result " + dims(o.out[0]) + " does not match the table " +
                  shapeString(w->shape));
    return Status::success();
  }
  case Code::RmsNorm: {
    if (!arity(2, 2, 1) || !isAct(o.in[0]) || !isAct(o.out[0]))
      return fail("expects (input, weight) -> result, f32 rows");
    const int64_t H = V(o.in[0]).cols;
    if (!vector(o.in[1], H) || V(o.out[0]).cols != H)
      return fail("weight or result does not have " + std::to_string(H) +
                  " features");
    return needF("epsilon", o.eps);
  }
  case Code::Add:
    if (!arity(2, 2, 1) || !isAct(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.out[0]))
      return fail("expects two f32 row tensors");
    if (V(o.in[0]).cols != V(o.in[1]).cols ||
        V(o.out[0]).cols != V(o.in[0]).cols)
      return fail("operands " + dims(o.in[0]) + " and " + dims(o.in[1]) +
                  " differ");
    return Status::success();
  case Code::Linear:
  case Code::LmHead:
  case Code::LatentProj: {
    if (!arity(2, 2, 1) || !isAct(o.in[0]) || !isAct(o.out[0]))
      return fail("expects (input, weight) -> result, f32 rows");
    const BoundWeight *w = matrix(o.in[1]);
    if (!w || w->shape[1] != V(o.in[0]).cols || w->shape[0] != V(o.out[0]).cols)
      return fail("input " + dims(o.in[0]) + ", weight " +
                  (W(o.in[1]) ? shapeString(W(o.in[1])->shape)
                              : std::string("(not a weight)")) +
                  " and result " + dims(o.out[0]) + " do not match");
    if (o.code == Code::LatentProj && !stringAttr(op, "direction"))
      return fail("missing attribute 'direction'");
    return Status::success();
  }
  case Code::Split: {
    std::optional<std::vector<int64_t>> sizes = listAttr(op, "sizes");
    if (!sizes)
      return fail("missing attribute 'sizes'");
    o.sizes = *sizes;
    if (o.in.size() != 1 || o.out.size() != o.sizes.size() || !isAct(o.in[0]))
      return fail("expects one input and one result per size");
    int64_t sum = 0;
    for (size_t i = 0; i < o.sizes.size(); ++i) {
      if (!isAct(o.out[i]) || V(o.out[i]).cols != o.sizes[i])
        return fail("result " + std::to_string(i) + " " + dims(o.out[i]) +
                    " does not have " + std::to_string(o.sizes[i]) +
                    " columns");
      sum += o.sizes[i];
    }
    if (sum != V(o.in[0]).cols)
      return fail("sizes sum to " + std::to_string(sum) + ", input is " +
                  dims(o.in[0]));
    return Status::success();
  }
  case Code::Activation:
    if (!arity(1, 1, 1) || !isAct(o.in[0]) || !isAct(o.out[0]) ||
        V(o.in[0]).cols != V(o.out[0]).cols)
      return fail("expects one f32 row tensor and a result of its shape");
    return activation("kind", true);
  case Code::GatedRmsNorm: {
    if (!arity(3, 3, 1) || !isAct(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.out[0]))
      return fail("expects (y, z, weight) -> result, f32 rows");
    const int64_t I = V(o.in[0]).cols;
    if (V(o.in[1]).cols != I || V(o.out[0]).cols != I || !vector(o.in[2], I))
      return fail("y, z, weight and result must all have " + std::to_string(I) +
                  " features");
    if (Status s = needI("groups", o.groups); !s)
      return s;
    if (o.groups <= 0 || I % o.groups != 0)
      return fail(std::to_string(I) + " features in " +
                  std::to_string(o.groups) + " groups");
    return needF("epsilon", o.eps);
  }
  case Code::CausalConv: {
    const StorageInfo *st = mambaStorage();
    if (!st)
      return fail("needs a MambaState storage");
    if (!arity(3, 4, 1) || !isBatch(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.out[0]))
      return fail("expects (batch, input, weight[, bias]) -> result");
    const MambaShape &s = st->mamba;
    const int64_t CD = s.convDim();
    const BoundWeight *w = W(o.in[2]);
    const bool wOk = w && w->view.valid() &&
                     (w->shape == std::vector<int64_t>{CD, 1, s.convKernel} ||
                      w->shape == std::vector<int64_t>{CD, s.convKernel});
    if (V(o.in[1]).cols != CD || V(o.out[0]).cols != CD || !wOk)
      return fail("input " + dims(o.in[1]) + " / weight " +
                  (w ? shapeString(w->shape) : std::string("?")) +
                  " do not match the state (conv_dim " + std::to_string(CD) +
                  ", window " + std::to_string(s.convKernel - 1) + ")");
    o.hasBias = o.in.size() == 4;
    if (o.hasBias && !vector(o.in[3], CD))
      return fail("bias must have " + std::to_string(CD) + " elements");
    std::optional<std::string> mode = stringAttr(op, "mode");
    if (mode && *mode != "prefill" && *mode != "decode")
      return fail("unknown mode '" + *mode + "'");
    return Status::success();
  }
  case Code::SsmScan:
  case Code::SsmUpdate: {
    const StorageInfo *st = mambaStorage();
    if (!st)
      return fail("needs a MambaState storage");
    if (!arity(6, 6, 1) || !isBatch(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.in[2]) || !isAct(o.out[0]))
      return fail("expects (batch, xbc, dt, dt_bias, A_log, D) -> y");
    const MambaShape &s = st->mamba;
    const int64_t nh = s.numHeads;
    if (V(o.in[1]).cols != s.convDim() || V(o.in[2]).cols != nh ||
        V(o.out[0]).cols != s.inner() || !vector(o.in[3], nh) ||
        !vector(o.in[4], nh) || !vector(o.in[5], nh))
      return fail("operands do not match the state (heads " +
                  std::to_string(nh) + ", head_dim " +
                  std::to_string(s.headDim) + ", state " +
                  std::to_string(s.stateSize) + ")");
    int64_t g = 0;
    if (Status e = needI("n_groups", g); !e)
      return e;
    if (g != s.nGroups)
      return fail("n_groups " + std::to_string(g) + " but the state implies " +
                  std::to_string(s.nGroups));
    double lo = 0, hi = 0;
    if (Status e = needF("time_step_min", lo); !e)
      return e;
    if (Status e = needF("time_step_max", hi); !e)
      return e;
    if (!(lo <= hi))
      return fail("time_step_min > time_step_max");
    o.dtMin = static_cast<float>(lo);
    o.dtMax = static_cast<float>(hi);
    return Status::success();
  }
  case Code::KvAppend: {
    const StorageInfo *st = kvStorage();
    if (!st)
      return fail("needs a KVCache storage");
    if (!arity(3, 3, 0) || !isBatch(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.in[2]))
      return fail("expects (batch, key, value)");
    const int64_t row = st->kv.numKvHeads * st->kv.headDim;
    if (V(o.in[1]).cols != row || V(o.in[2]).cols != row)
      return fail("key " + dims(o.in[1]) + " / value " + dims(o.in[2]) +
                  " do not have the cache's " + std::to_string(row) +
                  " features");
    return Status::success();
  }
  case Code::KvAttend: {
    const StorageInfo *st = kvStorage();
    if (!st)
      return fail("needs a KVCache storage");
    if (!arity(2, 2, 1) || !isBatch(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.out[0]))
      return fail("expects (batch, query) -> result");
    if (Status e = needI("num_heads", o.numHeads); !e)
      return e;
    double scale = 0;
    if (Status e = needF("scale", scale); !e)
      return e;
    o.scale = static_cast<float>(scale);
    const int64_t hd = st->kv.headDim, nkv = st->kv.numKvHeads;
    if (o.numHeads <= 0 || o.numHeads % nkv != 0)
      return fail(std::to_string(o.numHeads) + " query heads for " +
                  std::to_string(nkv) + " kv heads");
    if (V(o.in[1]).cols != o.numHeads * hd ||
        V(o.out[0]).cols != o.numHeads * hd)
      return fail("query " + dims(o.in[1]) + " is not heads x head_dim " +
                  std::to_string(hd));
    return Status::success();
  }
  case Code::Router: {
    if (!arity(3, 3, 2) || !isAct(o.in[0]) || !isAct(o.out[0]) ||
        !isAct(o.out[1]))
      return fail("expects (input, weight, correction_bias) -> (scores, "
                  "selection_scores)");
    const BoundWeight *w = matrix(o.in[1]);
    if (!w || w->shape[1] != V(o.in[0]).cols)
      return fail("gate weight does not match the input " + dims(o.in[0]));
    const int64_t E = w->shape[0];
    if (!vector(o.in[2], E) || V(o.out[0]).cols != E || V(o.out[1]).cols != E)
      return fail("bias and scores must have " + std::to_string(E) +
                  " experts");
    return Status::success();
  }
  case Code::Select: {
    if (!arity(3, 3, 3) || !isAct(o.in[0]) || !isAct(o.in[1]))
      return fail("expects (scores, selection_scores, budget) -> (experts, "
                  "weights, counts)");
    const ValueInfo &b = V(o.in[2]);
    if (b.kind != pl::ValueKind::Budget && !(isAct(o.in[2]) && b.cols == 1))
      return fail("budget must be the step's per-token budget");
    const int64_t E = V(o.in[0]).cols;
    if (V(o.in[1]).cols != E)
      return fail("scores and selection scores differ");
    int64_t norm = 1;
    double rsf = 1.0;
    if (Status s = needI("top_k", o.topK); !s)
      return s;
    if (Status s = needI("n_group", o.nGroup); !s)
      return s;
    if (Status s = needI("topk_group", o.topkGroup); !s)
      return s;
    if (Status s = needI("norm_topk_prob", norm); !s)
      return s;
    if (Status s = needF("routed_scaling_factor", rsf); !s)
      return s;
    o.minK = intAttr(op, "min_k").value_or(o.topK);
    o.normTopkProb = norm != 0;
    o.routedScalingFactor = static_cast<float>(rsf);
    std::optional<std::string> policy = stringAttr(op, "policy");
    if (policy && *policy != "topk" && *policy != "budget")
      return fail("unknown policy '" + *policy + "'");
    o.budgetPolicy = policy && *policy == "budget";
    if (o.nGroup <= 0 || E % o.nGroup != 0 || o.topkGroup <= 0 ||
        o.topkGroup > o.nGroup)
      return fail("bad expert groups (experts " + std::to_string(E) +
                  ", n_group " + std::to_string(o.nGroup) + ", topk_group " +
                  std::to_string(o.topkGroup) + ")");
    cpu::RouterConfig rc;
    rc.numExperts = E;
    rc.nGroup = o.nGroup;
    rc.topkGroup = o.topkGroup;
    if (o.topK <= 0 || o.topK > cpu::maxExpertsPerToken(rc))
      return fail("top_k " + std::to_string(o.topK) + " exceeds the " +
                  std::to_string(cpu::maxExpertsPerToken(rc)) +
                  " selectable experts");
    if (!isRows(o.out[0], pl::Rows::Tokens, pl::DType::I32) ||
        V(o.out[0]).cols != o.topK ||
        !isRows(o.out[1], pl::Rows::Tokens, pl::DType::F32) ||
        V(o.out[1]).cols != o.topK ||
        !isRows(o.out[2], pl::Rows::Tokens, pl::DType::I32) ||
        V(o.out[2]).cols != 1)
      return fail("results must be i32 [T, top_k], f32 [T, top_k], i32 [T]");
    return Status::success();
  }
  case Code::Dispatch: {
    if (!arity(2, 2, 1) || !isRows(o.in[0], pl::Rows::Tokens, pl::DType::I32) ||
        !isRows(o.in[1], pl::Rows::Tokens, pl::DType::I32) ||
        V(o.in[1]).cols != 1 || V(o.out[0]).kind != pl::ValueKind::Dispatch)
      return fail("expects (experts i32 [T, k], counts i32 [T]) -> dispatch");
    if (V(o.in[0]).cols > V(o.out[0]).maxPerToken)
      return fail(std::to_string(V(o.in[0]).cols) +
                  " experts per token exceed the dispatch's " +
                  std::to_string(V(o.out[0]).maxPerToken));
    return Status::success();
  }
  case Code::ExpertUp:
  case Code::ExpertDown: {
    const bool up = o.code == Code::ExpertUp;
    if (!arity(3, 3, 1) || V(o.in[1]).kind != pl::ValueKind::Dispatch ||
        !isRows(o.out[0], pl::Rows::Assignments, pl::DType::F32))
      return fail("expects (input, dispatch, weight) -> assignment rows");
    const ValueInfo &d = V(o.in[1]);
    const pl::Rows inRows = up ? pl::Rows::Tokens : pl::Rows::Assignments;
    if (!isRows(o.in[0], inRows, pl::DType::F32))
      return fail(std::string("input must be f32 ") +
                  (up ? "token" : "assignment") + " rows");
    const BoundWeight *w = stacked(o.in[2]);
    if (!w || w->shape[0] != d.numExperts || w->shape[2] != V(o.in[0]).cols ||
        w->shape[1] != V(o.out[0]).cols)
      return fail("weight " +
                  (W(o.in[2]) ? shapeString(W(o.in[2])->shape)
                              : std::string("(not a weight)")) +
                  " is not [" + std::to_string(d.numExperts) + ", " +
                  std::to_string(V(o.out[0]).cols) + ", " +
                  std::to_string(V(o.in[0]).cols) + "] stacked experts");
    const int64_t need = prog.maxTokens * d.maxPerToken * V(o.out[0]).cols * 4;
    if (V(o.out[0]).bytes < need)
      return fail("result has " + std::to_string(V(o.out[0]).bytes) +
                  " bytes, needs " + std::to_string(need));
    if (!up &&
        V(o.in[0]).bytes < prog.maxTokens * d.maxPerToken * V(o.in[0]).cols * 4)
      return fail("input has too few bytes for the dispatch");
    if (up)
      return activation("activation", false);
    return Status::success();
  }
  case Code::Combine: {
    if (!arity(3, 3, 1) || V(o.in[1]).kind != pl::ValueKind::Dispatch ||
        !isRows(o.in[0], pl::Rows::Assignments, pl::DType::F32) ||
        !isRows(o.in[2], pl::Rows::Tokens, pl::DType::F32) || !isAct(o.out[0]))
      return fail("expects (assignment rows, dispatch, weights) -> rows");
    if (V(o.in[0]).cols != V(o.out[0]).cols ||
        V(o.in[2]).cols > V(o.in[1]).maxPerToken)
      return fail("shapes do not match");
    return Status::success();
  }
  case Code::SharedExpert: {
    if (!arity(3, 3, 1) || !isAct(o.in[0]) || !isAct(o.out[0]))
      return fail("expects (input, up, down) -> result");
    const BoundWeight *up = matrix(o.in[1]), *down = matrix(o.in[2]);
    const int64_t H = V(o.in[0]).cols;
    if (!up || !down || up->shape[1] != H || down->shape[1] != up->shape[0] ||
        down->shape[0] != V(o.out[0]).cols)
      return fail("weights do not match the input " + dims(o.in[0]));
    return activation("activation", false);
  }
  }
  return fail("unhandled op");
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
      if (o.code == Code::Select)
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
      if (o.code == Code::Select) {
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
// Sequences

StatusOr<int32_t> CpuEngine::addSequence() {
  return sequences_.add(info_.maxSequences);
}

Status CpuEngine::removeSequence(int32_t sequence) {
  return sequences_.remove(sequence);
}

int64_t CpuEngine::sequenceLength(int32_t sequence) const {
  return sequences_.length(sequence);
}

// ---------------------------------------------------------------------------
// Steps

Status CpuEngine::step(std::span<const SequenceInput> inputs, LogitsFor which,
                       std::vector<float> &logits, StepStats *stats,
                       TopLogits *top) {
  cpu::ThreadCountScope threads(numThreads_);
  if (which == LogitsFor::LastTokenTop) { // the rows are in host memory
    which = LogitsFor::LastTokenPerSequence;
    if (top)
      top->k = 0;
  }
  try {
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
      stats->expertCalls.assign(n, 0);
      stats->expertCallsPerLayer.assign(
          n, std::vector<int64_t>(static_cast<size_t>(info_.numMoeLayers), 0));
      stats->budgetSpent.assign(n, 0.0);
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
      runProgram(prog, inputs, chunks, which, tokenBase, logits.data(), calls);
      for (const Chunk &c : chunks)
        (void)caches_.advance(slots[c.input], c.count);
    }
    if (stats && info_.numMoeLayers > 0 && info_.topK > 0)
      for (size_t i = 0; i < n; ++i)
        stats->budgetSpent[i] =
            static_cast<double>(stats->expertCalls[i]) /
            (static_cast<double>(info_.topK) * info_.numMoeLayers *
             static_cast<double>(inputs[i].tokens.size()));
    return Status::success();
  } catch (const std::bad_alloc &) {
    return Status::error("step: out of memory");
  } catch (const std::exception &e) {
    return Status::error(std::string("step: ") + e.what());
  }
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

void CpuEngine::execOp(Program &p, const OpInfo &o) {
  const int64_t T = run_.T;
  auto cols = [&](int32_t v) { return p.values[v].cols; };
  switch (o.code) {
  case Code::Embed: {
    const ValueInfo &tv = p.values[o.in[0]];
    std::span<const int32_t> toks =
        tv.kind == pl::ValueKind::Tokens
            ? std::span<const int32_t>(run_.tokens)
            : std::span<const int32_t>(i32(p, o.in[0]), static_cast<size_t>(T));
    cpu::embedding(weight(p, o.in[1]).view, toks, f32(p, o.out[0]));
    return;
  }
  case Code::RmsNorm:
    cpu::rmsNorm(f32(p, o.in[0]), T, cols(o.in[0]), weight(p, o.in[1]).view,
                 o.eps, f32(p, o.out[0]));
    return;
  case Code::Add: {
    const int64_t n = T * cols(o.out[0]);
    float *out = f32(p, o.out[0]);
    const float *a = f32(p, o.in[0]), *b = f32(p, o.in[1]);
    if (out == b)
      std::swap(a, b); // a + b == b + a exactly
    if (out != a)
      std::memcpy(out, a, static_cast<size_t>(n) * sizeof(float));
    cpu::addInPlace(out, b, n);
    return;
  }
  case Code::Linear:
  case Code::LatentProj:
    cpu::linear(f32(p, o.in[0]), T, cols(o.in[0]), weight(p, o.in[1]).view,
                f32(p, o.out[0]), cols(o.out[0]));
    return;
  case Code::LmHead:
    opLmHead(p, o);
    return;
  case Code::Split: {
    const float *x = f32(p, o.in[0]);
    const int64_t ld = cols(o.in[0]);
    int64_t c0 = 0;
    for (size_t i = 0; i < o.out.size(); ++i) {
      float *y = f32(p, o.out[i]);
      const int64_t w = o.sizes[i];
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(y + t * w, x + t * ld + c0,
                    static_cast<size_t>(w) * sizeof(float));
      c0 += w;
    }
    return;
  }
  case Code::Activation: {
    const int64_t n = T * cols(o.out[0]);
    float *out = f32(p, o.out[0]);
    const float *in = f32(p, o.in[0]);
    if (out != in)
      std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    activate(o.act, out, n);
    return;
  }
  case Code::GatedRmsNorm: {
    const int64_t I = cols(o.in[0]);
    cpu::gatedRmsNorm(f32(p, o.in[0]), I, f32(p, o.in[1]), I, T, I, o.groups,
                      weight(p, o.in[2]).view, o.eps, f32(p, o.out[0]));
    return;
  }
  case Code::CausalConv: {
    const MambaShape &s = storage_[o.storage].mamba;
    std::vector<float *> conv;
    for (const SeqSpan &sp : run_.spans)
      conv.push_back(caches_.state().conv(o.ordinal, sp.slot));
    const int64_t CD = s.convDim();
    cpu::causalConvSilu(f32(p, o.in[1]), CD, run_.spans, conv, s,
                        weight(p, o.in[2]).view,
                        o.hasBias ? weight(p, o.in[3]).view : WeightView{},
                        f32(p, o.out[0]), CD);
    return;
  }
  case Code::SsmScan:
  case Code::SsmUpdate: {
    const MambaShape &s = storage_[o.storage].mamba;
    const int64_t nh = s.numHeads;
    float *dt = scratchF(0, static_cast<size_t>(T * nh));
    cpu::mambaDt(f32(p, o.in[2]), nh, T, nh, weight(p, o.in[3]).view, o.dtMin,
                 o.dtMax, dt);
    std::vector<float *> ssm;
    for (const SeqSpan &sp : run_.spans)
      ssm.push_back(caches_.state().ssm(o.ordinal, sp.slot));
    cpu::ssmScan(f32(p, o.in[1]), s.convDim(), dt, run_.spans, ssm, s,
                 weight(p, o.in[4]).view, weight(p, o.in[5]).view,
                 f32(p, o.out[0]), s.inner());
    return;
  }
  case Code::KvAppend: {
    const int64_t row = cols(o.in[1]);
    cpu::kvAppend(f32(p, o.in[1]), row, f32(p, o.in[2]), row, run_.spans,
                  run_.pageTables, caches_.kv().layer(o.ordinal));
    return;
  }
  case Code::KvAttend: {
    const int64_t qd = cols(o.in[1]);
    cpu::pagedAttention(f32(p, o.in[1]), qd, o.numHeads, run_.spans,
                        run_.pageTables, caches_.kv().layer(o.ordinal),
                        f32(p, o.out[0]), qd, o.scale);
    return;
  }
  case Code::Router:
    opRouter(p, o);
    return;
  case Code::Select:
    opSelect(p, o);
    return;
  case Code::Dispatch:
    opDispatch(p, o);
    return;
  case Code::ExpertUp:
    opExperts(p, o, true);
    return;
  case Code::ExpertDown:
    opExperts(p, o, false);
    return;
  case Code::Combine:
    opCombine(p, o);
    return;
  case Code::SharedExpert: {
    const WeightView &up = weight(p, o.in[1]).view;
    const WeightView &down = weight(p, o.in[2]).view;
    if (o.act == Act::Relu2) {
      cpu::mlpRelu2(f32(p, o.in[0]), T, up, down, f32(p, o.out[0]));
      return;
    }
    const int64_t I = up.rows();
    float *hidden = scratchF(0, static_cast<size_t>(T * I));
    cpu::linear(f32(p, o.in[0]), T, up.cols(), up, hidden, I);
    activate(o.act, hidden, T * I);
    cpu::linear(hidden, T, I, down, f32(p, o.out[0]), down.rows());
    return;
  }
  }
}

void CpuEngine::opLmHead(const Program &p, const OpInfo &o) {
  const WeightView &W = weight(p, o.in[1]).view;
  const int64_t H = p.values[o.in[0]].cols, V = W.rows();
  const float *x = f32(p, o.in[0]);
  if (o.out[0] != p.logits) {
    cpu::linear(x, run_.T, H, W, f32(p, o.out[0]), V);
    return;
  }
  // The step's logits: only the rows the caller asked for, straight into
  // the caller's buffer when its rows are consecutive.
  const std::vector<int64_t> &need = run_.needRows, &outRows = run_.outRows;
  const int64_t n = static_cast<int64_t>(need.size());
  run_.logitsDone = true;
  if (n == 0)
    return;
  bool identity = n == run_.T, consecutive = true;
  for (int64_t i = 0; i < n; ++i) {
    identity &= need[i] == i;
    consecutive &= outRows[i] == outRows[0] + i;
  }
  const float *xs = x;
  if (!identity) {
    float *g = scratchF(0, static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(g + i * H, x + need[i] * H,
                  static_cast<size_t>(H) * sizeof(float));
    xs = g;
  }
  if (consecutive) {
    cpu::linear(xs, n, H, W, run_.logitsOut + outRows[0] * V, V);
    return;
  }
  float *y = scratchF(1, static_cast<size_t>(n * V));
  cpu::linear(xs, n, H, W, y, V);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(run_.logitsOut + outRows[i] * V, y + i * V,
                static_cast<size_t>(V) * sizeof(float));
}

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
  // (cpu/expert_budget.h); a budget of 1.0 is exactly top-k.
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
  const size_t per = up ? static_cast<size_t>(kBlock * In) : 0;
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

} // namespace

StatusOr<std::unique_ptr<Engine>>
createCpuEngine(std::unique_ptr<PlanFile> plan,
                std::unique_ptr<BoundWeights> weights,
                const EngineOptions &options) {
  try {
    auto engine =
        std::make_unique<CpuEngine>(std::move(plan), std::move(weights));
    if (Status s = engine->init(options); !s)
      return s;
    return std::unique_ptr<Engine>(std::move(engine));
  } catch (const std::bad_alloc &) {
    return Status::error("engine: out of memory loading the plan");
  }
}

} // namespace nf::engine
