//===- CudaCodegen.cpp - plan kernels -> CUDA C++ -------------------------===//
//
// One module per plan kernel; one __global__ function per op, or fewer where
// ops fuse:
//   nf.linear + nf.split [+ nf_kv.append]   one GEMM whose epilogue writes
//                                            the split columns (and K/V
//                                            cache rows)
//   nf.linear + nf.activation                GEMM with the activation in its
//                                            epilogue
//   nf.add + nf.rms_norm                     one row kernel
//   nf_moe.router + nf_moe.select            one block per token (scores in
//                                            f64 stay in shared memory)
// and a few ops take more than one launch (no grid-wide barriers anywhere):
//   nf_kv.causal_conv (prefill mode)         outputs, then the conv window
//   nf_moe.select (budget policy)            per-token ranking, then one
//                                            block per sequence decides counts
//   nf_moe.shared_expert                     up GEMM (+act), then down GEMM
// Function names: <p|d>k<kernel>_op<first op>_<what>, e.g.
// pk12_op0_add_rms_norm for prefill kernel 12.
//
//===----------------------------------------------------------------------===//

#include "CodeGen/CudaCodegen.h"

#include "nf/plan_attrs.h"
#include "nf/plan_generated.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace nf::codegen {
namespace {

namespace pl = ::nf::plan;

constexpr int64_t kAlignment = 256;

// Threads of the row kernels (norms): kRowThreads in kernels/nf_rows.cuh.
constexpr uint32_t kRowThreads = 256;

int64_t alignTo(int64_t v) {
  return (v + kAlignment - 1) / kAlignment * kAlignment;
}
int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
/// Bytes left beside a kernel's dynamic shared memory for its static
/// shared variables when checking a target's limit (the limit is for both).
constexpr int64_t kStaticSharedAllowance = 2048;

/// Feature tile of the warp-specialised GEMM for N features: 256, or 192 or
/// 128 where 256 rounds N up by enough more to outweigh their lower rates
/// (0.95x and 0.84x on the H200, bench/kernels/gemm_tiles.cu).
int64_t wsTileN(int64_t n) {
  const double cost256 = double(ceilDiv(n, 256) * 256);
  const double cost192 = double(ceilDiv(n, 192) * 192) / 0.95;
  const double cost128 = double(ceilDiv(n, 128) * 128) / 0.84;
  if (cost128 < std::min(cost192, cost256))
    return 128;
  return cost192 < cost256 ? 192 : 256;
}

/// A linear layer with these weights and K runs on the bf16-plane GEMMs
/// (emitLinear): outside decode, bf16 weights, K a multiple of 8.
bool onBf16Planes(const std::string &phase, bool bf16Weights, int64_t K) {
  return phase != "decode" && bf16Weights && K % 8 == 0;
}
/// Plane GEMM inputs may be stored as bf16 rows by their producers
/// (bf16RowValues): one bf16 term, targets with mma.sync's bf16 shapes.
bool bf16RowsAllowed(const CudaCodegenOptions &opts) {
  return opts.matmulTerms == 1 && opts.ampereOrLater;
}

uint32_t gridOf(int64_t blocks, int64_t cap) {
  return static_cast<uint32_t>(std::clamp<int64_t>(blocks, 1, cap));
}

struct ValueInfo {
  pl::ValueKind kind = pl::ValueKind::Tensor;
  pl::DType dtype = pl::DType::F32;
  pl::Rows rows = pl::Rows::None;
  std::vector<int64_t> shape;
  int64_t cols = 1; // elements per row (all elements when rows == None)
  int64_t offset = -1, bytes = 0;
  int weight = -1;
  int numExperts = 0, maxPerToken = 0;
};

/// How the step's activation rows are stored beyond plain f32 rows.
struct RowFormats {
  /// Stored as bf16 rows instead of f32 (bf16RowValues: prefill).
  std::set<int> bf16;
  /// Stored as f32 with a bf16 copy at this arena offset (decodeShadows).
  std::map<int, int64_t> shadow;
  /// End of the copies' region (0: none); generated scratch goes after it.
  int64_t shadowEnd = 0;
};

/// The step's expert statistics region (Step.expert_stats_offset, plan
/// 1.8): after the copies' region, for each nf_moe.select in step order
/// (layer l of L), counts i32 [rows] at offset + 4 l rows, then experts i32
/// [rows, k_l] at offset + 4 (L rows + l rows maxK). The ranking writes
/// them besides its own results; the runtime reads the region back after
/// the step instead of copying each layer's results between launches
/// (graph nodes there would break the programmatic launch chain).
struct ExpertStatsLayout {
  int64_t offset = -1, rows = 0, maxK = 0, layers = 0;
  std::map<const pl::Op *, int64_t> layerOf; // select op -> layer
  int64_t bytes() const { return 4 * layers * rows * (1 + maxK); }
  std::string counts(const pl::Op *select) const {
    return ptr(offset + 4 * layerOf.at(select) * rows);
  }
  std::string experts(const pl::Op *select) const {
    return ptr(offset + 4 * (layers * rows + layerOf.at(select) * rows * maxK));
  }
  static std::string ptr(int64_t off) {
    return "nf::arena<int32_t>(a, " + std::to_string(off) + "ll)";
  }
};

/// Decode steps of 2 to this many tokens run the narrow skinny variants
/// (f32 rows), longer ones the wide variants, one-token steps row_linear
/// (emitLinear).
constexpr int64_t kNarrowTokens = 16;
/// row_linear's 16-byte weight chunks in flight a lane (steps of one token):
/// 6 was the best of 4 to 11 on the Nano shapes alone on the H200
/// (bench/kernels/row_linear_sweep.cu).
constexpr int64_t kRowChunks = 6;

/// The TMA wide variants of dense decode linears (emitTmaLinear): 32
/// features an item, 256-deep K stages, 8 consumer warps; items of 32 rows
/// (steps of up to 32 tokens) in 6 stages, of 64 rows in 3. Their dynamic
/// shared memory (nf::tma_linear_smem), the larger of the two.
struct TmaLinearConfig {
  int64_t rows, stages, warps;
};
constexpr int64_t kTmaMt = 2, kTmaBk = 256;
constexpr TmaLinearConfig kTmaRows32{32, 6, 8}, kTmaRows64{64, 3, 8};
constexpr int64_t tmaLinearSmem(const TmaLinearConfig &c) {
  return 1024 + c.stages * (16 * kTmaMt + c.rows) * kTmaBk * 2 +
         c.warps * kTmaMt * (c.rows / 8) * 128 * 4 + 16 * c.stages;
}
constexpr int64_t kTmaSmem =
    std::max(tmaLinearSmem(kTmaRows32), tmaLinearSmem(kTmaRows64));

/// Rows that skinny GEMVs read get bf16 copies for their wide variants
/// (decodeShadows): decode steps of bf16 inputs that have wide variants.
bool decodeCopiesOn(const std::string &phase, const CudaCodegenOptions &opts,
                    int64_t maxTokens) {
  return phase == "decode" && bf16RowsAllowed(opts) &&
         maxTokens > kNarrowTokens;
}

std::string num(int64_t v) { return std::to_string(v); }

/// A double as a C++ literal (exact), or an expression for inf / nan.
std::string doubleLit(double v) {
  if (std::isnan(v))
    return "__longlong_as_double(0x7ff8000000000000ll)";
  if (std::isinf(v))
    return v > 0 ? "nf::f64_inf()" : "(-nf::f64_inf())";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos)
    s += ".0";
  return s;
}
/// A float parameter's value (the double attribute rounded as on the CPU).
std::string floatLit(double v) {
  if (std::isnan(v))
    return "__int_as_float(0x7fc00000)";
  if (std::isinf(v))
    return v > 0 ? "nf::f32_inf()" : "(-nf::f32_inf())";
  return "static_cast<float>(" + doubleLit(v) + ")";
}

using pl::floatAttr;
using pl::intAttr;
using pl::listAttr;
using pl::stringAttr;

std::string opName(const pl::Op &op) {
  return op.name() ? op.name()->str() : std::string("<unnamed>");
}
std::vector<int> operands(const pl::Op &op) {
  return op.operands()
             ? std::vector<int>(op.operands()->begin(), op.operands()->end())
             : std::vector<int>();
}
std::vector<int> results(const pl::Op &op) {
  return op.results()
             ? std::vector<int>(op.results()->begin(), op.results()->end())
             : std::vector<int>();
}

/// The fixed part of a linear layer spec (nf_linear.cuh).
struct LinearSpec {
  std::string wtype;
  int64_t N = 0, K = 0, G = 1;
  std::string groups = "nf::DenseGroups";
  std::string weight; // expression of `const W *` for group g
  /// One weight (not stacked): its Plan.weights index, for a tensor map.
  int weightIndex = -1;
  std::string input; // expression of the f32 input activation [rows, K]
  /// Instead of `input`: an expression of `const unsigned short *`, the
  /// input stored as bf16 rows by its producer (bf16RowValues).
  std::string input16;
  /// Decode: an expression of `const unsigned short *`, the input's bf16
  /// copy (RowFormats::shadow), which the wide skinny variant reads.
  std::string shadow16;
  int64_t shadowOffset = -1; // arena offset of that copy (rows of K bf16)
  std::string rowIndex;      // expression of row r's index in `input`
  /// Optional: an expression (long long) of row r that the store uses as
  /// `ctx`, computed once per row where a kernel supports it (HasRowCtx).
  std::string rowCtx;
  int64_t rowsPerToken = 1; // input rows per token (assignments: top-k)
  std::string store;        // statements storing v at (r, n)
  /// Optional: the store of the wide decode variants (steps of more than
  /// kNarrowTokens tokens) where it differs (S::store of `<spec>_wide`).
  std::string wideStore;
  /// Optional (N even): statements storing v0 at (r, n) and v1 at (r, n + 1)
  /// for an even n, in one store each (S::store2).
  std::string store2;
  int64_t maxRows = 0;
  /// Decode steps of more than kNarrowTokens tokens with a bf16 copy of the
  /// input: split_k_linear instead of skinny_linear's wide variant (for
  /// layers with enough feature tiles to fill the GPU without splitting K).
  bool wideFeatureTiles = false;
  /// The shared expert: its wide variant runs side by side with the routed
  /// experts' and takes their block size.
  bool wideWithExperts = false;
  /// Decode: the groups are the previous launch's output (DispatchGroups
  /// without kEarly), so skinny_linear lets the next launch start only
  /// after its wait.
  bool groupsAfterWait = false;
  /// Decode: only the one-token variant (row_linear), for steps of one
  /// token (every step where steps have one token at most).
  bool rowOnly = false;
  /// With rowOnly: the variant's body instead of the row_linear call (a
  /// template that takes the spec and more arguments).
  std::string rowBody;
};

class KernelEmitter {
public:
  KernelEmitter(const pl::Plan &plan, const std::vector<ValueInfo> &values,
                const RowFormats &rowFormats, const std::string &phase,
                int index, const pl::Kernel &kernel, int64_t maxTokens,
                int64_t arenaBytes, const CudaCodegenOptions &opts)
      : plan(plan), values(values), rowFormats(rowFormats), phase(phase),
        index(index), kernel(kernel), maxTokens(maxTokens),
        arenaBytes(arenaBytes), opts(opts) {}

  StatusOr<CudaKernelSource> run(int64_t &scratchEnd);

private:
  /// Each launch's function, written after every spec (run()).
  struct FunctionText {
    std::string comment, body;
    bool ownsStep = false; // the body declares its own nf::Step (co-launch)
    /// Its template indexes blocks through nf::Step (block(), grid()), so
    /// it can run on a slice of a co-launch's grid.
    bool sliceable = false;
    /// > 0: the blocks an SM must fit (__launch_bounds__' minimum blocks).
    int minBlocks = 0;
    /// > 0: blocks a cluster (__cluster_dims__; the grid a multiple of it).
    int clusterBlocks = 0;
  };
  // Diagnostics
  Status fail(size_t op, const std::string &message) const {
    std::string where =
        phase + " kernel " + std::to_string(index) + " '" + kname() + "'";
    if (op < ops.size())
      where += " op " + std::to_string(op) + " " + opName(*ops[op]);
    return Status::error("cuda: " + where + ": " + message);
  }
  std::string kname() const {
    return kernel.name() ? kernel.name()->str() : std::string("kernel");
  }

  // Values
  const ValueInfo &V(int v) const { return values[static_cast<size_t>(v)]; }
  bool isTensor(int v, pl::DType dt) const {
    return v >= 0 && v < static_cast<int>(values.size()) &&
           V(v).kind == pl::ValueKind::Tensor && V(v).dtype == dt;
  }
  bool isAct(int v) const {
    return isTensor(v, pl::DType::F32) && V(v).rows == pl::Rows::Tokens;
  }
  const pl::Weight *weightOf(int v) const {
    if (v < 0 || v >= static_cast<int>(values.size()) ||
        V(v).kind != pl::ValueKind::Weight || !plan.weights() ||
        V(v).weight < 0 ||
        V(v).weight >= static_cast<int>(plan.weights()->size()))
      return nullptr;
    return plan.weights()->Get(static_cast<unsigned>(V(v).weight));
  }
  std::vector<int64_t> weightShape(int v) const {
    const pl::Weight *w = weightOf(v);
    return w && w->shape()
               ? std::vector<int64_t>(w->shape()->begin(), w->shape()->end())
               : std::vector<int64_t>();
  }
  int64_t weightNumel(int v) const {
    int64_t n = 1;
    for (int64_t d : weightShape(v))
      n *= d;
    return n;
  }
  std::optional<std::string> weightType(int v) const {
    const pl::Weight *w = weightOf(v);
    if (!w)
      return std::nullopt;
    switch (w->dtype()) {
    case pl::DType::F32:
      return std::string("float");
    case pl::DType::BF16:
      return std::string("nf::bf16");
    case pl::DType::F16:
      return std::string("nf::f16");
    default:
      return std::nullopt;
    }
  }
  std::string arenaPtr(int v, const char *type = "float") const {
    return "nf::arena<" + std::string(type) + ">(a, " + num(V(v).offset) +
           "ll)";
  }
  /// Value v is stored as bf16 rows (bf16RowValues).
  bool rowsBf16(int v) const { return rowFormats.bf16.count(v) != 0; }
  /// Value v has a bf16 copy (decodeShadows).
  bool shadowed(int v) const { return rowFormats.shadow.count(v) != 0; }
  std::string shadowPtr(int v) const {
    return "nf::arena<unsigned short>(a, " + num(rowFormats.shadow.at(v)) +
           "ll)";
  }
  /// f32 rows with a bf16 copy that steps of more than kNarrowTokens
  /// tokens write (nf::ShadowedRows).
  static std::string shadowedRows(const std::string &f32,
                                  const std::string &bf16) {
    return "nf::shadowed_rows<" + num(kNarrowTokens) + ">(a->num_tokens, " +
           f32 + ", " + bf16 + ")";
  }
  /// Pointer expression of activation v as its producer writes it: f32,
  /// `unsigned short *` for bf16 rows, or nf::ShadowedRows for f32 rows
  /// with a bf16 copy (written with nf::store_act).
  std::string outPtr(int v) {
    if (shadowed(v)) {
      wroteShadow.insert(v);
      return shadowedRows(arenaPtr(v), shadowPtr(v));
    }
    if (!rowsBf16(v))
      return arenaPtr(v);
    wroteBf16.insert(v);
    return arenaPtr(v, "unsigned short");
  }
  /// A statement storing `value` to element `index` of activation v.
  std::string storeAct(int v, const std::string &index,
                       const std::string &value) {
    if (!rowsBf16(v) && !shadowed(v))
      return "    " + arenaPtr(v) + "[" + index + "] = " + value + ";\n";
    return "    nf::store_act(" + outPtr(v) + " + " + index + ", " + value +
           ");\n";
  }
  /// A statement storing `v0`, `v1` to elements `index`, `index` + 1 of
  /// activation v (index even) in one store.
  std::string storeAct2(int v, const std::string &index, const std::string &v0,
                        const std::string &v1) {
    return "    nf::store_act2(" + outPtr(v) + " + " + index + ", " + v0 +
           ", " + v1 + ");\n";
  }
  /// The input of a linear spec: activation v, as f32 or as bf16 rows,
  /// and its bf16 copy if it has one.
  void setInput(LinearSpec &s, int v) const {
    s.input = arenaPtr(v);
    if (rowsBf16(v))
      s.input16 = arenaPtr(v, "unsigned short");
    if (shadowed(v)) {
      s.shadow16 = shadowPtr(v);
      s.shadowOffset = rowFormats.shadow.at(v);
    }
  }
  std::string weightPtr(int v) const {
    return "nf::weight<" + *weightType(v) + ">(a, " + num(V(v).weight) + ")";
  }
  const pl::Storage *storageOf(const pl::Op &op, pl::StorageKind kind) const {
    if (op.storage() < 0 || !plan.storage() ||
        op.storage() >= static_cast<int>(plan.storage()->size()))
      return nullptr;
    const pl::Storage *s =
        plan.storage()->Get(static_cast<unsigned>(op.storage()));
    return s->kind() == kind ? s : nullptr;
  }
  /// Users of value v among this kernel's ops (op indices).
  std::vector<size_t> usersOf(int v) const {
    std::vector<size_t> u;
    for (size_t i = 0; i < ops.size(); ++i)
      for (int o : operands(*ops[i]))
        if (o == v) {
          u.push_back(i);
          break;
        }
    return u;
  }
  bool isOutput(int v) const { return outputs.count(v) != 0; }
  /// v must be stored unless every reader is among `fused`.
  bool needed(int v, std::initializer_list<size_t> fused) const {
    if (isOutput(v))
      return true;
    for (size_t u : usersOf(v))
      if (std::find(fused.begin(), fused.end(), u) == fused.end())
        return true;
    return false;
  }

