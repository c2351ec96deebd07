//===- PlanModel.h - a compiled module as the plan's tables -----*- C++ -*-===//
//
// A module that went through every compile phase, numbered as the plan
// stores it (runtime/schema/plan.fbs): the weights and storage it refers to,
// and per step the values (step inputs, weights, kernel outputs at their
// planned arena offsets, kernel-internal values in a scratch region after
// the arena) and the kernels' ops over them. The ops stay MLIR operations:
// their attributes are read from the IR.
//
// Built once (buildPlanModel) and read by both the CUDA code generator
// (compiler/Target/Cuda) and the plan writer, which serialises it once, with
// the generated binaries when there are any.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "nf/plan_generated.h"
#include "nf/plan_ops.h"
#include "nf/status.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OperationSupport.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nf::compiler {

namespace pl = ::nf::plan;

/// Plan.weights[i]: one nf.weight (weights naming the same tensors, stacking
/// and packing share one entry).
struct PlanWeight {
  mlir::Operation *op = nullptr; // the first nf.weight of this entry
  pl::DType dtype =
      pl::DType::F32;         // of the stored tensors (codes if quantised)
  std::vector<int64_t> shape; // logical shape
  /// How a GEMM over it quantises its input rows (#nf.quant activations).
  pl::ActivationQuant inputQuant = pl::ActivationQuant::None;
  /// int4 codes (#nf.quant scheme int4): the input columns of each scale.
  int64_t int4GroupSize = 0;
};

/// Plan.storage[i]: an nf_kv.kv_cache or nf_kv.mamba_state declaration.
struct PlanStorage {
  std::string name;
  pl::StorageKind kind = pl::StorageKind::KVCache;
  int layer = 0;
  pl::DType dtype = pl::DType::F32;
  // KVCache
  int64_t pageSize = 0, numPages = 0, kvHeads = 0, headDim = 0;
  int64_t hotWindow = 0; // a tiered cache's bf16 positions (0: none)
  // MambaState (headDim too)
  int64_t slots = 0, convDim = 0, convWindow = 0, numHeads = 0, stateSize = 0;
};

/// Step.values[i].
struct PlanValue {
  pl::ValueKind kind = pl::ValueKind::Tensor;
  pl::DType dtype = pl::DType::F32;
  pl::Rows rows = pl::Rows::None;
  std::vector<int64_t> shape; // -1 for the leading dim when rows != None
  int64_t offset = -1, bytes = 0;
  int weight = -1;                     // Weight: index into PlanModel::weights
  int numExperts = 0, maxPerToken = 0; // Dispatch
};

/// One op of a kernel, its operands and results as value indices.
struct PlanOp {
  mlir::Operation *op = nullptr;
  pl::OpCode code = pl::OpCode::Unknown;
  std::vector<int> operands, results;
  int storage = -1; // nf_kv ops: index into PlanModel::storage
};

struct PlanKernel {
  mlir::Operation *op = nullptr; // the nf.kernel
  std::string name;
  std::vector<int> inputs, outputs;
  std::vector<PlanOp> ops;
};

struct PlanStep {
  std::string phase; // "prefill" or "decode"
  std::vector<PlanValue> values;
  std::vector<PlanKernel> kernels;
  int tokens = -1, batch = -1, budget = -1, logits = -1;
  int64_t maxTokens = 0, arenaBytes = 0, noReuseBytes = 0;
  /// Kernel-internal values: offsets in [arenaBytes, arenaBytes +
  /// scratchBytes), reused by every kernel.
  int64_t scratchBytes = 0;
  /// End of the bf16 copies and the expert statistics region (0: neither;
  /// nf-plan-memory).
  int64_t reservedBytes = 0;
  /// End of every region of the step, the CUDA kernels' scratch regions
  /// (nf.kernel_scratch_offsets on their ops) included (nf-plan-memory).
  int64_t kernelScratchEnd = 0;
  /// The expert statistics region (CUDA steps with nf_moe.select), or -1.
  int64_t expertStatsOffset = -1;
  /// CUDA decode steps: steps of up to this many tokens run the narrow
  /// skinny GEMV variants (nf.skinny_narrow_tokens), or 0.
  int64_t skinnyNarrowTokens = 0;
};

struct PlanModel {
  mlir::ModuleOp module;
  std::vector<PlanWeight> weights;
  std::vector<PlanStorage> storage;
  PlanStep prefill, decode;
  std::string policy = "topk"; // of the steps' nf_moe.select ops
};

/// Numbers `module` as the plan stores it; errors name the op.
StatusOr<PlanModel> buildPlanModel(mlir::ModuleOp module);

// Reading an op's attributes from the IR as the plan stores them (the
// readers of nf/plan_attrs.h over a serialised op): booleans and integers
// are integers, floats are floats (an integer read as a float is converted),
// strings, and i64 arrays are lists.
std::optional<int64_t> intAttr(const PlanOp &op, std::string_view name);
std::optional<double> floatAttr(const PlanOp &op, std::string_view name);
std::optional<std::string> stringAttr(const PlanOp &op, std::string_view name);
/// A string array attribute's entries (empty when absent or of another kind).
std::vector<std::string> stringListAttr(const PlanOp &op,
                                        std::string_view name);
std::optional<std::vector<int64_t>> listAttr(const PlanOp &op,
                                             std::string_view name);
/// An array of i64 arrays' entries (a compiler decision the plan does not
/// store; empty when absent or of another kind).
std::vector<std::vector<int64_t>> listsAttr(const PlanOp &op,
                                            std::string_view name);
/// Every attribute the plan stores of `op`: its discardable attributes, then
/// its properties.
mlir::NamedAttrList planAttrs(mlir::Operation &op);
/// The op's name, e.g. "nf.linear".
std::string opName(const PlanOp &op);

} // namespace nf::compiler
