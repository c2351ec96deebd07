//===- KernelEmitter.h - one plan kernel -> CUDA C++ ------------*- C++ -*-===//
//
// Private to compiler/Target/Cuda. KernelEmitter turns one plan kernel into one
// CUDA module; CudaCodegen.cpp runs it for each kernel of a step and
// assembles the step, and the op emitters are defined by op family in
// Emit*.cpp. Also here: what those files share (the step's value table and
// row formats, the expert statistics layout, the linear layer spec, literal
// and launch-size helpers).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "Plan/PlanModel.h"
#include "Target/Cuda/CudaCodegen.h"
#include "Target/Cuda/KernelShapes.h"

#include "nf/plan_generated.h"
#include "nf/plan_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace nf::codegen::detail {

namespace pl = ::nf::plan;
using compiler::PlanKernel;
using compiler::PlanModel;
using compiler::PlanOp;
using compiler::PlanStep;
using compiler::PlanStorage;
using compiler::PlanWeight;

constexpr int64_t kAlignment = 256;

// Threads of the row kernels (norms): kRowThreads in kernels/nf_rows.cuh.
constexpr uint32_t kRowThreads = 256;

inline int64_t alignTo(int64_t v) {
  return (v + kAlignment - 1) / kAlignment * kAlignment;
}
inline int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
using shapes::kStaticSharedAllowance;

/// GEMM paths chosen by nf-cuda-gemm-paths (`nf.gemm_paths`, one per GEMM
/// of an op): bf16-plane tensor-core tiles (outside decode) and the skinny
/// tensor-core GEMVs (decode).
inline constexpr std::string_view kBf16Planes = "bf16_planes",
                                  kBf16Skinny = "bf16_skinny",
                                  kInt4Rows = "int4_rows";
/// The path of `op`'s GEMM i, or "" when the op has none.
inline std::string gemmPath(const PlanOp &op, size_t i) {
  std::vector<std::string> paths = stringListAttr(op, "nf.gemm_paths");
  return i < paths.size() ? paths[i] : std::string();
}
/// The kernel of `op`'s GEMM i in wide decode steps
/// (nf-cuda-gemm-variants: "feature_tiles", "tma", "skinny_rows32",
/// "skinny", "none"), or "" when the op has none.
inline std::string gemmWideVariant(const PlanOp &op, size_t i) {
  std::vector<std::string> v = stringListAttr(op, "nf.gemm_wide_variants");
  return i < v.size() ? v[i] : std::string();
}
/// Plane GEMM inputs may be stored as bf16 rows by their producers
/// (nf-cuda-row-formats): one bf16 term, targets with mma.sync's bf16 shapes.
inline bool bf16RowsAllowed(const CudaCodegenOptions &opts) {
  return opts.matmulTerms == 1 && opts.ampereOrLater;
}

inline uint32_t gridOf(int64_t blocks, int64_t cap) {
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
  /// Stored as bf16 rows instead of f32 (nf.row_format "bf16": prefill).
  std::set<int> bf16;
  /// Stored as f32 with a bf16 copy at this arena offset (nf.row_format
  /// "f32+bf16": decode).
  std::map<int, int64_t> shadow;
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
  std::map<const PlanOp *, int64_t> layerOf; // select op -> layer
  int64_t bytes() const { return 4 * layers * rows * (1 + maxK); }
  std::string counts(const PlanOp *select) const {
    return ptr(offset + 4 * layerOf.at(select) * rows);
  }
  std::string experts(const PlanOp *select) const {
    return ptr(offset + 4 * (layers * rows + layerOf.at(select) * rows * maxK));
  }
  static std::string ptr(int64_t off) {
    return "nf::arena<int32_t>(a, " + std::to_string(off) + "ll)";
  }
};