  // Emission
  std::string fnName(size_t op, const std::string &label) const {
    return std::string(phase == "prefill" ? "p" : "d") + "k" +
           std::to_string(index) + "_op" + std::to_string(op) + "_" + label;
  }
  /// One __global__ function and its launch, a programmatic dependent of
  /// the launch before it (nf_common.cuh). The function first waits for the
  /// grids before it (unless `bodyWaits`: the body waits itself, after
  /// fetching what does not depend on them). Decode functions then let the
  /// next launch start at once (unless `bodyTriggers`: the body does, after
  /// its wait), so its blocks are resident and fetching weights as this
  /// grid's blocks retire; prefill functions only when their work is done.
  void addLaunch(const std::string &fn, uint32_t grid, uint32_t block,
                 const std::string &body, const std::string &comment,
                 uint32_t minTokens = 0, uint32_t maxTokens = 0,
                 bool bodyWaits = false, bool bodyTriggers = false) {
    FunctionText f;
    f.comment = comment;
    if (!opts.injectError.empty() &&
        fn.find(opts.injectError) != std::string::npos)
      f.body = "  nf_injected_error(; // NF_CUDA_INJECT_ERROR\n";
    // Measured on the H200 (Nano shape, bf16 inputs): batch-1 decode 3.69
    // ms/step against 3.86 with the late trigger and 3.85 without
    // programmatic launches; batch 32 12.98 against 12.72 and 12.81.
    const bool early = phase == "decode";
    f.body += (bodyWaits ? "" : "  nf::wait_for_previous_grids();\n") +
              std::string(early && !bodyTriggers ? "  nf::allow_next_grid();\n"
                                                 : "") +
              body + (early ? "" : "  nf::allow_next_grid();\n");
    functions.push_back(f);
    CudaLaunchInfo l;
    l.function = fn;
    l.grid = grid;
    l.block = block;
    l.minTokens = minTokens;
    l.maxTokens = maxTokens;
    l.programmatic = true;
    launches.push_back(l);
  }
  /// Launches `a` and `b` as one launch: `a`'s first `ga` blocks, then
  /// `b`'s grid, each part on its slice (nf::Step::block()); it takes `b`'s
  /// token range. Both must be co-launchable templates with the same block
  /// size.
  using Merged = std::pair<CudaLaunchInfo, FunctionText>;
  Merged sideBySide(size_t a, size_t b, uint32_t ga, const std::string &name) {
    return sideBySideOf(launches[a], functions[a], launches[b], functions[b],
                        ga, name);
  }
  Merged sideBySideOf(const CudaLaunchInfo &la, const FunctionText &fa,
                      const CudaLaunchInfo &lb, const FunctionText &fb,
                      uint32_t ga, const std::string &name) {
    if (lb.block != la.block)
      internalError = "co-launch of " + la.function + " and " + lb.function +
                      " with different block sizes";
    CudaLaunchInfo l = lb;
    l.function = name;
    l.grid = ga + lb.grid;
    l.sharedBytes = std::max(la.sharedBytes, lb.sharedBytes);
    auto part = [&](const FunctionText &f, uint32_t block0, uint32_t blocks) {
      return "    const nf::Step a{args, " +
             std::string(phase == "decode" ? "nullptr" : "arena") + ", " +
             std::to_string(block0) + ", " + std::to_string(blocks) + "};\n" +
             indent(f.body);
    };
    FunctionText f;
    f.comment = fa.comment + ";\n// side by side with " + fb.comment;
    f.minBlocks = std::max(fa.minBlocks, fb.minBlocks);
    f.body = "  if (blockIdx.x < " + std::to_string(ga) + "u) {\n" +
             part(fa, 0, ga) + "  } else {\n" + part(fb, ga, lb.grid) + "  }\n";
    f.ownsStep = true;
    return std::make_pair(l, f);
  }
  /// A function name without its "dk<k>_op<i>_" prefix.
  static std::string unprefixed(const std::string &fn) {
    return fn.substr(fn.find('_', fn.find('_') + 1) + 1);
  }
  /// Runs launches [b, b + nb) (variants of one op by step size) side by side
  /// with launch `a` (an independent op): one launch per variant whose grid
  /// is `a`'s blocks followed by the variant's (sideBySide). `aBlocks(t)`:
  /// the blocks `a` needs for steps of up to t tokens (its grid serves the
  /// step's most tokens). `a` must run for every step size (the merged
  /// launches take the variants' token ranges); they replace `a` and the
  /// variants, in `a`'s place.
  void coLaunch(size_t a, size_t b, size_t nb,
                const std::function<uint32_t(int64_t)> &aBlocks) {
    std::vector<CudaLaunchInfo> merged;
    std::vector<FunctionText> mergedText;
    const CudaLaunchInfo la = launches[a];
    if (la.minTokens || la.maxTokens) {
      internalError = "co-launch of " + la.function +
                      ", which runs for some step sizes only";
      return;
    }
    for (size_t v = b; v < b + nb; ++v) {
      const CudaLaunchInfo &lb = launches[v];
      const uint32_t ga = std::min<uint32_t>(
          la.grid, aBlocks(lb.maxTokens ? int64_t(lb.maxTokens) : maxTokens));
      auto [l, f] =
          sideBySide(a, v, ga, la.function + "_and_" + unprefixed(lb.function));
      merged.push_back(l);
      mergedText.push_back(f);
    }
    // Replace: drop the variants, then put the merged ones in a's place.
    launches.erase(launches.begin() + b, launches.begin() + b + nb);
    functions.erase(functions.begin() + b, functions.begin() + b + nb);
    const size_t at = a > b ? a - nb : a;
    launches.erase(launches.begin() + at);
    functions.erase(functions.begin() + at);
    launches.insert(launches.begin() + at, merged.begin(), merged.end());
    functions.insert(functions.begin() + at, mergedText.begin(),
                     mergedText.end());
  }
  /// Variant v of one op (launches [a, a + n)) side by side with variant v
  /// of another ([b, b + n)), the same token ranges: `a`'s whole grid first.
  /// Returns the n merged launches (the caller places them).
  std::vector<Merged> pairVariants(size_t a, size_t b, size_t n) {
    std::vector<Merged> merged;
    for (size_t v = 0; v < n; ++v) {
      const CudaLaunchInfo &la = launches[a + v], &lb = launches[b + v];
      if (la.minTokens != lb.minTokens || la.maxTokens != lb.maxTokens)
        internalError = "co-launch of " + la.function + " and " + lb.function +
                        " for different step sizes";
      // "dk6_op4_expert_up_wide" + "dk6_op0_shared_up_wide" ->
      // "dk6_op4_expert_up_and_shared_up_wide".
      const std::string nb = lb.function, na = unprefixed(la.function);
      const size_t cut = nb.rfind('_');
      const size_t cutA = na.rfind('_');
      const bool suffixed = la.minTokens || la.maxTokens;
      const std::string name =
          suffixed && cut != std::string::npos && cutA != std::string::npos
              ? nb.substr(0, cut) + "_and_" + na.substr(0, cutA) +
                    nb.substr(cut)
              : nb + "_and_" + na;
      merged.push_back(sideBySide(a + v, b + v, la.grid, name));
    }
    return merged;
  }
  static std::string indent(const std::string &body) {
    std::string out;
    size_t start = 0;
    while (start < body.size()) {
      size_t end = body.find('\n', start);
      if (end == std::string::npos)
        end = body.size();
      out += "  " + body.substr(start, end - start) + "\n";
      start = end + 1;
    }
    return out;
  }
  uint32_t elementGrid(int64_t elements) const {
    return gridOf(ceilDiv(elements, 256), int64_t(opts.smCount) * 8);
  }
  uint32_t blockGrid(int64_t items) const { // a block per item
    return gridOf(items, int64_t(opts.smCount) * 8);
  }
  void emitLinear(const std::string &fn, const LinearSpec &s,
                  const std::string &comment);
  int64_t newScratch(int64_t bytes) {
    const int64_t off = alignTo(scratchTop);
    scratchTop = off + alignTo(bytes);
    return off;
  }

  // Op handlers: each returns the number of ops it consumed.
  StatusOr<size_t> embed(size_t i);
  StatusOr<size_t> rmsNorm(size_t i);
  StatusOr<size_t> add(size_t i);
  StatusOr<size_t> linear(size_t i);
  StatusOr<size_t> split(size_t i);
  StatusOr<size_t> activation(size_t i);
  StatusOr<size_t> gatedRmsNorm(size_t i, uint32_t minTokens = 0);
  StatusOr<size_t> causalConv(size_t i, uint32_t minTokens = 0);
  StatusOr<size_t> ssm(size_t i);
  StatusOr<size_t> kvAppend(size_t i);
  StatusOr<size_t> kvAttend(size_t i);
  StatusOr<size_t> route(size_t i);
  StatusOr<size_t> dispatch(size_t i);
  StatusOr<size_t> expert(size_t i, bool up);
  StatusOr<size_t> combine(size_t i);
  /// A decode MoE layer's end from the combine at op i: the combine, the
  /// add of the shared expert's rows, the residual add and an RMSNorm of
  /// the sum (FuseKernels' hoisted shared experts).
  struct CombineTail {
    int shared, residual, sum, out, normWeight;
    std::string normType;
    double eps;
  };
  std::optional<CombineTail> combineTail(size_t i) const;
  bool oneTokenExperts(size_t d);
  StatusOr<size_t> sharedExpert(size_t i);
  StatusOr<size_t> routeSharedExpert(size_t i);

  StatusOr<std::string> activationKind(size_t i, const char *attr,
                                       bool required) const {
    std::optional<std::string> k = stringAttr(*ops[i], attr);
    if (!k && !required)
      return std::string("nf::kActRelu2");
    if (!k)
      return fail(i, std::string("missing attribute '") + attr + "'");
    if (*k == "relu2")
      return std::string("nf::kActRelu2");
    if (*k == "silu")
      return std::string("nf::kActSilu");
    return fail(i, "unsupported activation '" + *k + "'");
  }

public:
  /// The step's expert statistics (none: offset -1).
  const ExpertStatsLayout *expertStats = nullptr;

private:
  const pl::Plan &plan;
  const std::vector<ValueInfo> &values;
  const RowFormats &rowFormats;
  std::set<int> wroteBf16;   // bf16 rows this kernel's code writes
  std::set<int> wroteShadow; // bf16 copies this kernel's code writes
  std::string internalError; // an emitter broke an invariant
  std::string phase;
  int index;
  const pl::Kernel &kernel;
  int64_t maxTokens, arenaBytes;
  const CudaCodegenOptions &opts;

  std::vector<const pl::Op *> ops;
  std::set<int> outputs;
  std::set<std::string> includes;
  std::ostringstream text;
  std::vector<FunctionText> functions;
  std::vector<CudaLaunchInfo> launches;
  int64_t scratchTop = 0;
  bool hopperFeatures = false; // some launch uses wgmma
  /// Initializers of the module's nf_tensor_map_descs (nf_abi.h).
  std::vector<std::string> tensorMaps;
  /// A 2D bf16 tensor map (nf_abi.h) of `outer` rows of `inner` elements,
  /// boxes of 64 x boxOuter; its index in nf_tensor_maps.
  size_t tensorMap(const char *source, int64_t index, int64_t offset,
                   int64_t inner, int64_t outer, int64_t boxOuter) {
    tensorMaps.push_back("{" + std::string(source) + ", " + num(index) + ", " +
                         num(offset) + "ll, {" + num(inner) + "ll, " +
                         num(outer) + "ll}, " + num(inner * 2) + "ll, {64, " +
                         num(boxOuter) + "}}");
    return tensorMaps.size() - 1;
  }
  /// The wide decode variants of a dense linear on TMA (nf_tma.cuh).
  void emitTmaLinear(const std::string &fn, const std::string &spec,
                     const LinearSpec &s, const std::string &comment);
};

void KernelEmitter::emitLinear(const std::string &fn, const LinearSpec &s,
                               const std::string &comment) {
  includes.insert("nf_linear.cuh");
  const std::string spec = fn + "_spec";
  const std::string rowOffset =
      "static_cast<long long>(" + s.rowIndex + ") * " + num(s.K);
  // Prefill with bf16 weights: the input rows are split into bf16 planes
  // first (one launch), so the GEMM streams both operands with cp.async
  // (pipelined_mma_tile); input rows stored as bf16 by their producer
  // (s.input16) are streamed as they are.
  const bool planes = onBf16Planes(phase, s.wtype == "nf::bf16", s.K);
  const bool stored16 = !s.input16.empty();
  if (stored16 && !planes) // bf16RowValues promised a plane-path reader
    internalError = fn + " reads bf16 rows but is not a bf16-plane GEMM";
  const int64_t terms = opts.matmulTerms;
  const int64_t planeElems = maxTokens * s.rowsPerToken * s.K;
  const bool splitLaunch = planes && !stored16;
  const int64_t planeOff = splitLaunch ? newScratch(terms * planeElems * 2) : 0;
  const std::string planePtr =
      stored16 ? s.input16
               : "nf::arena<unsigned short>(a, " + num(planeOff) + "ll)";
  text << "struct " << spec << " : " << s.groups << " {\n"
       << "  using W = " << s.wtype << ";\n"
       << "  static constexpr int N = " << s.N << ", K = " << s.K << ";\n"
       << "  __device__ static __forceinline__ const W *weight("
          "nf::Step a, int g) {\n"
       << "    (void)g;\n    return " << s.weight << ";\n  }\n";
  if (stored16)
    text << "  static constexpr bool kRowsBf16 = true;\n";
  else
    text << "  __device__ static __forceinline__ const float *row("
            "nf::Step a, int r) {\n"
         << "    return " << s.input << " + " << rowOffset << ";\n  }\n";
  const bool x16 = !s.shadow16.empty() && !planes; // decode: the copy
  if (x16)
    text << "  __device__ static __forceinline__ const unsigned short *"
            "row16(nf::Step a, int r) {\n"
         << "    return " << s.shadow16 << " + " << rowOffset << ";\n  }\n";
  if (planes)
    text << "  static constexpr long long PLANE = "
         << (stored16 ? int64_t(0) : planeElems) << "ll;\n"
         << "  __device__ static __forceinline__ const unsigned short *"
            "row16(nf::Step a, int r) {\n"
         << "    return " << planePtr << " + " << rowOffset << ";\n  }\n";
  // With a row context, the per-element store computes it only where it
  // is used (the branches that write the K/V cache).
  std::string perElement = s.store;
  for (size_t at; !s.rowCtx.empty() &&
                  (at = perElement.find("[ctx + ")) != std::string::npos;)
    perElement.replace(at, 7, "[" + s.rowCtx + " + ");
  if (!s.store2.empty() && s.N % 2 == 0)
    text << "  static constexpr bool kStore2 = true;\n"
         << "  __device__ static __forceinline__ void store2(nf::Step a, int "
            "r, int n, float v0, float v1) {\n"
         << s.store2 << "  }\n";
  if (s.rowCtx.empty()) {
    text << "  __device__ static __forceinline__ void store(nf::Step "
            "a, int r, int n, float v) {\n"
         << s.store << "  }\n};\n";
  } else {
    text << "  static constexpr bool kRowCtx = true;\n"
         << "  __device__ static __forceinline__ long long row_ctx("
            "nf::Step a, int r) {\n"
         << "    return " << s.rowCtx << ";\n  }\n"
         << "  __device__ static __forceinline__ void store(nf::Step "
            "a, long long ctx, int r, int n, float v) {\n"
         << s.store << "  }\n"
         << "  __device__ static __forceinline__ void store(nf::Step "
            "a, int r, int n, float v) {\n"
         << perElement << "  }\n};\n";
  }
  // The wide variants' spec: the same, but for its store.
  const std::string wideSpec = s.wideStore.empty() ? spec : spec + "_wide";
  if (!s.wideStore.empty())
    text << "struct " << wideSpec << " : " << spec << " {\n"
         << "  __device__ static __forceinline__ void store(nf::Step a, int r, "
            "int n, float v) {\n"
         << s.wideStore << "  }\n};\n";
  if (planes) {
    if (splitLaunch)
      addLaunch(fn + "_split", elementGrid(planeElems / 4), 256,
                "  nf::split_rows_bf16<" + num(terms) + ", " + num(s.K) + ", " +
                    num(s.rowsPerToken) + ", " + num(planeElems) + "ll>(a, " +
                    s.input + ", " + planePtr + ");\n",
                comment + ": input rows split into " + num(terms) +
                    " bf16 plane(s) (codegen scratch at " + num(planeOff) +
                    ")");
    // 128 x 128 tiles; as many blocks as fit on an SM (shared memory). With
    // wgmma the sm_90a cubin runs wgmma_tile and the PTX (other targets)
    // pipelined_mma_tile: the launch gets the larger shared memory of both.
    // With bf16 inputs the sm_90a cubin runs the warp-specialised GEMM
    // instead (wgmma_ws_gemm: a loading warpgroup and two multiplying ones,
    // 128 x TN tiles, one block per SM): 499-508 TFLOP/s on the Nano shapes
    // on the H200 against 441-472 for wgmma_tile
    // (bench/kernels/gemm_tiles.cu).
    const int64_t pipeSmem = (terms == 1 ? 4 : 3) * (terms + 1) * 128 * 40 * 2;
    const int64_t wgmmaSmem =
        (terms == 1 ? 5 : 3) * (terms + 1) * 128 * 64 * 2 + 1024;
    const int64_t wsTile = wsTileN(s.N);
    const int64_t wsStage = (128 + wsTile) * 64 * 2;
    const int64_t wsSmem = (210 * 1024) / wsStage * wsStage + 1024;
    const bool ws = opts.wgmma && terms == 1 &&
                    wsSmem + kStaticSharedAllowance <= opts.maxSharedBytes;
    const int64_t smem = ws           ? std::max(pipeSmem, wsSmem)
                         : opts.wgmma ? std::max(pipeSmem, wgmmaSmem)
                                      : pipeSmem;
    const int64_t perSm = (227 * 1024) / (smem + 1024);
    const int64_t tileN = ws ? wsTile : 128;
    const int64_t tiles =
        (ceilDiv(s.maxRows, 128) + (s.G > 1 ? s.G : 0)) * ceilDiv(s.N, tileN);
    const int64_t gemvBlocks = ceilDiv(s.G * s.N, 8);
    hopperFeatures = hopperFeatures || opts.wgmma;
    std::string sizeChecks = "  static_assert(nf::pipelined_gemm_smem<" +
                             num(terms) + ">() == " + num(pipeSmem) +
                             ", \"shared memory size\");\n";
    if (ws)
      sizeChecks += "  static_assert(nf::wgmma_ws_smem<" + num(wsTile) +
                    ">() == " + num(wsSmem) + ", \"shared memory size\");\n";
    else if (opts.wgmma)
      sizeChecks += "  static_assert(nf::wgmma_gemm_smem<" + num(terms) +
                    ">() == " + num(wgmmaSmem) + ", \"shared memory size\");\n";
    addLaunch(fn,
              gridOf(std::max(tiles, gemvBlocks),
                     int64_t(opts.smCount) * std::max<int64_t>(perSm, 1)),
              ws ? 384 : 256,
              sizeChecks + "  nf::linear<" + spec + ", " + num(terms) +
                  ", true, " + (opts.wgmma ? "true" : "false") + ", " +
                  num(ws ? wsTile : 0) + ">(a);\n",
              comment +
                  (ws ? ": warp-specialised wgmma GEMM on the bf16 plane, "
                        "128 x " +
                            num(wsTile) + " tiles (sm_90a; else mma.sync)"
                   : opts.wgmma ? ": tensor-core tiles on the bf16 planes "
                                  "(wgmma on sm_90a, else mma.sync)"
                                : ": pipelined tensor-core tiles on the bf16 "
                                  "planes"));
    launches.back().sharedBytes = static_cast<uint32_t>(smem);
    return;
  }
  // Decode with bf16 weights: the skinny tensor-core kernel (weights as mma's
  // A operand, K split across a block's warps), which reads each weight byte
  // once at any batch size up to 64 rows per group.
  // Two variants: up to kNarrowTokens tokens (16 features a block, 4 K
  // steps in flight) and more (32 features a block; with bf16 inputs each
  // warp's next activations staged in shared memory: batch-32 experts 93 ->
  // 79 us a launch, step 11.5 -> 10.9 ms on the H200; exact products keep
  // loads at use: staged, their three terms took the variant from 112 to
  // 154 registers, one block per SM, and batch 32 from 13.3 to 15.0 ms);
  // the plan says which runs for how many tokens. (64 features a block streamed
  // the batch-32 experts 19% faster alone, skinny_sweep.cu with
  // NF_SWEEP_WIDE=1, but made the plan's batch-32 step 10% slower on the H200,
  // bench/results/2026-11-30g/run39-wide64: the generated 32-feature
  // variant takes 111 registers, two blocks per SM, the sweep's more than
  // 128; the 64-feature one 176, one block.)
  if (phase == "decode" && s.wtype == "nf::bf16" && s.K % 32 == 0) {
    constexpr int64_t kWarps = 8;
    // Blocks loop over items, so the group scan at their start is paid
    // once (measured on the H200: equal to or faster than a block per item,
    // at batch 1 to 32). Two blocks per SM, three for the narrow variant
    // with bf16 inputs (its registers allow it): that streamed the batch-1
    // expert and in_proj weights 15-22% faster (bench/kernels/skinny_sweep.cu)
    // but slowed batch 64 when the wide variant did the same.
    // (No minimum-blocks launch bound: with one, ptxas spills to reach it,
    // where without one the narrow variant fits three blocks unspilled.)
    const int64_t cap = int64_t(opts.smCount) * 2;
    // The wide variant: 4 warps split an item's K, four blocks an SM (each
    // warp's weight stream twice as long between folds), for routed experts
    // and layers of at least a feature tile an SM; layers of fewer tiles
    // keep 8 warps (more bytes in flight per item). On the H200, Nano at
    // batch 32: routed experts 84 + 80 -> 81 + 79 us a layer, in_proj 31.1
    // -> 28.6, qkv 23.8 -> 19.1, but out_proj (84 tiles) 14.4 -> 19.4.
    const bool wide4 = s.G > 1 || s.wideWithExperts ||
                       ceilDiv(s.N, 32) >= int64_t(opts.smCount);
    const int64_t kWideWarps = wide4 ? 4 : kWarps;
    const int64_t kWideCap = int64_t(opts.smCount) * (wide4 ? 4 : 2);
    const int64_t narrowCap =
        opts.matmulTerms == 1 ? int64_t(opts.smCount) * 3 : cap;
    const std::string terms = num(opts.matmulTerms);
    const int64_t narrowRows = std::min(s.maxRows, kNarrowTokens);
    const int64_t narrowItems =
        (std::min(s.G, narrowRows) + 1) * ceilDiv(s.N, 16);
    const bool wide = maxTokens > kNarrowTokens;
    // One weight (not the routed experts), not run beside the experts.
    const bool dense = s.G == 1 && !s.wideWithExperts;
    // Dynamic shared memory (nf::skinny_smem): the fold's sums and, when
    // staged, the activation ring (the two parts of a co-launch share it).
    // The wide variant reads the input's bf16 copy where it has one (its
    // steps are the ones whose activation reads through L2 rival the
    // weights'); the narrow one reads f32 rows (bf16 rows there slowed
    // batch 1-8 by 2-3%, bench/results/2026-11-30f/run4-decode-rows).
    // rows: an item's rows at most (16, or 32 for wide dense layers whose
    // 16-row items would not all fit on the GPU at once).
    auto variant = [&](const std::string &name, int64_t grid, int64_t mt,
                       int64_t stages, int64_t warps, bool stageX, bool rows16,
                       uint32_t minT, uint32_t maxT, int64_t rows = 16) {
      const int64_t nt = rows / 8;
      const int64_t smem =
          (warps / 2) * mt * nt * 4 * 32 * 4 +
          (stageX ? warps * 2 * nt * (rows16 ? 1 : 2) * 32 * 16 : 0);
      const std::string x = stageX ? "true" : "false";
      const std::string &variantSpec =
          minT > uint32_t(kNarrowTokens) ? wideSpec : spec;
      std::string tail = rows16 ? ", true" : "";
      if (rows != 16)
        tail = (rows16 ? ", true, " : ", false, ") + num(rows);
      addLaunch(name, static_cast<uint32_t>(grid), 32 * warps,
                "  static_assert(nf::skinny_smem<" + variantSpec + ", " +
                    num(mt) + ", " + num(warps) + ", " + x + tail +
                    ">() == " + num(smem) +
                    ", \"shared memory size\");\n"
                    "  nf::skinny_linear<" +
                    variantSpec + ", " + num(mt) + ", " + num(stages) + ", " +
                    num(warps) + ", " + terms + ", " + x + tail + ">(a);\n",
                comment, minT, maxT, /*bodyWaits=*/true, s.groupsAfterWait);
      launches.back().sharedBytes = static_cast<uint32_t>(smem);
      functions.back().sliceable = true;
    };
    // Steps of one token: row_linear, a warp per feature on CUDA cores
    // (nf_linear.cuh), three blocks an SM (every step, where steps have one
    // token at most). On the H200, Nano at batch 1: see row_linear's
    // comment.
    const bool row = opts.rowLinear || s.rowOnly;
    if (row) {
      addLaunch(fn + "_row",
                gridOf(ceilDiv(s.G * s.N, kWarps), int64_t(opts.smCount) * 3),
                32 * kWarps,
                s.rowBody.empty() ? "  nf::row_linear<" + spec + ", " +
                                        num(kRowChunks) + ">(a);\n"
                                  : s.rowBody,
                comment + " (one token: a warp per feature)", 0,
                maxTokens > 1 ? 1 : 0, /*bodyWaits=*/true, s.groupsAfterWait);
      functions.back().sliceable = s.rowBody.empty();
      if (s.rowOnly)
        return;
    }
    if (!row || maxTokens > 1)
      variant(fn + (row || wide ? "_narrow" : ""),
              gridOf(narrowItems, narrowCap), 1, 4, kWarps, false, false,
              row ? 2 : 0, wide ? kNarrowTokens : 0);
    if (wide && x16 && s.wideFeatureTiles && s.G == 1) {
      // A block's 8 warps own 16 features each (128 a tile) and share the
      // tile's 32 rows, staged once in shared memory: each weight byte is
      // read once per 32 rows, the rows once per 128 features (skinny items
      // read weights once per 16 rows and rows once per 32 features). The
      // LM head alone on the H200: 32 rows 288 -> 189 us, 64 rows 543 ->
      // 284 (bench/kernels/feature_tile_sweep.cu).
      constexpr int64_t kMt = 1, kNt = 4, kW = 8, kStages = 4, kKp = 8;
      const int64_t items =
          ceilDiv(s.N, kW * kMt * 16) * ceilDiv(s.maxRows, 8 * kNt);
      const int64_t smem = 2 * kKp * 8 * kNt * 64;
      addLaunch(fn + "_wide", gridOf(items, cap), 32 * kW,
                "  static_assert(nf::feature_tile_smem<" + num(kNt) + ", " +
                    num(kKp) + ">() == " + num(smem) +
                    ", \"shared memory size\");\n"
                    "  nf::feature_tile_linear<" +
                    wideSpec + ", " + num(kMt) + ", " + num(kNt) + ", " +
                    num(kW) + ", " + num(kStages) + ", " + num(kKp) + ">(a);\n",
                comment + " (feature tiles of 128, rows staged once)",
                kNarrowTokens + 1, 0, /*bodyWaits=*/true);
      launches.back().sharedBytes = static_cast<uint32_t>(smem);
    } else if (wide && x16 && dense && opts.hopperOrLater &&
               opts.matmulTerms == 1 && s.groups == "nf::DenseGroups" &&
               s.weightIndex >= 0 && s.shadowOffset >= 0 && s.rowIndex == "r" &&
               s.K % 8 == 0 && kTmaSmem <= opts.maxSharedBytes) {
      // One dense weight read from the rows' bf16 copy: TMA (nf_tma.cuh).
      emitTmaLinear(fn, wideSpec, s, comment);
    } else if (wide && dense && wide4 && 2 * ceilDiv(s.N, 32) > kWideCap) {
      // Wide layers whose 16-row items at 32 rows would not all fit on the
      // GPU at once (in_proj: 644 items for 528 blocks): items of up to 32
      // rows, each weight tile read once, in one round of three blocks an
      // SM (142 registers). On the H200, the Nano in_proj alone at 32 rows
      // 28.9 -> 21.9 us, at 64 rows 41.6 -> 36.7
      // (bench/kernels/dense_wide_sweep.cu); the bf16 plan's step at batch
      // 32 7.34 / 7.33 -> 7.23 / 7.20 ms, batch 64 10.88 / 10.80 -> 10.77
      // / 10.71 (bench/results/2026-12-01e/ab-rows32).
      const int64_t items = ceilDiv(s.maxRows, 32) * ceilDiv(s.N, 32);
      variant(fn + "_wide", gridOf(items, int64_t(opts.smCount) * 3), 2, 2,
              kWideWarps, opts.matmulTerms == 1, x16, kNarrowTokens + 1, 0, 32);
      functions.back().minBlocks = 3;
    } else if (wide) {
      const int64_t items =
          (std::min(s.G, s.maxRows) + ceilDiv(s.maxRows, 16)) *
          ceilDiv(s.N, 32);
      variant(fn + "_wide", gridOf(items, kWideCap), 2, 2, kWideWarps,
              opts.matmulTerms == 1, x16, kNarrowTokens + 1, 0);
      if (wide4) // 128 registers: ptxas took 140 for the routed experts'
        functions.back().minBlocks = 4; // up (co-launch), three an SM
    }
    return;
  }
  const int64_t nt = ceilDiv(s.N, 64);
  const int64_t tiles = (ceilDiv(s.maxRows, 64) + (s.G > 1 ? s.G : 0)) * nt;
  const int64_t gemvBlocks = ceilDiv(s.G * s.N, 8);
  addLaunch(fn, gridOf(std::max(tiles, gemvBlocks), int64_t(opts.smCount) * 4),
            256,
            "  nf::linear<" + spec + ", " + num(opts.matmulTerms) + ">(a);\n",
            comment);
}

