//===- StepUtils.h - step functions made by nf-outline-steps ----*- C++ -*-===//
//
// A step function is a func.func with `nf.phase` ("prefill" or "decode") whose
// arguments carry `nf.arg` roles: "tokens", "batch", "expert_budget".
// Also the short names of the nf dialects' namespaces that the passes and the
// plan builder, which work on step functions, use.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::nf {}
namespace mlir::nf_kv {}
namespace mlir::nf_moe {}

namespace nf::compiler {

namespace nfir = ::mlir::nf;
namespace kv = ::mlir::nf_kv;
namespace moe = ::mlir::nf_moe;

inline constexpr llvm::StringLiteral kPhaseAttr = "nf.phase";
inline constexpr llvm::StringLiteral kArgRoleAttr = "nf.arg";
/// How a CUDA plan stores an op's result rows (nf-cuda-row-formats).
inline constexpr llvm::StringLiteral kRowFormatAttr = "nf.row_format";
/// The CUDA GEMM path of each GEMM of an op (nf-cuda-gemm-paths).
inline constexpr llvm::StringLiteral kGemmPathsAttr = "nf.gemm_paths";
/// On decode steps: steps of up to this many tokens run the narrow skinny
/// GEMV variants, longer ones the wide variants (nf-cuda-gemm-paths).
inline constexpr llvm::StringLiteral kSkinnyNarrowTokensAttr =
    "nf.skinny_narrow_tokens";
/// The kernel each GEMM of an op runs in wide decode steps
/// (nf-cuda-gemm-variants).
inline constexpr llvm::StringLiteral kGemmWideVariantsAttr =
    "nf.gemm_wide_variants";
/// The warps a block of each GEMM's wide skinny items (0: not skinny)
/// (nf-cuda-gemm-variants).
inline constexpr llvm::StringLiteral kGemmWideWarpsAttr = "nf.gemm_wide_warps";
/// The ops after a CUDA GEMM that its epilogue computes (nf-cuda-epilogues).
inline constexpr llvm::StringLiteral kEpilogueAttr = "nf.epilogue";
/// Steps of up to this many tokens compute the epilogue in the producer's
/// launch; longer ones launch the ops after it (nf-cuda-epilogues).
inline constexpr llvm::StringLiteral kEpilogueMaxTokensAttr =
    "nf.epilogue_max_tokens";
/// The kernel form of an nf_kv.attend, and its prefill K/V tile positions
/// (nf-cuda-attention-forms).
inline constexpr llvm::StringLiteral kAttentionFormAttr = "nf.attention_form";
inline constexpr llvm::StringLiteral kAttentionPositionsAttr =
    "nf.attention_positions";
/// The kernel form of a prefill nf_kv.ssm_scan, and its tensor-core
/// sub-chunk tokens (nf-cuda-scan-forms).
inline constexpr llvm::StringLiteral kScanFormAttr = "nf.scan_form";
inline constexpr llvm::StringLiteral kScanSubChunkAttr = "nf.scan_sub_chunk";
/// The bytes of each scratch region an op's CUDA kernels use beyond the
/// plan's values, in the order they use them (nf-cuda-kernel-scratch), and
/// where they are (nf-plan-memory).
inline constexpr llvm::StringLiteral kKernelScratchAttr = "nf.kernel_scratch";
inline constexpr llvm::StringLiteral kKernelScratchOffsetsAttr =
    "nf.kernel_scratch_offsets";
/// Likewise for regions used after the step (the decode step's top-logits
/// buffers), and the logits each top-logits block ranks.
inline constexpr llvm::StringLiteral kAfterStepScratchAttr =
    "nf.after_step_scratch";
inline constexpr llvm::StringLiteral kAfterStepScratchOffsetsAttr =
    "nf.after_step_scratch_offsets";
inline constexpr llvm::StringLiteral kTopLogitsChunkAttr =
    "nf.top_logits_chunk";
/// The kernel form of a routed nf_moe.router's logits, and its launches'
/// tiles (nf-cuda-launch-tiles).
inline constexpr llvm::StringLiteral kRouterLogitsAttr = "nf.router_logits";
inline constexpr llvm::StringLiteral kRouterTilesAttr = "nf.router_tiles";
/// The feature tile of each GEMM's warp-specialised wgmma GEMM (0: none)
/// (nf-cuda-launch-tiles).
inline constexpr llvm::StringLiteral kGemmWsTilesAttr = "nf.gemm_ws_tiles";
/// The tile of an SSM op that walks its tokens: head channels a block and
/// tokens a staged chunk (nf-cuda-launch-tiles).
inline constexpr llvm::StringLiteral kWalkTileAttr = "nf.walk_tile";
/// How a decode shared expert's launches run beside its MoE layer's
/// (nf-cuda-co-launches).
inline constexpr llvm::StringLiteral kCoLaunchAttr = "nf.co_launch";
/// On a decode dispatch: steps of one token run the routed experts on the
/// ranking's slots (nf-cuda-co-launches).
inline constexpr llvm::StringLiteral kOneTokenExpertsAttr =
    "nf.one_token_experts";

/// The phase of a step function, or "" for any other function.
llvm::StringRef stepPhase(mlir::func::FuncOp func);
/// The argument of `func` with role `role`, or null.
mlir::Value stepArgument(mlir::func::FuncOp func, llvm::StringRef role);
/// The step function enclosing `op`, or null.
mlir::func::FuncOp enclosingStep(mlir::Operation *op);

/// The value `v` stands for in the step: through kernel block arguments
/// (their input operands) and kernel results (the values their regions
/// yield), to the op result that computes it.
mlir::Value canonicalValue(mlir::Value v);
/// How the producer of `v` stores it (nf-cuda-row-formats' kRowFormatAttr:
/// "bf16", "f32+bf16"), through kernel boundaries; "" when unmarked.
llvm::StringRef rowFormatOf(mlir::Value v);
/// Dimension i of `v`'s ranked tensor type (ShapedType::kDynamic if dynamic,
/// unranked or out of range).
int64_t dimOf(mlir::Value v, unsigned i);
/// Whether `v` is an unquantised bf16 weight (through kernel boundaries).
bool isBf16Weight(mlir::Value v);
/// Whether `v` is a weight of FP8 E4M3 codes (#nf.quant, through kernel
/// boundaries).
bool isFp8CodesWeight(mlir::Value v);
/// Whether `v` is a weight of int4 codes (#nf.quant scheme int4).
bool isInt4CodesWeight(mlir::Value v);
/// Whether the GEMM over weight `v` quantises its input rows to FP8 first
/// (#nf.quant activations static_per_tensor or dynamic_per_token).
bool quantisesInput(mlir::Value v);
/// The weight operands of the GEMMs `op` runs, in order (nf.linear,
/// nf.lm_head, nf_moe.latent_proj, nf_moe.expert_up / expert_down: one;
/// nf_moe.shared_expert: up, then down; nf_moe.router: its gate); empty for
/// other ops.
llvm::SmallVector<mlir::Value, 2> gemmWeights(mlir::Operation &op);
/// Removes attribute `name` from every op of `module` (functions included):
/// a pass that decides it starts from no decision, whatever its input says.
void clearDecision(mlir::ModuleOp module, llvm::StringRef name);
/// The GEMM paths nf-cuda-gemm-paths gave `op` (kGemmPathsAttr), or none.
llvm::SmallVector<llvm::StringRef, 2> gemmPaths(mlir::Operation &op);
/// Whether `router` is routed by the nf_moe.select right after it, reading
/// both its scores: the CUDA target computes the two in one set of launches.
bool routesWithSelect(mlir::Operation &router);

} // namespace nf::compiler