/// The warp items of the one-token kernels (row_linear,
/// row_experts_combine): 16-byte weight chunks in flight a lane and feature,
/// output features an item, and the blocks an SM the kernel must fit
/// (__launch_bounds__; 0: ptxas's choice). Their grids are three blocks an
/// SM.
struct RowItem {
  int64_t chunks, features, minBlocks;
};
/// bf16: 6 chunks (the best of 4 to 11 on the Nano shapes alone on the H200,
/// bench/kernels/row_linear_sweep.cu), a feature an item. FP8 codes (row
/// scales): two features an item keep a bf16 row's bytes in flight, and a
/// lane reads its activations once for both (nf_linear_row.cuh), 3 chunks
/// a feature in flight, three blocks an SM (row_experts_combine: 80
/// registers, 70 bytes spilled; unbounded it took 128, two blocks an SM).
/// H100, Nano batch 1: 359 -> 379 tok/s against 6 chunks, one feature in
/// the combine (bench/results/2026-12-07e).
inline RowItem rowItemOf(bool quantised) {
  return quantised ? RowItem{3, 2, 3} : RowItem{6, 1, 0};
}

inline std::string num(int64_t v) { return std::to_string(v); }

/// A double as a C++ literal (exact), or an expression for inf / nan.
inline std::string doubleLit(double v) {
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
inline std::string floatLit(double v) {
  if (std::isnan(v))
    return "__int_as_float(0x7fc00000)";
  if (std::isinf(v))
    return v > 0 ? "nf::f32_inf()" : "(-nf::f32_inf())";
  return "static_cast<float>(" + doubleLit(v) + ")";
}

using compiler::floatAttr;
using compiler::intAttr;
using compiler::listAttr;
using compiler::listsAttr;
using compiler::opName;
using compiler::stringAttr;
namespace attr = pl::attr;
using pl::OpCode;

inline OpCode opCode(const PlanOp &op) { return op.code; }
inline const std::vector<int> &operands(const PlanOp &op) {
  return op.operands;
}
inline const std::vector<int> &results(const PlanOp &op) { return op.results; }

/// The fixed part of a linear layer spec (nf_linear.cuh).
struct LinearSpec {
  /// The op whose scratch regions (nf.kernel_scratch) the GEMM's planes
  /// take.
  const PlanOp *owner = nullptr;
  /// The GEMM's path (nf-cuda-gemm-paths: "bf16_planes", "bf16_skinny",
  /// "other"); gemmPath of the op it comes from.
  std::string path;
  /// The kernel of wide decode steps (nf-cuda-gemm-variants); gemmWideVariant
  /// of the op it comes from.
  std::string wideVariant;
  /// The warps a block of its wide skinny items (nf-cuda-gemm-variants).
  int64_t wideWarps = 0;
  /// The feature tile of its warp-specialised wgmma GEMM, 0 for none
  /// (nf-cuda-launch-tiles).
  int64_t wsTile = 0;
  std::string wtype;
  int64_t N = 0, K = 0, G = 1;
  std::string groups = "nf::DenseGroups";
  std::string weight; // expression of `const W *` for group g
  /// Quantised weights (setQuantised): an expression of `const float *`,
  /// group g's scale per output feature, and of the whole weight's codes
  /// (`const nf::fp8e4m3 *`, which the plane path widens to bf16); empty for
  /// others.
  std::string rowScales, codes;
  /// int4 codes (setQuantised; the "int4_rows" path): an expression of
  /// `const float *`, group g's scales ([N, K / groupSize]), and the input
  /// columns of each scale.
  std::string groupScales;
  int64_t groupSize = 0;
  /// Quantised activations (setQuantised): "static" (one scale, the
  /// expression inputScale of `const float *`) or "dynamic" (a scale per
  /// row) where the GEMM reads its input rows quantised to FP8 E4M3 and
  /// back to f32 by a launch before it; empty for others.
  std::string inputQuant, inputScale;
  /// One weight (not stacked): its Plan.weights index, for a tensor map.
  int weightIndex = -1;
  std::string input; // expression of the f32 input activation [rows, K]
  /// Instead of `input`: an expression of `const unsigned short *`, the
  /// input stored as bf16 rows by its producer (nf.row_format "bf16").
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
  /// the step's narrow tokens) where it differs (S::store of `<spec>_wide`).
  std::string wideStore;
  /// Optional (N even): statements storing v0 at (r, n) and v1 at (r, n + 1)
  /// for an even n, in one store each (S::store2).
  std::string store2;
  int64_t maxRows = 0;
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

  /// The spec of GEMM `gemm` of op (its path and wide variant) over an
  /// N x K weight of type wtype.
  static LinearSpec of(const PlanOp &op, size_t gemm, std::string wtype,
                       int64_t N, int64_t K) {
    LinearSpec s;
    s.owner = &op;
    s.path = gemmPath(op, gemm);
    s.wideVariant = gemmWideVariant(op, gemm);
    if (auto warps = listAttr(op, "nf.gemm_wide_warps");
        warps && gemm < warps->size())
      s.wideWarps = (*warps)[gemm];
    if (auto tiles = listAttr(op, "nf.gemm_ws_tiles");
        tiles && gemm < tiles->size())
      s.wsTile = (*tiles)[gemm];
    s.wtype = std::move(wtype);
    s.N = N;
    s.K = K;
    return s;
  }
};

class KernelEmitter {
public:
  KernelEmitter(const PlanModel &plan, const std::vector<ValueInfo> &values,
                const RowFormats &rowFormats, const std::string &phase,
                int index, const PlanKernel &kernel, int64_t maxTokens,
                int64_t arenaBytes, const CudaCodegenOptions &opts)
      : plan(plan), values(values), rowFormats(rowFormats), phase(phase),
        index(index), kernel(kernel), maxTokens(maxTokens),
        arenaBytes(arenaBytes), opts(opts) {}

  StatusOr<CudaKernelSource> run();

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
  std::string kname() const { return kernel.name; }

  // Values
  const ValueInfo &V(int v) const { return values[static_cast<size_t>(v)]; }
  bool isTensor(int v, pl::DType dt) const {
    return v >= 0 && v < static_cast<int>(values.size()) &&
           V(v).kind == pl::ValueKind::Tensor && V(v).dtype == dt;
  }
  bool isAct(int v) const {
    return isTensor(v, pl::DType::F32) && V(v).rows == pl::Rows::Tokens;
  }
  const PlanWeight *weightOf(int v) const {
    if (v < 0 || v >= static_cast<int>(values.size()) ||
        V(v).kind != pl::ValueKind::Weight || V(v).weight < 0 ||
        V(v).weight >= static_cast<int>(plan.weights.size()))
      return nullptr;
    return &plan.weights[static_cast<size_t>(V(v).weight)];
  }
  std::vector<int64_t> weightShape(int v) const {
    const PlanWeight *w = weightOf(v);
    return w ? w->shape : std::vector<int64_t>();
  }
  int64_t weightNumel(int v) const {
    int64_t n = 1;
    for (int64_t d : weightShape(v))
      n *= d;
    return n;
  }
  std::optional<std::string> weightType(int v) const {
    const PlanWeight *w = weightOf(v);
    if (!w)
      return std::nullopt;
    switch (w->dtype) {
    case pl::DType::F32:
      return std::string("float");
    case pl::DType::BF16:
      return std::string("nf::bf16");
    case pl::DType::F16:
      return std::string("nf::f16");
    case pl::DType::F8E4M3:
      return std::string("nf::fp8e4m3");
    case pl::DType::I32:
      if (w->int4GroupSize > 0)
        return std::string("nf::int4x8");
      return std::nullopt;
    default:
      return std::nullopt;
    }
  }
  std::string arenaPtr(int v, const char *type = "float") const {
    return "nf::arena<" + std::string(type) + ">(a, " + num(V(v).offset) +
           "ll)";
  }
  /// Value v is stored as bf16 rows (nf.row_format "bf16").
  bool rowsBf16(int v) const { return rowFormats.bf16.count(v) != 0; }
  /// Value v has a bf16 copy (nf.row_format "f32+bf16").
  bool shadowed(int v) const { return rowFormats.shadow.count(v) != 0; }
  std::string shadowPtr(int v) const {
    return "nf::arena<unsigned short>(a, " + num(rowFormats.shadow.at(v)) +
           "ll)";
  }
  /// f32 rows with a bf16 copy that the wide steps write
  /// (nf::ShadowedRows).
  std::string shadowedRows(const std::string &f32,
                           const std::string &bf16) const {
    return "nf::shadowed_rows<" + num(narrowTokens) + ">(a->num_tokens, " +
           f32 + ", " + bf16 + ")";
  }
  /// A decode step whose longest steps run the wide skinny variants (more
  /// than nf.skinny_narrow_tokens tokens); steps of 2 to that many tokens
  /// run the narrow ones, one-token steps row_linear (emitLinear).
  bool wideSteps() const {
    return phase == "decode" && narrowTokens > 0 && maxTokens > narrowTokens;
  }
  /// Rows that skinny GEMVs read get bf16 copies for their wide variants
  /// (nf.row_format "f32+bf16" of nf-cuda-row-formats).
  bool decodeCopies() const { return bf16RowsAllowed(opts) && wideSteps(); }
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
  /// Where weight v of spec s holds FP8 codes: s.codes, and s.rowScales
  /// from row `row0` (an expression: the expert's first row for stacked
  /// experts) of the scales the runtime puts after the codes
  /// (nf::weight_row_scales).
  ///
  /// Where it holds int4 codes: s.weight (words; group g's from row `row0`)
  /// and s.groupScales from row `row0` of the group scales the runtime puts
  /// after the codes.
  void setQuantised(LinearSpec &s, int v, const std::string &row0 = "") const {
    const PlanWeight *w = weightOf(v);
    if (w && w->int4GroupSize > 0) {
      const int64_t K = w->shape.empty() ? 0 : w->shape.back();
      const std::string at = row0.empty() ? "" : " + (" + row0 + ") * ";
      s.weight = weightPtr(v) + (row0.empty() ? "" : at + num(K / 8) + "ll");
      s.groupScales =
          "nf::weight_row_scales(a, " + num(V(v).weight) + ", " +
          num(weightNumel(v) / 2) + "ll)" +
          (row0.empty() ? "" : at + num(K / w->int4GroupSize) + "ll");
      s.groupSize = w->int4GroupSize;
      return;
    }
    if (!w || w->dtype != pl::DType::F8E4M3)
      return;
    s.codes = weightPtr(v);
    const std::string scales = "nf::weight_row_scales(a, " + num(V(v).weight) +
                               ", " + num(weightNumel(v)) + "ll)";
    s.rowScales = scales + (row0.empty() ? "" : " + " + row0);
    if (w->inputQuant == pl::ActivationQuant::StaticPerTensor) {
      // After the scale of every row (the runtime's upload, cuda_load.cpp).
      const std::vector<int64_t> &shape = weightShape(v);
      s.inputQuant = "static";
      s.inputScale = scales + " + " +
                     num(weightNumel(v) / (shape.empty() ? 1 : shape.back())) +
                     "ll";
    } else if (w->inputQuant == pl::ActivationQuant::DynamicPerToken) {
      s.inputQuant = "dynamic";
    }
  }
  /// Whether weight v holds int4 codes (only linears read them).
  bool int4Weight(int v) const {
    const PlanWeight *w = weightOf(v);
    return w && w->int4GroupSize > 0;
  }
  /// Whether a GEMM over weight v quantises its input rows (setQuantised).
  bool quantisesInput(int v) const {
    const PlanWeight *w = weightOf(v);
    return w && w->inputQuant != pl::ActivationQuant::None;
  }
  /// The K (part 0) or V (part 1) buffer of op's KV cache `st` as the
  /// kernels take it: f32 storage as it is, bf16 as nf::bf16 values
  /// (nf_kv_cache.cuh's kv_cache), fp8 as pages of codes and scales
  /// (kv_cache_e4m3), a tiered cache as units of both (kv_cache_tiered).
  /// Empty for other element types.
  std::string kvCachePtr(const PlanOp &op, const PlanStorage &st,
                         int part) const {
    const std::string words =
        "nf::storage(a, " + num(2 * op.storage + part) + ")";
    if (st.dtype == pl::DType::F32)
      return words;
    if (st.dtype == pl::DType::BF16)
      return "nf::kv_cache<nf::bf16>(" + words + ")";
    if (st.dtype == pl::DType::F8E4M3 && st.hotWindow > 0)
      return "nf::kv_cache_tiered<" + num(st.kvHeads * st.headDim) + ", " +
             num(st.pageSize) + ", " + num(st.headDim) + ">(" + words + ")";
    if (st.dtype == pl::DType::F8E4M3)
      return "nf::kv_cache_e4m3<" + num(st.kvHeads * st.headDim) + ", " +
             num(st.pageSize) + ", " + num(st.headDim) + ">(" + words + ")";
    return std::string();
  }
  const PlanStorage *storageOf(const PlanOp &op, pl::StorageKind kind) const {
    if (op.storage < 0 || op.storage >= static_cast<int>(plan.storage.size()))
      return nullptr;
    const PlanStorage &s = plan.storage[static_cast<size_t>(op.storage)];
    return s.kind == kind ? &s : nullptr;
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
  /// The names of the ops after op i that its launch computes in its
  /// epilogue (nf-cuda-epilogues' nf.epilogue), checked against the ops
  /// that follow it.
  StatusOr<std::vector<std::string>> epilogueOf(size_t i) const {
    std::vector<std::string> names = stringListAttr(*ops[i], "nf.epilogue");
    for (size_t k = 0; k < names.size(); ++k)
      if (i + 1 + k >= ops.size() || opName(*ops[i + 1 + k]) != names[k])
        return fail(i, "nf.epilogue names " + names[k] +
                           ", which does not follow");
    return names;
  }
  /// Op k, which nf.epilogue names, does not fit its producer's epilogue.
  Status notInEpilogue(size_t k) const {
    return fail(k, "cannot be computed in the epilogue that nf.epilogue "
                   "puts it in");
  }
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
  /// The offset of `op`'s next scratch region, which nf-cuda-kernel-scratch
  /// sized (`bytes`, as this emitter uses it) and nf-plan-memory placed.
  int64_t scratchOf(const PlanOp &op, int64_t bytes) {
    const size_t n = scratchTaken[&op]++;
    const std::vector<int64_t> sizes =
        listAttr(op, "nf.kernel_scratch").value_or(std::vector<int64_t>{});
    const std::vector<int64_t> offsets =
        listAttr(op, "nf.kernel_scratch_offsets")
            .value_or(std::vector<int64_t>{});
    if (n >= sizes.size() || n >= offsets.size() || sizes[n] != bytes) {
      internalError =
          opName(op) + ": its kernels use a scratch region of " +
          std::to_string(bytes) + " bytes that " +
          (n < sizes.size()
               ? "nf.kernel_scratch sizes as " + std::to_string(sizes[n])
               : std::string("nf.kernel_scratch does not list")) +
          " (nf-cuda-kernel-scratch)";
      return 0;
    }
    return offsets[n];
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

  StatusOr<std::string> activationKind(size_t i, std::string_view key,
                                       bool required) const {
    std::optional<std::string> k = stringAttr(*ops[i], key);
    if (!k && !required)
      return std::string("nf::kActRelu2");
    if (!k)
      return fail(i, "missing attribute '" + std::string(key) + "'");
    if (*k == "relu2")
      return std::string("nf::kActRelu2");
    if (*k == "silu")
      return std::string("nf::kActSilu");
    return fail(i, "unsupported activation '" + *k + "'");
  }

public:
  /// The step's expert statistics (none: offset -1).
  const ExpertStatsLayout *expertStats = nullptr;
  /// The step's nf.skinny_narrow_tokens (decode; 0 elsewhere).
  int64_t narrowTokens = 0;

private:
  const PlanModel &plan;
  const std::vector<ValueInfo> &values;
  const RowFormats &rowFormats;
  std::set<int> wroteBf16;   // bf16 rows this kernel's code writes
  std::set<int> wroteShadow; // bf16 copies this kernel's code writes
  std::string internalError; // an emitter broke an invariant
  std::string phase;
  int index;
  const PlanKernel &kernel;
  int64_t maxTokens, arenaBytes;
  const CudaCodegenOptions &opts;

  std::vector<const PlanOp *> ops;
  std::set<int> outputs;
  std::set<std::string> includes;
  std::ostringstream text;
  std::vector<FunctionText> functions;
  std::vector<CudaLaunchInfo> launches;
  /// Scratch regions of each op taken so far (scratchOf).
  std::map<const PlanOp *, size_t> scratchTaken;
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
  /// Every step's launches of a linear over int4 codes (nf_linear_int4.cuh).
  void emitInt4Linear(const std::string &fn, const std::string &spec,
                      const LinearSpec &s, const std::string &comment);
  /// The wide decode variants of a dense linear on TMA (nf_tma.cuh).
  void emitTmaLinear(const std::string &fn, const std::string &spec,
                     const LinearSpec &s, const std::string &comment);
};

// Row formats of a step (RowFormats.cpp): the values stored as bf16 rows
// (prefill) and the bf16 copies beside f32 rows (decode).
StatusOr<RowFormats> rowFormatsOf(const PlanStep &step,
                                  const std::vector<ValueInfo> &values);

} // namespace nf::codegen::detail