void KernelEmitter::emitTmaLinear(const std::string &fn,
                                  const std::string &spec, const LinearSpec &s,
                                  const std::string &comment) {
  // Weights and rows stream into shared memory by TMA, ~200 KB in flight a
  // block, one block an SM. On the H200 alone (bench/kernels/
  // tma_gemv_sweep.cu), against the register-ring skinny variant: 32 rows
  // out_proj 14.2 -> 8.9 us, in_proj 21.8 -> 18.0, qkv 17.3 -> 11.8; 64 rows
  // 23.0 -> 10.8, 36.9 -> 23.9, 19.8 -> 15.3; the bf16 Nano plan's step at
  // batch 32 7.13 / 7.09 -> 6.86 / 6.83 ms, batch 64 10.76 / 10.70 -> 9.66
  // / 9.72. (Narrow steps keep skinny_linear: on TMA, with the copies
  // written in every step, batch 1 went 3.07 -> 3.14 ms and batch 8 5.02
  // -> 5.14, though out_proj alone at 8 rows took 10.5 -> 8.6 us: a block
  // of ~210 KB of shared memory cannot start on an SM before the launch
  // before it has left, where the skinny blocks fetch weights beside it.)
  includes.insert("nf_tma.cuh");
  const size_t wmap = tensorMap("NF_TENSOR_MAP_WEIGHT", s.weightIndex, 0, s.K,
                                s.N, 16 * kTmaMt);
  const int64_t tiles = ceilDiv(s.N, 16 * kTmaMt);
  auto launch = [&](const std::string &name, const TmaLinearConfig &c,
                    uint32_t minT, uint32_t maxT) {
    const size_t xmap = tensorMap("NF_TENSOR_MAP_ARENA", 0, s.shadowOffset, s.K,
                                  maxTokens, c.rows);
    const int64_t lastRows = maxT > 0 ? int64_t(maxT) : maxTokens;
    const int64_t items = tiles * ceilDiv(lastRows, c.rows);
    const std::string cfg = num(kTmaMt) + ", " + num(kTmaBk) + ", " +
                            num(c.stages) + ", " + num(c.warps) + ", " +
                            num(c.rows);
    addLaunch(name, gridOf(items, opts.smCount), 32 * (c.warps + 1),
              "  static_assert(nf::tma_linear_smem<" + cfg +
                  ">() == " + num(tmaLinearSmem(c)) +
                  ", \"shared memory size\");\n"
                  "  nf::tma_linear<" +
                  spec + ", " + cfg + ">(a, &nf_tensor_maps[" +
                  num(int64_t(wmap)) + "], &nf_tensor_maps[" +
                  num(int64_t(xmap)) + "]);\n",
              comment + " (TMA, items of " + num(c.rows) + " rows)", minT, maxT,
              /*bodyWaits=*/true);
    launches.back().sharedBytes = static_cast<uint32_t>(tmaLinearSmem(c));
  };
  const int64_t split = kTmaRows32.rows;
  launch(fn + "_wide", kTmaRows32, kNarrowTokens + 1,
         maxTokens > split ? uint32_t(split) : 0);
  if (maxTokens > split)
    launch(fn + "_wide64", kTmaRows64, uint32_t(split + 1), 0);
}

// ---------------------------------------------------------------------------
// Row-wise ops

StatusOr<size_t> KernelEmitter::embed(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 2 || out.size() != 1 || !isAct(out[0]))
    return fail(i, "expects (tokens, table) -> f32 rows");
  std::string ids;
  if (V(in[0]).kind == pl::ValueKind::Tokens)
    ids = "a->tokens";
  else if (isTensor(in[0], pl::DType::I32) && V(in[0]).cols == 1)
    ids = arenaPtr(in[0], "int32_t");
  else
    return fail(i, "token ids must be the step's tokens or an i32 column");
  auto shape = weightShape(in[1]);
  auto wt = weightType(in[1]);
  if (!wt || shape.size() != 2 || shape[1] != V(out[0]).cols)
    return fail(i, "table must be a [vocab, hidden] weight");
  const int64_t H = shape[1];
  includes.insert("nf_rows.cuh");
  addLaunch(fnName(i, "embed"), elementGrid(maxTokens * H), 256,
            "  nf::embed<" + *wt + ", " + num(H) + ">(a, " + ids + ", " +
                weightPtr(in[1]) + ", " + arenaPtr(out[0]) + ");\n",
            "nf.embed");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::rmsNorm(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 2 || out.size() != 1 || !isAct(in[0]) || !isAct(out[0]))
    return fail(i, "expects (input, weight) -> result, f32 rows");
  const int64_t H = V(in[0]).cols;
  auto wt = weightType(in[1]);
  auto eps = floatAttr(op, "epsilon");
  if (!wt || weightNumel(in[1]) != H || V(out[0]).cols != H || !eps)
    return fail(i, "weight, result or epsilon does not match " +
                       std::to_string(H) + " features");
  includes.insert("nf_rows.cuh");
  addLaunch(fnName(i, "rms_norm"), blockGrid(maxTokens), kRowThreads,
            "  nf::rms_norm<" + *wt + ", " + num(H) + ">(a, " +
                arenaPtr(in[0]) + ", " + weightPtr(in[1]) + ", " +
                doubleLit(*eps) + ", " + outPtr(out[0]) + ");\n",
            "nf.rms_norm");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::add(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 2 || out.size() != 1 || !isAct(in[0]) || !isAct(in[1]) ||
      !isAct(out[0]) || V(in[0]).cols != V(in[1]).cols ||
      V(out[0]).cols != V(in[0]).cols)
    return fail(i, "expects two f32 row tensors of one shape");
  const int64_t H = V(out[0]).cols;
  includes.insert("nf_rows.cuh");
  // add + rms_norm of the sum: one row kernel.
  if (i + 1 < ops.size() && opName(*ops[i + 1]) == "nf.rms_norm") {
    const pl::Op &norm = *ops[i + 1];
    auto nin = operands(norm), nout = results(norm);
    auto wt = nin.size() == 2 ? weightType(nin[1]) : std::nullopt;
    auto eps = floatAttr(norm, "epsilon");
    if (nin.size() == 2 && nin[0] == out[0] && nout.size() == 1 &&
        isAct(nout[0]) && V(nout[0]).cols == H && wt &&
        weightNumel(nin[1]) == H && eps) {
      addLaunch(fnName(i, "add_rms_norm"), blockGrid(maxTokens), kRowThreads,
                "  nf::add_rms_norm<" + *wt + ", " + num(H) + ">(a, " +
                    arenaPtr(in[0]) + ", " + arenaPtr(in[1]) + ", " +
                    arenaPtr(out[0]) + ", " + weightPtr(nin[1]) + ", " +
                    doubleLit(*eps) + ", " + outPtr(nout[0]) + ");\n",
                "nf.add + nf.rms_norm");
      return size_t(2);
    }
  }
  addLaunch(fnName(i, "add"), elementGrid(maxTokens * H), 256,
            "  nf::add<" + num(H) + ">(a, " + arenaPtr(in[0]) + ", " +
                arenaPtr(in[1]) + ", " + arenaPtr(out[0]) + ");\n",
            "nf.add");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::split(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  auto sizes = listAttr(op, "sizes");
  if (in.size() != 1 || !isAct(in[0]) || !sizes || sizes->size() != out.size())
    return fail(i, "expects one f32 input and one result per size");
  const int64_t ld = V(in[0]).cols;
  std::string body;
  int64_t c0 = 0;
  for (size_t r = 0; r < out.size(); ++r) {
    if (!isAct(out[r]) || V(out[r]).cols != (*sizes)[r])
      return fail(i, "result " + std::to_string(r) + " does not match size " +
                         std::to_string((*sizes)[r]));
    body += "  nf::copy_columns<" + num(ld) + ", " + num(c0) + ", " +
            num((*sizes)[r]) + ">(a, " + arenaPtr(in[0]) + ", " +
            arenaPtr(out[r]) + ");\n";
    c0 += (*sizes)[r];
  }
  if (c0 != ld)
    return fail(i, "sizes do not sum to the input's columns");
  includes.insert("nf_rows.cuh");
  addLaunch(fnName(i, "split"), elementGrid(maxTokens * ld), 256, body,
            "nf.split");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::activation(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 1 || out.size() != 1 || !isAct(in[0]) || !isAct(out[0]) ||
      V(in[0]).cols != V(out[0]).cols)
    return fail(i, "expects one f32 row tensor and a result of its shape");
  auto act = activationKind(i, "kind", true);
  if (!act)
    return act.status();
  includes.insert("nf_rows.cuh");
  const int64_t n = V(out[0]).cols;
  addLaunch(fnName(i, "activation"), elementGrid(maxTokens * n), 256,
            "  nf::activation<" + num(n) + ", " + *act + ">(a, " +
                arenaPtr(in[0]) + ", " + outPtr(out[0]) + ");\n",
            "nf.activation");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::gatedRmsNorm(size_t i, uint32_t minTokens) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 3 || out.size() != 1 || !isAct(in[0]) || !isAct(in[1]) ||
      !isAct(out[0]))
    return fail(i, "expects (y, z, weight) -> result, f32 rows");
  const int64_t I = V(in[0]).cols;
  auto groups = intAttr(op, "groups");
  auto eps = floatAttr(op, "epsilon");
  auto wt = weightType(in[2]);
  if (V(in[1]).cols != I || V(out[0]).cols != I || !wt ||
      weightNumel(in[2]) != I || !groups || *groups <= 0 || I % *groups || !eps)
    return fail(i, "shapes, groups or epsilon do not match");
  includes.insert("nf_rows.cuh");
  // A warp per (token, group) where groups are whole float4s per lane (the
  // template's choice), else a block.
  const int64_t gs = I / *groups;
  const int64_t items = maxTokens * *groups;
  addLaunch(
      fnName(i, "gated_rms_norm"),
      gs % 128 == 0 && gs <= 1024
          ? gridOf(ceilDiv(items, kRowThreads / 32), int64_t(opts.smCount) * 8)
          : blockGrid(items),
      kRowThreads,
      "  nf::gated_rms_norm<" + *wt + ", " + num(I) + ", " + num(*groups) +
          ">(a, " + arenaPtr(in[0]) + ", " + arenaPtr(in[1]) + ", " +
          weightPtr(in[2]) + ", " + doubleLit(*eps) + ", " + outPtr(out[0]) +
          ");\n",
      "nf.gated_rms_norm", minTokens);
  return size_t(1);
}

// ---------------------------------------------------------------------------
// Linear layers

StatusOr<size_t> KernelEmitter::linear(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 2 || out.size() != 1 || !isAct(in[0]) || !isAct(out[0]))
    return fail(i, "expects (input, weight) -> result, f32 rows");
  auto shape = weightShape(in[1]);
  auto wt = weightType(in[1]);
  if (!wt || shape.size() != 2 || shape[1] != V(in[0]).cols ||
      shape[0] != V(out[0]).cols)
    return fail(i, "weight does not match the input and result");
  LinearSpec s;
  s.wtype = *wt;
  s.N = shape[0];
  s.K = shape[1];
  s.weight = weightPtr(in[1]);
  s.weightIndex = V(in[1]).weight;
  setInput(s, in[0]);
  s.rowIndex = "r";
  s.maxRows = maxTokens;
  std::string rn = "static_cast<long long>(r) * ";
  std::string label = opName(op) == "nf.lm_head"           ? "lm_head"
                      : opName(op) == "nf_moe.latent_proj" ? "latent_proj"
                                                           : "linear";
  // The LM head computes only the rows whose logits the runtime reads
  // (a->logit_rows: the last token of each sequence unless every token's
  // logits are asked for), when nothing else reads its result.
  if (label == "lm_head" && usersOf(out[0]).empty()) {
    s.wideFeatureTiles = true;
    s.groups = "nf::LogitRowGroups";
    s.rowIndex = "nf::logit_row(a, r)";
    rn = "static_cast<long long>(nf::logit_row(a, r)) * ";
  }
  std::string comment = opName(op);
  size_t consumed = 1;
  std::string store, store2;
  // With a decode conv fused (below): the split piece it reads, and the
  // store without the conv.
  int convPiece = -1;
  std::string rawStore;
  std::vector<size_t> fused;

  // linear + split [+ append]: the epilogue writes the split columns.
  if (i + 1 < ops.size() && opName(*ops[i + 1]) == "nf.split" &&
      operands(*ops[i + 1]) == std::vector<int>{out[0]}) {
    const pl::Op &sp = *ops[i + 1];
    auto pieces = results(sp);
    auto sizes = listAttr(sp, "sizes");
    if (!sizes || sizes->size() != pieces.size())
      return fail(i + 1, "missing or mismatched 'sizes'");
    int64_t sum = 0;
    for (size_t r = 0; r < pieces.size(); ++r) {
      if (!isAct(pieces[r]) || V(pieces[r]).cols != (*sizes)[r])
        return fail(i + 1,
                    "result " + std::to_string(r) + " does not match its size");
      sum += (*sizes)[r];
    }
    if (sum != s.N)
      return fail(i + 1, "sizes do not sum to the input's columns");
    // K/V rows of a following append, by split piece.
    std::map<int, std::string> cacheOf;
    if (i + 2 < ops.size() && opName(*ops[i + 2]) == "nf_kv.append") {
      const pl::Op &ap = *ops[i + 2];
      auto ain = operands(ap);
      const pl::Storage *st = storageOf(ap, pl::StorageKind::KVCache);
      if (st && ain.size() == 3 && V(ain[0]).kind == pl::ValueKind::Batch) {
        auto k = std::find(pieces.begin(), pieces.end(), ain[1]);
        auto v = std::find(pieces.begin(), pieces.end(), ain[2]);
        const int64_t row = st->kv_heads() * st->head_dim();
        if (k != pieces.end() && v != pieces.end() && V(ain[1]).cols == row &&
            V(ain[2]).cols == row && st->dtype() == pl::DType::F32) {
          includes.insert("nf_attention.cuh");
          // The row's cache offset (page table lookups) is the store's
          // row context: GEMM epilogues compute it once per row.
          s.rowCtx = "nf::kv_row_offset<" + num(row) + ", " +
                     num(st->page_size()) + ">(a, r)";
          cacheOf[static_cast<int>(k - pieces.begin())] =
              "nf::storage(a, " + num(2 * ap.storage()) + ")[ctx + ";
          cacheOf[static_cast<int>(v - pieces.begin())] =
              "nf::storage(a, " + num(2 * ap.storage() + 1) + ")[ctx + ";
          consumed = 3;
          label = "qkv_append";
          comment += " + nf.split + nf_kv.append";
        }
      }
    }
    // A decode conv of a split piece (one token per sequence): the
    // piece's store is the conv of its channel (nf::causal_conv_decode),
    // and the piece itself is stored only if something else reads it.
    std::string convStore;
    if (consumed == 1 && phase == "decode" && i + 2 < ops.size() &&
        opName(*ops[i + 2]) == "nf_kv.causal_conv" &&
        stringAttr(*ops[i + 2], "mode").value_or("") == "decode") {
      const pl::Op &cv = *ops[i + 2];
      auto cin = operands(cv), cout = results(cv);
      const pl::Storage *st = storageOf(cv, pl::StorageKind::MambaState);
      auto piece = cin.size() >= 3
                       ? std::find(pieces.begin(), pieces.end(), cin[1])
                       : pieces.end();
      if (st && piece != pieces.end() && (cin.size() == 3 || cin.size() == 4) &&
          cout.size() == 1 && isAct(cout[0]) &&
          V(cin[0]).kind == pl::ValueKind::Batch) {
        const int64_t CD = st->conv_dim(), KW = st->conv_window() + 1;
        auto wt = weightType(cin[2]);
        const bool bias = cin.size() == 4;
        auto bt = bias ? weightType(cin[3]) : wt;
        if (wt && bt && V(cin[1]).cols == CD && V(cout[0]).cols == CD &&
            weightNumel(cin[2]) == CD * KW &&
            (!bias || weightNumel(cin[3]) == CD)) {
          includes.insert("nf_mamba.cuh");
          convPiece = static_cast<int>(piece - pieces.begin());
          convStore = "      nf::causal_conv_decode<" + *wt + ", " + *bt +
                      ", " + num(CD) + ", " + num(KW) + ", " +
                      (bias ? "true" : "false") + ">(a, r, COL, v, " +
                      weightPtr(cin[2]) + ", " +
                      (bias ? weightPtr(cin[3])
                            : "static_cast<const " + *bt + " *>(nullptr)") +
                      ", nf::storage(a, " + num(2 * cv.storage()) + "), " +
                      arenaPtr(cout[0]) + ");\n";
          consumed = 3;
          label += "_split_conv";
          comment += " + nf.split + nf_kv.causal_conv (decode, per channel "
                     "in the epilogue)";
        }
      }
    }
    if (consumed == 1) {
      consumed = 2;
      label += "_split";
      comment += " + nf.split";
    }
    fused = {i + 1};
    if (consumed == 3)
      fused.push_back(i + 2);
    int64_t c0 = 0;
    // Column pairs never straddle pieces of even widths: then store2 too.
    bool pairs = cacheOf.empty();
    for (size_t r = 0; r < pieces.size(); ++r) {
      const int64_t w = (*sizes)[r];
      pairs = pairs && w % 2 == 0;
      const std::string col = c0 ? "(n - " + num(c0) + ")" : std::string("n");
      std::string piece = "      " + arenaPtr(pieces[r]) + "[" + rn + num(w) +
                          " + " + col + "] = v;\n";
      const std::string rawPiece = piece;
      if (static_cast<int>(r) == convPiece) {
        std::string conv = convStore;
        conv.replace(conv.find("COL"), 3, col);
        piece = (needed(pieces[r], {i + 2}) ? piece : std::string()) + conv;
        pairs = false; // per element: the conv's store has no pair form
      }
      std::string piece2 = "      nf::store_act2(" + arenaPtr(pieces[r]) +
                           " + " + rn + num(w) + " + " + col + ", v0, v1);\n";
      if (auto it = cacheOf.find(static_cast<int>(r)); it != cacheOf.end())
        piece += "      " + it->second + col + "] = v;\n";
      const bool last = r + 1 == pieces.size();
      const std::string open =
          r == 0 ? (last ? "    {" : "    if (n < " + num(c0 + w) + ") {")
                 : (last ? " else {" : " else if (n < " + num(c0 + w) + ") {");
      store += open + "\n" + piece + "    }";
      store2 += open + "\n" + piece2 + "    }";
      rawStore += open + "\n" + rawPiece + "    }";
      c0 += w;
    }
    store += "\n";
    rawStore += "\n";
    store2 = pairs ? store2 + "\n" : std::string();
  } else if (i + 1 < ops.size() && opName(*ops[i + 1]) == "nf.activation" &&
             operands(*ops[i + 1]) == std::vector<int>{out[0]}) {
    // linear + activation: in the epilogue.
    const pl::Op &act = *ops[i + 1];
    auto aout = results(act);
    auto kind = activationKind(i + 1, "kind", true);
    if (!kind)
      return kind.status();
    if (aout.size() != 1 || !isAct(aout[0]) || V(aout[0]).cols != s.N)
      return fail(i + 1, "result does not match the linear layer");
    store = storeAct(aout[0], rn + num(s.N) + " + n",
                     "nf::activate<" + *kind + ">(v)");
    store2 = storeAct2(aout[0], rn + num(s.N) + " + n",
                       "nf::activate<" + *kind + ">(v0)",
                       "nf::activate<" + *kind + ">(v1)");
    fused = {i + 1};
    consumed = 2;
    label += std::string("_") + stringAttr(act, "kind").value_or("act");
    comment += " + nf.activation";
  }
  bool raw = consumed == 1;
  if (!raw) {
    raw = isOutput(out[0]);
    for (size_t u : usersOf(out[0]))
      raw |= std::find(fused.begin(), fused.end(), u) == fused.end();
  }
  if (raw) {
    store = storeAct(out[0], rn + num(s.N) + " + n", "v") + store;
    // Pairs for the result alone (fused stores besides it keep per element).
    store2 = consumed == 1
                 ? storeAct2(out[0], rn + num(s.N) + " + n", "v0", "v1")
                 : std::string();
  }
  s.store = store;
  s.store2 = store2;
  // The conv in the epilogue pays its window's dependent loads once per
  // element, one element after another (the stores may alias the next
  // loads): cheap for the few rows of narrow steps (Nano at batch 1: 3.19
  // -> 3.16 ms), but 44 us against 22 + 3.3 for in_proj and the conv at
  // batch 32 on the H200. The wide variants store xBC, and a conv launch
  // follows for their steps.
  const bool wideConv = convPiece >= 0 && phase == "decode" &&
                        s.wtype == "nf::bf16" && s.K % 32 == 0 &&
                        maxTokens > kNarrowTokens;
  if (wideConv)
    s.wideStore = rawStore;
  emitLinear(fnName(i, label), s, comment);
  if (wideConv)
    if (auto conv = causalConv(i + 2, kNarrowTokens + 1); !conv)
      return conv;
  return consumed;
}

StatusOr<size_t> KernelEmitter::sharedExpert(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 3 || out.size() != 1 || !isAct(in[0]) || !isAct(out[0]))
    return fail(i, "expects (input, up, down) -> result");
  auto up = weightShape(in[1]), down = weightShape(in[2]);
  auto ut = weightType(in[1]), dt = weightType(in[2]);
  const int64_t H = V(in[0]).cols;
  if (!ut || !dt || up.size() != 2 || down.size() != 2 || up[1] != H ||
      down[1] != up[0] || down[0] != V(out[0]).cols)
    return fail(i, "weights do not match the input");
  auto act = activationKind(i, "activation", false);
  if (!act)
    return act.status();
  const int64_t I = up[0];
  // The hidden rows as bf16 where the down GEMM would round them anyway
  // (as bf16RowValues does for values).
  const bool hidden16 =
      bf16RowsAllowed(opts) && onBf16Planes(phase, *dt == "nf::bf16", I);
  const int64_t hidden = newScratch(maxTokens * I * (hidden16 ? 2 : 4));
  const std::string hid =
      std::string(hidden16 ? "nf::arena<unsigned short>" : "nf::arena<float>") +
      "(a, " + num(hidden) + "ll)";
  // Decode: a bf16 copy for the wide down projection (as decodeShadows
  // gives values).
  const bool hiddenCopy = decodeCopiesOn(phase, opts, maxTokens) &&
                          *dt == "nf::bf16" && I % 32 == 0;
  const std::string hidCopy =
      hiddenCopy ? "nf::arena<unsigned short>(a, " +
                       num(newScratch(maxTokens * I * 2)) + "ll)"
                 : std::string();
  const std::string hidOut = hiddenCopy ? shadowedRows(hid, hidCopy) : hid;
  LinearSpec s1;
  s1.wtype = *ut;
  s1.N = I;
  s1.K = H;
  s1.weight = weightPtr(in[1]);
  setInput(s1, in[0]);
  s1.rowIndex = "r";
  s1.store = "    nf::store_act(" + hidOut + " + static_cast<long long>(r) * " +
             num(I) + " + n, nf::activate<" + *act + ">(v));\n";
  s1.store2 = "    nf::store_act2(" + hidOut +
              " + static_cast<long long>(r) * " + num(I) +
              " + n, nf::activate<" + *act + ">(v0), nf::activate<" + *act +
              ">(v1));\n";
  s1.maxRows = maxTokens;
  s1.wideWithExperts = true;
  emitLinear(fnName(i, "shared_up"), s1,
             "nf_moe.shared_expert: hidden = act(x . up^T) (codegen scratch "
             "at " +
                 num(hidden) + (hidden16 ? ", bf16 rows)" : ")"));
  LinearSpec s2;
  s2.wtype = *dt;
  s2.N = down[0];
  s2.K = I;
  s2.weight = weightPtr(in[2]);
  (hidden16 ? s2.input16 : s2.input) = hid;
  s2.shadow16 = hidCopy;
  s2.rowIndex = "r";
  // Followed by nf.add of its result and another row of the same width
  // (the routed experts' combined rows): the epilogue adds that row and
  // writes the sum instead (same value as the add: one f32 addition).
  std::string dst = arenaPtr(out[0]), addend, addend2;
  size_t consumed = 1;
  if (i + 1 < ops.size() && opName(*ops[i + 1]) == "nf.add" &&
      !needed(out[0], {i + 1})) {
    auto ain = operands(*ops[i + 1]), aout = results(*ops[i + 1]);
    if (ain.size() == 2 && aout.size() == 1 &&
        (ain[0] == out[0]) != (ain[1] == out[0])) {
      const int other = ain[0] == out[0] ? ain[1] : ain[0];
      if (isAct(other) && isAct(aout[0]) && V(other).cols == s2.N &&
          V(aout[0]).cols == s2.N) {
        dst = arenaPtr(aout[0]);
        addend = " + " + arenaPtr(other) + "[static_cast<long long>(r) * " +
                 num(s2.N) + " + n]";
        addend2 = "    const float2 o = *reinterpret_cast<const float2 *>(" +
                  arenaPtr(other) + " + static_cast<long long>(r) * " +
                  num(s2.N) + " + n);\n";
        consumed = 2;
      }
    }
  }
  s2.store = "    " + dst + "[static_cast<long long>(r) * " + num(s2.N) +
             " + n] = v" + addend + ";\n";
  s2.store2 = addend2 + "    nf::store_act2(" + dst +
              " + static_cast<long long>(r) * " + num(s2.N) + " + n, v0" +
              (addend2.empty() ? ", v1" : " + o.x, v1 + o.y") + ");\n";
  s2.maxRows = maxTokens;
  s2.wideWithExperts = true;
  emitLinear(fnName(i, "shared_down"), s2,
             consumed == 2
                 ? "nf_moe.shared_expert + nf.add: out = hidden . down^T + "
                   "the routed rows"
                 : "nf_moe.shared_expert: out = hidden . down^T");
  return consumed;
}

/// Decode's "moe_route_shared_expert" and "moe_shared_and_routed_experts":
/// the shared expert's GEMVs run side by side with other launches of its
/// layer (sideBySide), which leave most of the GPU idle or read other
/// weights.
///  - Steps of few tokens (the narrow variants, or every step without the
///    routed experts in the kernel): beside the routing chain, its up
///    projection with the router's logits, its down projection with the
///    ranking (moe_route); the dispatch follows.
///  - Steps of more tokens (the wide variants, with the routed experts in
///    the kernel): beside the routed projections of the same side (the
///    launch of up projections, then of down projections), so the routing
///    chain (logits, ranking, dispatch) waits for nothing but itself; the
///    logits' blocks first ask L2 for the shared expert's weights, which the
///    chain would otherwise leave the memory idle for.
/// Measured on the H200 (Nano shape, bf16 inputs): batch 32 8.22 -> 7.95 ms,
/// batch 64 12.6 -> 12.3, batch 1 and 8 unchanged; all steps beside the
/// routed experts made batch 1 3.17 -> 3.37 ms (the shared expert then
/// streams in the experts' launches instead of during the chain)
/// (bench/results/2026-12-01b).
StatusOr<size_t> KernelEmitter::routeSharedExpert(size_t i) {
  const size_t l0 = launches.size();
  StatusOr<size_t> n = sharedExpert(i);
  if (!n)
    return n;
  if (*n != 1)
    return fail(i, "internal: the shared expert took the ops after it");
  const size_t l1 = launches.size();
  // Its up variants first, then the down ones (as many of each).
  const size_t variants = (l1 - l0) / 2;
  n = route(i + 1);
  if (!n)
    return n;
  const size_t l2 = launches.size();
  size_t consumed = 1 + *n;
  // The rest of "moe_shared_and_routed_experts": dispatch, up, down.
  const size_t d = i + consumed;
  const bool withExperts = d + 2 < ops.size() &&
                           opName(*ops[d]) == "nf_moe.dispatch" &&
                           opName(*ops[d + 1]) == "nf_moe.expert_up" &&
                           opName(*ops[d + 2]) == "nf_moe.expert_down";
  size_t l3 = l2, l4 = l2, l5 = l2; // ends of dispatch, ups, downs
  if (withExperts) {
    for (size_t k = 0; k < 3; ++k) {
      n = k == 0 ? dispatch(d) : expert(d + k, k == 1);
      if (!n)
        return n;
      (k == 0 ? l3 : k == 1 ? l4 : l5) = launches.size();
    }
    consumed += 3;
  }
  auto endsWith = [](const std::string &s, const std::string &tail) {
    return s.size() >= tail.size() &&
           s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  // The layer's end (FuseKernels' "moe_layer_rms_norm"): the combine, the
  // adds and the next norm, one launch after the down projections.
  size_t l6 = l5;
  if (withExperts && combineTail(d + 3)) {
    n = combine(d + 3);
    if (!n)
      return n;
    consumed += *n;
    l6 = launches.size();
  }
  // Steps of one token (the up and down projections' first variants,
  // row_linear's): the routed projections on the ranking's slots, the down
  // projection ending the layer (oneTokenExperts), in place of those
  // variants; the dispatch and the layer's end launch then run for more
  // tokens only. On the H200 (Nano, batch 1): see row_experts_combine.
  if (l6 == l5 + 1 && l4 > l3 && l5 > l4 &&
      endsWith(launches[l3].function, "_row") &&
      endsWith(launches[l4].function, "_row") &&
      launches[l3].maxTokens == launches[l4].maxTokens &&
      launches[l3].maxTokens <= 1 && oneTokenExperts(d)) {
    for (size_t k = 0; k < 2; ++k) {
      const size_t to = k == 0 ? l3 : l4, from = l6 + k;
      launches[to] = launches[from];
      functions[to] = functions[from];
    }
    launches.resize(l6);
    functions.resize(l6);
    launches[l2].minTokens = 2; // the dispatch
    launches[l5].minTokens = 2; // moe_combine_add_rms_norm
  }
  const int E = static_cast<int>(V(results(*ops[i + 1])[0]).cols);
  bool sliceable = true;
  for (size_t l = l0; l < l2; ++l)
    sliceable = sliceable && functions[l].sliceable;
  // Other forms (e.g. f32 weights: the general linear, whose template
  // indexes the whole grid) run one after the other, and so do routers of
  // more than 256 experts: a co-launch's static shared memory is both
  // parts' (the ranking's 16 bytes an expert) and must stay within 48 KB.
  if (!sliceable || E > 256 || variants == 0 || l1 - l0 != 2 * variants ||
      l2 - l1 != 2 || !endsWith(launches[l1].function, "router_logits") ||
      !endsWith(launches[l1 + 1].function, "moe_route"))
    return consumed;
  // The last variant of each GEMV is the wide one where steps have more
  // than kNarrowTokens tokens; the others (one token, few tokens) run
  // beside the routing chain.
  bool split = withExperts && variants >= 2 && l3 - l2 == 1 &&
               l4 - l3 == variants && l5 - l4 == variants &&
               launches[l0 + variants - 1].minTokens > kNarrowTokens;
  // (The wide variants run beside the shared expert's.)
  split = split && functions[l3 + variants - 1].sliceable &&
          functions[l4 + variants - 1].sliceable;
  if (!split) {
    // Co-launches need one block size: GEMV variants of another (the wide
    // ones) run one after the other.
    for (size_t v = 0; v < variants; ++v)
      if (launches[l0 + v].block != launches[l1].block ||
          launches[l0 + variants + v].block != launches[l1 + 1].block)
        return consumed;
    // Logits: a warp per (token, expert), 8 a block; ranking: a block per
    // token. Ranking with the down projection first (the later indices).
    coLaunch(l1 + 1, l0 + variants, variants,
             [](int64_t t) { return static_cast<uint32_t>(t); });
    coLaunch(l1 - variants, l0, variants, [E](int64_t t) {
      return static_cast<uint32_t>(ceilDiv(t * E, 8));
    });
    return consumed;
  }
  // Variants [0, few) of each GEMV take few tokens, variant `few` is the
  // wide one; the routing launches run for every step size, so each takes a
  // copy per token range.
  const size_t few = variants - 1;
  const CudaLaunchInfo wide = launches[l0 + few];
  auto ranged = [&](size_t l, const CudaLaunchInfo &range, int64_t blocks,
                    const std::string &suffix) {
    CudaLaunchInfo r = launches[l];
    r.grid = std::min<uint32_t>(r.grid, static_cast<uint32_t>(blocks));
    r.minTokens = range.minTokens;
    r.maxTokens = range.maxTokens;
    r.function += suffix;
    return r;
  };
  auto named = [&](const CudaLaunchInfo &a, size_t b) {
    return a.function + "_and_" + unprefixed(launches[b].function);
  };
  std::string prefetch;
  for (int w : {operands(*ops[i])[1], operands(*ops[i])[2]})
    if (weightType(w) == std::optional<std::string>("nf::bf16"))
      prefetch += "  nf::prefetch_l2(a.block(), a.grid(), " + weightPtr(w) +
                  ", " + num(weightNumel(w) * 2) + "ll);\n";
  std::vector<Merged> seq;
  for (size_t v = 0; v < few; ++v) {
    const CudaLaunchInfo &up = launches[l0 + v];
    const CudaLaunchInfo logits =
        ranged(l1, up, ceilDiv(int64_t(up.maxTokens) * E, 8), "");
    seq.push_back(sideBySideOf(logits, functions[l1], up, functions[l0 + v],
                               logits.grid, named(logits, l0 + v)));
  }
  // (A warp per 4 tokens x 4 experts for the wide logits, each gate row
  // read once per 4 tokens, made batch 32 slower on the H200: 8.01 -> 8.23
  // ms, bench/results/2026-12-01b/ab-router-tiled.)
  FunctionText logitsWide = functions[l1];
  // The prefetches after the wait: asked for before it, they competed with
  // the launch before (an add + RMSNorm whose rows are on the step's
  // critical path; H200, Nano at batch 32: part of 7.19 -> 7.16 ms with the
  // down projection's early fetch, bench/results/2026-12-02).
  {
    const std::string trigger = "  nf::allow_next_grid();\n";
    const size_t at = logitsWide.body.find(trigger);
    if (at == std::string::npos)
      internalError = "router logits without a trigger line";
    else
      logitsWide.body.insert(at + trigger.size(), prefetch);
  }
  const CudaLaunchInfo logitsWideLaunch =
      ranged(l1, wide, launches[l1].grid, "_wide");
  seq.push_back({logitsWideLaunch, logitsWide});
  for (size_t v = 0; v < few; ++v) {
    const size_t down = l0 + variants + v;
    const CudaLaunchInfo route =
        ranged(l1 + 1, launches[down], launches[down].maxTokens, "");
    seq.push_back(sideBySideOf(route, functions[l1 + 1], launches[down],
                               functions[down], route.grid,
                               named(route, down)));
  }
  seq.push_back({ranged(l1 + 1, wide, launches[l1 + 1].grid, "_wide"),
                 functions[l1 + 1]});
  seq.push_back({launches[l2], functions[l2]}); // dispatch
  // The routed projections: up, then down, each its few-token variants
  // alone and its wide one beside the shared expert's.
  for (size_t v = 0; v < few; ++v)
    seq.push_back({launches[l3 + v], functions[l3 + v]});
  seq.push_back(pairVariants(l0 + few, l3 + few, 1)[0]);
  for (size_t v = 0; v < few; ++v)
    seq.push_back({launches[l4 + v], functions[l4 + v]});
  seq.push_back(pairVariants(l0 + variants + few, l4 + few, 1)[0]);
  for (size_t l = l5; l < l6; ++l) // the layer's end
    seq.push_back({launches[l], functions[l]});
  launches.resize(l0);
  functions.resize(l0);
  for (auto &[l, f] : seq) {
    launches.push_back(l);
    functions.push_back(f);
  }
  return consumed;
}

StatusOr<size_t> KernelEmitter::expert(size_t i, bool up) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 3 || out.size() != 1 ||
      V(in[1]).kind != pl::ValueKind::Dispatch ||
      !isTensor(out[0], pl::DType::F32) ||
      V(out[0]).rows != pl::Rows::Assignments ||
      !isTensor(in[0], pl::DType::F32) ||
      V(in[0]).rows != (up ? pl::Rows::Tokens : pl::Rows::Assignments))
    return fail(i, "expects (input, dispatch, weight) -> assignment rows");
  const ValueInfo &d = V(in[1]);
  auto shape = weightShape(in[2]);
  auto wt = weightType(in[2]);
  const pl::Weight *w = weightOf(in[2]);
  if (!wt || !w || shape.size() != 3 || shape[0] != d.numExperts ||
      shape[2] != V(in[0]).cols || shape[1] != V(out[0]).cols)
    return fail(i, "weight is not [experts, out, in] stacked experts");
  LinearSpec s;
  s.wtype = *wt;
  s.N = shape[1];
  s.K = shape[2];
  s.G = d.numExperts;
  // The down projection follows the up projection of the same dispatch,
  // which lets the next launch start only after its own wait: the dispatch
  // is complete when the down projection starts, so it reads the groups and
  // fetches its first weights before waiting (H200, Nano: batch 1 3.12 ->
  // 3.09 ms, batch 32 7.19 -> 7.16 with the router's prefetch moved,
  // bench/results/2026-12-02).
  const bool groupsEarly =
      !up && i > 0 && opName(*ops[i - 1]) == "nf_moe.expert_up" &&
      operands(*ops[i - 1]).size() == 3 && operands(*ops[i - 1])[1] == in[1];
  s.groups = "nf::DispatchGroups<" + num(d.numExperts) + ", " + num(d.offset) +
             "ll" + (groupsEarly ? ", true>" : ">");
  s.groupsAfterWait = !groupsEarly;
  s.weight = weightPtr(in[2]) + " + static_cast<long long>(g) * " +
             num(s.N * s.K) + "ll";
  setInput(s, in[0]);
  s.rowIndex = up ? "row_token(a)[r]" : "r";
  s.rowsPerToken = up ? 1 : d.maxPerToken;
  std::string act;
  if (up) {
    auto kind = activationKind(i, "activation", false);
    if (!kind)
      return kind.status();
    act = *kind;
  }
  auto valueOf = [&](const std::string &v) {
    return up ? "nf::activate<" + act + ">(" + v + ")" : v;
  };
  const std::string index = "static_cast<long long>(r) * " + num(s.N) + " + n";
  s.store = storeAct(out[0], index, valueOf("v"));
  s.store2 = storeAct2(out[0], index, valueOf("v0"), valueOf("v1"));
  s.maxRows = maxTokens * d.maxPerToken;
  emitLinear(fnName(i, up ? "expert_up" : "expert_down"), s, opName(op));
  return size_t(1);
}

/// Steps of one token in a decode MoE layer that ends in
/// moe_combine_add_rms_norm (combineTail at d + 3): the routed experts read
/// the ranking's slots directly (nf::SlotGroups), so the dispatch does not
/// run, and the down projection ends the layer itself
/// (nf::row_experts_combine: the combine, both adds and the next norm), so
/// moe_combine_add_rms_norm does not run. Appends the up and down
/// projections' "_row" launches (token range: as emitLinear's row variant);
/// false (nothing appended) where the layer does not fit this form.
bool KernelEmitter::oneTokenExperts(size_t d) {
  if (d + 3 >= ops.size() || opName(*ops[d]) != "nf_moe.dispatch" ||
      opName(*ops[d + 1]) != "nf_moe.expert_up" ||
      opName(*ops[d + 2]) != "nf_moe.expert_down")
    return false;
  std::optional<CombineTail> c = combineTail(d + 3);
  if (!c)
    return false;
  auto din = operands(*ops[d]), dout = results(*ops[d]);
  auto uin = operands(*ops[d + 1]), uout = results(*ops[d + 1]);
  auto win = operands(*ops[d + 2]), wout = results(*ops[d + 2]);
  auto cin = operands(*ops[d + 3]);
  if (din.size() != 2 || dout.size() != 1 || uin.size() != 3 ||
      uout.size() != 1 || win.size() != 3 || wout.size() != 1 ||
      cin.size() != 3 || uin[1] != dout[0] || win[1] != dout[0] ||
      win[0] != uout[0] || cin[0] != wout[0] || cin[1] != dout[0])
    return false;
  const ValueInfo &disp = V(dout[0]);
  const int64_t KW = V(din[0]).cols;
  auto upShape = weightShape(uin[2]), downShape = weightShape(win[2]);
  const std::optional<std::string> bf16("nf::bf16");
  // The hidden rows read as f32 (SlotGroups rows are slot rows, row_linear
  // and row_experts_combine read S::row); at most 8 slots (a register
  // per slot and lane).
  if (KW < 1 || KW > 8 || V(cin[2]).cols != KW || KW > disp.maxPerToken ||
      weightType(uin[2]) != bf16 || weightType(win[2]) != bf16 ||
      upShape.size() != 3 || downShape.size() != 3 || upShape[2] % 32 ||
      downShape[2] % 32 || rowsBf16(uin[0]) || rowsBf16(uout[0]) ||
      !isTensor(uin[0], pl::DType::F32) || V(uin[0]).cols != upShape[2] ||
      downShape[2] != upShape[1] || downShape[1] != V(c->sum).cols)
    return false;
  auto act = activationKind(d + 1, "activation", false);
  if (!act)
    return false;
  const std::string groups =
      "nf::SlotGroups<" + num(KW) + ", " + num(disp.numExperts) + ", " +
      num(V(din[0]).offset) + "ll, " + num(V(din[1]).offset) + "ll";
  auto slotSpec = [&](int weight, const std::vector<int64_t> &shape,
                      bool early) {
    LinearSpec s;
    s.wtype = "nf::bf16";
    s.N = shape[1];
    s.K = shape[2];
    s.G = KW;
    s.groups = groups + (early ? ", true>" : ">");
    s.groupsAfterWait = !early;
    s.weight = weightPtr(weight) +
               " + static_cast<long long>(expert(a, g)) * " + num(s.N * s.K) +
               "ll";
    s.maxRows = KW;
    s.rowOnly = true;
    return s;
  };
  LinearSpec up = slotSpec(uin[2], upShape, false);
  setInput(up, uin[0]);
  up.rowIndex = "token_of(a, r)";
  const std::string index = "static_cast<long long>(r) * " + num(up.N) + " + n";
  up.store = storeAct(uout[0], index, "nf::activate<" + *act + ">(v)");
  emitLinear(fnName(d + 1, "expert_up_one"), up,
             "nf_moe.expert_up of one token: the ranking's slots (no "
             "dispatch)");
  const std::string fn = fnName(d + 2, "expert_down_one");
  LinearSpec down = slotSpec(win[2], downShape, true);
  setInput(down, uout[0]);
  down.rowIndex = "r";
  down.store = "    (void)a; (void)r; (void)n; (void)v;\n"; // sums instead
  text << "// Blocks of " << fn << "_row done (row_experts_combine).\n"
       << "__device__ unsigned " << fn << "_done;\n";
  down.rowBody = "  nf::row_experts_combine<" + fn + "_spec, " +
                 num(kRowChunks) + ">(a, " + arenaPtr(cin[2]) + ", " +
                 arenaPtr(c->shared) + ", " + arenaPtr(c->residual) + ", " +
                 arenaPtr(c->sum) + ", " + weightPtr(c->normWeight) + ", " +
                 doubleLit(c->eps) + ", " + outPtr(c->out) + ", &" + fn +
                 "_done);\n";
  emitLinear(fn, down,
             "nf_moe.expert_down + nf_moe.combine + nf.add (shared expert) + "
             "nf.add + nf.rms_norm of one token: a warp per feature over the "
             "slots, the last block normalises");
  return true;
}

// ---------------------------------------------------------------------------
// Mamba

StatusOr<size_t> KernelEmitter::causalConv(size_t i, uint32_t minTokens) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  const pl::Storage *st = storageOf(op, pl::StorageKind::MambaState);
  if (!st)
    return fail(i, "needs a MambaState storage");
  if (in.size() < 3 || in.size() > 4 || out.size() != 1 ||
      V(in[0]).kind != pl::ValueKind::Batch || !isAct(in[1]) || !isAct(out[0]))
    return fail(i, "expects (batch, input, weight[, bias]) -> result");
  const int64_t CD = st->conv_dim(), KW = st->conv_window() + 1;
  auto wt = weightType(in[2]);
  if (!wt || V(in[1]).cols != CD || V(out[0]).cols != CD ||
      weightNumel(in[2]) != CD * KW)
    return fail(i, "input / weight do not match the conv state (" +
                       std::to_string(CD) + " channels, kernel " +
                       std::to_string(KW) + ")");
  const bool bias = in.size() == 4;
  std::optional<std::string> bt = bias ? weightType(in[3]) : wt;
  if (!bt || (bias && weightNumel(in[3]) != CD))
    return fail(i, "bias must have " + std::to_string(CD) + " elements");
  includes.insert("nf_mamba.cuh");
  const std::string targs = "<" + *wt + ", " + *bt + ", " + num(CD) + ", " +
                            num(KW) + ", " + (bias ? "true" : "false") + ">";
  const std::string biasPtr =
      bias ? weightPtr(in[3]) : "static_cast<const " + *bt + " *>(nullptr)";
  const std::string window = "nf::storage(a, " + num(2 * op.storage()) + ")";
  const std::string mode = stringAttr(op, "mode").value_or("prefill");
  if (mode == "decode") {
    addLaunch(fnName(i, "causal_conv"), elementGrid(maxTokens * CD), 256,
              "  nf::causal_conv_seq" + targs + "(a, " + arenaPtr(in[1]) +
                  ", " + weightPtr(in[2]) + ", " + biasPtr + ", " + window +
                  ", " + arenaPtr(out[0]) + ");\n",
              "nf_kv.causal_conv (decode: one thread per sequence and "
              "channel)",
              minTokens);
    return size_t(1);
  }
  addLaunch(fnName(i, "causal_conv"), elementGrid(ceilDiv(maxTokens, 8) * CD),
            256,
            "  nf::causal_conv_out" + targs + "(a, " + arenaPtr(in[1]) + ", " +
                weightPtr(in[2]) + ", " + biasPtr + ", " + window + ", " +
                arenaPtr(out[0]) + ");\n",
            "nf_kv.causal_conv: outputs (reads the old conv window)");
  addLaunch(fnName(i, "conv_window"), elementGrid(maxTokens * CD), 256,
            "  nf::causal_conv_window<" + num(CD) + ", " + num(KW) + ">(a, " +
                arenaPtr(in[1]) + ", " + window + ");\n",
            "nf_kv.causal_conv: advance the conv window");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::ssm(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  const pl::Storage *st = storageOf(op, pl::StorageKind::MambaState);
  if (!st)
    return fail(i, "needs a MambaState storage");
  if (in.size() != 6 || out.size() != 1 ||
      V(in[0]).kind != pl::ValueKind::Batch || !isAct(in[1]) || !isAct(in[2]) ||
      !isAct(out[0]))
    return fail(i, "expects (batch, xbc, dt, dt_bias, A_log, D) -> y");
  const int64_t NH = st->num_heads(), P = st->head_dim(), N = st->state_size(),
                CD = st->conv_dim();
  if (NH <= 0 || P <= 0 || N <= 0 || CD <= NH * P ||
      (CD - NH * P) % (2 * N) != 0)
    return fail(i, "bad mamba state sizes");
  const int64_t G = (CD - NH * P) / (2 * N);
  auto t3 = weightType(in[3]), t4 = weightType(in[4]), t5 = weightType(in[5]);
  if (NH % G || V(in[1]).cols != CD || V(in[2]).cols != NH ||
      V(out[0]).cols != NH * P || !t3 || !t4 || !t5 ||
      weightNumel(in[3]) != NH || weightNumel(in[4]) != NH ||
      weightNumel(in[5]) != NH)
    return fail(i, "operands do not match the state");
  auto lo = floatAttr(op, "time_step_min"), hi = floatAttr(op, "time_step_max");
  if (!lo || !hi)
    return fail(i, "missing time_step_min / time_step_max");
  // Tiling (nf_mamba.cuh): NS threads per head channel, each holding
  // N / NS (<= 16 where possible) state values; PT channels per block.
  int64_t NS = 1;
  while (NS < 32 && (N / NS > 16) && N % (NS * 2) == 0)
    NS *= 2;
  int64_t PT = P;
  while (PT > 1 && (P % PT != 0 || PT * NS > 128))
    --PT;
  // TC tokens per staged chunk: three chunks of B, C, x and dt plus the
  // chunk's partial y sums in static shared memory (nf_mamba.cuh). Decode
  // (a token per sequence) stages one: chunks sized for prefill (11 tokens
  // at the Nano shape, 42 KB a block) would limit it to 5 blocks per SM.
  const int64_t perToken = ((2 * N + PT + 1) * 3 + 2 + PT * NS) * 4;
  const int64_t TC = opName(op) == "nf_kv.ssm_update"
                         ? 1
                         : std::clamp<int64_t>(45056 / perToken, 1, 32);
  const int64_t block = PT * NS;
  includes.insert("nf_mamba.cuh");
  const std::string state = "nf::storage(a, " + num(2 * op.storage() + 1) + ")";
  // Decode: a warp per (sequence, head, 32 / NS channels), no shared
  // memory or barriers (ssm_decode); the H200, Nano at batch 32: see
  // docs/performance.md.
  if (opName(op) == "nf_kv.ssm_update" && 32 % NS == 0 && N % (4 * NS) == 0 &&
      P % (32 / NS) == 0 && (NH * P) % 4 == 0 && CD % 4 == 0) {
    // With the gated norm of its result (groups = the state's groups):
    // steps whose clusters fit the GPU at a block an SM (a block per head:
    // up to SMs / NH tokens, Nano 2) run both in one launch of clusters
    // (ssm_gated_decode; the norm's launch was 3.9 us a layer on the
    // step's critical path at batch 1, the step 3.16 -> 3.11 ms on the
    // H200), larger ones as two launches: a cluster walks its items one
    // after another, barriers in each, where ssm_update streams the state
    // at its bytes (batch 8 with clusters up to 16 tokens: 5.07 -> 5.41
    // ms).
    const int64_t HPG = NH / G, warpsPerHead = P / (32 / NS);
    const int64_t fusedTokens = std::max<int64_t>(opts.smCount / NH, 1);
    bool fuseNorm = opts.hopperOrLater && i + 1 < ops.size() &&
                    opName(*ops[i + 1]) == "nf.gated_rms_norm" &&
                    !needed(out[0], {i + 1}) && HPG <= 8 && P % 4 == 0 &&
                    warpsPerHead * 32 <= 1024;
    if (fuseNorm) {
      const pl::Op &nop = *ops[i + 1];
      auto nin = operands(nop), nout = results(nop);
      auto groups = intAttr(nop, "groups");
      auto eps = floatAttr(nop, "epsilon");
      auto wt = nin.size() == 3 ? weightType(nin[2]) : std::nullopt;
      fuseNorm = nin.size() == 3 && nout.size() == 1 && nin[0] == out[0] &&
                 isAct(nin[1]) && isAct(nout[0]) && V(nin[1]).cols == NH * P &&
                 V(nout[0]).cols == NH * P && wt &&
                 weightNumel(nin[2]) == NH * P && groups && *groups == G &&
                 eps && (HPG * P) % 128 == 0 && HPG * P <= 1024;
      if (fuseNorm) {
        includes.insert("nf_rows.cuh");
        const int64_t clusters = std::min(maxTokens, fusedTokens) * G;
        addLaunch(fnName(i, "ssm_gated_decode"),
                  static_cast<uint32_t>(clusters * HPG), 32 * warpsPerHead,
                  "  nf::ssm_gated_decode<" + *t3 + ", " + *t4 + ", " + *t5 +
                      ", " + *wt + ", " + num(NH) + ", " + num(P) + ", " +
                      num(N) + ", " + num(G) + ", " + num(NS) + ">(a, " +
                      arenaPtr(in[1]) + ", " + arenaPtr(in[2]) + ", " +
                      weightPtr(in[3]) + ", " + weightPtr(in[4]) + ", " +
                      weightPtr(in[5]) + ", " + floatLit(*lo) + ", " +
                      floatLit(*hi) + ", " + state + ", " + arenaPtr(nin[1]) +
                      ", " + weightPtr(nin[2]) + ", " + doubleLit(*eps) + ", " +
                      outPtr(nout[0]) + ");\n",
                  opName(op) + " + nf.gated_rms_norm: a cluster of a group's " +
                      num(HPG) +
                      " heads per (sequence, group), a block per "
                      "head, the norm over distributed shared memory",
                  0, maxTokens > fusedTokens ? fusedTokens : 0,
                  /*bodyWaits=*/true);
        functions.back().clusterBlocks = static_cast<int>(HPG);
        if (maxTokens <= fusedTokens)
          return size_t(2);
      }
    }
    const int64_t warps = maxTokens * NH * (P / (32 / NS));
    addLaunch(fnName(i, "ssm_update"),
              gridOf(ceilDiv(warps, 8), int64_t(opts.smCount) * 4), 256,
              "  nf::ssm_decode<" + *t3 + ", " + *t4 + ", " + *t5 + ", " +
                  num(NH) + ", " + num(P) + ", " + num(N) + ", " + num(G) +
                  ", " + num(NS) + ">(a, " + arenaPtr(in[1]) + ", " +
                  arenaPtr(in[2]) + ", " + weightPtr(in[3]) + ", " +
                  weightPtr(in[4]) + ", " + weightPtr(in[5]) + ", " +
                  floatLit(*lo) + ", " + floatLit(*hi) + ", " + state + ", " +
                  arenaPtr(out[0]) + ");\n",
              opName(op) + ": a warp per (sequence, head, " + num(32 / NS) +
                  " channels), tokens in order",
              fuseNorm ? fusedTokens + 1 : 0, 0, /*bodyWaits=*/true);
    if (!fuseNorm)
      return size_t(1);
    auto norm = gatedRmsNorm(i + 1, fusedTokens + 1);
    if (!norm)
      return norm;
    return size_t(2);
  }
  const int64_t items = maxTokens * NH * (P / PT);
  // Prefill on tensor cores (SSD's matrix form, nf_mamba.cuh ssd_chunk)
  // when the head channels and state fit mma's tiles: chunks of kChunk
  // tokens, sub-chunks of 64 tokens (32 where 64 needs more shared memory
  // than the targets have). Measured on the H200 at the Nano shape, 8192
  // tokens (bench/kernels/ssd_check.cu): 0.80 ms per layer with bf16
  // inputs, 1.96 with exact products, against 2.20 for the walk.
  constexpr int64_t kChunk = 256;
  const int64_t terms = opts.matmulTerms;
  auto smemOf = [&](int64_t q, bool states) {
    return 2 * terms *
           (q * (N + 8) + q * (P + 8) +
            (states ? 0 : q * (N + 8) + q * (P + 8) + P * (N + 8)));
  };
  auto fits = [&](int64_t q) {
    return smemOf(q, false) + kStaticSharedAllowance <= opts.maxSharedBytes;
  };
  const int64_t kSub = fits(64) ? 64 : 32;
  if (opName(op) == "nf_kv.ssm_scan" && opts.ampereOrLater && P % 16 == 0 &&
      N % 16 == 0 && P <= 128 && st->slots() > 0 && fits(kSub)) {
    const int64_t cmax = ceilDiv(maxTokens, kChunk);
    auto smemOfSub = [&](bool states) { return smemOf(kSub, states); };
    std::string local = "static_cast<float *>(nullptr)", decay = local;
    const std::string common = ", " + num(NH) + ", " + num(P) + ", " + num(N) +
                               ", " + num(G) + ", " + num(kChunk) + ", " +
                               num(cmax) + ", " + num(kSub) + ", " + num(terms);
    auto body = [&](bool states) {
      const std::string tmpl = "<" + *t3 + ", " + *t4 + ", " + *t5 + common +
                               (states ? ", true>" : ", false>");
      return "  static_assert(nf::ssd_chunk_smem<" + num(P) + ", " + num(N) +
             ", " + num(kSub) + ", " + num(terms) +
             (states ? ", true>" : ", false>") +
             "() == " + num(smemOfSub(states)) +
             ", \"shared memory size\");\n  nf::ssd_chunk" + tmpl + "(a, " +
             arenaPtr(in[1]) + ", " + arenaPtr(in[2]) + ", " +
             weightPtr(in[3]) + ", " + weightPtr(in[4]) + ", " +
             weightPtr(in[5]) + ", " + floatLit(*lo) + ", " + floatLit(*hi) +
             ", " + state + ", " + arenaPtr(out[0]) + ", " + local + ", " +
             decay + ");\n";
    };
    const uint32_t block = static_cast<uint32_t>(32 * (P / 16));
    if (maxTokens > kChunk) {
      const int64_t slots = maxTokens / kChunk + st->slots() + 1;
      local = "nf::arena<float>(a, " + num(newScratch(slots * NH * P * N * 4)) +
              "ll)";
      decay = "nf::arena<float>(a, " + num(newScratch(slots * NH * 4)) + "ll)";
      addLaunch(fnName(i, "ssd_states"),
                gridOf(cmax * NH, int64_t(opts.smCount) * 8), block, body(true),
                "nf_kv.ssm_scan, chunked on tensor cores: each chunk's state "
                "from zero and its decay (generated scratch)");
      launches.back().sharedBytes = static_cast<uint32_t>(smemOfSub(true));
      addLaunch(fnName(i, "ssm_chunk_carry"), elementGrid(NH * P * N), 256,
                "  nf::ssm_chunk_carry<" + num(NH) + ", " + num(P) + ", " +
                    num(N) + ", " + num(kChunk) + ">(a, " + state + ", " +
                    local + ", " + decay + ");\n",
                "nf_kv.ssm_scan, chunked: chunk inits in order");
    }
    addLaunch(fnName(i, "ssd_scan"),
              gridOf(cmax * NH, int64_t(opts.smCount) * 8), block, body(false),
              "nf_kv.ssm_scan on tensor cores: a block per (sequence, chunk, "
              "head), sub-chunks of " +
                  num(kSub) + " tokens in order");
    launches.back().sharedBytes = static_cast<uint32_t>(smemOfSub(false));
    return size_t(1);
  }
  // Prefill steps longer than a chunk: the chunked scan (nf_mamba.cuh), so
  // a long sequence's chunks walk in parallel.
  const bool chunked = opName(op) == "nf_kv.ssm_scan" && maxTokens > kChunk &&
                       P % 4 == 0 && N % 8 == 0 && st->slots() > 0;
  std::string chunkArgs, chunkInit;
  if (chunked) {
    const int64_t cmax = ceilDiv(maxTokens, kChunk);
    const int64_t slots = maxTokens / kChunk + st->slots() + 1;
    const int64_t localOff = newScratch(slots * NH * P * N * 4);
    const int64_t decayOff = newScratch(slots * NH * 4);
    const std::string local = "nf::arena<float>(a, " + num(localOff) + "ll)";
    const std::string decay = "nf::arena<float>(a, " + num(decayOff) + "ll)";
    addLaunch(fnName(i, "ssm_chunk_states"),
              gridOf(cmax * NH, int64_t(opts.smCount) * 8), 256,
              "  nf::ssm_chunk_states<" + *t3 + ", " + *t4 + ", " + num(NH) +
                  ", " + num(P) + ", " + num(N) + ", " + num(G) + ", " +
                  num(kChunk) + ", " + num(cmax) + ">(a, " + arenaPtr(in[1]) +
                  ", " + arenaPtr(in[2]) + ", " + weightPtr(in[3]) + ", " +
                  weightPtr(in[4]) + ", " + floatLit(*lo) + ", " +
                  floatLit(*hi) + ", " + local + ", " + decay + ");\n",
              "nf_kv.ssm_scan, chunked: each chunk's state from zero and its "
              "decay (generated scratch)");
    addLaunch(fnName(i, "ssm_chunk_carry"), elementGrid(NH * P * N), 256,
              "  nf::ssm_chunk_carry<" + num(NH) + ", " + num(P) + ", " +
                  num(N) + ", " + num(kChunk) + ">(a, " + state + ", " + local +
                  ", " + decay + ");\n",
              "nf_kv.ssm_scan, chunked: chunk inits in order");
    chunkArgs = ", " + num(kChunk) + ", " + num(cmax);
    chunkInit = ", " + local;
  }
  addLaunch(
      fnName(i, opName(op) == "nf_kv.ssm_update" ? "ssm_update" : "ssm_scan"),
      gridOf(items, int64_t(opts.smCount) * 8), static_cast<uint32_t>(block),
      "  nf::ssm_scan<" + *t3 + ", " + *t4 + ", " + *t5 + ", " + num(NH) +
          ", " + num(P) + ", " + num(N) + ", " + num(G) + ", " + num(PT) +
          ", " + num(NS) + ", " + num(TC) + chunkArgs + ">(a, " +
          arenaPtr(in[1]) + ", " + arenaPtr(in[2]) + ", " + weightPtr(in[3]) +
          ", " + weightPtr(in[4]) + ", " + weightPtr(in[5]) + ", " +
          floatLit(*lo) + ", " + floatLit(*hi) + ", " + state + ", " +
          arenaPtr(out[0]) + chunkInit + ");\n",
      opName(op) + (chunked ? ": sequential over each chunk's tokens"
                            : ": sequential over each sequence's tokens"));
  return size_t(1);
}

// ---------------------------------------------------------------------------
// Attention

StatusOr<size_t> KernelEmitter::kvAppend(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op);
  const pl::Storage *st = storageOf(op, pl::StorageKind::KVCache);
  if (!st)
    return fail(i, "needs a KVCache storage");
  const int64_t row = st->kv_heads() * st->head_dim();
  if (in.size() != 3 || V(in[0]).kind != pl::ValueKind::Batch ||
      !isAct(in[1]) || !isAct(in[2]) || V(in[1]).cols != row ||
      V(in[2]).cols != row)
    return fail(i, "expects (batch, key, value) rows of the cache's width");
  if (st->dtype() != pl::DType::F32)
    return fail(i, "only f32 KV caches are supported");
  includes.insert("nf_attention.cuh");
  addLaunch(fnName(i, "kv_append"), elementGrid(maxTokens * row), 256,
            "  nf::kv_append<" + num(row) + ", " + num(st->page_size()) +
                ">(a, " + arenaPtr(in[1]) + ", " + arenaPtr(in[2]) +
                ", nf::storage(a, " + num(2 * op.storage()) +
                "), nf::storage(a, " + num(2 * op.storage() + 1) + "));\n",
            "nf_kv.append");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::kvAttend(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  const pl::Storage *st = storageOf(op, pl::StorageKind::KVCache);
  if (!st)
    return fail(i, "needs a KVCache storage");
  auto heads = intAttr(op, "num_heads");
  auto scale = floatAttr(op, "scale");
  const int64_t HD = st->head_dim(), NKV = st->kv_heads();
  if (in.size() != 2 || out.size() != 1 ||
      V(in[0]).kind != pl::ValueKind::Batch || !isAct(in[1]) ||
      !isAct(out[0]) || !heads || !scale || *heads <= 0 || *heads % NKV ||
      V(in[1]).cols != *heads * HD || V(out[0]).cols != *heads * HD)
    return fail(i, "expects (batch, query) -> result with num_heads x "
                   "head_dim features");
  if (st->dtype() != pl::DType::F32)
    return fail(i, "only f32 KV caches are supported");
  includes.insert("nf_attention.cuh");
  const std::string args = "(a, " + arenaPtr(in[1]) + ", nf::storage(a, " +
                           num(2 * op.storage()) + "), nf::storage(a, " +
                           num(2 * op.storage() + 1) + "), " +
                           floatLit(*scale) + ", " + arenaPtr(out[0]) + ");\n";
  // Decode: split over the context, then combine (flash decoding). Up to
  // 64 splits of at least 32 positions, as many as give about 64 warps per
  // SM for a warp per head, 16 for a warp per kv head (nf_attention.cuh
  // decode_splits): at batch 1 that is 64 splits for 32 heads, and a 1K
  // context is one 32-position tile per warp; at batch 32 (Nano: 2 kv
  // heads) 33 splits of 32 positions.
  if (phase == "decode") {
    constexpr int64_t kSplits = 64, perBlock = 8;
    const std::string warpsTarget = num(int64_t(opts.smCount) * 64);
    const int64_t part =
        newScratch(maxTokens * *heads * kSplits * (HD + 2) * 4);
    const std::string partPtr = "nf::arena<float>(a, " + num(part) + "ll)";
    // Every split launch: (q, K cache, V cache, scale, partials).
    const std::string splitArgs = ">(a, " + arenaPtr(in[1]) +
                                  ", nf::storage(a, " + num(2 * op.storage()) +
                                  "), nf::storage(a, " +
                                  num(2 * op.storage() + 1) + "), " +
                                  floatLit(*scale) + ", " + partPtr + ");\n";
    // The combine: a block of 8 warps per (token, head), with the split
    // count's parameters of the split launches.
    auto addCombine = [&](const std::string &target,
                          const std::string &gqaFrom) {
      addLaunch(fnName(i, "attend_combine"),
                gridOf(maxTokens * *heads, int64_t(opts.smCount) * 8), 256,
                "  nf::kv_attend_combine<" + num(*heads) + ", " + num(NKV) +
                    ", " + num(HD) + ", " + num(kSplits) + ", " + target +
                    ", " + gqaFrom + ">(a, " + partPtr + ", " + outPtr(out[0]) +
                    ");\n",
                "nf_kv.attend (decode): the splits' softmaxes merged, a block "
                "per (token, head)");
    };
    const int64_t rep = *heads / NKV;
    // On tensor cores for every step size where every target has them
    // (kv_attend_split_mma: a warp per (token, kv head, split) whose query
    // heads are mma's 16 rows, K/V tiles through its shared memory, in the
    // plan's bf16 terms), 4 warps a block and one block an SM (the tiles),
    // so its splits aim at 4 warps an SM. (Before sm_80 the kernel has no
    // body.)
    constexpr int64_t kMmaWarps = 4;
    const int64_t mmaSmem = kMmaWarps * 2 * 32 * (HD + 8) * 4;
    if (opts.ampereOrLater && rep <= 16 && HD % 16 == 0 &&
        mmaSmem + kStaticSharedAllowance <= opts.maxSharedBytes) {
      const std::string mmaTarget = num(int64_t(opts.smCount) * kMmaWarps * 4);
      addLaunch(fnName(i, "attend_split_mma"),
                gridOf(ceilDiv(maxTokens * NKV * kSplits, kMmaWarps),
                       int64_t(opts.smCount)),
                32 * kMmaWarps,
                "  static_assert(nf::kv_attend_split_mma_smem<" + num(HD) +
                    ", " + num(kMmaWarps) + ">() == " + num(mmaSmem) +
                    ", \"shared memory size\");\n"
                    "  nf::kv_attend_split_mma<" +
                    num(*heads) + ", " + num(NKV) + ", " + num(HD) + ", " +
                    num(st->page_size()) + ", " + num(kMmaWarps) + ", " +
                    num(kSplits) + ", " + mmaTarget + ", " +
                    num(opts.matmulTerms) + splitArgs,
                "nf_kv.attend (decode): a warp per (token, kv head, context "
                "split), its " +
                    num(rep) +
                    " query heads one mma tile, online softmax per split");
      launches.back().sharedBytes = static_cast<uint32_t>(mmaSmem);
      addCombine(mmaTarget, "0"); // grouped from the first token
      return size_t(1);
    }
    // Grouped queries (2 to 16 query heads per kv head), from kGqaTokens
    // tokens: a warp per (token, kv head, split) takes all of the kv head's
    // query heads, reading each K/V row once for them (its queries and
    // exponentials in static shared memory, 4 warps a block). Measured on
    // the H200 (Nano shape): batch 32 128 us per layer against 269 for a
    // warp per head, but batch 1 39 against 23 (its 64 warps each walk 16
    // heads where the per-head form has 2048 warps), so up to 3 tokens keep
    // a warp per head (about even at 4, where the fixtures' batched decode
    // steps then check the grouped form). The grouped form takes its own
    // split count (decode_splits: 16 warps an SM, not 64 / 16 heads): batch
    // 32 70 us against 132 with the per-head form's 8 splits (the combine
    // 19 against 11 us).
    constexpr int64_t kGqaWarps = 4, kGqaTokens = 4;
    const bool gqa = rep >= 2 && rep <= 16 && HD % 4 == 0 &&
                     kGqaWarps * rep * (HD + 32) * 4 <= 48 * 1024 &&
                     maxTokens >= kGqaTokens;
    // Where the grouped form takes over (INT32_MAX: never); the split
    // count depends on it (decode_splits), so every launch gets it.
    const std::string gqaFrom = gqa ? num(kGqaTokens) : "0x7fffffff";
    addLaunch(
        fnName(i, "attend_split"),
        gridOf(ceilDiv((gqa ? kGqaTokens - 1 : maxTokens) * *heads * kSplits,
                       perBlock),
               int64_t(opts.smCount) * 8),
        32 * perBlock,
        "  nf::kv_attend_split<" + num(*heads) + ", " + num(NKV) + ", " +
            num(HD) + ", " + num(st->page_size()) + ", " + num(perBlock) +
            ", " + num(kSplits) + ", " + warpsTarget + ", " + gqaFrom +
            splitArgs,
        "nf_kv.attend (decode): a warp per (token, head, context "
        "split), online softmax per split",
        0, gqa ? uint32_t(kGqaTokens - 1) : 0);
    if (gqa)
      addLaunch(fnName(i, "attend_split_gqa"),
                gridOf(ceilDiv(maxTokens * NKV * kSplits, kGqaWarps),
                       int64_t(opts.smCount) * 8),
                32 * kGqaWarps,
                "  nf::kv_attend_split_gqa<" + num(*heads) + ", " + num(NKV) +
                    ", " + num(HD) + ", " + num(st->page_size()) + ", " +
                    num(kGqaWarps) + ", " + num(kSplits) + ", " + warpsTarget +
                    ", " + gqaFrom + splitArgs,
                "nf_kv.attend (decode): a warp per (token, kv head, context "
                "split) for its " +
                    num(rep) + " query heads, online softmax per split",
                uint32_t(kGqaTokens), 0);
    addCombine(warpsTarget, gqaFrom);
    return size_t(1);
  }
  // Prefill on tensor cores (FlashAttention-2 loop, nf_attention.cuh) when
  // the head dimension fits mma's K steps and the O tile the registers;
  // activations split into the plan's bf16 terms as the GEMMs do.
  // K/V tiles of 64 positions with one bf16 term (3.19 ms against 3.53
  // for 32 per 8192-token Nano layer on the H200,
  // bench/kernels/attention_check.cu); exact products keep 32 (their three
  // terms' tiles would not fit beside the registers), and so does a target
  // whose shared memory 64 would pass. Only when every target is sm_80 or
  // later (before, the kernel falls back to the warp form, which needs none
  // of the tiles) and the tiles fit every target.
  // With one term, the step's K/V rows are first rounded to bf16 once
  // (kv_rows_to_bf16, codegen scratch), and the blocks stream them with
  // cp.async into double-buffered tiles instead of each converting the f32
  // cache rows through registers.
  constexpr int64_t kWarps = 8, kRows = 16 * kWarps;
  const int64_t terms = opts.matmulTerms;
  const bool kv16 = terms == 1;
  auto mmaSmem = [&](int64_t positions) {
    return 2 * terms *
           (kRows * (HD + 8) + (kv16 ? 4 : 2) * positions * (HD + 8));
  };
  const int64_t positions =
      terms == 1 && mmaSmem(64) + kStaticSharedAllowance <= opts.maxSharedBytes
          ? 64
          : 32;
  if (HD % 16 == 0 && HD <= 128 && opts.ampereOrLater &&
      mmaSmem(positions) + kStaticSharedAllowance <= opts.maxSharedBytes) {
    const int64_t tiles = ceilDiv(maxTokens * (*heads / NKV), kRows) * NKV;
    const int64_t smem = mmaSmem(positions);
    const std::string tmpl = num(HD) + ", " + num(kWarps) + ", " + num(terms) +
                             ", " + num(positions) +
                             (kv16 ? ", true" : std::string());
    std::string callArgs = args;
    if (kv16) {
      const int64_t row = NKV * HD;
      const int64_t k16 = newScratch(2 * maxTokens * row * 2);
      const std::string k16Ptr =
          "nf::arena<unsigned short>(a, " + num(k16) + "ll)";
      const std::string v16Ptr = "nf::arena<unsigned short>(a, " +
                                 num(k16 + maxTokens * row * 2) + "ll)";
      addLaunch(fnName(i, "attend_kv16"), elementGrid(maxTokens * row / 4), 256,
                "  nf::kv_rows_to_bf16<" + num(row) + ", " +
                    num(st->page_size()) + ">(a, nf::storage(a, " +
                    num(2 * op.storage()) + "), nf::storage(a, " +
                    num(2 * op.storage() + 1) + "), " + k16Ptr + ", " + v16Ptr +
                    ");\n",
                "nf_kv.attend: the step's K/V rows in bf16 (codegen scratch "
                "at " +
                    num(k16) + ")");
      callArgs = args.substr(0, args.rfind(");")) + ", " + k16Ptr + ", " +
                 v16Ptr + ");\n";
    }
    addLaunch(fnName(i, "attend_mma"), gridOf(tiles, int64_t(opts.smCount) * 4),
              static_cast<uint32_t>(32 * kWarps),
              "  static_assert(nf::kv_attend_mma_smem<" + tmpl +
                  ">() == " + num(smem) + ", \"shared memory size\");\n" +
                  "  nf::kv_attend_mma<" + num(*heads) + ", " + num(NKV) +
                  ", " + num(HD) + ", " + num(st->page_size()) + ", " +
                  num(kWarps) + ", " + num(terms) + ", " + num(positions) +
                  (kv16 ? ", true" : "") + ">" + callArgs,
              "nf_kv.attend: tensor cores, a block per 128 (token, head) rows "
              "of a kv head, " +
                  num(positions) + " positions per step, online softmax" +
                  (kv16 ? ", bf16 K/V tiles by cp.async" : ""));
    launches.back().sharedBytes = static_cast<uint32_t>(smem);
    return size_t(1);
  }
  // Block per (token, kv head), K/V tiles in shared memory, when they fit.
  const int64_t rep = *heads / NKV;
  const int64_t warps = std::min<int64_t>(rep, 16);
  const int64_t hpw = ceilDiv(rep, warps);
  const int64_t smem = 32 * (2 * HD + 1) * 4 + warps * hpw * HD * 4 + 256;
  // Prefill: a block per (query tile of consecutive tokens, kv head) when a
  // one-token block's tiles fit in 48 KiB; four tokens share each K/V tile
  // (queries in dynamic shared memory; bit-identical to one per block) when
  // their queries fit too.
  if (smem <= 48 * 1024) {
    auto tileSmem = [&](int64_t qt) {
      return (32 * (HD + 1) + 32 * HD + qt * warps * hpw * HD) * 4;
    };
    const int64_t qt = tileSmem(4) <= 96 * 1024 ? 4 : 1;
    addLaunch(fnName(i, "attend"),
              gridOf(ceilDiv(maxTokens, qt) * NKV, int64_t(opts.smCount) * 8),
              static_cast<uint32_t>(32 * warps),
              "  nf::kv_attend<" + num(*heads) + ", " + num(NKV) + ", " +
                  num(HD) + ", " + num(st->page_size()) + ", " + num(warps) +
                  ", " + num(qt) + ">" + args,
              "nf_kv.attend: one block per (" + num(qt) +
                  " tokens, kv head), K/V tiles in shared memory, online "
                  "softmax");
    launches.back().sharedBytes = static_cast<uint32_t>(tileSmem(qt));
    return size_t(1);
  }
  constexpr int perBlock = 4;
  addLaunch(
      fnName(i, "attend"),
      gridOf(ceilDiv(maxTokens * *heads, perBlock), int64_t(opts.smCount) * 8),
      32 * perBlock,
      "  nf::kv_attend_warp<" + num(*heads) + ", " + num(NKV) + ", " + num(HD) +
          ", " + num(st->page_size()) + ", " + num(perBlock) + ">" + args,
      "nf_kv.attend: one warp per (token, head), online softmax");
  return size_t(1);
}

// ---------------------------------------------------------------------------
// Mixture of experts

StatusOr<size_t> KernelEmitter::route(size_t i) {
  const pl::Op &first = *ops[i];
  const bool isRouter = opName(first) == "nf_moe.router";
  std::string wg = "float", wb = "float", x = "nullptr", gate = "nullptr",
              bias = "nullptr";
  int64_t E = 0, H = 1;
  int xV = -1, scoresV = -1, selV = -1;
  size_t sel = i;
  if (isRouter) {
    auto in = operands(first), out = results(first);
    if (in.size() != 3 || out.size() != 2 || !isAct(in[0]) || !isAct(out[0]) ||
        !isAct(out[1]))
      return fail(i, "expects (input, weight, correction_bias) -> (scores, "
                     "selection_scores)");
    auto shape = weightShape(in[1]);
    auto gt = weightType(in[1]), bt = weightType(in[2]);
    if (!gt || !bt || shape.size() != 2 || shape[1] != V(in[0]).cols)
      return fail(i, "gate weight does not match the input");
    E = shape[0];
    H = shape[1];
    if (weightNumel(in[2]) != E || V(out[0]).cols != E || V(out[1]).cols != E)
      return fail(i, "bias and scores must have " + std::to_string(E) +
                         " experts");
    wg = *gt;
    wb = *bt;
    xV = in[0];
    x = arenaPtr(in[0]);
    gate = weightPtr(in[1]);
    bias = weightPtr(in[2]);
    scoresV = out[0];
    selV = out[1];
    sel = i + 1;
    // A select that reads both scores fuses with the router.
    if (!(sel < ops.size() && opName(*ops[sel]) == "nf_moe.select" &&
          operands(*ops[sel]).size() == 3 &&
          operands(*ops[sel])[0] == scoresV && operands(*ops[sel])[1] == selV))
      sel = ops.size();
  }
  std::string body;
  includes.insert("nf_moe.cuh");
  // Every form but the logits GEMM reads the input as f32 rows.
  auto checkF32Input = [&] {
    if (xV >= 0 && rowsBf16(xV) && x != "nullptr")
      internalError =
          fnName(i, "router") + " reads bf16 rows but is not the logits GEMM";
  };
  if (sel >= ops.size()) { // the router alone
    checkF32Input();
    addLaunch(fnName(i, "router"), gridOf(maxTokens, int64_t(opts.smCount) * 4),
              256,
              "  nf::moe_route<" + wg + ", " + wb + ", " + num(E) + ", " +
                  num(H) + ", 1, 1, 1, true, false, false, false>(a, " + x +
                  ", " + gate + ", " + bias + ", " + arenaPtr(scoresV) + ", " +
                  arenaPtr(selV) + ", nullptr, nullptr, nullptr, 1.0f);\n",
              "nf_moe.router: one block per token, logits in f64");
    return size_t(1);
  }
  const pl::Op &op = *ops[sel];
  auto in = operands(op), out = results(op);
  if (in.size() != 3 || out.size() != 3 || !isAct(in[0]) || !isAct(in[1]))
    return fail(sel, "expects (scores, selection_scores, budget) -> "
                     "(experts, weights, counts)");
  if (!isRouter) {
    E = V(in[0]).cols;
    scoresV = in[0];
    selV = in[1];
  }
  if (V(in[0]).cols != E || V(in[1]).cols != E)
    return fail(sel, "scores and selection scores differ");
  std::string budget;
  if (V(in[2]).kind == pl::ValueKind::Budget)
    budget = "a->budget";
  else if (isAct(in[2]) && V(in[2]).cols == 1)
    budget = arenaPtr(in[2]);
  else
    return fail(sel, "budget must be the step's per-token budget");
  auto K = intAttr(op, "top_k"), nGroup = intAttr(op, "n_group"),
       topkGroup = intAttr(op, "topk_group"),
       norm = intAttr(op, "norm_topk_prob");
  auto rsf = floatAttr(op, "routed_scaling_factor");
  if (!K || !nGroup || !topkGroup || !norm || !rsf)
    return fail(sel, "missing top_k, n_group, topk_group, norm_topk_prob or "
                     "routed_scaling_factor");
  const int64_t minK = intAttr(op, "min_k").value_or(*K);
  const std::string policy = stringAttr(op, "policy").value_or("topk");
  if (policy != "topk" && policy != "budget")
    return fail(sel, "unknown policy '" + policy + "'");
  if (*nGroup <= 0 || E % *nGroup || *topkGroup <= 0 || *topkGroup > *nGroup ||
      *K <= 0 || *K > 32 || E > 1024)
    return fail(sel, "unsupported routing (experts " + std::to_string(E) +
                         ", top_k " + std::to_string(*K) + ", groups " +
                         std::to_string(*nGroup) + ")");
  if (!isTensor(out[0], pl::DType::I32) || V(out[0]).cols != *K ||
      !isAct(out[1]) || V(out[1]).cols != *K ||
      !isTensor(out[2], pl::DType::I32) || V(out[2]).cols != 1)
    return fail(sel, "results must be i32 [T, top_k], f32 [T, top_k], i32 [T]");
  const bool defer = policy == "budget";
  const std::string experts = arenaPtr(out[0], "int32_t"),
                    weights = arenaPtr(out[1]),
                    counts = arenaPtr(out[2], "int32_t");
  // The logits over the whole grid first (decode: a warp per token and
  // expert; prefill: tiles of tokens x experts). Short prompts take 16 x 32
  // tiles so that every SM gets work; long ones 32 x 64 tiles, which reuse
  // each staged value more. The per-token blocks then only rank.
  std::string pre = "nullptr";
  if (isRouter && phase != "decode") {
    const int64_t off = newScratch(maxTokens * E * 2 * 8);
    pre = "nf::arena<double>(a, " + num(off) + "ll)";
    constexpr int64_t kSmallTileTokens = 2048;
    auto tiles = [&](int64_t tokens, int64_t experts, const char *suffix,
                     int64_t stepTokens, uint32_t minT, uint32_t maxT) {
      addLaunch(fnName(i, "router_logits") + suffix,
                gridOf(ceilDiv(stepTokens, tokens) * ceilDiv(E, experts),
                       int64_t(opts.smCount) * 8),
                256,
                "  nf::moe_router_logits_tiled<" + wg + ", " + wb + ", " +
                    num(E) + ", " + num(H) + ", " + num(tokens) + ", " +
                    num(experts) + ">(a, " + x + ", " + gate + ", " + bias +
                    ", " + arenaPtr(scoresV) + ", " + arenaPtr(selV) + ", " +
                    pre + ");\n",
                "nf_moe.router: logits in tiles of " + num(tokens) + " x " +
                    num(experts) + " (tokens x experts), f64",
                minT, maxT);
    };
    // On f64 tensor cores (sm_80+) when the f64 slices fit static shared
    // memory: 16 tokens a block up to
    // 2048 tokens, then 32 (bench/kernels/router_check.cu, H200, Nano
    // shape: 0.145 ms for 1000 tokens and 0.299 for 8192, against 0.186
    // and 0.653 for the f64 tiles; the same sums, products being exact).
    auto dmmaFits = [&](int64_t tokens) {
      return opts.ampereOrLater &&
             (tokens + ceilDiv(E, 8) * 8) * 20 * 8 <= 48 * 1024;
    };
    auto dmma = [&](int64_t tokens, const char *suffix, int64_t stepTokens,
                    uint32_t minT, uint32_t maxT) {
      addLaunch(fnName(i, "router_logits") + suffix,
                gridOf(ceilDiv(stepTokens, tokens), int64_t(opts.smCount) * 8),
                256,
                "  nf::moe_router_logits_dmma<" + wg + ", " + wb + ", " +
                    num(E) + ", " + num(H) + ", " + num(tokens) + ">(a, " + x +
                    ", " + gate + ", " + bias + ", " + arenaPtr(scoresV) +
                    ", " + arenaPtr(selV) + ", " + pre + ");\n",
                "nf_moe.router: logits of " + num(tokens) +
                    " tokens a block, f64 tensor cores",
                minT, maxT);
    };
    // With bf16 matmul inputs the logits are a GEMM of the input rounded to
    // bf16 (as bf16 frameworks compute them: products exact, sums in f32)
    // whose epilogue computes s and sb (f64) from each f32 logit.
    if (bf16RowsAllowed(opts) && onBf16Planes(phase, wg == "nf::bf16", H)) {
      LinearSpec s;
      s.wtype = wg;
      s.N = E;
      s.K = H;
      s.weight = gate;
      setInput(s, xV);
      s.rowIndex = "r";
      s.maxRows = maxTokens;
      s.store = "    {\n      double sc, sb;\n      nf::router_score("
                "static_cast<double>(v), " +
                bias + ", n, static_cast<long long>(r) * " + num(E) + " + n, " +
                arenaPtr(scoresV) + ", " + arenaPtr(selV) + ", " + pre +
                ", sc, sb);\n    }\n";
      emitLinear(fnName(i, "router_logits"), s,
                 "nf_moe.router: logits on the bf16 GEMM, s and sb in f64");
      x = "nullptr"; // moe_route reads s and sb from `pre`, not the rows
    } else if (dmmaFits(16) && dmmaFits(32)) {
      if (maxTokens <= kSmallTileTokens) {
        dmma(16, "", maxTokens, 0, 0);
      } else {
        dmma(16, "_small", kSmallTileTokens, 0, kSmallTileTokens);
        dmma(32, "_large", maxTokens, kSmallTileTokens + 1, 0);
      }
    } else if (maxTokens <= kSmallTileTokens) {
      tiles(16, 32, "", maxTokens, 0, 0);
    } else {
      tiles(16, 32, "_small", kSmallTileTokens, 0, kSmallTileTokens);
      tiles(32, 64, "_large", maxTokens, kSmallTileTokens + 1, 0);
    }
  } else if (isRouter) {
    const int64_t off = newScratch(maxTokens * E * 2 * 8);
    pre = "nf::arena<double>(a, " + num(off) + "ll)";
    addLaunch(fnName(i, "router_logits"),
              gridOf(ceilDiv(maxTokens * E, 8), int64_t(opts.smCount) * 8), 256,
              "  nf::moe_router_logits<" + wg + ", " + wb + ", " + num(E) +
                  ", " + num(H) + ">(a, " + x + ", " + gate + ", " + bias +
                  ", " + arenaPtr(scoresV) + ", " + arenaPtr(selV) + ", " +
                  pre + ");\n",
              "nf_moe.router: logits, a warp per (token, expert), f64");
    functions.back().sliceable = true;
  }
  checkF32Input();
  // The step's expert statistics, where the step has a region for them.
  std::string statArgs;
  if (expertStats && expertStats->offset >= 0 &&
      expertStats->layerOf.count(&op))
    statArgs =
        ", " + expertStats->counts(&op) + ", " + expertStats->experts(&op);
  // Decode steps have one token per sequence: the budget decision is then
  // per token and made by moe_route itself (no moe_budget launch).
  const bool oneTokenBudget = defer && phase == "decode";
  addLaunch(
      fnName(i, isRouter ? "moe_route" : "moe_select"),
      gridOf(maxTokens, int64_t(opts.smCount) * 4), 256,
      "  nf::moe_route<" + wg + ", " + wb + ", " + num(E) + ", " + num(H) +
          ", " + num(*K) + ", " + num(*nGroup) + ", " + num(*topkGroup) + ", " +
          (isRouter ? "true" : "false") + ", true, " +
          (defer ? "true" : "false") + ", " + (*norm ? "true" : "false") +
          ", " + (oneTokenBudget ? "true" : "false") + ">(a, " + x + ", " +
          gate + ", " + bias + ", " + arenaPtr(scoresV) + ", " +
          arenaPtr(selV) + ", " + experts + ", " + weights + ", " + counts +
          ", " + floatLit(*rsf) + ", " + pre + ", " +
          (oneTokenBudget ? budget + ", " + num(minK) : "nullptr, 0") +
          statArgs + ");\n",
      std::string(isRouter ? "nf_moe.router + " : "") + "nf_moe.select (" +
          policy + (oneTokenBudget ? ", one token per sequence" : "") +
          "): one block per token, ranking by warp argmax");
  functions.back().sliceable = true;
  if (defer && !oneTokenBudget)
    addLaunch(fnName(sel, "moe_budget"),
              gridOf(maxTokens, int64_t(opts.smCount)), 256,
              "  nf::moe_budget<" + num(*K) + ", " + num(E) + ">(a, " + budget +
                  ", " + experts + ", " + weights + ", " + counts + ", " +
                  num(minK) + ", " + (*norm ? "true" : "false") + ", " +
                  floatLit(*rsf) + statArgs + ");\n",
              "nf_moe.select (budget): one block per sequence decides each "
              "token's expert count");
  return sel + 1 - i;
}

StatusOr<size_t> KernelEmitter::dispatch(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 2 || out.size() != 1 || !isTensor(in[0], pl::DType::I32) ||
      !isTensor(in[1], pl::DType::I32) || V(in[1]).cols != 1 ||
      V(out[0]).kind != pl::ValueKind::Dispatch)
    return fail(i, "expects (experts i32 [T, k], counts i32 [T]) -> dispatch");
  const ValueInfo &d = V(out[0]);
  const int64_t K = V(in[0]).cols;
  if (K > d.maxPerToken || d.numExperts <= 0 || d.numExperts > 4096)
    return fail(i, "experts per token exceed the dispatch's");
  if (K > 32)
    return fail(i, "more than 32 experts per token");
  // Warps of the one block: about 128 assignments each at the step's most
  // tokens (fewer warps are quicker through the block's scans at decode
  // sizes), up to 32, and per-warp counters of every expert in 32 KiB.
  const int64_t warps =
      std::clamp<int64_t>(ceilDiv(maxTokens * K, 128), 1,
                          std::clamp<int64_t>(8192 / d.numExperts, 1, 32));
  includes.insert("nf_moe.cuh");
  addLaunch(fnName(i, "moe_dispatch"), 1, static_cast<uint32_t>(32 * warps),
            "  nf::moe_dispatch<" + num(d.numExperts) + ", " + num(K) + ", " +
                num(d.maxPerToken) + ", " + num(warps) + ">(a, " +
                arenaPtr(in[0], "int32_t") + ", " + arenaPtr(in[1], "int32_t") +
                ", " + arenaPtr(out[0], "int32_t") + ");\n",
            "nf_moe.dispatch: one block, counting sort by expert");
  return size_t(1);
}

std::optional<KernelEmitter::CombineTail>
KernelEmitter::combineTail(size_t i) const {
  if (i + 3 >= ops.size() || opName(*ops[i]) != "nf_moe.combine" ||
      opName(*ops[i + 1]) != "nf.add" || opName(*ops[i + 2]) != "nf.add" ||
      opName(*ops[i + 3]) != "nf.rms_norm")
    return std::nullopt;
  auto out = results(*ops[i]);
  auto a1 = operands(*ops[i + 1]), r1 = results(*ops[i + 1]);
  auto a2 = operands(*ops[i + 2]), r2 = results(*ops[i + 2]);
  auto nin = operands(*ops[i + 3]), nout = results(*ops[i + 3]);
  if (out.size() != 1)
    return std::nullopt;
  auto wt = nin.size() == 2 ? weightType(nin[1]) : std::nullopt;
  auto eps = floatAttr(*ops[i + 3], "epsilon");
  const int64_t HE = V(out[0]).cols;
  if (!(a1.size() == 2 && r1.size() == 1 &&
        (a1[0] == out[0]) != (a1[1] == out[0]) && !needed(out[0], {i + 1}) &&
        a2.size() == 2 && r2.size() == 1 &&
        (a2[0] == r1[0]) != (a2[1] == r1[0]) && !needed(r1[0], {i + 2}) &&
        nin.size() == 2 && nin[0] == r2[0] && nout.size() == 1 && wt && eps &&
        weightNumel(nin[1]) == HE))
    return std::nullopt;
  CombineTail c;
  c.shared = a1[0] == out[0] ? a1[1] : a1[0];
  c.residual = a2[0] == r1[0] ? a2[1] : a2[0];
  c.sum = r2[0];
  c.out = nout[0];
  c.normWeight = nin[1];
  c.normType = *wt;
  c.eps = *eps;
  if (!isAct(c.shared) || !isAct(c.residual) || !isAct(c.sum) ||
      !isAct(c.out) || V(c.shared).cols != HE || V(c.residual).cols != HE ||
      V(c.out).cols != HE)
    return std::nullopt;
  return c;
}

StatusOr<size_t> KernelEmitter::combine(size_t i) {
  const pl::Op &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 3 || out.size() != 1 ||
      V(in[1]).kind != pl::ValueKind::Dispatch ||
      !isTensor(in[0], pl::DType::F32) ||
      V(in[0]).rows != pl::Rows::Assignments || !isAct(in[2]) ||
      !isAct(out[0]) || V(in[0]).cols != V(out[0]).cols ||
      V(in[2]).cols > V(in[1]).maxPerToken)
    return fail(i, "expects (assignment rows, dispatch, weights) -> rows");
  const ValueInfo &d = V(in[1]);
  const int64_t HE = V(out[0]).cols;
  includes.insert("nf_rows.cuh");
  // Followed by the add of the shared expert's rows, the residual add and
  // an RMSNorm of the sum (decode's "moe_combine_add_rms_norm"): one row
  // kernel gathers each token's routed rows, adds the shared rows and the
  // residual and normalises, with the same f32 operations in the same order
  // as the combine, the shared expert's epilogue add and add_rms_norm.
  if (std::optional<CombineTail> c = combineTail(i)) {
    addLaunch(fnName(i, "moe_combine_add_rms_norm"), blockGrid(maxTokens),
              kRowThreads,
              "  nf::moe_combine_add_rms_norm<" + c->normType + ", " + num(HE) +
                  ", " + num(V(in[2]).cols) + ", " + num(d.numExperts) + ", " +
                  num(d.maxPerToken) + ">(a, " + arenaPtr(c->residual) + ", " +
                  arenaPtr(in[0]) + ", " + arenaPtr(in[1], "int32_t") + ", " +
                  arenaPtr(in[2]) + ", " + arenaPtr(c->shared) + ", " +
                  arenaPtr(c->sum) + ", " + weightPtr(c->normWeight) + ", " +
                  doubleLit(c->eps) + ", " + outPtr(c->out) + ");\n",
              "nf_moe.combine + nf.add (shared expert) + nf.add + "
              "nf.rms_norm: one block per token");
    return size_t(4);
  }
  // Four columns a thread where rows are whole float4s (the template's
  // choice).
  addLaunch(fnName(i, "moe_combine"),
            elementGrid(maxTokens * (HE % 4 == 0 ? HE / 4 : HE)), 256,
            "  nf::moe_combine<" + num(HE) + ", " + num(V(in[2]).cols) + ", " +
                num(d.numExperts) + ", " + num(d.maxPerToken) + ">(a, " +
                arenaPtr(in[0]) + ", " + arenaPtr(in[1], "int32_t") + ", " +
                arenaPtr(in[2]) + ", " + arenaPtr(out[0]) + ");\n",
            "nf_moe.combine: weighted sum of each token's expert rows");
  return size_t(1);
}

StatusOr<CudaKernelSource> KernelEmitter::run(int64_t &scratchEnd) {
  if (kernel.ops())
    for (const pl::Op *op : *kernel.ops())
      ops.push_back(op);
  if (kernel.outputs())
    outputs.insert(kernel.outputs()->begin(), kernel.outputs()->end());
  // Generated scratch goes after the plan's kernel-internal values and the
  // bf16 copies' region.
  scratchTop = std::max(arenaBytes, rowFormats.shadowEnd);
  for (const pl::Op *op : ops)
    for (int r : results(*op))
      if (r >= 0 && r < static_cast<int>(values.size()) &&
          V(r).offset >= arenaBytes)
        scratchTop = std::max(scratchTop, V(r).offset + V(r).bytes);
  for (const pl::Op *op : ops)
    for (int v : operands(*op))
      if (v < 0 || v >= static_cast<int>(values.size()))
        return fail(0, "operand value " + std::to_string(v) + " out of range");

  for (size_t i = 0; i < ops.size();) {
    const std::string name = opName(*ops[i]);
    StatusOr<size_t> n = fail(i, "no CUDA implementation");
    if (name == "nf.embed")
      n = embed(i);
    else if (name == "nf.rms_norm")
      n = rmsNorm(i);
    else if (name == "nf.add")
      n = add(i);
    else if (name == "nf.linear" || name == "nf.lm_head" ||
             name == "nf_moe.latent_proj")
      n = linear(i);
    else if (name == "nf.split")
      n = split(i);
    else if (name == "nf.activation")
      n = activation(i);
    else if (name == "nf.gated_rms_norm")
      n = gatedRmsNorm(i);
    else if (name == "nf_kv.causal_conv")
      n = causalConv(i);
    else if (name == "nf_kv.ssm_scan" || name == "nf_kv.ssm_update")
      n = ssm(i);
    else if (name == "nf_kv.append")
      n = kvAppend(i);
    else if (name == "nf_kv.attend")
      n = kvAttend(i);
    else if (name == "nf_moe.router" || name == "nf_moe.select")
      n = route(i);
    else if (name == "nf_moe.dispatch")
      n = dispatch(i);
    else if (name == "nf_moe.expert_up")
      n = expert(i, true);
    else if (name == "nf_moe.expert_down")
      n = expert(i, false);
    else if (name == "nf_moe.combine")
      n = combine(i);
    else if (name == "nf_moe.shared_expert" && phase == "decode" &&
             i + 1 < ops.size() && opName(*ops[i + 1]) == "nf_moe.router")
      n = routeSharedExpert(i);
    else if (name == "nf_moe.shared_expert")
      n = sharedExpert(i);
    if (!n)
      return n.status();
    i += *n;
  }
  // Launches for more tokens than a step has never run (plans of one-token
  // steps: the dispatch and the layer's end of oneTokenExperts).
  for (size_t l = launches.size(); l-- > 0;)
    if (launches[l].minTokens > maxTokens) {
      launches.erase(launches.begin() + static_cast<std::ptrdiff_t>(l));
      functions.erase(functions.begin() + static_cast<std::ptrdiff_t>(l));
    }
  if (launches.empty())
    return fail(0, "kernel has no ops");
  if (!internalError.empty())
    return fail(ops.size(), "internal: " + internalError);
  // Every value stored as bf16 rows or with a bf16 copy must have been
  // written so by its producer here (bf16RowValues, decodeShadows and the
  // emitters agree).
  for (size_t i = 0; i < ops.size(); ++i)
    for (int r : results(*ops[i])) {
      if (rowsBf16(r) && !wroteBf16.count(r))
        return fail(i, "internal: value " + std::to_string(r) +
                           " is stored as bf16 rows but its producer does "
                           "not write them");
      if (shadowed(r) && !wroteShadow.count(r))
        return fail(i, "internal: value " + std::to_string(r) +
                           " has a bf16 copy but its producer does not "
                           "write it");
    }

  for (size_t l = 0; l < launches.size(); ++l) {
    const FunctionText &f = functions[l];
    text << "// " << f.comment << "\n"
         << "extern \"C\" __global__ void __launch_bounds__("
         << launches[l].block
         << (f.minBlocks > 0 ? ", " + std::to_string(f.minBlocks) : "") << ") "
         << (f.clusterBlocks > 0
                 ? "__cluster_dims__(" + std::to_string(f.clusterBlocks) +
                       ", 1, 1) "
                 : "")
         << launches[l].function
         << (phase == "decode" ? "(const nf_step_args *__restrict__ args) {\n"
                               : "(const nf_step_args *__restrict__ args, char "
                                 "*__restrict__ arena) {\n")
         << (f.ownsStep          ? ""
             : phase == "decode" ? "  const nf::Step a{args, nullptr};\n"
                                 : "  const nf::Step a{args, arena};\n")
         << f.body << "}\n\n";
  }

  CudaKernelSource out;
  out.step = phase;
  out.index = index;
  out.name = kname();
  std::string safe = out.name;
  for (char &c : safe)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_')
      c = '_';
  out.fileName = phase + "_k" + std::to_string(index) + "_" + safe + ".cu";
  std::ostringstream src;
  src << "// Generated by nfc: " << phase << " kernel " << index << " \""
      << out.name << "\" (";
  for (size_t i = 0; i < ops.size(); ++i)
    src << (i ? ", " : "") << opName(*ops[i]);
  src << ").\n// Launch ABI: nf_abi.h. Launches in order:";
  for (const CudaLaunchInfo &l : launches)
    src << "\n//   " << l.function << " <<<" << l.grid << ", " << l.block
        << ">>>";
  // Decode functions read the arena's base from the step's arguments at
  // each use (nf_common.cuh, nf::arena).
  src << "\n"
      << (phase == "decode" ? "#define NF_ARENA_FROM_ARGS 1\n" : "")
      << "#include \"nf_common.cuh\"\n";
  for (const std::string &inc : includes)
    src << "#include \"" << inc << "\"\n";
  if (!tensorMaps.empty()) {
    // Encoded by the runtime when it loads the module (nf_abi.h).
    src << "\nextern \"C\" {\n__device__ nf_tensor_map_desc "
           "nf_tensor_map_descs["
        << tensorMaps.size() << "] = {\n";
    for (const std::string &m : tensorMaps)
      src << "    " << m << ",\n";
    src << "};\n__device__ nf_tensor_map nf_tensor_maps[" << tensorMaps.size()
        << "];\n}\n";
  }
  src << "\n" << text.str();
  out.source = src.str();
  out.launches = launches;
  out.hopperFeatures = hopperFeatures;
  scratchEnd = std::max(scratchEnd, scratchTop);
  return out;
}

/// Value v is a weight stored as bf16.
bool isBf16Weight(const pl::Plan &plan, const std::vector<ValueInfo> &values,
                  int v) {
  if (v < 0 || v >= static_cast<int>(values.size()) ||
      values[v].kind != pl::ValueKind::Weight || !plan.weights() ||
      values[v].weight < 0 ||
      values[v].weight >= static_cast<int>(plan.weights()->size()))
    return false;
  return plan.weights()
             ->Get(static_cast<unsigned>(values[v].weight))
             ->dtype() == pl::DType::BF16;
}

/// With bf16 matmul inputs, the prefill activations that only tensor-core
/// GEMMs read are stored as bf16 rows by the ops that produce them (norms,
/// GEMM epilogues, activations), rounded as the GEMMs would round them: the
/// GEMMs stream them as they are, without a launch that rounds them first,
/// and half the bytes are written and read. A value qualifies when it is an
/// f32 row tensor that is not the logits, every reader takes it as the
/// input of a GEMM on the bf16 plane path (emitLinear) or of the router's
/// logits GEMM (route()), and its producer can write bf16 rows. The
/// emitters of those producers and readers consult the set. (Decode steps
/// keep f32 rows, and bf16 copies beside them for steps of many tokens,
/// decodeShadows: the narrow skinny variants reading bf16 rows gave
/// identical logits but slowed batch 1-8 by 2-3% on the H200,
/// bench/results/2026-11-30f.)
std::set<int> bf16RowValues(const pl::Plan &plan, const pl::Step &step,
                            const std::vector<ValueInfo> &values,
                            const std::string &phase,
                            const CudaCodegenOptions &opts) {
  std::set<int> out;
  if (phase == "decode" || !bf16RowsAllowed(opts))
    return out;
  auto valid = [&](int v) {
    return v >= 0 && v < static_cast<int>(values.size());
  };
  auto bf16Weight = [&](int v) { return isBf16Weight(plan, values, v); };
  // Per value: readers all GEMM inputs so far / read at all / producer ok.
  std::vector<char> gemmOnly(values.size(), 1), read(values.size(), 0),
      producible(values.size(), 0);
  for (const pl::Kernel *k : *step.kernels()) {
    if (!k->ops())
      continue;
    const unsigned n = k->ops()->size();
    for (unsigned i = 0; i < n; ++i) {
      const pl::Op &op = *k->ops()->Get(i);
      const std::string name = opName(op);
      auto in = operands(op);
      int gemmInput = -1; // the operand read as a GEMM's bf16 input
      // The plane path's K (its bf16 weights are checked per op below).
      if (!in.empty() && valid(in[0]) &&
          onBf16Planes(phase, true, values[in[0]].cols)) {
        if ((name == "nf.linear" || name == "nf.lm_head" ||
             name == "nf_moe.latent_proj") &&
            in.size() == 2 && bf16Weight(in[1]))
          gemmInput = in[0];
        else if ((name == "nf_moe.expert_up" || name == "nf_moe.expert_down") &&
                 in.size() == 3 && bf16Weight(in[2]))
          gemmInput = in[0];
        else if (name == "nf_moe.shared_expert" && in.size() == 3 &&
                 bf16Weight(in[1]))
          gemmInput = in[0];
        else if (name == "nf_moe.router" && in.size() == 3 &&
                 bf16Weight(in[1]) && i + 1 < n) {
          // Only when route() fuses the select (the router alone reads f32).
          const pl::Op &next = *k->ops()->Get(i + 1);
          auto rout = results(op), nin = operands(next);
          if (opName(next) == "nf_moe.select" && rout.size() == 2 &&
              nin.size() == 3 && nin[0] == rout[0] && nin[1] == rout[1])
            gemmInput = in[0];
        }
      }
      for (size_t o = 0; o < in.size(); ++o) {
        if (!valid(in[o]))
          continue;
        read[in[o]] = 1;
        if (!(o == 0 && in[o] == gemmInput))
          gemmOnly[in[o]] = 0;
      }
      const bool canWriteBf16 =
          name == "nf.rms_norm" || name == "nf.gated_rms_norm" ||
          name == "nf.activation" || name == "nf_moe.expert_up" ||
          name == "nf.linear";
      for (int r : results(op))
        if (valid(r))
          producible[r] = canWriteBf16;
    }
  }
  for (size_t v = 0; v < values.size(); ++v) {
    const ValueInfo &vi = values[v];
    if (static_cast<int>(v) != step.logits() && read[v] && gemmOnly[v] &&
        producible[v] && vi.kind == pl::ValueKind::Tensor &&
        vi.dtype == pl::DType::F32 &&
        (vi.rows == pl::Rows::Tokens || vi.rows == pl::Rows::Assignments))
      out.insert(static_cast<int>(v));
  }
  return out;
}

/// With bf16 matmul inputs, decode rows that a skinny GEMM reads get a bf16
/// copy written beside them by their producer (norms, attention, the expert up
/// projection's epilogue), rounded as the GEMM would round them: the wide
/// skinny variants (steps of more than kNarrowTokens tokens) stream the
/// copy, the narrow ones and every other reader the f32 rows, so results
/// do not depend on the step's size. A value's copy sits at
/// `valuesEnd + offset / 2`: values live at the same time have disjoint
/// offsets, so their copies (half the bytes) are disjoint too. Returns the
/// copies and the end of their region.
void decodeShadows(const pl::Plan &plan, const pl::Step &step,
                   const std::vector<ValueInfo> &values,
                   const std::string &phase, const CudaCodegenOptions &opts,
                   RowFormats &out) {
  if (!decodeCopiesOn(phase, opts, step.max_tokens()))
    return;
  auto valid = [&](int v) {
    return v >= 0 && v < static_cast<int>(values.size());
  };
  auto bf16Weight = [&](int v) { return isBf16Weight(plan, values, v); };
  // Per value: read as a skinny GEMM's input / producer writes copies.
  std::vector<char> gemmRead(values.size(), 0), producible(values.size(), 0);
  for (const pl::Kernel *k : *step.kernels()) {
    if (!k->ops())
      continue;
    for (const pl::Op *op : *k->ops()) {
      const std::string name = opName(*op);
      auto in = operands(*op);
      int weight = -1;
      if ((name == "nf.linear" || name == "nf.lm_head" ||
           name == "nf_moe.latent_proj") &&
          in.size() == 2)
        weight = in[1];
      else if ((name == "nf_moe.expert_up" || name == "nf_moe.expert_down") &&
               in.size() == 3)
        weight = in[2];
      else if (name == "nf_moe.shared_expert" && in.size() == 3)
        weight = in[1];
      if (weight >= 0 && valid(in[0]) && bf16Weight(weight) &&
          values[in[0]].cols % 32 == 0)
        gemmRead[in[0]] = 1;
      // Emitters that store these results through outPtr / storeAct.
      const bool writesCopy =
          name == "nf.rms_norm" || name == "nf.gated_rms_norm" ||
          name == "nf.activation" || name == "nf_moe.expert_up" ||
          name == "nf_kv.attend";
      for (int r : results(*op))
        if (valid(r))
          producible[r] = writesCopy;
    }
  }
  const int64_t valuesEnd = alignTo(step.arena_bytes() + step.scratch_bytes());
  int64_t end = valuesEnd;
  for (size_t v = 0; v < values.size(); ++v) {
    const ValueInfo &vi = values[v];
    if (static_cast<int>(v) == step.logits() || !gemmRead[v] ||
        !producible[v] || vi.kind != pl::ValueKind::Tensor ||
        vi.dtype != pl::DType::F32 || vi.offset < 0 || vi.offset % 32 != 0 ||
        (vi.rows != pl::Rows::Tokens && vi.rows != pl::Rows::Assignments))
      continue;
    const int64_t at = valuesEnd + vi.offset / 2;
    out.shadow[static_cast<int>(v)] = at;
    end = std::max(end, at + (vi.bytes + 1) / 2);
  }
  if (!out.shadow.empty())
    out.shadowEnd = alignTo(end);
}

/// Values per row the top-logits launches keep: a sampler whose top-k is
/// below this reads no vocabulary row (the runtime checks the rest).
constexpr int kTopLogits = 64;
/// sizeof(nf::top_logit_noise): how a row is ranked.
constexpr int64_t kTopLogitNoiseBytes = 24;

/// Appends the top-logits functions (kernels/nf_sample.cuh) to the module of
/// the kernel that computes the decode step's logits, with their output after
/// every other scratch value (they run after the step). Vocabularies beyond
/// 64 chunks of 4096 logits (a 32 KB shared-memory sort) get none.
void addTopLogits(const pl::Step &step, const std::vector<ValueInfo> &values,
                  const CudaCodegenOptions &opts, int64_t &scratchEnd,
                  CudaStepSources &out) {
  const int logits = step.logits();
  if (logits < 0 || logits >= static_cast<int>(values.size()) ||
      values[logits].dtype != pl::DType::F32 || values[logits].offset < 0)
    return;
  int kernel = -1;
  for (unsigned k = 0; k < step.kernels()->size(); ++k)
    if (const auto *o = step.kernels()->Get(k)->outputs())
      for (int v : *o)
        if (v == logits)
          kernel = static_cast<int>(k);
  const int64_t vocab = values[logits].cols;
  auto pow2AtLeast = [](int64_t n) {
    int64_t p = 1;
    while (p < n)
      p <<= 1;
    return p;
  };
  const int64_t chunk =
      std::max(pow2AtLeast(ceilDiv(vocab, 64)),
               std::min<int64_t>(
                   2048, pow2AtLeast(std::max<int64_t>(vocab, kTopLogits))));
  if (kernel < 0 || chunk > 4096)
    return;
  const int64_t chunks = ceilDiv(vocab, chunk), rows = step.max_tokens();
  CudaTopLogits &t = out.topLogits;
  t.kernel = kernel;
  t.k = kTopLogits;
  const int64_t partial = alignTo(scratchEnd);
  t.idsOffset = alignTo(partial + rows * chunks * kTopLogits * 8);
  t.valuesOffset = alignTo(t.idsOffset + rows * kTopLogits * 4);
  t.noiseOffset = alignTo(t.valuesOffset + rows * kTopLogits * 4);
  t.totalsOffset = alignTo(t.noiseOffset + rows * kTopLogitNoiseBytes);
  // The chunks' parts of the totals (nf::top_chunk_total, 16 bytes).
  const int64_t chunkSums = alignTo(t.totalsOffset + rows * 8);
  scratchEnd = alignTo(chunkSums + rows * chunks * 16);

  CudaKernelSource &src = out.kernels[static_cast<size_t>(kernel)];
  const std::string prefix = "dk" + std::to_string(kernel) + "_top_logits";
  const std::string tmpl = std::to_string(vocab) + ", " +
                           std::to_string(chunk) + ", " +
                           std::to_string(kTopLogits);
  const std::string rowsAndNoise = "nf::arena<float>(a, " +
                                   std::to_string(values[logits].offset) +
                                   "ll), nf::arena<nf::top_logit_noise>(a, " +
                                   std::to_string(t.noiseOffset) + "ll)";
  const std::string inc = "#include \"nf_common.cuh\"\n";
  const size_t at = src.source.find(inc);
  if (at != std::string::npos)
    src.source.insert(at + inc.size(), "#include \"nf_sample.cuh\"\n");
  src.source +=
      "// The largest logits of each row, run by the runtime after the step "
      "on request:\n// ranks of " +
      std::to_string(chunk) + " logits, " + std::to_string(kTopLogits) +
      " kept from each\nextern \"C\" __global__ void __launch_bounds__(256) " +
      prefix + "_chunks(const nf_step_args *__restrict__ args) {\n" +
      "  const nf::Step a{args, nullptr};\n  nf::top_logits_chunks<" + tmpl +
      ", 256>(a, " + rowsAndNoise + ", nf::arena<unsigned long long>(a, " +
      std::to_string(partial) + "ll), nf::arena<nf::top_chunk_total>(a, " +
      std::to_string(chunkSums) + "ll));\n}\n\n// the rows' " +
      std::to_string(kTopLogits) +
      " largest of the chunks' (ids and values)\nextern \"C\" __global__ "
      "void __launch_bounds__(512) " +
      prefix + "_merge(const nf_step_args *__restrict__ args) {\n" +
      "  const nf::Step a{args, nullptr};\n  nf::top_logits_merge<" + tmpl +
      ", 512>(a, " + rowsAndNoise + ", nf::arena<unsigned long long>(a, " +
      std::to_string(partial) + "ll), nf::arena<nf::top_chunk_total>(a, " +
      std::to_string(chunkSums) + "ll), nf::arena<int>(a, " +
      std::to_string(t.idsOffset) + "ll), nf::arena<float>(a, " +
      std::to_string(t.valuesOffset) + "ll), nf::arena<double>(a, " +
      std::to_string(t.totalsOffset) + "ll));\n}\n";
  CudaLaunchInfo c;
  c.function = prefix + "_chunks";
  c.grid = gridOf(rows * chunks, int64_t(opts.smCount) * 8);
  c.block = 256;
  CudaLaunchInfo m;
  m.function = prefix + "_merge";
  m.grid = gridOf(rows, int64_t(opts.smCount) * 8);
  m.block = 512;
  t.launches = {c, m};
}

StatusOr<CudaStepSources> generateStep(const pl::Plan &plan,
                                       const pl::Step *step, const char *phase,
                                       const CudaCodegenOptions &opts) {
  if (!step || !step->values() || !step->kernels())
    return Status::error(std::string("cuda: ") + phase +
                         " step has no values or kernels");
  std::vector<ValueInfo> values;
  for (const pl::Value *v : *step->values()) {
    ValueInfo vi;
    vi.kind = v->kind();
    vi.dtype = v->dtype();
    vi.rows = v->rows();
    if (v->shape())
      vi.shape.assign(v->shape()->begin(), v->shape()->end());
    for (size_t d = vi.rows != pl::Rows::None ? 1 : 0; d < vi.shape.size(); ++d)
      vi.cols *= vi.shape[d];
    vi.offset = v->offset();
    vi.bytes = v->bytes();
    vi.weight = v->weight();
    vi.numExperts = v->num_experts();
    vi.maxPerToken = v->max_per_token();
    values.push_back(std::move(vi));
  }
  CudaStepSources out;
  const int64_t arena = step->arena_bytes();
  int64_t scratchEnd = arena + step->scratch_bytes();
  RowFormats rowFormats;
  rowFormats.bf16 = bf16RowValues(plan, *step, values, phase, opts);
  decodeShadows(plan, *step, values, phase, opts, rowFormats);
  scratchEnd = std::max(scratchEnd, rowFormats.shadowEnd);
  // The expert statistics region, before the generated scratch (which
  // each kernel reuses).
  ExpertStatsLayout stats;
  stats.rows = step->max_tokens();
  for (const pl::Kernel *kernel : *step->kernels())
    if (kernel->ops())
      for (const pl::Op *op : *kernel->ops())
        if (op->name() && op->name()->string_view() == "nf_moe.select" &&
            op->results() && op->results()->size() == 3) {
          const int e = op->results()->Get(0);
          if (e < 0 || e >= static_cast<int>(values.size()))
            continue;
          stats.layerOf[op] = stats.layers++;
          stats.maxK = std::max(stats.maxK, values[e].cols);
        }
  if (stats.layers > 0) {
    stats.offset = alignTo(scratchEnd);
    scratchEnd = stats.offset + alignTo(stats.bytes());
    rowFormats.shadowEnd = scratchEnd; // generated scratch after it
    out.expertStatsOffset = stats.offset;
  }
  for (unsigned k = 0; k < step->kernels()->size(); ++k) {
    KernelEmitter e(plan, values, rowFormats, phase, static_cast<int>(k),
                    *step->kernels()->Get(k), step->max_tokens(), arena, opts);
    e.expertStats = &stats;
    auto src = e.run(scratchEnd);
    if (!src)
      return src.status();
    out.kernels.push_back(std::move(*src));
  }
  if (std::string_view(phase) == "decode")
    addTopLogits(*step, values, opts, scratchEnd, out);
  out.scratchBytes = alignTo(scratchEnd - arena);
  return out;
}

} // namespace

StatusOr<CudaPlanSources> generateCudaSources(const pl::Plan &plan,
                                              const CudaCodegenOptions &opts) {
  CudaPlanSources out;
  auto prefill = generateStep(plan, plan.prefill(), "prefill", opts);
  if (!prefill)
    return prefill.status();
  auto decode = generateStep(plan, plan.decode(), "decode", opts);
  if (!decode)
    return decode.status();
  out.prefill = std::move(*prefill);
  out.decode = std::move(*decode);
  return out;
}

} // namespace nf::codegen
